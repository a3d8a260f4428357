#!/usr/bin/env bash
# The report session (issue 7), on the device machine from the repository root with the staged
# folder G (default .gpu-final: the release `eqfuse`, `torch_baselines.py`, exported graphs and
# examples; see benches/gpu/final-stage.sh): `eqfuse bench` over every example that runs on the
# GPU (and the extra sizes), then PyTorch eager and torch.compile on the same programs. Writes
# device.txt, bench*.json, torch.json and logs into $OUT/session.tgz (REPORT.md is made from it
# by benches/report.py).
set -uo pipefail
OUT="${OUT:-/tmp/eqfuse-out}"
G="${G:-.gpu-final}"
S=/tmp/session
rm -rf "$S" && mkdir -p "$S"
export EQFUSE_CACHE_DIR="$G/cache" PYTHONUNBUFFERED=1
lib="$(ls /usr/local/cuda/lib64/libnvrtc.so.13 2>/dev/null || find / -xdev -name libnvrtc.so.13 2>/dev/null | head -1)"
export EQFUSE_NVRTC_DIR="$(dirname "$lib")" LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "commit: $(cat $G/COMMIT)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
} > "$S/device.txt"
cat "$S/device.txt"
E=$G/examples
# DEVICE: the profile the bench plans with (default h100; h200 on an H200).
DEV="--device ${DEVICE:-h100}"
# PARTS (default "bench torch"): the eqfuse benches, the PyTorch baselines; one call each fits
# the device's 10-minute limit (the two sessions' folders are merged before benches/report.py).
PARTS="${PARTS:-bench torch}"
if [[ " $PARTS " == *" bench "* ]]; then
timeout "${BENCH_TIMEOUT:-420}" "$G/eqfuse" bench $DEV $(cat $G/programs.txt | sed "s|^|$E/|; s|$|.eqf|") --json "$S/bench.json" > "$S/bench.txt" 2>&1
echo "bench exit $?"; tail -40 "$S/bench.txt"
timeout 60 "$G/eqfuse" bench $DEV $E/layernorm.eqf --dim R=16384 --dim C=4096 --json "$S/bench_16384x4096.json" > "$S/bench_16384x4096.txt" 2>&1
echo "bench 16384x4096 exit $?"
timeout 60 "$G/eqfuse" bench $DEV $E/softmax_regression.eqf --dim B=64 --dim F=128 --dim K=10 --json "$S/bench_64x128x10.json" > "$S/bench_64x128x10.txt" 2>&1
echo "bench 64x128x10 exit $?"
timeout 60 "$G/eqfuse" bench $DEV $E/softmax_regression.eqf --dim B=1024 --dim F=1024 --dim K=100 --json "$S/bench_1024x1024x100.json" > "$S/bench_1024x1024x100.txt" 2>&1
echo "bench 1024x1024x100 exit $?"
fi
if [[ " $PARTS " == *" torch "* ]]; then
timeout 540 python3 "$G/torch_baselines.py" --out "$S/torch.json" "$G"/graphs/*.json > "$S/torch.log" 2>&1
echo "torch exit $?"; grep '^{"graph"' "$S/torch.log" | cut -c1-200
fi
tar czf "$OUT/session.tgz" -C /tmp session
