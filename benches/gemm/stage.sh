#!/usr/bin/env bash
# Stages what benches/gemm/run.sh needs into DEST (default /work/main/.gpu-gemm): the release
# binary, the GPU test binary, a filled NVRTC cache, the PyTorch scripts and exported graphs.
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(.ci/install-nvrtc)"
export EQFUSE_CACHE_DIR="$PWD/target/gemm-stage/cache"
rm -rf target/gemm-stage && mkdir -p "$EQFUSE_CACHE_DIR"
tests="$(cargo test --release --test gpu --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])')"
cargo build --release --quiet
EQFUSE_PREFILL=1 "$tests" --test-threads=1 >/dev/null
DEST="${DEST:-/work/main/.gpu-gemm}"
rm -rf "$DEST" && mkdir -p "$DEST/graphs"
cp "$tests" "$DEST/gpu-tests"
cp -r examples "$DEST/examples"
cp target/release/eqfuse "$DEST/eqfuse"
cp benches/gemm/run.sh benches/torch_baselines.py benches/gemm/softmax_regression_eager.py "$DEST/"
target/release/eqfuse export examples/dense_gelu_bf16.eqf > "$DEST/graphs/dense_gelu_bf16.json"
cp -r "$EQFUSE_CACHE_DIR" "$DEST/cache"
git rev-parse --short HEAD > "$DEST/COMMIT"
du -sh "$DEST"
