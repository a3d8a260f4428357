#!/usr/bin/env bash
# Issues 6-8 on the device, from the repository root with the staged folder G (default
# .gpu-views; see benches/gpu/views-stage.sh), in one call:
#   1. the GPT-2 block from `transformers`: `eqfuse run` of its exported graph, compared with
#      PyTorch (CPU and this GPU), kernels counted against torch.compile's;
#   2. `eqfuse run` of the transformer block, forward and forward+backward, at their declared
#      sizes: every output checked against the CPU reference;
#   3. `eqfuse bench` of both (fused against unfused, measured against predicted).
# Writes at most 8 files under $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/eqfuse-out}"
G="${G:-.gpu-views}"
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 EQFUSE_CACHE_DIR="$G/cache"
mkdir -p "$OUT/gpt2"
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "commit: $(cat $G/COMMIT)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "== GPT-2 block"
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  timeout 60 python3 "$G/python/gpt2_block.py" prepare --dir /tmp/gpt2 --eqfuse "$G/eqfuse" 2>&1
  echo "prepare exit $?"
  timeout 150 python3 "$G/python/gpt2_block.py" gpu --dir /tmp/gpt2 --eqfuse "$G/eqfuse" --out "$OUT/gpt2" \
    --work /tmp/gpt2-work --skip-backend 2>&1
  echo "gpt2 exit $?"
  for p in transformer_block transformer_block_grad; do
    echo "== eqfuse run $p"
    timeout 60 "$G/eqfuse" run "$G/examples/$p.eqf" --repeat 20 --outputs /tmp/out-$p 2>&1
    echo "run $p exit $?"
  done
  echo "== eqfuse bench"
  timeout 100 "$G/eqfuse" bench "$G/examples/transformer_block.eqf" "$G/examples/transformer_block_grad.eqf" \
    --json "$OUT/bench.json" 2>&1
  echo "bench exit $?"
} 2>&1 | tee "$OUT/views.log"
