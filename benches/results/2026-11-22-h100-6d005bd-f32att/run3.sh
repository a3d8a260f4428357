#!/usr/bin/env bash
# f32att device run 3: the binary of 6d005bd with the calibrated profile embedded: eqfuse bench of
# the f32 attention programs (fused plan against unfused), eqfuse run of the d96 and d1 programs
# planned as the attention kernel (its tile rate free), and their memcheck.
set -uo pipefail
G=.gpu-f32att
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export EQFUSE_REQUIRE_GPU=1 EQFUSE_CACHE_DIR=$PWD/$G/cache PYTHONUNBUFFERED=1
mkdir -p $OUT/r3; T0=$(date +%s); el(){ echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
el bench
timeout 200 $G/eqfuse bench $G/progs/composites.eqf $G/progs/small.eqf $G/progs/large.eqf $G/progs/large_causal.eqf $G/progs/d128.eqf --json $OUT/r3/bench3.json > $OUT/r3/bench3.log 2>&1; echo "bench exit $?"; tail -12 $OUT/r3/bench3.log
el runs
for p in d96 d1 large; do echo "== $p"; timeout 60 $G/eqfuse run $G/progs/$p.eqf --device $G/prof_free.json --repeat 20 --outputs /tmp/o-$p 2>&1; done > $OUT/r3/run3.log 2>&1
grep -E "==|attention_f32|ok:|mismatch|rror" $OUT/r3/run3.log | head -12
el memcheck
for p in d96 d1; do timeout 40 compute-sanitizer --tool memcheck $G/eqfuse run $G/progs/$p.eqf --device $G/prof_free.json --repeat 1 --outputs /tmp/m-$p 2>&1 | grep -E "ERROR SUMMARY|mismatch"; done > $OUT/r3/memcheck3.log 2>&1; cat $OUT/r3/memcheck3.log
el done
