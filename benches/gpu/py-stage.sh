#!/usr/bin/env bash
# Stages what benches/gpu/py.sh needs into DEST (default /work/main/.gpu-py, git-ignored there):
# the eqfuse binary (BIN, default target/release/eqfuse), python/ and the bench script.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${DEST:-/work/main/.gpu-py}"
BIN="${BIN:-target/release/eqfuse}"
rm -rf "$DEST" && mkdir -p "$DEST/benches" "$DEST/python"
cp "$BIN" "$DEST/eqfuse"
cp -r python/eqfuse_torch python/tests python/gpt2_block.py "$DEST/python/"
find "$DEST" -name __pycache__ -prune -exec rm -rf {} +
cp benches/py_backend_speed.py benches/gpu/py.sh "$DEST/benches/"
echo "${COMMIT:-$(git rev-parse --short HEAD)}" > "$DEST/COMMIT"
du -sh "$DEST"
