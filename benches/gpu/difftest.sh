#!/usr/bin/env bash
# Issue 9's GPU session, run on the device machine from the repository root with the binaries
# staged in G (default .gpu-diff): `gpu-diff` is tests/gpu_differential.rs, `gpu-tests` is
# tests/gpu.rs, both built in release.
#   1. the NVRTC cache filled for the random programs in 16 parallel shards (CPU only);
#   2. the GPU differential run over EQFUSE_GPU_DIFF_CASES (default 1000) random programs, and
#      the saved GPU cases;
#   3. compute-sanitizer memcheck over the first 100 of them;
#   4. the GPU tests (tests/gpu.rs), the strict one included: every case and example, strict
#      plan bit-identical to the strict unfused plan.
# Logs go to $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/eqfuse-out}"
G="${G:-.gpu-diff}"
mkdir -p "$OUT"
export EQFUSE_CACHE_DIR="$G/cache" EQFUSE_REQUIRE_GPU=1
lib="$(ls /usr/local/cuda/lib64/libnvrtc.so.13 2>/dev/null || find / -xdev -name libnvrtc.so.13 2>/dev/null | head -1)"
export EQFUSE_NVRTC_DIR="$(dirname "$lib")" LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "commit: $(cat $G/COMMIT 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
} | tee "$OUT/difftest.log"
t0=$(date +%s)
for k in $(seq 0 15); do
  EQFUSE_PREFILL_SHARD=$k/16 timeout 200 "$G/gpu-diff" random_programs --test-threads=1 > /dev/null 2>&1 &
done
wait
echo "prefill: $(( $(date +%s) - t0 )) s, $(ls "$G/cache" | wc -l) cached kernels" | tee -a "$OUT/difftest.log"
timeout 240 "$G/gpu-diff" --test-threads=1 --nocapture > "$OUT/gpu-diff.log" 2>&1
echo "gpu differential exit $?" | tee -a "$OUT/difftest.log"; grep -E "programs|failed|FAILED|panicked" "$OUT/gpu-diff.log" | head -20
EQFUSE_GPU_DIFF_CASES=100 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$G/gpu-diff" random_programs --test-threads=1 --nocapture > "$OUT/memcheck-diff.log" 2>&1
echo "memcheck (100 programs) exit $?" | tee -a "$OUT/difftest.log"; grep -E "ERROR SUMMARY|programs" "$OUT/memcheck-diff.log"
timeout 200 "$G/gpu-tests" --test-threads=1 --nocapture > "$OUT/strict.log" 2>&1
echo "gpu tests (strict included) exit $?" | tee -a "$OUT/difftest.log"; grep -E "strict:|panicked|not run|test result|MISMATCH|ERROR" "$OUT/strict.log" | head -30
tar czf "$OUT/cases.tgz" tests/cases/diff_gpu; tar tzf "$OUT/cases.tgz" | wc -l
