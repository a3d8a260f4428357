#!/usr/bin/env bash
# Stages benches/gpu/views.sh into DEST (default /work/main/.gpu-views, git-ignored there): the
# release binary, the transformer examples, the GPT-2 block prepared here (exported graph,
# inputs, PyTorch's CPU output; `python/gpt2_block.py prepare`, needs torch and transformers) and
# an NVRTC cache holding every kernel of their plans (`examples/prefill.rs`), so that the device
# spends its time running. Run from the repository.
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
python3 python/gpt2_block.py prepare --dir "$DEST/gpt2" --eqfuse target/release/eqfuse --cpu-check
rm -f "$DEST/gpt2/torch/block.pt.bak"
EQFUSE_CACHE_DIR="$DEST/cache" target/release/examples/prefill "$DEST"/examples/*.eqf "$DEST/gpt2/graph.json"
git rev-parse --short HEAD > "$DEST/COMMIT"
du -sh "$DEST"
