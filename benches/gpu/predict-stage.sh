#!/usr/bin/env bash
# Stages the prediction session (benches/gpu/predict.sh) into DEST (default
# /work/main/.gpu-predict): the release binary, the examples, the probe programs, and the lists
# PROGRAMS (default benches/gpu/predict/programs.txt) and SWEEPS (default
# benches/gpu/predict/sweeps.txt). Run from the repository.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${DEST:-/work/main/.gpu-predict}"
cargo build --release --quiet
rm -rf "$DEST" && mkdir -p "$DEST/examples" "$DEST/probes"
cp target/release/eqfuse benches/gpu/predict.sh "$DEST/"
cp examples/*.eqf "$DEST/examples/"
cp benches/gpu/predict/*.eqf "$DEST/probes/"
cp "${PROGRAMS:-benches/gpu/predict/programs.txt}" "$DEST/programs.txt"
cp "${SWEEPS:-benches/gpu/predict/sweeps.txt}" "$DEST/sweeps.txt"
git rev-parse --short HEAD > "$DEST/COMMIT"
du -sh "$DEST"
