#!/usr/bin/env bash
# The GPU differential run, on the device machine: `bash .gpu/benches/gpu/difftest.sh` after
# `benches/gpu/stage.sh diff tests` (benches/README.md): `gpu-diff` is
# tests/gpu_differential.rs, `gpu-tests` tests/gpu.rs, both built in release.
#   1. the NVRTC cache filled for the random programs in parallel shards (CPU only);
#   2. the GPU differential run over CASES random programs for each of SEEDS (one process per
#      seed), and the saved GPU cases (tests/cases/diff_gpu);
#   3. compute-sanitizer memcheck over the first 100 of them;
#   4. the GPU tests (tests/gpu.rs), the strict one included: every case and example, strict
#      plan bit-identical to the strict unfused plan.
# SEEDS (default "1 2") and CASES (default 500) random programs per seed, one process per seed
# on the one GPU; a failing program is saved as a case and the run goes on.
# PARTS (default "random memcheck strict") picks the steps: random (prefill, the random programs
# and the saved cases), saved (the saved cases alone), memcheck (the first 100 programs of the
# first seed), strict (tests/gpu.rs, every case and example), examples-memcheck (tests/gpu.rs
# under compute-sanitizer memcheck), check (`eqfuse run` of three gradient examples at full
# size). Writes difftest.log (the summary), logs.tgz (every other log) and cases.tgz (the saved
# cases, new ones included) under $OUT.
set -uo pipefail
PARTS="${PARTS:-random memcheck strict}"
source "$(dirname "$0")/device-env.sh"
cp "$OUT/device.txt" "$OUT/difftest.log"
SEEDS="${SEEDS:-1 2}" CASES="${CASES:-500}"
first_seed="${SEEDS%% *}"
if has random; then
t0=$(date +%s)
for s in $SEEDS; do
  for k in $(seq 0 7); do
    EQFUSE_GPU_DIFF_SEED=$s EQFUSE_GPU_DIFF_CASES=$CASES EQFUSE_PREFILL_SHARD=$k/8 timeout 200 \
      "$G/gpu-diff" random_programs --include-ignored --test-threads=1 > /dev/null 2>&1 &
  done
done
wait
echo "prefill: $(( $(date +%s) - t0 )) s, $(ls "$G/cache" | wc -l) cached kernels" | tee -a "$OUT/difftest.log"
for s in $SEEDS; do
  EQFUSE_GPU_DIFF_SEED=$s EQFUSE_GPU_DIFF_CASES=$CASES timeout 330 "$G/gpu-diff" random_programs \
    --include-ignored --test-threads=1 --nocapture > "$OUT/gpu-diff-seed$s.log" 2>&1 &
done
wait
for s in $SEEDS; do
  echo "seed $s:" | tee -a "$OUT/difftest.log"
  grep -E "random programs:|FAILED|panicked" "$OUT/gpu-diff-seed$s.log" | cut -c1-600 | head -20 | tee -a "$OUT/difftest.log"
done
timeout 120 "$G/gpu-diff" every_saved --include-ignored --test-threads=1 --nocapture > "$OUT/gpu-diff-cases.log" 2>&1
echo "saved cases exit $?" | tee -a "$OUT/difftest.log"; grep -E "saved GPU cases:|panicked" "$OUT/gpu-diff-cases.log" | head -5
fi
if has saved; then
timeout 150 "$G/gpu-diff" every_saved --include-ignored --test-threads=1 --nocapture > "$OUT/gpu-diff-cases.log" 2>&1
echo "saved cases exit $?" | tee -a "$OUT/difftest.log"; grep -E "saved GPU cases:|fail" "$OUT/gpu-diff-cases.log" | cut -c1-400 | head -8 | tee -a "$OUT/difftest.log"
fi
if has strict; then
timeout 200 "$G/gpu-tests" --include-ignored --test-threads=1 --nocapture > "$OUT/strict.log" 2>&1
echo "gpu tests (strict included) exit $?" | tee -a "$OUT/difftest.log"; grep -E "strict:|panicked|not run|test result|MISMATCH|ERROR" "$OUT/strict.log" | head -30
fi
if has check; then
# `eqfuse run` (the release binary staged as $G/eqfuse) of the examples whose check needs the
# f32-evaluation allowance or leaves out elements near a decision.
for x in transformer_block_grad mlp_relu_grad mlp_relu_dropout_grad; do
  timeout 120 "$G/eqfuse" run "examples/$x.eqf" --repeat 3 > "$OUT/run-$x.log" 2>&1
  echo "run $x exit $?" | tee -a "$OUT/difftest.log"
  sed -n '/outputs against the CPU reference/,$p' "$OUT/run-$x.log" | cut -c1-260 | tee -a "$OUT/difftest.log"
done
fi
if has memcheck; then
EQFUSE_GPU_DIFF_SEED=$first_seed EQFUSE_GPU_DIFF_CASES=100 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$G/gpu-diff" random_programs --include-ignored --test-threads=1 --nocapture > "$OUT/memcheck-diff.log" 2>&1
echo "memcheck (100 programs) exit $?" | tee -a "$OUT/difftest.log"; grep -E "ERROR SUMMARY|programs" "$OUT/memcheck-diff.log"
fi
if has examples-memcheck; then
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$G/gpu-tests" --include-ignored --test-threads=1 --nocapture \
  > "$OUT/memcheck-tests.log" 2>&1
echo "memcheck of the GPU tests (cases and examples) exit $?" | tee -a "$OUT/difftest.log"
grep -E "ERROR SUMMARY|test result" "$OUT/memcheck-tests.log" | tail -3 | tee -a "$OUT/difftest.log"
fi
tar czf "$OUT/cases.tgz" tests/cases/diff_gpu; tar tzf "$OUT/cases.tgz" | wc -l
# At most 8 files come back from the device: every log but difftest.log goes into logs.tgz.
(cd "$OUT" && tar czf logs.tgz $(ls *.log | grep -v '^difftest.log$') && ls *.log | grep -v '^difftest.log$' | xargs rm -f)
