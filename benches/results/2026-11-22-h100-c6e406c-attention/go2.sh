G=.gpu-attn
cd $G
export EQFUSE_CACHE_DIR=$PWD/cache EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat COMMIT)"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } > $OUT/device2.log 2>&1
cat $OUT/device2.log
timeout 150 ./eqfuse run progs/attention.eqf --repeat 100 --outputs /tmp/o-dec > $OUT/run2-decomposed.log 2>&1; echo "exit $?" >> $OUT/run2-decomposed.log; cat $OUT/run2-decomposed.log
timeout 100 python3 sdpa.py > $OUT/sdpa2.log 2>&1; echo "sdpa exit $?" >> $OUT/sdpa2.log; grep -v Warn $OUT/sdpa2.log
timeout 60 ./eqfuse run progs/causal_full.eqf --repeat 100 --outputs /tmp/o-c > $OUT/run2-causal.log 2>&1; echo "exit $?" >> $OUT/run2-causal.log; cat $OUT/run2-causal.log
