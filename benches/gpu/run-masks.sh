#!/usr/bin/env bash
# Issue 5's device run (1-bit masks), from the repository root with the files staged by
# benches/gpu/stage-masks.sh in $G (default .gpu-masks): tests/masks.rs on the GPU, then
# `eqfuse run` of the ReLU/dropout MLP example at a medium and at its declared size (packed
# mask, every output checked against the CPU reference, kernels timed), then tests/gpu.rs's
# cases and examples. Logs under $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/eqfuse-out}"
G="${G:-.gpu-masks}"
mkdir -p "$OUT"
export EQFUSE_CACHE_DIR="$G/cache" EQFUSE_REQUIRE_GPU=1
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "commit: $(cat $G/COMMIT)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
} > "$OUT/masks.log" 2>&1
# The tests read examples/ from the working directory: the staged copy holds this branch's.
(cd "$G" && EQFUSE_CACHE_DIR=cache timeout 60 ./masks-tests --include-ignored --test-threads=1 --nocapture) >> "$OUT/masks.log" 2>&1
echo "masks tests exit $?" >> "$OUT/masks.log"
ex="$G/examples/mlp_relu_dropout_grad.eqf"
timeout 30 "$G/eqfuse" run "$ex" --dim B=1024 --dim D=512 --dim H=2048 --repeat 10 --outputs /tmp/o1 > "$OUT/run-medium.log" 2>&1
echo "run medium exit $?" >> "$OUT/run-medium.log"
for seed in 0 1; do
  timeout 60 "$G/eqfuse" run "$ex" --seed $seed --repeat 10 --outputs /tmp/o2 >> "$OUT/run-full.log" 2>&1
  echo "run full seed $seed exit $?" >> "$OUT/run-full.log"
done
# Control: the ReLU MLP without dropout at its declared size (no packed mask: the backward reads
# the activation); a mask decided by the sign of a product near 0 can differ from the f64
# reference's whether or not it is packed.
timeout 60 "$G/eqfuse" run "$G/examples/mlp_relu_grad.eqf" --repeat 10 --outputs /tmp/o3 >> "$OUT/run-full.log" 2>&1
echo "run mlp_relu_grad exit $?" >> "$OUT/run-full.log"
"$G/eqfuse" optimize "$ex" --format json > "$OUT/plan-full.json" 2>&1
if [ "${GPU_TESTS:-1}" = 1 ]; then
  timeout 50 "$G/gpu-tests" cases_and_examples --include-ignored --test-threads=1 --nocapture > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests exit $?" >> "$OUT/gpu-tests.log"
fi
for f in "$OUT"/*.log; do tail -n 3 "$f"; done
