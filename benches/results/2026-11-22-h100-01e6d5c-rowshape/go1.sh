#!/usr/bin/env bash
# Session 7 call 1: the bf16 row kernel after cuBLASLt (ncu), delta with 16-byte reads, small examples under 0.52 us stage latency, generated gemm time against K.
set -uo pipefail
G="$(cd .gpu-me && pwd)"; OUT="${OUT:-/tmp/out}"; cd "$G"
export EQFUSE_CACHE_DIR="$G/cache" EQFUSE_REQUIRE_GPU=1 EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
E="$G/eqfuse"
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat COMMIT) + uncommitted choose_vec change (row stores do not narrow lanes)"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; } > $OUT/device.txt
{
echo "== sr bf16 4096x1024x128 run"; timeout 60 $E run softmax_regression_bf16.eqf --repeat 50 --graph
echo "== sr bf16 ncu"; timeout 90 ncu --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active $E run softmax_regression_bf16.eqf --repeat 3 2>&1 | grep -E "rowreduce|gemm|sm90|sm80|gpu__time|Kernel|cutlass|nvjet|xmma|grid|block" | head -60
echo "== attention_grad"; timeout 90 $E run examples/attention_grad.eqf --repeat 20
} > $OUT/runs.log 2>&1
echo "runs done"
timeout 150 $E bench examples/softmax_small.eqf examples/softmax_regression.eqf examples/matmul_softmax.eqf examples/layernorm.eqf examples/composites.eqf --device h100-052.json --json $OUT/bench052.json > $OUT/bench052.txt 2>&1; echo "bench exit $?" >> $OUT/bench052.txt
{
for F in 64 256 1024 4096 16384; do echo "== sr f32 F=$F"; timeout 30 $E run examples/softmax_regression.eqf --dim F=$F --repeat 200 | grep -E "gemm|total|ok|MISMATCH"; done
for F in 64 256 1024 4096 16384; do echo "== sr f32 unfused F=$F"; timeout 30 $E run examples/softmax_regression.eqf --no-fusion --dim F=$F --repeat 200 | grep -E "gemm|total"; done
} > $OUT/gemmk.log 2>&1
tail -3 $OUT/bench052.txt; grep -E "==|rowreduce|gemm|attention|total" $OUT/runs.log | head -40
