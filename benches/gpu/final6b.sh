#!/usr/bin/env bash
# Sixth session's closing device run 2, from the repository root with the staged folder $G
# (benches/gpu/final-stage.sh, plus gpu-tests, profile.json and merge_profile.py): eqfuse
# calibrate, of which the row kernels' stage latency is merged into the committed profile
# ($OUT/h100.json); `eqfuse bench` over every example with that profile (final.sh PARTS=bench);
# compute-sanitizer memcheck of the GPU test of every case and example.
set -uo pipefail
G="${G:-.gpu-final}"
OUT="${OUT:-/tmp/out}"
export EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s); el(){ echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
el calibrate
EQFUSE_CACHE_DIR=/tmp/cal-cache timeout 200 "$G/eqfuse" calibrate -o "$OUT/calibrated.json" > "$OUT/calibrate.log" 2>&1
echo "calibrate exit $?"; grep -A4 "row stage" "$OUT/calibrate.log"
python3 "$G/merge_profile.py" "$G/profile.json" "$OUT/calibrated.json" "$OUT/h100.json" \
  "on $(date -u +%F) at commit $(cat $G/COMMIT) (benches/results/$(date -u +%F)-h100-$(cat $G/COMMIT)-final6b)" \
  templates.rowreduce.stage_latency_us
el bench
DEVICE="$OUT/h100.json" PARTS=bench BENCH_TIMEOUT=300 G="$G" OUT="$OUT" bash "$G/final.sh" 2>&1 | tail -32
el memcheck
EQFUSE_CACHE_DIR=/tmp/mc-cache timeout 200 compute-sanitizer --tool memcheck "$G/gpu-tests" cases_and_examples --include-ignored --test-threads=1 > "$OUT/memcheck.log" 2>&1
echo "memcheck exit $?"; grep -E "ERROR SUMMARY|test result|panicked" "$OUT/memcheck.log" | tail -5
el done
