#!/usr/bin/env bash
# The cost model's fidelity on programs nobody tuned it for, on the device machine:
# `bash .gpu/benches/gpu/fidelity.sh` after `benches/gpu/stage.sh fidelity` (benches/README.md),
# with `carry: [".gpu"]`. The staged folder holds random programs at the sizes models run at
# (`fidelity/gSEED.eqf`, written by `examples/gen_programs.rs`, each predicted to take at least
# 50 us on an H100) and the NVRTC cache of their kernels (`fidelity-cache.tar.xz`, unpacked into
# the staged cache first). `eqfuse bench` runs them in batches of BATCH (default 10) programs,
# each batch under BATCH_TIMEOUT seconds (default 90); a batch that fails (a program the bench
# rejects or one that runs out of time) is run again one program at a time, so that one
# program costs only itself. No batch starts after BUDGET seconds (default 500), so that the run
# fits one 10-minute device call; FIRST and COUNT (default: all) pick a slice of the programs
# (sorted by seed) for a run split over several calls. Every fused plan is checked against the
# CPU reference by `eqfuse bench` itself (there is no way to skip it). DEVICE: the profile
# (default h100; the programs' saved plans are for the profile gen_programs was given).
# Writes $OUT/fidelity.tgz (fidelity/: bench-*.json, bench-*.txt, run.log); analyse it here with
# `python3 benches/fidelity.py UNPACKED/fidelity --programs PROGRAMS_DIR`.
set -uo pipefail
PARTS=""
source "$(dirname "$0")/device-env.sh"
P="${PROGRAMS_DIR:-$G/fidelity}"
BATCH="${BATCH:-10}" BATCH_TIMEOUT="${BATCH_TIMEOUT:-90}" BUDGET="${BUDGET:-500}"
S=/tmp/fidelity
rm -rf "$S" && mkdir -p "$S" && cp "$OUT/device.txt" "$S/"
[ -d "$P" ] || { echo "no programs in $P: stage them with benches/gpu/stage.sh fidelity"; exit 2; }
if [ -f "$G/fidelity-cache.tar.xz" ]; then
  mkdir -p "$EQFUSE_CACHE_DIR" && tar xJf "$G/fidelity-cache.tar.xz" -C "$EQFUSE_CACHE_DIR"
  echo "NVRTC cache: $(ls "$EQFUSE_CACHE_DIR" | wc -l) kernels ($((SECONDS - t0)) s)"
fi
mapfile -t all < <(ls "$P"/g*.eqf | sort -V)
progs=("${all[@]:${FIRST:-0}:${COUNT:-${#all[@]}}}")
echo "${#progs[@]} of ${#all[@]} programs from $P, batches of $BATCH" | tee "$S/run.log"
bench() { # JSON-NAME TIMEOUT PROGRAM...
  local name="$1" limit="$2"; shift 2
  timeout "$limit" "$G/eqfuse" bench --device "${DEVICE:-h100}" "$@" --json "$S/$name.json" > "$S/$name.txt" 2>&1
}
for ((i = 0; i < ${#progs[@]}; i += BATCH)); do
  if ((SECONDS - t0 > BUDGET)); then
    echo "budget of $BUDGET s spent: stopped before program $i (FIRST=$((${FIRST:-0} + i)) resumes)" | tee -a "$S/run.log"
    break
  fi
  batch=("${progs[@]:i:BATCH}")
  tag="$(printf 'bench-%04d' $((${FIRST:-0} + i)))"
  bench "$tag" "$BATCH_TIMEOUT" "${batch[@]}"
  rc=$?
  echo "$tag: ${#batch[@]} programs, exit $rc ($((SECONDS - t0)) s)" | tee -a "$S/run.log"
  if [ "$rc" != 0 ]; then
    tail -3 "$S/$tag.txt" | tee -a "$S/run.log"
    rm -f "$S/$tag.json"
    for p in "${batch[@]}"; do
      one="bench-$(basename "$p" .eqf)"
      bench "$one" 30 "$p"
      rc=$?
      echo "  $one: exit $rc ($((SECONDS - t0)) s)$( [ $rc != 0 ] && echo ": $(tail -1 "$S/$one.txt")")" | tee -a "$S/run.log"
    done
  fi
done
grep -h "rank correlation" "$S"/bench-*.txt | head -3
tar czf "$OUT/fidelity.tgz" -C /tmp fidelity
step done
