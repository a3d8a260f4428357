#!/usr/bin/env bash
# The Python side on the GPU, on the device machine: `bash .gpu/benches/gpu/python.sh` after
# `benches/gpu/stage.sh` with any parts (benches/README.md), in one call:
#   1. python/tests (pytest): the exporter, the torch.compile backend launching eqfuse's kernels
#      (CuPy), training through the backend against eager;
#   2. benches/py_backend_speed.py: layernorm + GELU + residual by eager, the eqfuse backend and
#      Inductor (backend-speed.json);
#   3. python/gpt2_block.py prepare + gpu: a GPT-2 block exported, `eqfuse run` on the GPU,
#      compared with PyTorch, kernels counted against torch.compile's (gpt2/).
# PYTESTS: the pytest paths of step 1 (default python/tests); B and T: the GPT-2 block's batch
# and sequence (default 4, 256). Writes py.log, backend-speed.json and gpt2/ under $OUT.
set -uo pipefail
PARTS=""
source "$(dirname "$0")/device-env.sh"
export EQFUSE="$G/eqfuse"
mkdir -p "$OUT/gpt2"
{
  python3 -c "import torch, cupy, transformers; print('torch', torch.__version__, 'cupy', cupy.__version__, 'transformers', transformers.__version__)"
  step "1. pytest python/tests"
  timeout 300 python3 -m pytest -q -rs -p no:cacheprovider ${PYTESTS:-python/tests} 2>&1
  echo "pytest exit $?"
  step "2. backend speed"
  timeout 150 python3 benches/py_backend_speed.py --json "$OUT/backend-speed.json" 2>&1
  echo "speed exit $?"
  step "3. GPT-2 block"
  timeout 60 python3 python/gpt2_block.py prepare --dir /tmp/gpt2 --batch "${B:-4}" --seq "${T:-256}" --eqfuse "$EQFUSE" 2>&1
  echo "prepare exit $?"
  timeout 300 python3 python/gpt2_block.py gpu --dir /tmp/gpt2 --eqfuse "$EQFUSE" --out "$OUT/gpt2" --work /tmp/gpt2-work 2>&1
  echo "gpt2 exit $?"
} 2>&1 | tee "$OUT/py.log"
