#!/usr/bin/env bash
# Stages helper ce2's device run (benches/gpu/ce2.sh) into DEST (default /work/main/.gpu-ce2):
# the release `eqfuse`, the GPU test binary, the examples, the cross-entropy graphs for the
# PyTorch baselines, the CuPy variant harness with the variants in VARIANTS (a folder of .cu
# files, optional), and an NVRTC cache prefilled with every kernel the GPU tests and the
# bench's h100-planned programs compile (NVRTC 13.0 here and on the device: same cache keys),
# packed as cache.tar.gz. Run from the repository after `cargo build --release`.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${DEST:-/work/main/.gpu-ce2}"
eval "$(.ci/install-nvrtc)"
cargo test --release --test gpu --no-run 2>&1 | tail -1
tests="$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)"
rm -rf "$DEST" && mkdir -p "$DEST/graphs" "$DEST/examples"
cp "$tests" "$DEST/gpu-tests"
cp target/release/eqfuse benches/gpu/ce2.sh benches/gpu/ce_cluster.py benches/gpu/ce_variants.py benches/torch_baselines.py "$DEST/"
cp examples/*.eqf "$DEST/examples/"
for n in cross_entropy cross_entropy_grad; do
  target/release/eqfuse export "examples/$n.eqf" > "$DEST/graphs/$n.json"
done
if [ -n "${VARIANTS:-}" ]; then mkdir -p "$DEST/v" && cp "$VARIANTS"/*.cu "$DEST/v/"; fi
cache="$(mktemp -d)"
EQFUSE_PREFILL=1 EQFUSE_CACHE_DIR="$cache" "$DEST/gpu-tests" --include-ignored --test-threads=2 > /dev/null 2>&1 || true
cargo build --release --quiet --example prefill
EQFUSE_CACHE_DIR="$cache" target/release/examples/prefill examples/{cross_entropy_grad,cross_entropy,softmax,layernorm_grad,rmsnorm}.eqf >/dev/null
echo "prefilled $(ls "$cache" | wc -l) kernels"
tar -C "$cache" -czf "$DEST/cache.tar.gz" . && rm -rf "$cache"
git rev-parse --short HEAD > "$DEST/COMMIT"
du -sh "$DEST"
