#!/usr/bin/env bash
# Helper ce's device run, from the repository root with the staged folder G (default .gpu-ce, see
# benches/gpu/ce-stage.sh): the GPU tests (every case and example against the CPU reference,
# strict plans bit-identical to the unfused plan), `eqfuse bench` on the memory-bound examples
# (fused against unfused, measured against predicted, share of copy bandwidth), then PyTorch
# eager and torch.compile on cross-entropy and bias+gelu+dropout in the same session.
set -uo pipefail
OUT="${OUT:-/tmp/eqfuse-out}"
G="${G:-.gpu-ce}"
export PYTHONUNBUFFERED=1 EQFUSE_REQUIRE_GPU=1 EQFUSE_CACHE_DIR=/tmp/eqfuse-cache
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "commit: $(cat $G/COMMIT)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
} > "$OUT/device.txt"
cat "$OUT/device.txt"
E=$G/examples
timeout "${BENCH_TIMEOUT:-220}" "$G/eqfuse" bench $E/cross_entropy_grad.eqf $E/cross_entropy.eqf $E/bias_gelu_dropout.eqf \
  $E/softmax.eqf $E/rmsnorm.eqf $E/layernorm_grad.eqf $E/add_mul.eqf $E/softplus.eqf $E/softmax_small.eqf $E/layernorm.eqf \
  --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
echo "bench exit $?"; cat "$OUT/bench.txt" | tail -25
timeout "${TORCH_TIMEOUT:-150}" python3 "$G/torch_baselines.py" --out "$OUT/torch.json" "$G"/graphs/*.json > "$OUT/torch.log" 2>&1
echo "torch exit $?"; grep '^{"graph"' "$OUT/torch.log" | cut -c1-300
timeout "${TESTS_TIMEOUT:-150}" "$G/gpu-tests" --include-ignored --test-threads=1 > "$OUT/gpu-tests.log" 2>&1
echo "tests exit $?"; grep -E "^test |test result" "$OUT/gpu-tests.log" | tail -40
