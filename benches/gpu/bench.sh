#!/usr/bin/env bash
# Benches, on the device machine: `bash .gpu/benches/gpu/bench.sh` after
# `benches/gpu/stage.sh graphs cache` (plus gpu-bench for that step; benches/README.md). Steps
# (PARTS, default "bench torch"; each of the first two fits one 10-minute device call):
#   bench        `eqfuse bench` of every example at its declared sizes and of the report's three
#                extra sizes (layernorm 16384x4096, softmax regression 64x128x10 and
#                1024x1024x100): fused against eqfuse's unfused plan, measured against
#                predicted, each fused plan checked against the CPU reference
#                (bench*.json, bench*.txt);
#   torch        PyTorch eager and torch.compile on the same programs, shapes and GPU, from the
#                staged graphs (benches/torch_baselines.py: torch.json, torch.log);
#   sdpa         attention_grad.eqf by `eqfuse run` beside PyTorch SDPA's attention backward
#                (benches/sdpa_backward.py: sdpa.log);
#   softmax_regression  softmax regression at 64x128x10, 256x512x50 and 1024x1024x100 by
#                `eqfuse run` beside PyTorch eager (benches/softmax_regression_eager.py:
#                softmax_regression.log);
#   gpu-bench    benches/gpu.rs: calibration, then the large memory-bound programs fused and
#                unfused (gpu-bench/).
# DEVICE: the profile to plan with (default h100; h200 on an H200, or a profile file). Writes
# $OUT/session.tgz, a session folder (with device.txt) from which `python3 benches/report.py
# SESSION_DIR` writes benches/results/REPORT.md and its figures.
set -uo pipefail
PARTS="${PARTS:-bench torch}"
source "$(dirname "$0")/device-env.sh"
S=/tmp/session
rm -rf "$S" && mkdir -p "$S" && cp "$OUT/device.txt" "$S/"
E="$G/eqfuse"
DEV="--device ${DEVICE:-h100}"
if has bench; then
  step bench
  timeout "${BENCH_TIMEOUT:-420}" "$E" bench $DEV examples/*.eqf --json "$S/bench.json" > "$S/bench.txt" 2>&1
  echo "bench exit $?"; tail -40 "$S/bench.txt"
  timeout 60 "$E" bench $DEV examples/layernorm.eqf --dim R=16384 --dim C=4096 \
    --json "$S/bench_16384x4096.json" > "$S/bench_16384x4096.txt" 2>&1
  echo "bench 16384x4096 exit $?"
  for s in "64 128 10" "1024 1024 100"; do set -- $s
    timeout 60 "$E" bench $DEV examples/softmax_regression.eqf --dim B=$1 --dim F=$2 --dim K=$3 \
      --json "$S/bench_$1x$2x$3.json" > "$S/bench_$1x$2x$3.txt" 2>&1
    echo "bench $1x$2x$3 exit $?"
  done
fi
if has torch; then
  step torch
  timeout "${TORCH_TIMEOUT:-540}" python3 benches/torch_baselines.py --out "$S/torch.json" "$G"/graphs/*.json > "$S/torch.log" 2>&1
  echo "torch exit $?"; grep '^{"graph"' "$S/torch.log" | cut -c1-200
fi
if has sdpa; then
  step sdpa
  { echo "== eqfuse attention_grad"; timeout 60 "$E" run examples/attention_grad.eqf $DEV --repeat 30
    echo "== PyTorch SDPA"; timeout 90 python3 benches/sdpa_backward.py; } > "$S/sdpa.log" 2>&1
  grep -E "^==|attention|total|_ms" "$S/sdpa.log" | head -30
fi
if has softmax_regression; then
  step softmax_regression
  { for s in "64 128 10" "256 512 50" "1024 1024 100"; do set -- $s
      echo "== softmax_regression $1x$2x$3"
      timeout 30 "$E" run examples/softmax_regression.eqf $DEV --dim B=$1 --dim F=$2 --dim K=$3 --repeat 500
    done
    echo "== PyTorch eager"; timeout 100 python3 benches/softmax_regression_eager.py; } > "$S/softmax_regression.log" 2>&1
  grep -E "^==|total|eager" "$S/softmax_regression.log" | head -30
fi
if has gpu-bench; then
  step gpu-bench
  timeout "${GPU_BENCH_TIMEOUT:-300}" "$G/gpu-bench" --out "$S/gpu-bench" > "$S/gpu-bench.log" 2>&1
  echo "gpu-bench exit $?"; tail -30 "$S/gpu-bench.log"
fi
tar czf "$OUT/session.tgz" -C /tmp session
step done
