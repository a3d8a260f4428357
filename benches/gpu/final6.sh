#!/usr/bin/env bash
# Sixth session's first closing device run, from the repository root with the staged files in
# $G (benches/gpu/final6-stage.sh): eqfuse calibrate (cuBLASLt's rate by size is what is taken:
# benches/gpu/merge_profile.py merges it into the committed profile as $OUT/h100.json), the
# GPU tests, softmax regression at the seeds' sizes and matmul_softmax with the merged profile
# (and the one-kernel split-K plan under the profile before, profile-old.json), PyTorch eager.
set -uo pipefail
G="$(cd "${G:-.gpu-final6}" && pwd)"
OUT="${OUT:-/tmp/out}"
cd "$G"
export EQFUSE_CACHE_DIR=/tmp/eqfuse-cache EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
E="$G/eqfuse"
T0=$(date +%s); el(){ echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat COMMIT)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; } > "$OUT/device.log" 2>&1
cat "$OUT/device.log"
el calibrate
timeout 240 "$E" calibrate -o "$OUT/calibrated.json" > "$OUT/calibrate.log" 2>&1; echo "calibrate exit $?"
grep -E "cuBLASLt|cublaslt" "$OUT/calibrate.log"
python3 merge_profile.py profile.json "$OUT/calibrated.json" "$OUT/h100.json" \
  "on $(date -u +%F) at commit $(cat COMMIT) (benches/results/$(date -u +%F)-h100-$(cat COMMIT)-final6)" \
  templates.gemm.implementations.cublaslt.rate_by_size templates.gemm.implementations.cublaslt.call_overhead_us
python3 -c "import json;print(json.load(open('$OUT/h100.json'))['templates']['gemm']['implementations']['cublaslt'])"
el tests
timeout 330 "$G/gpu-tests" gemm_implementations cases_and_examples strict --include-ignored --test-threads=1 --nocapture > "$OUT/gpu-tests.log" 2>&1
echo "tests exit $?" >> "$OUT/gpu-tests.log"; grep -E "^test |test result|panicked|exit" "$OUT/gpu-tests.log" | tail -12
el runs
{ for s in "64 128 10" "256 512 50" "1024 1024 100"; do set -- $s
    echo "== softmax_regression $1x$2x$3"
    timeout 60 "$E" run examples/softmax_regression.eqf --device "$OUT/h100.json" --dim B=$1 --dim F=$2 --dim K=$3 --repeat 500
  done
  echo "== softmax_regression 1024x1024x100, one kernel (profile-old.json)"
  timeout 60 "$E" run examples/softmax_regression.eqf --device profile-old.json --dim B=1024 --dim F=1024 --dim K=100 --repeat 500
  echo "== matmul_softmax"; timeout 60 "$E" run examples/matmul_softmax.eqf --device "$OUT/h100.json" --repeat 200
} > "$OUT/runs.log" 2>&1
echo "runs exit $?"; grep -E "^==|total|gemm|rowreduce|MISMATCH|rror" "$OUT/runs.log" | head -40
el eager
timeout 100 python3 softmax_regression_eager.py > "$OUT/eager.log" 2>&1; echo "eager exit $?"; cat "$OUT/eager.log"
el done
