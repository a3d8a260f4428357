# call 2: the branch's kernel (fin) against base; d128 load form (C2o); correctness
cd .gpu-bwd
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH EQFUSE_REQUIRE_GPU=1 EQFUSE_CACHE_DIR=$PWD/cache
T0=$(date +%s); el(){ echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } > $OUT/device2.log 2>&1
run(){ v=$1; p=$2; echo "== $v $p"; timeout 90 ./eqfuse-$v run progs/$p.eqf --repeat 20 --inputs /tmp/in-$p --outputs /tmp/o-$v-$p; echo "exit $?"; }
el full
{ for v in base A fin; do run $v attention_grad; el; done; } > $OUT/full2.log 2>&1
el d128
{ for v in base fin C2o; do run $v f16_d128_full; el; done; } > $OUT/d128_2.log 2>&1
el causal
{ for v in base fin; do run $v full_causal; el; done; } > $OUT/causal2.log 2>&1
el small
{ for p in ragged_causal_long ragged_causal_sqsk f16_d40; do timeout 40 ./eqfuse-fin run progs/$p.eqf --repeat 3 --outputs /tmp/s-$p >/tmp/s.log 2>&1; echo "fin $p exit $? $(grep -cE ' ok:' /tmp/s.log) ok, $(grep -ciE 'mismatch|fail|error:' /tmp/s.log) bad"; grep -E "attention_bwd" /tmp/s.log; done; } > $OUT/small2.log 2>&1
el gpu-test
cd ..; timeout 110 .gpu-bwd/gpu-test cases_and_examples --nocapture > $OUT/gputest.log 2>&1; echo "gpu-test exit $?" >> $OUT/gputest.log; cd .gpu-bwd
el done
for f in full2 d128_2 causal2; do grep -E "^==|attention_bwd|exit|MISMATCH" $OUT/$f.log; done
cat $OUT/small2.log; tail -5 $OUT/gputest.log
