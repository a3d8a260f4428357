#!/usr/bin/env bash
# Session 7 call 2: calibrate (stage and split-K latency), ncu of the bf16 row kernel after cuBLASLt, row-kernel variants.
set -uo pipefail
G="$(cd .gpu-me && pwd)"; OUT="${OUT:-/tmp/out}"; cd "$G"
export EQFUSE_CACHE_DIR="$G/cache" EQFUSE_REQUIRE_GPU=1 EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
E="$G/eqfuse"
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat COMMIT) + uncommitted (choose_vec for row stores; split-K latency in the model and calibrate)"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; } > $OUT/device.txt
(cd rowv && ./build.sh > $OUT/rowv.log 2>&1 && timeout 60 ./rowv >> $OUT/rowv.log 2>&1; echo "rowv exit $?" >> $OUT/rowv.log) &
wait
timeout 240 $E calibrate -o $OUT/calibrated.json > $OUT/calibrate.log 2>&1; echo "calibrate exit $?" >> $OUT/calibrate.log
timeout 120 ncu -k regex:rowreduce --metrics gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,dram__bytes.sum $E run softmax_regression_bf16.eqf --repeat 2 > $OUT/ncu.log 2>&1; echo "ncu exit $?" >> $OUT/ncu.log
tail -5 $OUT/rowv.log; grep -E "split|stage|exit" $OUT/calibrate.log | head; grep -E "gpu__time|rowreduce" $OUT/ncu.log | head -12
