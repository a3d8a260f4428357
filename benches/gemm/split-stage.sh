#!/usr/bin/env bash
# Stages benches/gemm/split.sh's files into DEST (default /work/main/.gpu-split): the release
# binary, the GPU test binary, the examples, two split-K programs and the eager baseline.
set -euo pipefail
cd "$(dirname "$0")/../.."
tests="$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)"
DEST="${DEST:-/work/main/.gpu-split}"
rm -rf "$DEST" && mkdir -p "$DEST/progs"
cp "$tests" "$DEST/gpu-tests"
cp -r examples "$DEST/examples"
cp target/release/eqfuse benches/gemm/split.sh benches/torch_baselines.py benches/gemm/softmax_regression_eager.py "$DEST/"
printf 'input a: f32[3, 40, 300]\ninput b: f32[300, 20]\ninput c: f32[20]\ny = log_softmax(a @ b + c, -1)\noutput y\n' > "$DEST/progs/split_batched.eqf"
git rev-parse --short HEAD > "$DEST/COMMIT"
du -sh "$DEST"
