#!/usr/bin/env bash
# Session 7 call 3: calibrate; the H100 profile with its stage latency and the split-K latency
# (split probes against the committed tiles); runs of the bf16 row kernel and attention's delta;
# bench of every example with that profile.
set -uo pipefail
G="$(cd .gpu-me && pwd)"; OUT="${OUT:-/tmp/out}"; cd "$G"
export EQFUSE_CACHE_DIR="$G/cache" EQFUSE_REQUIRE_GPU=1 EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
E="$G/eqfuse"
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat COMMIT)"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; } > $OUT/device.txt
timeout 200 $E calibrate -o $OUT/calibrated.json > $OUT/calibrate.log 2>&1; echo "calibrate exit $?" >> $OUT/calibrate.log
python3 merge_profile.py h100.json $OUT/calibrated.json p-a.json "on $(date -u +%Y-%m-%d) at $(cat COMMIT) (NVIDIA H100 80GB HBM3)" templates.rowreduce.stage_latency_us
python3 - <<'PY'
import json; p=json.load(open('p-a.json')); p['templates']['gemm']['implementations']['generated']['split_latency_us']=0.0; json.dump(p,open('p-a.json','w'),indent=2)
PY
{
timeout 60 $E bench split/*.eqf --device p-a.json --json split-bench.json
python3 split_latency.py split-bench.json p-a.json $OUT/h100.json "on $(date -u +%Y-%m-%d) at $(cat COMMIT) (NVIDIA H100 80GB HBM3)"
} > $OUT/split.log 2>&1
{
echo "== sr bf16 4096x1024x128"; timeout 60 $E run softmax_regression_bf16.eqf --device $OUT/h100.json --repeat 50
echo "== attention_grad"; timeout 90 $E run examples/attention_grad.eqf --device $OUT/h100.json --repeat 20
} > $OUT/runs.log 2>&1
cd "$G" && timeout 330 $E bench --device $OUT/h100.json --json $OUT/bench.json > $OUT/bench.txt 2>&1; echo "bench exit $?" >> $OUT/bench.txt
grep -E "stage|split|exit" $OUT/calibrate.log | head; cat $OUT/split.log | tail -5; grep -E "==|rowreduce|attention|total" $OUT/runs.log; tail -4 $OUT/bench.txt
