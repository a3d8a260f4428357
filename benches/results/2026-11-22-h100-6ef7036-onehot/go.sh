#!/usr/bin/env bash
# Helper ce2's device run: eqfuse bench on the row-kernel examples, the GPU tests, torch baselines.
set -uo pipefail
G=.gpu-ce2; DEV=${DEV:-h100}
export PYTHONUNBUFFERED=1 EQFUSE_REQUIRE_GPU=1 EQFUSE_CACHE_DIR=/tmp/c EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; echo "commit: $(cat $G/COMMIT)") | tee $OUT/device.txt
E=$G/examples
timeout 200 $G/eqfuse bench --device $DEV $E/cross_entropy_grad.eqf $E/cross_entropy.eqf $E/softmax.eqf $E/layernorm.eqf $E/layernorm_grad.eqf $E/rmsnorm.eqf --json $OUT/bench.json > $OUT/bench.txt 2>&1; echo "bench exit $?"; tail -30 $OUT/bench.txt
timeout 60 $G/eqfuse run --device $DEV $E/cross_entropy_grad.eqf --repeat 30 --outputs /tmp/o > $OUT/run-ceg.txt 2>&1; cat $OUT/run-ceg.txt | tail -14
timeout 150 python3 $G/torch_baselines.py --out $OUT/torch.json $G/graphs/*.json > $OUT/torch.log 2>&1; echo "torch exit $?"; grep '^{"graph"' $OUT/torch.log | cut -c1-300
timeout ${TT:-200} $G/gpu-tests --test-threads=1 > $OUT/gpu-tests.log 2>&1; echo "tests exit $?"; grep -E "^test |test result" $OUT/gpu-tests.log | tail -30
