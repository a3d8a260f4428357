#!/usr/bin/env bash
# Issue 8's GPU checks of the Python side, run on the device machine from the repository root
# with the staged folder G (default .gpu-py; see benches/gpu/py-stage.sh), in one call:
#   1. python/tests/test_runtime.py: the torch.compile backend launching eqfuse's kernels (CuPy);
#   2. benches/py_backend_speed.py: layernorm + GELU + residual by eager, the eqfuse backend, Inductor;
#   3. python/gpt2_block.py prepare + gpu: a GPT-2 block exported, `eqfuse run` on the GPU,
#      compared with PyTorch, kernels counted against torch.compile's.
# Writes at most 8 files under $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/eqfuse-out}"
G="${G:-.gpu-py}"
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 EQFUSE="$PWD/$G/eqfuse" EQFUSE_CACHE_DIR=/tmp/eqfuse-cache
mkdir -p "$OUT/gpt2"
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "commit: $(cat $G/COMMIT 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, cupy, transformers; print('torch', torch.__version__, 'cupy', cupy.__version__, 'transformers', transformers.__version__)"
  echo "== 1. pytest python/tests/test_runtime.py"
  timeout 150 python3 -m pytest -q -rs "$G/python/tests/test_runtime.py" 2>&1
  echo "pytest exit $?"
  echo "== 2. backend speed"
  timeout 150 python3 "$G/benches/py_backend_speed.py" --json "$OUT/backend-speed.json" 2>&1
  echo "speed exit $?"
  echo "== 3. GPT-2 block"
  timeout 60 python3 "$G/python/gpt2_block.py" prepare --dir /tmp/gpt2 --batch "${B:-4}" --seq "${T:-256}" --eqfuse "$EQFUSE" 2>&1
  echo "prepare exit $?"
  timeout 300 python3 "$G/python/gpt2_block.py" gpu --dir /tmp/gpt2 --eqfuse "$EQFUSE" --out "$OUT/gpt2" --work /tmp/gpt2-work 2>&1
  echo "gpt2 exit $?"
} 2>&1 | tee "$OUT/py.log"
