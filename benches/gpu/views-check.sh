#!/usr/bin/env bash
# The second views call: is transformer_block_grad's mismatch at seed 0 the plan's, or the
# program's conditioning under unscaled N(0, 1) weights? Runs it (1) with weights scaled by
# 1/sqrt(fan-in) (folder tbg-scaled, written by hand from the seed-0 inputs), and (2) planned
# with --no-fusion at seed 0, each checked against the CPU reference. Staged folder G as views.sh.
set -uo pipefail
OUT="${OUT:-/tmp/eqfuse-out}"
G="${G:-.gpu-views}"
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export EQFUSE_REQUIRE_GPU=1 EQFUSE_CACHE_DIR="$G/cache"
mkdir -p "$OUT"
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "commit: $(cat $G/COMMIT)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "== transformer_block_grad, weights scaled by 1/sqrt(fan-in)"
  timeout 60 "$G/eqfuse" run "$G/examples/transformer_block_grad.eqf" --inputs "$G/tbg-scaled" --outputs /tmp/o1 --repeat 5 2>&1
  echo "scaled exit $?"
  echo "== transformer_block_grad --no-fusion, seed 0"
  timeout 100 "$G/eqfuse" run "$G/examples/transformer_block_grad.eqf" --no-fusion --outputs /tmp/o2 --repeat 5 2>&1
  echo "no-fusion exit $?"
} 2>&1 | tee "$OUT/views-check.log"
