# Device call 2: the driver's variants (BN 64 and two blocks per SM as the default), eqfuse on the
# wgmma path (checked runs, bench on both paths), GPU tests, torch.compile of the example.
cd .gpu-attnfwd
export EQFUSE_CACHE_DIR=/tmp/eqcache EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat COMMIT)"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } > $OUT/device.log 2>&1
cat $OUT/device.log
(cd attnfwd && KDIR=../kernels timeout 150 bash build.sh > build.out 2>&1; echo "build exit $?" >> build.out) &
B=$!
for p in causal_tail f16_d128 heads_view; do timeout 40 ./eqfuse run progs/$p.eqf --repeat 10 --outputs /tmp/o-$p; echo "$p exit $?"; done > $OUT/run-small.log 2>&1
grep -E "exit|ok|MISMATCH|rror|compiled|attention_" $OUT/run-small.log | head -30
wait $B; cat attnfwd/build.out attnfwd/build_*.log > $OUT/build.log; tail -16 attnfwd/build.out
(cd attnfwd && timeout 60 ./driver) > $OUT/driver.log 2>&1; echo "driver exit $?" >> $OUT/driver.log
cat $OUT/driver.log
timeout 80 ./eqfuse run progs/attention.eqf --repeat 30 --outputs /tmp/o-att > $OUT/run-attention.log 2>&1; echo "exit $?" >> $OUT/run-attention.log
tail -9 $OUT/run-attention.log
EQFUSE_NO_SM90A=1 timeout 60 ./eqfuse bench progs/attention.eqf --repeat 30 > $OUT/bench.log 2>&1; echo "exit $?" >> $OUT/bench.log
timeout 60 ./eqfuse bench progs/attention.eqf --repeat 30 >> $OUT/bench.log 2>&1; echo "exit $?" >> $OUT/bench.log
grep -E "attention|exit" $OUT/bench.log
cd .. && timeout 100 python3 benches/torch_baselines.py --repeat 30 --out /tmp/torch.json .gpu-attnfwd/progs/attention.json > $OUT/torch.log 2>&1; echo "torch exit $?" >> $OUT/torch.log; cat /tmp/torch.json >> $OUT/torch.log; tail -5 $OUT/torch.log
timeout 100 .gpu-attnfwd/gpu-tests --test-threads=1 --nocapture cases_and_examples > $OUT/gpu-tests.log 2>&1; echo "tests exit $?" >> $OUT/gpu-tests.log
grep -E "attention|MISMATCH|ERROR|ran |exit|test result" $OUT/gpu-tests.log | head -20
