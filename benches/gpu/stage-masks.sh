#!/usr/bin/env bash
# Stages issue 5's device run (1-bit masks) into DEST (default /work/main/.gpu-masks): the
# release binaries of tests/masks.rs and tests/gpu.rs, the eqfuse binary, the examples, and an
# NVRTC cache prefilled for the mask tests (no GPU needed). Run from the repository; then
# benches/gpu/run-masks.sh on the device (G=.gpu-masks).
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(.ci/install-nvrtc)"
export EQFUSE_CACHE_DIR="$PWD/target/gpu-stage-masks/cache"
rm -rf target/gpu-stage-masks && mkdir -p "$EQFUSE_CACHE_DIR"
exe() {
  cargo test --release --test "$1" --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1"
}
masks="$(exe masks)"
gpu="$(exe gpu)"
EQFUSE_PREFILL=1 "$gpu" --include-ignored --test-threads=1 cases_and_examples >/dev/null
cargo build --release --quiet
DEST="${DEST:-/work/main/.gpu-masks}"
rm -rf "$DEST" && mkdir -p "$DEST"
cp "$masks" "$DEST/masks-tests"
cp "$gpu" "$DEST/gpu-tests"
cp target/release/eqfuse "$DEST/eqfuse"
cp benches/gpu/run-masks.sh "$DEST/"
mkdir -p "$DEST/examples" && cp examples/*.eqf "$DEST/examples/"
cp -r "$EQFUSE_CACHE_DIR" "$DEST/cache"
git rev-parse --short HEAD > "$DEST/COMMIT"
du -sh "$DEST"
