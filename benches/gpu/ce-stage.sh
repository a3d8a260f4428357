#!/usr/bin/env bash
# Stages helper ce's device run (row kernels and bias+gelu+dropout at copy bandwidth) into DEST
# (default /work/main/.gpu-ce): the release `eqfuse`, the GPU test binary, the examples, graphs
# for the PyTorch baselines, and the kernel-variant harness with its variants (VARIANTS, a folder
# of edited generated kernels, optional). Run from the repository after `cargo build --release`
# and `cargo test --release --test gpu --no-run`.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${DEST:-/work/main/.gpu-ce}"
tests="$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)"
rm -rf "$DEST" && mkdir -p "$DEST/graphs" "$DEST/examples"
cp "$tests" "$DEST/gpu-tests"
cp target/release/eqfuse benches/gpu/ce.sh benches/gpu/ce_variants.py benches/torch_baselines.py "$DEST/"
cp examples/*.eqf "$DEST/examples/"
for n in cross_entropy cross_entropy_grad bias_gelu_dropout; do
  target/release/eqfuse export "examples/$n.eqf" > "$DEST/graphs/$n.json"
done
if [ -n "${VARIANTS:-}" ]; then mkdir -p "$DEST/v" && cp "$VARIANTS"/*.cu "$DEST/v/"; fi
git rev-parse --short HEAD > "$DEST/COMMIT"
du -sh "$DEST"
