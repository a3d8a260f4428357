#!/usr/bin/env bash
# Builds the GPU test and bench binaries in release, fills the NVRTC cache for them (no GPU
# needed), and stages everything the device run needs into DEST (default MAIN/.gpu; MAIN: the checkout the
# device tool sends, default /work/main; .gpu is git-ignored there). Run from the repository.
set -euo pipefail
cd "$(dirname "$0")/../.."
MAIN="${MAIN:-/work/main}"
eval "$(.ci/install-nvrtc)"
export EQFUSE_CACHE_DIR="$PWD/target/gpu-stage/cache"
rm -rf target/gpu-stage && mkdir -p "$EQFUSE_CACHE_DIR"
tests="$(cargo test --release --test gpu --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])')"
bench="$(cargo bench --bench gpu --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])')"
EQFUSE_PREFILL=1 "$tests" --include-ignored --test-threads=1 >/dev/null
"$bench" --prefill
DEST="${DEST:-$MAIN/.gpu}"
rm -rf "$DEST" && mkdir -p "$DEST"
cp "$tests" "$DEST/gpu-tests"
cp "$bench" "$DEST/gpu-bench"
cp benches/gpu/run.sh benches/torch_baselines.py "$DEST/"
# The PyTorch baselines run the same programs, exported as JSON graphs at the bench's sizes.
cargo build --release --quiet
mkdir -p "$DEST/graphs"
for n in add_mul softplus bias_gelu_dropout rmsnorm softmax softmax_small cross_entropy layernorm \
  cross_entropy_grad layernorm_grad; do
  target/release/eqfuse export "examples/$n.eqf" > "$DEST/graphs/$n.json"
done
target/release/eqfuse export examples/layernorm.eqf --dim R=16384 --dim C=4096 > "$DEST/graphs/layernorm_16384x4096.json"
cp target/release/eqfuse "$DEST/eqfuse"
mkdir -p "$DEST/examples" && cp examples/*.eqf "$DEST/examples/"
cp -r "$EQFUSE_CACHE_DIR" "$DEST/cache"
git rev-parse --short HEAD > "$DEST/COMMIT"
du -sh "$DEST"
