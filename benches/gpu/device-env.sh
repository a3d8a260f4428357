# Sourced by the device scripts of benches/gpu (not run on its own). A script runs in the tree
# it belongs to: the staged folder when it is run as `bash .gpu/benches/gpu/SCRIPT.sh` (the way
# benches/gpu/stage.sh means it), else the checkout holding it. G is the staged build (default:
# that folder, or .gpu in a checkout), OUT the folder whose files come back (default
# /tmp/eqfuse-out). Points eqfuse at the machine's NVRTC and at the staged NVRTC cache, makes a
# missing GPU a failure, and writes $OUT/device.txt: date, commit staged, GPU, driver, clocks.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [ -x ./eqfuse ]; then G="${G:-.}"; else G="${G:-.gpu}"; fi
OUT="${OUT:-/tmp/eqfuse-out}"
mkdir -p "$OUT"
[ -x "$G/eqfuse" ] || { echo "no staged build in $G: run benches/gpu/stage.sh first and carry it"; exit 2; }
G="$(cd "$G" && pwd)"
export EQFUSE_CACHE_DIR="${EQFUSE_CACHE_DIR:-$G/cache}" EQFUSE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
nvrtc="$(ls /usr/local/cuda/lib64/libnvrtc.so.13 2>/dev/null || find / -xdev -name libnvrtc.so.13 2>/dev/null | head -1)"
if [ -n "$nvrtc" ]; then
  export EQFUSE_NVRTC_DIR="$(dirname "$nvrtc")"
  export LD_LIBRARY_PATH="$EQFUSE_NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "commit: $(cat "$G/COMMIT" 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.mem --format=csv,noheader
  echo "nvrtc: ${nvrtc:-not found}"
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
# PARTS selects a script's steps; `has NAME` says whether NAME is one of them.
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$SECONDS
step() { echo "== $1 ($((SECONDS - t0)) s)"; }
