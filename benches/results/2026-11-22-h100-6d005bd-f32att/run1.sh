#!/usr/bin/env bash
# f32att device run 1: variant timings (harness), eqfuse run checks, calibrate, GPU tests.
set -uo pipefail
G=.gpu-f32att
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export EQFUSE_REQUIRE_GPU=1 EQFUSE_CACHE_DIR=$PWD/$G/cache PYTHONUNBUFFERED=1
T0=$(date +%s); el(){ echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/device.txt; date -u >> $OUT/device.txt
el harness
timeout 150 python3 $G/harness.py $G/var $OUT/variants.json > $OUT/variants.log 2>&1; echo "harness exit $?"
tail -16 $OUT/variants.log
el runs
for p in composites small c2 c3; do echo "== $p"; timeout 60 $G/eqfuse run $G/progs/$p.eqf --repeat 50 --outputs /tmp/o-$p 2>&1; done > $OUT/run.log 2>&1
grep -iE "attention|mismatch|error|ok|==" $OUT/run.log | head -30
el calibrate
timeout 200 $G/eqfuse calibrate -o $OUT/cal.json > $OUT/calibrate.log 2>&1; echo "calibrate exit $?"
grep -iA12 "attention f32" $OUT/calibrate.log | head -30
el gputests
timeout 150 $G/gpu-tests cases_and_examples --test-threads=1 > $OUT/gputests.log 2>&1; echo "gpu-tests exit $?"
grep -E "attention_f32|MISMATCH|ERROR|test result|composites" $OUT/gputests.log | head -20
el done
