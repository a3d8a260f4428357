G=.gpu-attn
cd $G
export EQFUSE_CACHE_DIR=/tmp/c EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH EQFUSE_REQUIRE_GPU=1
T0=$(date +%s)
el(){ echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
{ date -u +"date: %Y-%m-%d %H:%M UTC"; cat COMMITS; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } > $OUT/device2.log 2>&1
cat $OUT/device2.log
{ for c in a b; do ./eqfuse-$c codegen progs/attention_grad.eqf -o /tmp/cg-$c >/dev/null 2>&1
  for f in /tmp/cg-$c/attention_bwd*.cu; do echo "== $c $(basename $f)"; /usr/local/cuda/bin/nvcc -cubin -arch=sm_90 -Xptxas -v -o /tmp/x.cubin $f 2>&1 | grep -E "registers|spill"; done; done; } > $OUT/ptxas2.log 2>&1; cat $OUT/ptxas2.log
el small
{ for c in a b; do for p in ragged_causal_long ragged_causal_sqsk f16_d40 f16_d128_causal; do
  echo "== $c $p"; timeout 30 ./eqfuse-$c run progs/$p.eqf --repeat 3 --outputs /tmp/o-$p; echo "$c $p exit $?"; done; done
  echo "== memcheck b"; timeout 40 compute-sanitizer --tool memcheck ./eqfuse-b run progs/ragged_causal_long.eqf --repeat 2 --outputs /tmp/o-m; echo "exit $?"; } > $OUT/small2.log 2>&1
grep -E "exit|MISMATCH|DIFFER|rror|ERROR SUMMARY" $OUT/small2.log | head -30
el full
{ for c in base a b c d; do echo "== $c"; timeout 60 ./eqfuse-$c run progs/attention_grad.eqf --repeat 30 --inputs /tmp/in --outputs /tmp/o-$c; echo "exit $?"; done; } > $OUT/full2.log 2>&1
grep -E "==|rowreduce|attention_bwd|total|ok:|exit" $OUT/full2.log
el causal
{ for c in a b c; do echo "== $c"; timeout 60 ./eqfuse-$c run progs/full_causal.eqf --repeat 30 --inputs /tmp/inc --outputs /tmp/oc-$c; echo "exit $?"; done; } > $OUT/causal2.log 2>&1
grep -E "==|rowreduce|attention_bwd|total|ok:|exit" $OUT/causal2.log
el done
