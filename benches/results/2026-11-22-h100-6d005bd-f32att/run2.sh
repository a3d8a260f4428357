#!/usr/bin/env bash
# f32att device run 2 (commit in $G/COMMIT): calibrate, the attention f32 tile merged into the
# committed profile ($OUT/h100.json); eqfuse run and bench with it; harness (old vs new kernel);
# GPU tests; compute-sanitizer memcheck of the attention programs.
set -uo pipefail
G=.gpu-f32att
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export EQFUSE_REQUIRE_GPU=1 EQFUSE_CACHE_DIR=$PWD/$G/cache PYTHONUNBUFFERED=1
T0=$(date +%s); el(){ echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/device.txt; date -u >> $OUT/device.txt
el calibrate
timeout 200 $G/eqfuse calibrate -o $OUT/cal.json > $OUT/calibrate.log 2>&1; echo "calibrate exit $?"
grep -A9 "attention f32" $OUT/calibrate.log | head -10
python3 $G/merge_att.py $G/profile.json $OUT/cal.json $OUT/h100.json 32x32 "on $(date -u +%F) at commit $(cat $G/COMMIT) (benches/results/$(date -u +%F)-h100-$(cat $G/COMMIT)-f32att, calibrate.log)"
el runs
for p in composites small c2 c3 d96 d1; do echo "== $p"; timeout 60 $G/eqfuse run $G/progs/$p.eqf --device $OUT/h100.json --repeat 50 --outputs /tmp/o-$p 2>&1; done > $OUT/run.log 2>&1
grep -E "==|attention_f32|mismatch|MISMATCH|rror" $OUT/run.log | head -20
el bench
timeout 90 $G/eqfuse bench $G/progs/composites.eqf --device $OUT/h100.json --json $OUT/bench.json > $OUT/bench.log 2>&1; echo "bench exit $?"; tail -8 $OUT/bench.log
el harness
timeout 90 python3 $G/harness.py $G/var $OUT/variants.json > $OUT/variants.log 2>&1; echo "harness exit $?"; tail -6 $OUT/variants.log
el gputests
timeout 150 $G/gpu-tests f32_attention cases_and_examples --test-threads=1 > $OUT/gputests.log 2>&1; echo "gpu-tests exit $?"
grep -E "^ok: [a-z0-9_]+:|MISMATCH|ERROR|test result|panicked" $OUT/gputests.log | grep -vE "^ok: .*kernels$" | head -14
el memcheck
for p in composites c2 c3 d96 d1; do timeout 40 compute-sanitizer --tool memcheck $G/eqfuse run $G/progs/$p.eqf --device $OUT/h100.json --repeat 1 --outputs /tmp/m-$p 2>&1 | grep -E "ERROR SUMMARY|mismatch"; done > $OUT/memcheck.log 2>&1; cat $OUT/memcheck.log
el done
