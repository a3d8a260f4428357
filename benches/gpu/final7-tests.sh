#!/usr/bin/env bash
# The seventh session's closing GPU tests (H100), files of final7-stage.sh in $G: every GPU
# test, then compute-sanitizer memcheck of every case and example (fused and unfused). Logs
# under $OUT.
set -uo pipefail
G="$(cd "${G:-.gpu-final7}" && pwd)"; OUT="${OUT:-/tmp/out}"; cd "$G"
export EQFUSE_CACHE_DIR="$G/cache" EQFUSE_REQUIRE_GPU=1
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat COMMIT)"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; } > "$OUT/device-tests.txt"
timeout 300 "$G/gpu-tests" --include-ignored --test-threads=1 --nocapture > "$OUT/gpu-tests.log" 2>&1
echo "tests exit $?" >> "$OUT/gpu-tests.log"; grep -E "^test |test result|exit" "$OUT/gpu-tests.log" | tail -14
EQFUSE_CACHE_DIR="$G/mc-cache" timeout 250 compute-sanitizer --tool memcheck "$G/gpu-tests" cases_and_examples --include-ignored --test-threads=1 > "$OUT/memcheck.log" 2>&1
echo "memcheck exit $?" >> "$OUT/memcheck.log"; grep -E "ERROR SUMMARY|test result|panicked|exit" "$OUT/memcheck.log" | tail -5
# softmax_small again, three separate benches (its unfused plan's small kernels are timed
# with the host's launches in the gaps when the host falls behind).
for i in 1 2 3; do timeout 60 "$G/eqfuse" bench examples/softmax_small.eqf --device profile.json --json "$OUT/softmax_small_$i.json" > /dev/null 2>&1; done
python3 - "$OUT" <<'PY'
import json, sys
for i in (1, 2, 3):
    p = json.load(open(f"{sys.argv[1]}/softmax_small_{i}.json"))["programs"][0]
    print(f"softmax_small run {i}: fused {p['fused']['measured_us']:.1f} us, unfused {p['unfused']['measured_us']:.1f} us, "
          f"speedup {p['speedup_measured']:.2f}x against {p['speedup_predicted']:.2f}x predicted")
PY
