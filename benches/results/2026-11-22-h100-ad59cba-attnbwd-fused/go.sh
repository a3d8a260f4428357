# One device call: correctness at small sizes, memcheck, the full-size run, SDPA, bench, causal.
G=.gpu-bwd
cd $G
export EQFUSE_CACHE_DIR=$PWD/cache EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
T0=$(date +%s)
el(){ echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat COMMIT)"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; } > $OUT/device.log 2>&1
cat $OUT/device.log
for p in small_bf16 ragged_causal_bf16 ragged_bf16 ragged_causal_sqsk f16_d128_causal f16_d128; do
  el "small $p" >> $OUT/small.log
  timeout 40 ./eqfuse run progs/$p.eqf --repeat 5 --graph --outputs /tmp/o-$p >> $OUT/small.log 2>&1; echo "$p exit $?" >> $OUT/small.log
done
grep -E "exit|ok|MISMATCH|DIFFER|rror|attention_bwd|total" $OUT/small.log | head -60
el memcheck
{ for p in "progs/attention_grad.eqf --dim S=256 --dim B=1 --dim H=2" "progs/ragged_causal_sqsk.eqf"; do
  echo "== memcheck $p"; timeout 45 compute-sanitizer --tool memcheck ./eqfuse run $p --repeat 2 --outputs /tmp/o-m; echo "exit $?"; done; } > $OUT/memcheck.log 2>&1
grep -E "ERROR SUMMARY|exit|==" $OUT/memcheck.log
el full run
timeout 110 ./eqfuse run progs/attention_grad.eqf --repeat 30 --graph --outputs /tmp/o-full > $OUT/run.log 2>&1; echo "exit $?" >> $OUT/run.log; cat $OUT/run.log
el sdpa
timeout 60 python3 sdpa_bwd.py > $OUT/sdpa.log 2>&1; echo "sdpa exit $?" >> $OUT/sdpa.log; grep -v Warn $OUT/sdpa.log | grep -v '^  "' | head -30
el bench
timeout 100 ./eqfuse bench progs/attention_grad.eqf --repeat 10 --json $OUT/bench.json > $OUT/bench.log 2>&1; echo "exit $?" >> $OUT/bench.log; cat $OUT/bench.log
el causal
timeout 60 ./eqfuse run progs/full_causal.eqf --repeat 30 --outputs /tmp/o-fc > $OUT/run-causal.log 2>&1; echo "exit $?" >> $OUT/run-causal.log; cat $OUT/run-causal.log
el done
