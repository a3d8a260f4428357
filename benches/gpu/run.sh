#!/usr/bin/env bash
# One GPU session of issue 4's checks and measurements, run on the device machine from the
# repository root with the staged binaries in .gpu/ (see benches/gpu/stage.sh):
#   1. the GPU tests (every case and example, fused and unfused, against the CPU reference);
#   2. the large-size bench with calibration (fused against unfused, measured against predicted),
#      and (`persistent`) the row-reduction programs again with a persistent grid (one wave of
#      resident blocks) instead of one block per row group;
#   3. compute-sanitizer: memcheck on every test case and example, racecheck on the reduction
#      cases (shared-memory combining);
#   4. PyTorch eager and torch.compile on the same programs and GPU (TORCH_GRAPHS: which);
#   5. (`cli`) `eqfuse run --graph` of the gradient examples at full size, from the command line.
# Writes at most 8 files under $OUT. Stages have their own time limits so that one slow stage
# cannot starve the rest; STAGES (default "tests bench persistent memcheck torch") picks stages.
set -uo pipefail
OUT="${OUT:-/tmp/eqfuse-out}"
mkdir -p "$OUT/bench"
G="${G:-.gpu}"
STAGES="${STAGES:-tests bench persistent memcheck torch}"
export EQFUSE_CACHE_DIR="$G/cache" EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
lib="$(ls /usr/local/cuda/lib64/libnvrtc.so.13 2>/dev/null || find / -xdev -name libnvrtc.so.13 2>/dev/null | head -1)"
if [ -n "$lib" ]; then
  export EQFUSE_NVRTC_DIR="$(dirname "$lib")"
  export LD_LIBRARY_PATH="$EQFUSE_NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "commit: $(cat $G/COMMIT 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv
  echo "nvrtc: ${lib:-not found}"
} > "$OUT/bench.log" 2>&1
cat "$OUT/bench.log"
for s in $STAGES; do
  echo "== stage $s"
  case "$s" in
    tests) timeout 120 "$G/gpu-tests" --include-ignored --test-threads=1 --nocapture > "$OUT/gpu-tests.log" 2>&1
           echo "tests exit $?" | tee -a "$OUT/gpu-tests.log"; tail -5 "$OUT/gpu-tests.log" ;;
    bench) timeout "${BENCH_TIMEOUT:-200}" "$G/gpu-bench" --out "$OUT/bench" ${BENCH_ONLY:+--only $BENCH_ONLY} >> "$OUT/bench.log" 2>&1
           echo "bench exit $?" | tee -a "$OUT/bench.log"; tail -45 "$OUT/bench.log" ;;
    persistent) timeout "${PERSISTENT_TIMEOUT:-100}" "$G/gpu-bench" --persistent --out /tmp/persistent \
             --only "${PERSISTENT_ONLY:-layernorm,layernorm_4096x1024,rmsnorm_bf16,softmax,softmax_small,cross_entropy}" > /tmp/persistent.log 2>&1
           echo "persistent exit $?"; cp /tmp/persistent/gpu-bench.md "$OUT/bench/gpu-bench-persistent.md"
           cat /tmp/persistent/gpu-bench.md ;;
    memcheck) timeout "${MEMCHECK_TIMEOUT:-150}" compute-sanitizer --tool memcheck --error-exitcode 9 \
             "$G/gpu-tests" --include-ignored --test-threads=1 --nocapture > "$OUT/memcheck.log" 2>&1
           echo "memcheck exit $?" | tee -a "$OUT/memcheck.log"; grep -E "ERROR SUMMARY|test result|^ran" "$OUT/memcheck.log"
           [ "${RACECHECK:-1}" = 1 ] && timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 \
             "$G/gpu-tests" reductions_are_deterministic --include-ignored --test-threads=1 --nocapture >> "$OUT/memcheck.log" 2>&1
           echo "racecheck exit $?" | tee -a "$OUT/memcheck.log"; tail -3 "$OUT/memcheck.log" ;;
    torch) graphs="${TORCH_GRAPHS:-$(ls "$G"/graphs/*.json)}"
           timeout "${TORCH_TIMEOUT:-300}" python3 "$G/torch_baselines.py" --out "$OUT/bench/torch.json" $graphs > "$OUT/torch.log" 2>&1
           echo "torch exit $?" | tee -a "$OUT/torch.log"; grep '^{"graph"' "$OUT/torch.log" ;;
    cli) for p in cross_entropy_grad layernorm_grad; do
           timeout 90 "$G/eqfuse" run "$G/examples/$p.eqf" --graph --repeat 10 --outputs /tmp/cli-$p 2>&1 | tee -a "$OUT/cli.log"
           echo "cli $p exit ${PIPESTATUS[0]}" | tee -a "$OUT/cli.log"
         done ;;
  esac
done
