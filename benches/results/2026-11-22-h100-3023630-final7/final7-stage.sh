#!/usr/bin/env bash
# Stages the seventh session's closing device runs (benches/gpu/final7.sh, final7-tests.sh) into
# DEST (default /work/main/.gpu-final7): the release binary, the GPU test binary, the examples,
# the latency probes and fit, the committed H100 profile and the PyTorch baselines.
set -euo pipefail
cd "$(dirname "$0")/../.."
tests="$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)"
DEST="${DEST:-/work/main/.gpu-final7}"
rm -rf "$DEST" && mkdir -p "$DEST"
cp "$tests" "$DEST/gpu-tests"
cp -r examples benches/gpu/stage benches/gpu/split "$DEST/"
mkdir -p "$DEST/benches/gpu" && cp -r benches/gpu/predict "$DEST/benches/gpu/"  # the tensor-core row epilogue test reads it
cp target/release/eqfuse benches/gpu/final7.sh benches/gpu/final7-tests.sh benches/gpu/fit_latencies.py \
  benches/torch_baselines.py benches/gemm/softmax_regression_eager.py \
  benches/results/2026-11-22-h100-ad59cba-attnbwd-fused/sdpa_bwd.py "$DEST/"
cp profiles/h100.json "$DEST/profile.json"
git rev-parse --short HEAD > "$DEST/COMMIT"
du -sh "$DEST"
