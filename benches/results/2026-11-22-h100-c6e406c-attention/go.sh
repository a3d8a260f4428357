# One device session for the attention template (run from the repository root of /work/main's copy).
G=.gpu-attn
cd $G
export EQFUSE_CACHE_DIR=$PWD/cache EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat COMMIT)"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } > $OUT/device.log 2>&1
cat $OUT/device.log
(bash build.sh > $OUT/build.log 2>&1; echo "build exit $?" >> $OUT/build.log) &
BUILD=$!
echo "== full-size runs (composite form, checked against the reference)"
for p in attention_full causal_full; do timeout 120 ./eqfuse run progs/$p.eqf --repeat 50 --outputs /tmp/o-$p; echo "exit $?"; done > $OUT/run.log 2>&1
cat $OUT/run.log
echo "== sdpa"
timeout 100 python3 sdpa.py > $OUT/sdpa.log 2>&1; echo "sdpa exit $?" >> $OUT/sdpa.log; cat $OUT/sdpa.log
wait $BUILD; tail -30 $OUT/build.log | grep -E "registers|spill|error|exit" | head -30
echo "== driver"
timeout 60 ./driver > $OUT/driver.log 2>&1; echo "driver exit $?" >> $OUT/driver.log; cat $OUT/driver.log
echo "== gpu tests"
timeout 100 ./gpu-tests --test-threads=1 --nocapture cases_and_examples > $OUT/gpu-tests.log 2>&1; echo "tests exit $?" >> $OUT/gpu-tests.log
grep -E "attention|composites|MISMATCH|ERROR|ran |exit|test result" $OUT/gpu-tests.log | head -30
echo "== memcheck"
for p in causal_odd f16_d128 hv composites; do timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 ./eqfuse run progs/$p.eqf --repeat 0 --outputs /tmp/m-$p 2>&1 | grep -E "ERROR SUMMARY|ok:|MISMATCH| ok|error"; echo "$p exit ${PIPESTATUS[0]}"; done > $OUT/memcheck.log 2>&1
cat $OUT/memcheck.log
echo "== decomposed example, full size"
timeout 150 ./eqfuse run progs/attention.eqf --repeat 50 --outputs /tmp/o-dec > $OUT/run-decomposed.log 2>&1; echo "exit $?" >> $OUT/run-decomposed.log; cat $OUT/run-decomposed.log
