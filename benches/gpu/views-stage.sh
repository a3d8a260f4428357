#!/usr/bin/env bash
# Stages benches/gpu/views.sh into DEST (default /work/main/.gpu-views, git-ignored there): the
# release binary, the transformer examples, `python/gpt2_block.py` with the exporter, and an NVRTC
# cache holding every kernel of their plans (`examples/prefill.rs`; the GPT-2 block's from a
# local `prepare`, which needs torch and transformers), so that the device spends its time
# running. The GPT-2 block is prepared again on the device (its weights are too large to carry).
# Run from the repository.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${DEST:-/work/main/.gpu-views}"
eval "$(.ci/install-nvrtc)"
cargo build --release --quiet
cargo build --release --quiet --example prefill
rm -rf "$DEST" && mkdir -p "$DEST/examples" "$DEST/python"
cp target/release/eqfuse benches/gpu/views.sh "$DEST/"
cp examples/transformer_block.eqf examples/transformer_block_grad.eqf "$DEST/examples/"
cp python/gpt2_block.py "$DEST/python/"
cp -r python/eqfuse_torch "$DEST/python/"
find "$DEST" -name __pycache__ -prune -exec rm -rf {} +
python3 python/gpt2_block.py prepare --dir target/gpt2 --eqfuse target/release/eqfuse --cpu-check
EQFUSE_CACHE_DIR="$DEST/cache" target/release/examples/prefill "$DEST"/examples/*.eqf target/gpt2/graph.json
git rev-parse --short HEAD > "$DEST/COMMIT"
du -sh "$DEST"
