# call 1: variants of attention_bwd_dqkv (run from the main checkout's .gpu-bwd)
cd .gpu-bwd
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH EQFUSE_REQUIRE_GPU=1 EQFUSE_CACHE_DIR=$PWD/cache
T0=$(date +%s); el(){ echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } > $OUT/device.log 2>&1
run(){ v=$1; p=$2; echo "== $v $p"; timeout 90 ./eqfuse-$v run progs/$p.eqf --repeat 20 --inputs /tmp/in-$p --outputs /tmp/o-$v-$p; echo "exit $?"; }
el full
{ for v in base A C1 C2 L3 L3C2 D L3D base; do run $v attention_grad; el; done; } > $OUT/full.log 2>&1
el causal
{ for v in base A L3 L3D; do run $v full_causal; el; done; } > $OUT/causal.log 2>&1
el d128
{ for v in base D; do run $v f16_d128_full; el; done; } > $OUT/d128.log 2>&1
el small
{ for v in D L3D; do for p in small_bf16 ragged_bf16 ragged_causal_long ragged_causal_sqsk f16_d40 f16_d128_causal; do timeout 40 ./eqfuse-$v run progs/$p.eqf --repeat 3 --outputs /tmp/s-$v-$p >/tmp/s.log 2>&1; echo "$v $p exit $? $(grep -cE ' ok:' /tmp/s.log) ok, $(grep -ciE 'mismatch|fail|error:' /tmp/s.log) bad"; grep -E "attention_bwd" /tmp/s.log; done; done; } > $OUT/small.log 2>&1
el done
for f in full causal d128; do grep -E "^==|attention_bwd|exit|MISMATCH|FAIL" $OUT/$f.log; done
cat $OUT/small.log | grep exit
