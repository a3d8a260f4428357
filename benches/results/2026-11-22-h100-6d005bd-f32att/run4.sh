#!/usr/bin/env bash
# f32att device run 4: eqfuse bench of transformer_block (its plan now takes the f32 attention kernel).
set -uo pipefail
G=.gpu-f32att
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export EQFUSE_REQUIRE_GPU=1 EQFUSE_CACHE_DIR=$PWD/$G/cache PYTHONUNBUFFERED=1
mkdir -p $OUT/r4
timeout 200 $G/eqfuse bench $G/progs/transformer_block.eqf --json $OUT/r4/bench4.json > $OUT/r4/bench4.log 2>&1; echo "bench exit $?"; tail -8 $OUT/r4/bench4.log
timeout 120 $G/eqfuse run $G/progs/transformer_block.eqf --repeat 20 --outputs /tmp/o-tb > $OUT/r4/run4.log 2>&1; echo "run exit $?"; grep -E "attention|total|mismatch" $OUT/r4/run4.log
