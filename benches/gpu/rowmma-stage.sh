#!/usr/bin/env bash
# Stages benches/gpu/rowmma.sh into DEST (default /work/main/.gpu-rowmma): this commit's release
# `eqfuse` (and `eqfuse-base`, built beforehand from the commit before the row tiles, kept), the
# gpu test binary, the probe programs under repo/, the program and sweep lists. Run from the
# repository.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${DEST:-/work/main/.gpu-rowmma}"
cargo build --release --quiet
gpu=$(cargo test --release --no-run --test gpu 2>&1 | grep -o 'target/release/deps/gpu-[0-9a-f]*' | head -1)
mkdir -p "$DEST"
rm -rf "$DEST/repo" && mkdir -p "$DEST/repo/benches/gpu/predict"
cp target/release/eqfuse "$DEST/eqfuse-new"
cp target/release/eqfuse "$DEST/eqfuse"
cp "$gpu" "$DEST/gpu-tests"
cp benches/gpu/rowmma.sh "$DEST/"
cp benches/gpu/predict/* "$DEST/repo/benches/gpu/predict/"
mkdir -p "$DEST/repo/examples" && cp examples/*.eqf "$DEST/repo/examples/"
cp benches/gpu/predict/rowmma-programs.txt "$DEST/programs.txt"
cp benches/gpu/predict/rowmma-sweeps.txt "$DEST/sweeps.txt"
git rev-parse --short HEAD > "$DEST/COMMIT"
# The NVRTC cache: every kernel the session compiles with this commit's binaries, generated here
# from the same relative paths the device runs them with (the sources name their program).
eval "$(.ci/install-nvrtc)"
here="$PWD"
main="$(dirname "$DEST")"
G="$(basename "$DEST")"
P="$G/repo/benches/gpu/predict"
rm -rf "$DEST/cache" /tmp/rowmma-cg && mkdir -p "$DEST/cache"
i=0
{
  while read -r tag bin prog args; do echo "$prog $args --device $P/generated-only.json"; done < "$DEST/sweeps.txt"
  while read -r tag bin prog args; do [ "$bin" = new ] && echo "$prog ${args//GEN/$P/generated-only.json}"; done < "$DEST/programs.txt"
  for d in "M=4096 K=1024 N=128" "M=1024 K=1024 N=100" "M=64 K=128 N=10" "M=130 K=96 N=200" "M=100 K=72 N=20"; do
    echo "softmax_regression_bf16.eqf $(for v in $d; do printf -- "--dim %s " "$v"; done)--device $P/generated-only.json"
  done
} | while read -r prog args; do
  i=$((i + 1))
  (cd "$main" && "$here/target/release/eqfuse" codegen "$P/$prog" $args -o "/tmp/rowmma-cg/$i" > /dev/null)
  python3 "$here/benches/gpu/prefill-nvrtc.py" "$DEST/cache" sm_90 /tmp/rowmma-cg/$i/*.cu > /dev/null
done
(cd "$DEST/repo" && EQFUSE_CACHE_DIR="$DEST/cache" EQFUSE_PREFILL=1 "$DEST/gpu-tests" tensor_core_row gemm_implementations cases_and_examples > /dev/null 2>&1)
echo "NVRTC cache: $(ls "$DEST/cache" | wc -l) kernels"
du -sh "$DEST"
