#!/usr/bin/env bash
# The GPU tests, on the device machine: `bash .gpu/benches/gpu/tests.sh` after
# `benches/gpu/stage.sh tests [masks] cache` (benches/README.md). Steps (PARTS, default "tests
# memcheck racecheck"):
#   tests      tests/gpu.rs: every test case and example (dims capped), fused and unfused,
#              against the CPU reference with outputs poisoned first; reductions repeatable;
#              every gemm implementation; pipelined rows and CUDA-graph replay; strict plans
#              bit-identical to the unfused plan; attention kernels; then tests/masks.rs if
#              staged (masks-tests);
#   memcheck   compute-sanitizer memcheck of every case and example, fused and unfused;
#   racecheck  compute-sanitizer racecheck of the reduction cases (shared-memory combining).
# ONLY (a test-name filter, e.g. cases_and_examples) narrows the `tests` step. The GPU tests are
# #[ignore]d without a GPU, so every call passes --include-ignored. Writes device.txt,
# gpu-tests.log, masks-tests.log, memcheck.log, racecheck.log under $OUT.
set -uo pipefail
PARTS="${PARTS:-tests memcheck racecheck}"
source "$(dirname "$0")/device-env.sh"
if has tests; then
  step tests
  timeout "${TESTS_TIMEOUT:-300}" "$G/gpu-tests" ${ONLY:-} --include-ignored --test-threads=1 --nocapture \
    > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests exit $?" | tee -a "$OUT/gpu-tests.log"
  grep -E "^test |test result|MISMATCH|panicked" "$OUT/gpu-tests.log" | tail -20
  if [ -x "$G/masks-tests" ]; then
    timeout 120 "$G/masks-tests" --include-ignored --test-threads=1 --nocapture > "$OUT/masks-tests.log" 2>&1
    echo "masks tests exit $?" | tee -a "$OUT/masks-tests.log"; grep -E "test result" "$OUT/masks-tests.log"
  fi
fi
if has memcheck; then
  step memcheck
  timeout "${MEMCHECK_TIMEOUT:-250}" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$G/gpu-tests" cases_and_examples --include-ignored --test-threads=1 > "$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?" | tee -a "$OUT/memcheck.log"; grep -E "ERROR SUMMARY|test result" "$OUT/memcheck.log" | tail -3
fi
if has racecheck; then
  step racecheck
  timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$G/gpu-tests" reductions_are_deterministic --include-ignored --test-threads=1 > "$OUT/racecheck.log" 2>&1
  echo "racecheck exit $?" | tee -a "$OUT/racecheck.log"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|test result" "$OUT/racecheck.log" | tail -3
fi
step done
