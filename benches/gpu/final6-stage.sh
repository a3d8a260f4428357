#!/usr/bin/env bash
# Stages benches/gpu/final6.sh's files into DEST (default /work/main/.gpu-final6).
set -euo pipefail
cd "$(dirname "$0")/../.."
tests="$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)"
DEST="${DEST:-/work/main/.gpu-final6}"
rm -rf "$DEST" && mkdir -p "$DEST"
cp "$tests" "$DEST/gpu-tests"
cp -r examples "$DEST/examples"
cp target/release/eqfuse benches/gpu/final6.sh benches/gpu/merge_profile.py benches/torch_baselines.py \
  benches/gemm/softmax_regression_eager.py "$DEST/"
cp profiles/h100.json "$DEST/profile.json"
git show 9ae404f:profiles/h100.json > "$DEST/profile-old.json"
git rev-parse --short HEAD > "$DEST/COMMIT"
du -sh "$DEST"
