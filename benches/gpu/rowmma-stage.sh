#!/usr/bin/env bash
# Stages benches/gpu/rowmma.sh into DEST (default /work/main/.gpu-rowmma): this commit's release
# `eqfuse` (and `eqfuse-base`, built beforehand from the commit before the row tiles, kept), the
# gpu test binary, the probe programs under repo/, the program and sweep lists. Run from the
# repository.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${DEST:-/work/main/.gpu-rowmma}"
cargo build --release --quiet
gpu=$(cargo test --release --no-run --test gpu 2>&1 | grep -o 'target/release/deps/gpu-[0-9a-f]*' | head -1)
mkdir -p "$DEST"
rm -rf "$DEST/repo" && mkdir -p "$DEST/repo/benches/gpu/predict"
cp target/release/eqfuse "$DEST/eqfuse-new"
cp target/release/eqfuse "$DEST/eqfuse"
cp "$gpu" "$DEST/gpu-tests"
cp benches/gpu/rowmma.sh "$DEST/"
cp benches/gpu/predict/* "$DEST/repo/benches/gpu/predict/"
cp benches/gpu/predict/rowmma-programs.txt "$DEST/programs.txt"
cp benches/gpu/predict/rowmma-sweeps.txt "$DEST/sweeps.txt"
git rev-parse --short HEAD > "$DEST/COMMIT"
du -sh "$DEST"
