#!/usr/bin/env bash
# Stages the report session (benches/gpu/final.sh) into DEST (default /work/main/.gpu-final):
# the release binary, the examples and their exported graphs at the bench's sizes (the bench
# compiles its kernels there). Run from the repository.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${DEST:-/work/main/.gpu-final}"
eval "$(.ci/install-nvrtc)"
cargo build --release --quiet
rm -rf "$DEST" && mkdir -p "$DEST/graphs" "$DEST/examples"
cp target/release/eqfuse benches/torch_baselines.py benches/gpu/final.sh "$DEST/"
cp examples/*.eqf "$DEST/examples/"
# Every example (all run on the GPU).
# PROGS overrides the list (e.g. the memory-bound examples alone for a second GPU kind).
progs="${PROGS:-add_mul softplus bias_gelu_dropout layernorm rmsnorm softmax softmax_small cross_entropy cross_entropy_grad \
layernorm_grad dense dense_gelu_bf16 matmul_softmax softmax_regression attention composites mlp_grad mlp_relu_grad \
transformer_block transformer_block_grad mlp_relu_dropout_grad attention_grad}"
echo $progs | tr ' ' '\n' > "$DEST/programs.txt"
for n in $progs; do target/release/eqfuse export "examples/$n.eqf" > "$DEST/graphs/$n.json"; done
target/release/eqfuse export examples/layernorm.eqf --dim R=16384 --dim C=4096 > "$DEST/graphs/layernorm_16384x4096.json"
target/release/eqfuse export examples/softmax_regression.eqf --dim B=64 --dim F=128 --dim K=10 \
  > "$DEST/graphs/softmax_regression_64x128x10.json"
target/release/eqfuse export examples/softmax_regression.eqf --dim B=1024 --dim F=1024 --dim K=100 \
  > "$DEST/graphs/softmax_regression_1024x1024x100.json"
# Every kernel of the examples' fused and unfused plans at their declared sizes, compiled here
# into the cache final.sh uses (the transformer blocks alone have some 200).
cargo build --release --quiet --example prefill
EQFUSE_CACHE_DIR="$DEST/cache" target/release/examples/prefill $(for n in $progs; do echo "examples/$n.eqf"; done) >/dev/null
git rev-parse --short HEAD > "$DEST/COMMIT"
du -sh "$DEST"
