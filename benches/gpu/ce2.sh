#!/usr/bin/env bash
# Helper ce2's device run, from the repository root with the staged folder G (default .gpu-ce2,
# see benches/gpu/ce2-stage.sh): `eqfuse bench` on the row-kernel examples, `eqfuse run` of the
# cross-entropy gradient, torch.compile on the cross-entropy graphs, the CuPy variant harness
# (VARIANTS, e.g. "C1,C2,G,GX"), then the GPU tests (every case and example against the CPU
# reference, pipelined long rows, strict plans bit-identical to the unfused plan). DEV: the
# profile the bench plans with (h200 or h100); TB, TT, TG: time limits of the bench, the torch
# baselines and the GPU tests (TG=0 skips the tests).
set -uo pipefail
G=${G:-.gpu-ce2}; DEV=${DEV:-h200}; OUT=${OUT:-/tmp/eqfuse-out}
export PYTHONUNBUFFERED=1 EQFUSE_REQUIRE_GPU=1 EQFUSE_CACHE_DIR=/tmp/c
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64
mkdir -p /tmp/c && tar -C /tmp/c -xzf $G/cache.tar.gz
t0=$(date +%s); lap() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
 date -u +"date: %Y-%m-%d %H:%M UTC"; echo "commit: $(cat $G/COMMIT)"; echo "cached kernels: $(ls /tmp/c | wc -l)") | tee $OUT/device.txt
E=$G/examples
timeout ${TB:-150} $G/eqfuse bench --device $DEV $E/cross_entropy_grad.eqf $E/cross_entropy.eqf $E/softmax.eqf \
  $E/layernorm_grad.eqf $E/rmsnorm.eqf --json $OUT/bench.json > $OUT/bench.txt 2>&1; lap "bench exit $?"; tail -22 $OUT/bench.txt
timeout 60 $G/eqfuse run --device $DEV $E/cross_entropy_grad.eqf --repeat 30 --outputs /tmp/o > $OUT/run.txt 2>&1
lap "run exit $?"; tail -12 $OUT/run.txt
if [ -n "${VARIANTS:-}" ]; then
  timeout 60 python3 $G/ce_cluster.py $G/v --reps 30 --only "$VARIANTS" >> $OUT/run.txt 2>&1
  timeout 60 python3 $G/ce_cluster.py $G/v --reps 30 --only "$VARIANTS" >> $OUT/run.txt 2>&1; lap "variants exit $?"
  grep -E "^(device|[A-Z0-9]+ +occ|.*failed)" $OUT/run.txt
fi
timeout ${TT:-150} python3 $G/torch_baselines.py --out $OUT/torch.json $G/graphs/*.json \
  > $OUT/torch.log 2>&1; lap "torch exit $?"; grep '^{"graph"' $OUT/torch.log | cut -c1-300
[ "${TG:-240}" = 0 ] && exit 0  # TG=0: no GPU tests
timeout ${TG:-240} $G/gpu-tests --include-ignored --test-threads=1 > $OUT/gpu-tests.log 2>&1; lap "tests exit $?"
grep -E "^test |test result|MISMATCH|ERROR|panicked" $OUT/gpu-tests.log | tail -30
