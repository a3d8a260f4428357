#!/usr/bin/env bash
# Builds the GPU test and bench binaries in release, fills the NVRTC cache for them (no GPU
# needed), and stages everything the device run needs into MAIN/.gpu (MAIN: the checkout the
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
EQFUSE_PREFILL=1 "$tests" --test-threads=1 >/dev/null
"$bench" --prefill
rm -rf "$MAIN/.gpu" && mkdir -p "$MAIN/.gpu"
cp "$tests" "$MAIN/.gpu/gpu-tests"
cp "$bench" "$MAIN/.gpu/gpu-bench"
cp benches/gpu/run.sh benches/torch_baselines.py "$MAIN/.gpu/"
# The PyTorch baselines run the same programs, exported as JSON graphs at the bench's sizes.
cargo build --release --quiet
mkdir -p "$MAIN/.gpu/graphs"
for n in add_mul softplus bias_gelu_dropout rmsnorm softmax softmax_small cross_entropy layernorm; do
  target/release/eqfuse export "examples/$n.eqf" > "$MAIN/.gpu/graphs/$n.json"
done
target/release/eqfuse export examples/layernorm.eqf --dim R=16384 --dim C=4096 > "$MAIN/.gpu/graphs/layernorm_16384x4096.json"
cp -r "$EQFUSE_CACHE_DIR" "$MAIN/.gpu/cache"
git rev-parse --short HEAD > "$MAIN/.gpu/COMMIT"
du -sh "$MAIN/.gpu"
