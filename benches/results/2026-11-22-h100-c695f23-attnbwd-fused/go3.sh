# Third device call: diagnostic builds of 76573a6 timed without the reference check
# (EQFUSE_DIAG_NOCHECK; outputs wrong by design where named no-*), two candidates checked and
# timed (eqfuse-coal: c695f23, eqfuse-norot: 359516d), Nsight Compute on the fused kernel.
G=.gpu-bwd
cd $G
export EQFUSE_CACHE_DIR=$PWD/cache EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
T0=$(date +%s)
el(){ echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commits: bwd $(cat COMMIT), coal $(cat COMMIT-coal), norot $(cat COMMIT-norot)"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } > $OUT/device.log 2>&1
cat $OUT/device.log
el diag
for v in v1 d-noatomic d-nodq d-noconvert v1; do echo "== $v"; EQFUSE_DIAG_NOCHECK=1 timeout 40 ./eqfuse-diag-$v run progs/attention_grad.eqf --repeat 30 --outputs /tmp/o-d 2>&1 | grep -E "attention_bwd|total|rror"; done > $OUT/diag.log 2>&1; cat $OUT/diag.log
el candidates
for c in coal norot; do echo "== $c"; timeout 60 ./eqfuse-$c run progs/attention_grad.eqf --repeat 30 --graph --outputs /tmp/o-$c; echo "exit $?"; done > $OUT/cand.log 2>&1; cat $OUT/cand.log
el coal small
{ for p in small_bf16 ragged_causal_bf16 ragged_bf16 ragged_causal_sqsk f16_d128_causal f16_d128; do
  timeout 40 ./eqfuse-coal run progs/$p.eqf --repeat 5 --graph --outputs /tmp/o-$p; echo "$p exit $?"; done
  for p in "progs/attention_grad.eqf --dim S=256 --dim B=1 --dim H=2" "progs/ragged_causal_sqsk.eqf"; do
  echo "== memcheck $p"; timeout 45 compute-sanitizer --tool memcheck ./eqfuse-coal run $p --repeat 2 --outputs /tmp/o-m; echo "exit $?"; done; } > $OUT/small.log 2>&1
grep -E "exit|MISMATCH|DIFFER|rror|attention_bwd|one CUDA graph|ERROR SUMMARY" $OUT/small.log | head -40
el ncu
EQFUSE_DIAG_NOCHECK=1 timeout 100 ncu --clock-control none --kernel-name regex:attention_bwd --launch-count 1 --set full -o $OUT/fused ./eqfuse-diag-v1 run progs/attention_grad.eqf --repeat 0 --outputs /tmp/o-n > /tmp/ncu-run.log 2>&1; echo "ncu exit $?"; tail -3 /tmp/ncu-run.log
ncu -i $OUT/fused.ncu-rep --page details > $OUT/ncu.log 2>&1; grep -E "Duration|Throughput|Registers|Achieved Occupancy|L2 Hit|Issue Slots|No Eligible|Stall" $OUT/ncu.log | head -30
el causal
for c in coal norot; do echo "== $c"; timeout 45 ./eqfuse-$c run progs/full_causal.eqf --repeat 30 --outputs /tmp/o-fc-$c; echo "exit $?"; done > $OUT/causal.log 2>&1; grep -E "==|attention_bwd|total|ok:|exit" $OUT/causal.log
el done
