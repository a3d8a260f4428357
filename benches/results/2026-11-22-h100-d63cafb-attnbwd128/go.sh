# attnbwd128 device call 1: registers (ptxas), correctness of the new kernel on small ragged /
# causal / f16 / d40 / d128 programs and memcheck, then full-size timings of base, k128, new, w4.
G=.gpu-attn
cd $G
export EQFUSE_CACHE_DIR=/tmp/c EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH EQFUSE_REQUIRE_GPU=1
T0=$(date +%s)
el(){ echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
{ date -u +"date: %Y-%m-%d %H:%M UTC"; cat COMMITS; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } > $OUT/device.log 2>&1
cat $OUT/device.log
el ptxas
{ for p in attention_grad f16_d128_full full_causal; do ./eqfuse-new codegen progs/$p.eqf -o /tmp/cg-$p >/dev/null 2>&1
  for f in /tmp/cg-$p/attention_bwd*.cu; do echo "== $p $(basename $f)"; /usr/local/cuda/bin/nvcc -cubin -arch=sm_90 -Xptxas -v -o /tmp/x.cubin $f 2>&1 | grep -E "registers|spill"; done; done; } > $OUT/ptxas.log 2>&1; cat $OUT/ptxas.log
el small
{ for p in small_bf16 ragged_causal_bf16 ragged_bf16 ragged_causal_sqsk f16_d128_causal f16_d128 ragged_causal_long f16_d40; do
  echo "== $p"; timeout 40 ./eqfuse-new run progs/$p.eqf --repeat 5 --graph --outputs /tmp/o-$p; echo "$p exit $?"; done
  for p in "progs/attention_grad.eqf --dim S=256 --dim B=1 --dim H=2" progs/ragged_causal_sqsk.eqf progs/ragged_causal_long.eqf progs/f16_d40.eqf; do
  echo "== memcheck $p"; timeout 45 compute-sanitizer --tool memcheck ./eqfuse-new run $p --repeat 2 --outputs /tmp/o-m; echo "exit $?"; done; } > $OUT/small.log 2>&1
grep -E "exit|MISMATCH|DIFFER|rror|attention_bwd|ERROR SUMMARY" $OUT/small.log | head -50
el full
{ for c in base k128 new w4; do echo "== $c"; timeout 70 ./eqfuse-$c run progs/attention_grad.eqf --repeat 30 --graph --inputs /tmp/in --outputs /tmp/o-$c; echo "exit $?"; done; } > $OUT/full.log 2>&1
grep -E "==|rowreduce|attention_bwd|total|ok:|exit" $OUT/full.log
el causal
{ for c in base new; do echo "== $c"; timeout 60 ./eqfuse-$c run progs/full_causal.eqf --repeat 30 --inputs /tmp/inc --outputs /tmp/oc-$c; echo "exit $?"; done; } > $OUT/causal.log 2>&1
grep -E "==|rowreduce|attention_bwd|total|ok:|exit" $OUT/causal.log
el d128
{ for c in base new; do echo "== $c"; timeout 60 ./eqfuse-$c run progs/f16_d128_full.eqf --repeat 30 --inputs /tmp/ind --outputs /tmp/od-$c; echo "exit $?"; done; } > $OUT/d128.log 2>&1
grep -E "==|rowreduce|attention_bwd|total|ok:|exit" $OUT/d128.log
el done
