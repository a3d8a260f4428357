#!/usr/bin/env bash
# Predictions against measurements, on the device machine: `bash .gpu/benches/gpu/predict.sh`
# after `benches/gpu/stage.sh cache` (benches/README.md): `eqfuse calibrate` (the profile
# as measured now, L2 size included; CALIBRATE=0 skips it), `eqfuse bench` over the examples
# named in PROGRAMS (default benches/gpu/predict/programs.txt, one name a line), then one
# `eqfuse bench` per line of SWEEPS (default benches/gpu/predict/sweeps.txt: `TAG PROGRAM
# ARGS...`, the same program at other sizes, the probes of benches/gpu/predict/, `--strict` to
# time the generated gemm instead of cuBLASLt, `--device FILE` for another profile). Every
# bench JSON holds each kernel's predicted and measured time. Writes $OUT/predict.tgz.
set -uo pipefail
PARTS=""
source "$(dirname "$0")/device-env.sh"
PROGRAMS="${PROGRAMS:-benches/gpu/predict/programs.txt}"
SWEEPS="${SWEEPS:-benches/gpu/predict/sweeps.txt}"
S=/tmp/predict
rm -rf "$S" && mkdir -p "$S/sweeps" && cp "$OUT/device.txt" "$S/"
if [ "${CALIBRATE:-1}" = 1 ]; then
  timeout 120 "$G/eqfuse" calibrate -o "$S/calibrated.json" > "$S/calibrate.log" 2>&1
  echo "calibrate exit $? ($((SECONDS - t0)) s)"
fi
if [ -s "$PROGRAMS" ]; then
  timeout "${BENCH_TIMEOUT:-300}" "$G/eqfuse" bench $(sed 's|^|examples/|; s|$|.eqf|' "$PROGRAMS") \
    --json "$S/bench.json" > "$S/bench.txt" 2>&1
  echo "bench exit $? ($((SECONDS - t0)) s)"; cat "$S/bench.txt"
fi
while read -r tag prog args; do
  [ -z "$tag" ] && continue
  timeout 60 "$G/eqfuse" bench "$prog" $args --json "$S/sweeps/$tag.json" > "$S/sweeps/$tag.txt" 2>&1
  echo "$tag exit $? ($((SECONDS - t0)) s): $(grep -E '│ ' "$S/sweeps/$tag.txt" | tail -1 | tr -s ' ')"
done < "$SWEEPS"
tar czf "$OUT/predict.tgz" -C /tmp predict
