#!/usr/bin/env bash
# Issue 6 (matrix products) on the device, from the repository root with the staged files in
# $G (benches/gemm/stage.sh): GPU tests (gemm implementations and every example against the
# reference), calibration of the gemm rates, eqfuse run of the dense bf16 target and softmax
# regression at three sizes, and the PyTorch baselines on the same GPU. Logs under $OUT.
set -uo pipefail
G="$(cd "${G:-.gpu-gemm}" && pwd)"
OUT="${OUT:-/tmp/out}"
# The staged examples (this branch's) are the ones the tests and runs read.
cd "$G"
export EQFUSE_CACHE_DIR="$G/cache" EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
E="$G/eqfuse"
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat $G/COMMIT)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; } > "$OUT/gemm.log" 2>&1
timeout 150 "$G/gpu-tests" --test-threads=1 --nocapture > "$OUT/gpu-tests.log" 2>&1
echo "tests exit $?" >> "$OUT/gpu-tests.log"; tail -4 "$OUT/gpu-tests.log"
{
  echo "== calibrate"; timeout 90 "$E" calibrate -o "$OUT/profile.json"
  echo "== dense bf16 8192x4096x4096 + bias + gelu_tanh"
  timeout 60 "$E" run examples/dense_gelu_bf16.eqf --repeat 50
  for s in "64 128 10" "256 512 50" "1024 1024 100"; do set -- $s
    echo "== softmax_regression $1x$2x$3"
    timeout 60 "$E" run examples/softmax_regression.eqf --dim B=$1 --dim F=$2 --dim K=$3 --repeat 500
  done
  echo "== matmul_softmax"; timeout 60 "$E" run examples/matmul_softmax.eqf --repeat 200
  echo "== dense (f32)"; timeout 60 "$E" run examples/dense.eqf --repeat 20
} >> "$OUT/gemm.log" 2>&1
echo "runs exit $?"; grep -E "^==|total|MISMATCH|ok:|error" "$OUT/gemm.log" | head -60
timeout 200 python3 "$G/torch_baselines.py" --repeat 50 --out "$OUT/torch.json" "$G/graphs/dense_gelu_bf16.json" > "$OUT/torch.log" 2>&1
echo "torch exit $?" >> "$OUT/torch.log"
timeout 100 python3 "$G/softmax_regression_eager.py" >> "$OUT/torch.log" 2>&1
echo "eager exit $?" >> "$OUT/torch.log"; tail -8 "$OUT/torch.log"
