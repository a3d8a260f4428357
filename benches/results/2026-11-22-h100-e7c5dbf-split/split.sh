#!/usr/bin/env bash
# Split-K row epilogues on the device, from the repository root with the staged files in $G
# (benches/gemm/split-stage.sh): the gemm GPU tests (every implementation against the
# reference, split-K cases included), compute-sanitizer memcheck of split kernels, `eqfuse
# calibrate` (the new CUDA-core row tiles), softmax regression at the seeds' sizes and
# matmul_softmax timed (committed and calibrated profiles), `eqfuse bench` with the calibrated
# profile, and PyTorch eager on the same GPU. Logs under $OUT.
set -uo pipefail
G="$(cd "${G:-.gpu-split}" && pwd)"
OUT="${OUT:-/tmp/out}"
cd "$G"
export EQFUSE_CACHE_DIR=/tmp/eqfuse-cache EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
E="$G/eqfuse"
T0=$(date +%s); el(){ echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat $G/COMMIT)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; } > "$OUT/device.log" 2>&1
cat "$OUT/device.log"
el tests
timeout 200 "$G/gpu-tests" gemm_implementations cases_and_examples --test-threads=1 --nocapture > "$OUT/gpu-tests.log" 2>&1
echo "tests exit $?" >> "$OUT/gpu-tests.log"; grep -E "^ok:|test result|panicked|exit" "$OUT/gpu-tests.log" | tail -50
el memcheck
{ for p in "examples/softmax_regression.eqf" "examples/matmul_softmax.eqf" "progs/split_batched.eqf"; do
    echo "== memcheck $p"; timeout 60 compute-sanitizer --tool memcheck "$E" run $p --repeat 2 --outputs /tmp/o-m; echo "exit $?"; done
  echo "== memcheck gpu-tests gemm_implementations"
  timeout 150 compute-sanitizer --tool memcheck "$G/gpu-tests" gemm_implementations --test-threads=1; echo "exit $?"; } > "$OUT/memcheck.log" 2>&1
grep -E "==|ERROR SUMMARY|exit" "$OUT/memcheck.log"
el calibrate
timeout 240 "$E" calibrate -o "$OUT/h100.json" > "$OUT/calibrate.log" 2>&1; echo "calibrate exit $?"; grep -iE "tile.*(32x|64x16)|f32" "$OUT/calibrate.log" | head -20
el runs
{ for prof in h100 "$OUT/h100.json"; do
  for s in "64 128 10" "256 512 50" "1024 1024 100"; do set -- $s
    echo "== softmax_regression $1x$2x$3 ($prof)"
    timeout 60 "$E" run examples/softmax_regression.eqf --device "$prof" --dim B=$1 --dim F=$2 --dim K=$3 --repeat 500
  done
  echo "== matmul_softmax ($prof)"; timeout 60 "$E" run examples/matmul_softmax.eqf --device "$prof" --repeat 200
  done; } > "$OUT/runs.log" 2>&1
echo "runs exit $?"; grep -E "^==|total|gemm|MISMATCH|rror" "$OUT/runs.log" | head -60
el bench
timeout 150 "$E" bench examples/softmax_regression.eqf examples/matmul_softmax.eqf examples/softmax_small.eqf --device "$OUT/h100.json" --json /tmp/bench.json > "$OUT/bench.txt" 2>&1
echo "bench exit $?"; tail -12 "$OUT/bench.txt"
el eager
timeout 100 python3 "$G/softmax_regression_eager.py" > "$OUT/eager.log" 2>&1; echo "eager exit $?"; cat "$OUT/eager.log"
el done
