G=.gpu-attnbwd
cd $G
export EQFUSE_CACHE_DIR=$PWD/cache EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat COMMIT)"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } > $OUT/device.log 2>&1
cat $OUT/device.log
for p in small_bf16 ragged_causal_bf16 ragged_bf16 f16_d128_causal f16_d128; do
  timeout 60 ./eqfuse run progs/$p.eqf --repeat 5 --outputs /tmp/o-$p >> $OUT/small.log 2>&1; echo "$p exit $?" >> $OUT/small.log
done
grep -E "exit|ok|MISMATCH|error|max error|attention" $OUT/small.log | grep -v "^  attention_bf16_k\|^  attention_f16_k" | head -60
mkdir -p /tmp/cg && ./eqfuse codegen progs/attention_grad.eqf -o /tmp/cg > /dev/null 2>&1
for f in /tmp/cg/attention_bwd*.cu; do echo "== $f"; nvcc -arch=sm_90 -cubin -o /tmp/x.cubin -Xptxas -v $f 2>&1 | grep -E "registers|spill"; done > $OUT/build.log 2>&1; cat $OUT/build.log
timeout 60 compute-sanitizer --tool memcheck ./eqfuse run progs/ragged_causal_bf16.eqf --repeat 1 --outputs /tmp/o-m > $OUT/memcheck.log 2>&1; echo "exit $?" >> $OUT/memcheck.log; tail -4 $OUT/memcheck.log
timeout 150 ./eqfuse run progs/attention_grad.eqf --repeat 50 --outputs /tmp/o-full > $OUT/run.log 2>&1; echo "exit $?" >> $OUT/run.log; cat $OUT/run.log
timeout 80 python3 sdpa_bwd.py > $OUT/sdpa.log 2>&1; echo "sdpa exit $?" >> $OUT/sdpa.log; grep -v Warn $OUT/sdpa.log | grep -v '^  "' | head -30
timeout 100 ./eqfuse run progs/full_causal.eqf --repeat 50 --outputs /tmp/o-fc > $OUT/run-causal.log 2>&1; echo "exit $?" >> $OUT/run-causal.log; cat $OUT/run-causal.log
