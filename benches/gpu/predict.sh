#!/usr/bin/env bash
# The prediction session (issues 4 and 7), on the device machine from the repository root with
# the staged folder G (default .gpu-predict; see benches/gpu/predict-stage.sh): `eqfuse
# calibrate` (the profile as measured now, L2 size included), `eqfuse bench` over the programs in
# $G/programs.txt, then one `eqfuse bench` per line of $G/sweeps.txt (`TAG PROGRAM ARGS...`: the
# same program at other sizes, or `--strict` to time the generated gemm instead of cuBLASLt).
# Every bench JSON holds each kernel's predicted and measured time. Writes $OUT/predict.tgz.
set -uo pipefail
OUT="${OUT:-/tmp/eqfuse-out}"
G="${G:-.gpu-predict}"
S=/tmp/predict
rm -rf "$S" && mkdir -p "$S/sweeps"
export EQFUSE_CACHE_DIR="$G/cache" EQFUSE_REQUIRE_GPU=1
lib="$(ls /usr/local/cuda/lib64/libnvrtc.so.13 2>/dev/null || find / -xdev -name libnvrtc.so.13 2>/dev/null | head -1)"
export EQFUSE_NVRTC_DIR="$(dirname "$lib")" LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "commit: $(cat $G/COMMIT)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
} > "$S/device.txt"
cat "$S/device.txt"
t0=$SECONDS
if [ "${CALIBRATE:-1}" = 1 ]; then
  timeout 90 "$G/eqfuse" calibrate -o "$S/calibrated.json" > "$S/calibrate.log" 2>&1
  echo "calibrate exit $? ($((SECONDS - t0)) s)"
fi
E=$G/examples
if [ -s "$G/programs.txt" ]; then
  timeout "${BENCH_TIMEOUT:-300}" "$G/eqfuse" bench $(sed "s|^|$E/|; s|$|.eqf|" "$G/programs.txt") \
    --json "$S/bench.json" > "$S/bench.txt" 2>&1
  echo "bench exit $? ($((SECONDS - t0)) s)"; cat "$S/bench.txt"
fi
while read -r tag prog args; do
  [ -z "$tag" ] && continue
  timeout 60 "$G/eqfuse" bench "$G/$prog" $args --json "$S/sweeps/$tag.json" > "$S/sweeps/$tag.txt" 2>&1
  echo "$tag exit $? ($((SECONDS - t0)) s): $(grep -E '│ ' "$S/sweeps/$tag.txt" | tail -1 | tr -s ' ')"
done < "$G/sweeps.txt"
tar czf "$OUT/predict.tgz" -C /tmp predict
