#!/usr/bin/env bash
# The tensor-core row tiles' session (benches/gpu/rowmma-stage.sh stages $G): on the device
# machine, from the repository root. Writes $OUT/rowmma.tgz (logs, bench JSONs) as it goes.
#   1. the GPU tests of the row tiles (tests/gpu.rs) from the staged test binary;
#   2. `eqfuse run` (checked against the reference) of bf16 softmax regression at three sizes;
#   3. `eqfuse run` of the step-time probes ($G/sweeps.txt, planned without cuBLASLt) and
#      `eqfuse bench` of the programs ($G/programs.txt); both list `TAG BIN PROGRAM ARGS`, BIN
#      `new` (this commit) or `base` (before it: the CUDA-core row tile), `--device GEN` the
#      profile without cuBLASLt (benches/gpu/predict/generated-only.json);
#   4. PyTorch eager; 5. ptxas resource usage of the row tiles' kernels;
#   6. compute-sanitizer memcheck and racecheck on small cases; 7. with EXAMPLES=1, the GPU
#      test of every case and capped example (TORCH=0 leaves step 4 out).
set -uo pipefail
G="${G:-.gpu-rowmma}"
S=/tmp/rowmma
rm -rf "$S" && mkdir -p "$S/bench"
rm -rf /tmp/rowmma-cache && cp -r "$G/cache" /tmp/rowmma-cache 2>/dev/null
export EQFUSE_CACHE_DIR=/tmp/rowmma-cache EQFUSE_REQUIRE_GPU=1
export EQFUSE_NVRTC_DIR=/usr/local/cuda/lib64 LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
GEN="$G/repo/benches/gpu/predict/generated-only.json"
P="$G/repo/benches/gpu/predict"
pack() { tar czf "$OUT/rowmma.tgz" -C /tmp rowmma; }
t0=$SECONDS
step() { echo "== $1 ($((SECONDS - t0)) s)"; }
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "commit: $(cat $G/COMMIT)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  echo "nvrtc: $(ls /usr/local/cuda/lib64/libnvrtc.so.* | tr '\n' ' '); prefilled PTX: $(ls /tmp/rowmma-cache | wc -l)"
} > "$S/device.txt"
cat "$S/device.txt"
step tests
(cd "$G/repo" && timeout 60 ../gpu-tests tensor_core_row gemm_implementations --nocapture) > "$S/tests.txt" 2>&1
echo "tests exit $?"; grep -E "^test |test result|ok: |panicked" "$S/tests.txt"
pack
step run
for d in "M=4096 K=1024 N=128" "M=1024 K=1024 N=100" "M=64 K=128 N=10"; do
  args=$(for v in $d; do printf -- "--dim %s " "$v"; done)
  timeout 40 "$G/eqfuse" run "$P/softmax_regression_bf16.eqf" $args --device "$GEN" --outputs /tmp/rowmma-out >> "$S/run.txt" 2>&1
  echo "run $d exit $?" | tee -a "$S/run.txt"
done
pack
step probes
mkdir -p "$S/probes"
while read -r tag bin prog args; do
  [ -z "$tag" ] && continue
  timeout 40 "$G/eqfuse-$bin" run "$P/$prog" $args --device "$GEN" --outputs /tmp/rowmma-out > "$S/probes/$tag.txt" 2>&1
  echo "$tag exit $? ($((SECONDS - t0)) s): $(grep -E '^ +gemm' "$S/probes/$tag.txt" | tr -s ' ')"
done < "$G/sweeps.txt"
pack
step bench
while read -r tag bin prog args; do
  [ -z "$tag" ] && continue
  args="${args//GEN/$GEN}"
  timeout 40 "$G/eqfuse-$bin" bench "$P/$prog" $args --json "$S/bench/$tag.json" > "$S/bench/$tag.txt" 2>&1
  echo "$tag exit $? ($((SECONDS - t0)) s): $(grep -E '│ ' "$S/bench/$tag.txt" | tail -1 | tr -s ' ')"
done < "$G/programs.txt"
pack
if [ "${TORCH:-1}" = 1 ]; then
  step torch
  timeout 60 python3 "$P/softmax_regression_torch.py" 4096,1024,128 1024,1024,100 64,128,10 > "$S/torch.txt" 2>&1
  echo "torch exit $?"; cat "$S/torch.txt"
  pack
fi
step ptxas
for n in 16 32 64 128 256; do
  rm -rf /tmp/cg && "$G/eqfuse" codegen "$P/softmax_regression_bf16.eqf" --dim M=4096 --dim K=1024 --dim N=$n --device "$GEN" -o /tmp/cg > /dev/null 2>&1
  f=$(ls /tmp/cg/*.cu | head -1); cp "$f" "$S/n$n.cu"
  nvcc -arch=sm_90 -cubin -o /tmp/cg/k.cubin -Xptxas -v "$f" > "$S/ptxas-n$n.txt" 2>&1
  echo "N=$n: $(grep -E 'registers|spill' "$S/ptxas-n$n.txt" | tr -s ' ' | tr '\n' ' ')"
done
pack
step sanitizer
for d in "M=64 K=128 N=10" "M=130 K=96 N=200"; do
  args=$(for v in $d; do printf -- "--dim %s " "$v"; done)
  timeout 60 compute-sanitizer --tool memcheck "$G/eqfuse" run "$P/softmax_regression_bf16.eqf" $args --device "$GEN" --repeat 1 --outputs /tmp/rowmma-out > "$S/memcheck-${d// /_}.txt" 2>&1
  echo "memcheck $d exit $?: $(grep -E 'ERROR SUMMARY' "$S/memcheck-${d// /_}.txt")"
done
timeout 60 compute-sanitizer --tool racecheck "$G/eqfuse" run "$P/softmax_regression_bf16.eqf" --dim M=100 --dim K=72 --dim N=20 --device "$GEN" --repeat 1 --outputs /tmp/rowmma-out > "$S/racecheck.txt" 2>&1
echo "racecheck exit $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$S/racecheck.txt")"
pack
if [ "${EXAMPLES:-0}" = 1 ]; then
  step examples
  (cd "$G/repo" && timeout 70 ../gpu-tests cases_and_examples --nocapture) > "$S/examples.txt" 2>&1
  echo "examples exit $?"; grep -E "^test |test result|MISMATCH|ERROR|panicked|ran " "$S/examples.txt"
  pack
fi
step done
