#!/usr/bin/env bash
# eqfuse calibrate, then eqfuse bench with the calibrated profile (and the committed one if time is left).
set -uo pipefail
G=.gpu-cal
OUT="${OUT:-/tmp/cal-out}"
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64 EQFUSE_CACHE_DIR=/tmp/eqfuse-cache EQFUSE_REQUIRE_GPU=1
LIMIT=${LIMIT:-345}
{ date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat $G/COMMIT)"; nproc;
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,temperature.gpu --format=csv,noheader; } | tee $OUT/device.txt
left() { echo $((LIMIT - SECONDS)); }
timeout $(( $(left) - 5 )) $G/eqfuse calibrate -o $OUT/h100.json > $OUT/calibrate.log 2>&1
echo "calibrate exit $? at $SECONDS s" | tee -a $OUT/device.txt
cat $OUT/calibrate.log
E=$G/examples
PROGS="$E/attention.eqf $E/attention_grad.eqf $E/transformer_block.eqf $E/dense_gelu_bf16.eqf"
if [ -s $OUT/h100.json ]; then
  timeout $(( $(left) - 3 )) $G/eqfuse bench $PROGS --device $OUT/h100.json --repeat 20 --json $OUT/bench-calibrated.json > $OUT/bench-calibrated.txt 2>&1
  echo "bench (calibrated) exit $? at $SECONDS s" | tee -a $OUT/device.txt
  cat $OUT/bench-calibrated.txt
fi
if [ "$(left)" -gt 100 ] && [ "${COMMITTED:-1}" = 1 ]; then
  timeout $(( $(left) - 3 )) $G/eqfuse bench $PROGS --device h100 --repeat 20 --json $OUT/bench-committed.json > $OUT/bench-committed.txt 2>&1
  echo "bench (committed) exit $? at $SECONDS s" | tee -a $OUT/device.txt
  cat $OUT/bench-committed.txt
fi
