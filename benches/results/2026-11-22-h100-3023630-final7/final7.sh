#!/usr/bin/env bash
# The seventh session's closing bench (H100), from the repository root with the files of
# final7-stage.sh in $G: the row stage and split-K latencies fitted to their probes against
# the committed profile (fit_latencies.py), every example benched with that profile, attention's
# backward beside PyTorch SDPA's (same call), softmax regression at issue 6's sizes (the
# planner's plan, the one-kernel plan with cuBLASLt priced out, PyTorch eager). Logs under $OUT.
set -uo pipefail
G="$(cd "${G:-.gpu-final7}" && pwd)"; OUT="${OUT:-/tmp/out}"; cd "$G"
export EQFUSE_CACHE_DIR="$G/cache" EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
E="$G/eqfuse"; W="on $(date -u +%Y-%m-%d) at $(cat COMMIT) (NVIDIA H100 80GB HBM3)"
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat COMMIT)"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; } > "$OUT/device.txt"
python3 - <<'PY'
import json
p = json.load(open("profile.json"))
p["templates"]["rowreduce"]["stage_latency_us"] = 0.0
p["templates"]["gemm"]["implementations"]["generated"]["split_latency_us"] = 0.0
p["templates"]["gemm"]["implementations"]["cublaslt"]["call_overhead_us"] = 1e6  # the split probes: one generated gemm
json.dump(p, open("zero.json", "w"), indent=2)
q = json.load(open("profile.json"))
q["templates"]["gemm"]["implementations"]["cublaslt"]["call_overhead_us"] = 1e6
json.dump(q, open("no-cublaslt.json", "w"), indent=2)
PY
{
  timeout 60 "$E" bench stage/*.eqf --device zero.json --json stage.json
  timeout 60 "$E" bench split/*.eqf --device zero.json --json split.json
  python3 fit_latencies.py stage.json split.json profile.json "$OUT/h100.json" "$W"
} > "$OUT/fit.log" 2>&1
echo "fit exit $?"; tail -1 "$OUT/fit.log"
timeout 400 "$E" bench --device "$OUT/h100.json" --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
echo "bench exit $?" >> "$OUT/bench.txt"; tail -3 "$OUT/bench.txt"
{
  echo "== attention_grad"; timeout 60 "$E" run examples/attention_grad.eqf --device "$OUT/h100.json" --repeat 30
  echo "== sdpa"; timeout 90 python3 sdpa_bwd.py
  for s in "64 128 10" "256 512 50" "1024 1024 100"; do set -- $s
    echo "== softmax_regression $1x$2x$3 (planner)"
    timeout 30 "$E" run examples/softmax_regression.eqf --device "$OUT/h100.json" --dim B=$1 --dim F=$2 --dim K=$3 --repeat 500
    echo "== softmax_regression $1x$2x$3 (one kernel: cuBLASLt priced out)"
    timeout 30 "$E" run examples/softmax_regression.eqf --device no-cublaslt.json --dim B=$1 --dim F=$2 --dim K=$3 --repeat 500
  done
  echo "== eager"; timeout 100 python3 softmax_regression_eager.py
} > "$OUT/runs.log" 2>&1
grep -E "^==|attention_bwd|rowreduce_f32|gemm_|total|bwd_ms|eager" "$OUT/runs.log" | head -60
