#!/usr/bin/env bash
# Stages a release build for the GPU machine into DEST (default MAIN/.gpu, where MAIN is the
# checkout the device tool sends, default /work/main; `.gpu*` is git-ignored there), so that a
# branch's build runs on the device whatever that checkout holds: the device run is
# `bash .gpu/benches/gpu/SCRIPT.sh` with `carry: [".gpu"]`. Runs here, no GPU needed. DEST is a
# small copy of this checkout (examples/, tests/cases/, benches/ without results/, python/,
# profiles/: the files the tests, benches and scripts read, from this branch) plus:
#   eqfuse       the release binary (always), and COMMIT, the commit staged;
#   tests        gpu-tests: tests/gpu.rs built in release;
#   masks        masks-tests: tests/masks.rs;
#   diff         gpu-diff: tests/gpu_differential.rs (benches/gpu/difftest.sh fills its cache
#                on the device);
#   gpu-bench    gpu-bench: benches/gpu.rs (`cargo bench --bench gpu`);
#   graphs       graphs/: every example, and the report's extra sizes, exported as JSON graphs
#                for benches/torch_baselines.py;
#   cache        cache/: the NVRTC disk cache filled with every kernel the staged test binaries
#                compile and every kernel of every example's fused and unfused plans (plain
#                and strict), so that the device spends its time running.
#   fidelity     fidelity/: FIDELITY_COUNT (default 250) random programs at the sizes models
#                run at, from seed FIDELITY_SEED (default 1), by examples/gen_programs.rs for the
#                profile FIDELITY_DEVICE (default h100; benches/gpu/fidelity.sh's DEVICE) (their
#                plans and index.json stay here, in FIDELITY_DIR, default target/fidelity, for
#                benches/fidelity.py), and fidelity-cache.tar.xz: the NVRTC cache of every kernel
#                of their fused and unfused plans, compressed (benches/gpu/fidelity.sh unpacks
#                it on the device). Stage it alone: `benches/gpu/stage.sh fidelity`.
# Usage, from anywhere in the checkout: benches/gpu/stage.sh [PART...] (default: tests graphs
# cache). What the device gets (the sent checkout and DEST) must stay under 64 MiB: stage only
# what the run needs; the script prints DEST's size.
set -euo pipefail
cd "$(dirname "$0")/../.."
PARTS=" ${*:-tests graphs cache} "
has() { [[ "$PARTS" == *" $1 "* ]]; }
DEST="${DEST:-${MAIN:-/work/main}/.gpu}"
eval "$(.ci/install-nvrtc)"
# The release executable cargo builds for test or bench target $2 ($1: test or bench; benches
# build in release anyway).
exe() {
  local release=--release
  [ "$1" = bench ] && release=
  cargo "$1" $release --"$1" "$2" --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$2"
}
cargo build --release --quiet
rm -rf "$DEST" && mkdir -p "$DEST/tests" "$DEST/benches" "$DEST/python"
DEST="$(cd "$DEST" && pwd)"
cp target/release/eqfuse "$DEST/eqfuse"
cp -r examples profiles "$DEST/"
cp -r tests/cases "$DEST/tests/"
cp -r benches/README.md benches/*.py benches/gpu benches/attention_forward benches/programs "$DEST/benches/"
cp -r python/eqfuse_torch python/tests python/gpt2_block.py "$DEST/python/"
find "$DEST" -name __pycache__ -prune -exec rm -rf {} +
git rev-parse --short HEAD > "$DEST/COMMIT"
has tests && cp "$(exe test gpu)" "$DEST/gpu-tests"
has masks && cp "$(exe test masks)" "$DEST/masks-tests"
has diff && cp "$(exe test gpu_differential)" "$DEST/gpu-diff"
has gpu-bench && cp "$(exe bench gpu)" "$DEST/gpu-bench"
if has graphs; then
  mkdir -p "$DEST/graphs"
  for f in examples/*.eqf; do n="$(basename "$f" .eqf)"; target/release/eqfuse export "$f" > "$DEST/graphs/$n.json"; done
  target/release/eqfuse export examples/layernorm.eqf --dim R=16384 --dim C=4096 > "$DEST/graphs/layernorm_16384x4096.json"
  for s in "64 128 10" "1024 1024 100"; do set -- $s
    target/release/eqfuse export examples/softmax_regression.eqf --dim B=$1 --dim F=$2 --dim K=$3 \
      > "$DEST/graphs/softmax_regression_$1x$2x$3.json"
  done
fi
if has cache; then
  export EQFUSE_CACHE_DIR="$DEST/cache"
  mkdir -p "$EQFUSE_CACHE_DIR"
  cargo build --release --quiet --example prefill
  target/release/examples/prefill examples/*.eqf > /dev/null
  target/release/examples/prefill --strict examples/*.eqf > /dev/null
  for b in gpu-tests masks-tests; do
    [ -x "$DEST/$b" ] && EQFUSE_PREFILL=1 "$DEST/$b" --include-ignored --test-threads=2 > /dev/null 2>&1 || true
  done
  echo "NVRTC cache: $(ls "$EQFUSE_CACHE_DIR" | wc -l) kernels"
fi
if has fidelity; then
  F="${FIDELITY_DIR:-target/fidelity}"
  rm -rf "$F" && mkdir -p "$F" "$DEST/fidelity"
  cargo build --release --quiet --example gen_programs --example prefill
  target/release/examples/gen_programs --count "${FIDELITY_COUNT:-250}" --seed "${FIDELITY_SEED:-1}" \
    --device "${FIDELITY_DEVICE:-h100}" -o "$F" \
    2> "$F/gen.log" | tail -1 || echo "gen_programs FAILED on some programs: see $F/failed/ and $F/gen.log"
  cp "$F"/g*.eqf "$DEST/fidelity/"
  cache="$(mktemp -d)"
  ls "$F"/g*.eqf | xargs -P "$(nproc)" -n 5 env EQFUSE_CACHE_DIR="$cache" target/release/examples/prefill \
    --device "${FIDELITY_DEVICE:-h100}" > /dev/null
  echo "fidelity NVRTC cache: $(ls "$cache" | wc -l) kernels, $(du -sh "$cache" | cut -f1) before compression"
  tar cJf "$DEST/fidelity-cache.tar.xz" -C "$cache" .
  rm -rf "$cache"
fi
ls "$DEST"
du -sh "$DEST"
