#!/usr/bin/env bash
# Calibration, on the device machine: `bash .gpu/benches/gpu/calibrate.sh` after
# `benches/gpu/stage.sh` with any parts (benches/README.md). Steps (PARTS, default "calibrate"):
#   calibrate  `eqfuse calibrate`: copy bandwidth, launch overhead, template efficiencies and
#              every compute entry the planner reads (calibrated.json, calibrate.log); with MERGE
#              set (dot paths, e.g. "templates.rowreduce.stage_latency_us"), those figures are
#              merged into BASE (default profiles/h100.json) by merge_profile.py as profile.json;
#   fit        the row kernels' stage latency and the split-K latency fitted by
#              fit_latencies.py to the probes benches/gpu/stage/*.eqf and benches/gpu/split/*.eqf,
#              benched with BASE (or the step before's profile.json) at both latencies 0
#              (fit.log, profile.json).
# Every figure taken says where it came from in the profile's `source`. Review profile.json and
# copy it into profiles/ by hand. Writes under $OUT.
set -uo pipefail
PARTS="${PARTS:-calibrate}"
source "$(dirname "$0")/device-env.sh"
E="$G/eqfuse"
BASE="${BASE:-profiles/h100.json}"
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
WHERE="on $(date -u +%F) at commit $(cat "$G/COMMIT") ($GPU)"
if has calibrate; then
  step calibrate
  timeout "${CALIBRATE_TIMEOUT:-300}" "$E" calibrate -o "$OUT/calibrated.json" > "$OUT/calibrate.log" 2>&1
  echo "calibrate exit $?"; tail -30 "$OUT/calibrate.log"
  if [ -n "${MERGE:-}" ]; then
    python3 benches/gpu/merge_profile.py "$BASE" "$OUT/calibrated.json" "$OUT/profile.json" "$WHERE" $MERGE
    BASE="$OUT/profile.json"
  fi
fi
if has fit; then
  step fit
  python3 - "$BASE" /tmp/zero.json <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["templates"]["rowreduce"]["stage_latency_us"] = 0.0
p["templates"]["gemm"]["implementations"]["generated"]["split_latency_us"] = 0.0
p["templates"]["gemm"]["implementations"]["cublaslt"]["call_overhead_us"] = 1e6  # each split probe: one generated gemm
json.dump(p, open(sys.argv[2], "w"), indent=2)
PY
  {
    timeout 60 "$E" bench benches/gpu/stage/*.eqf --device /tmp/zero.json --json /tmp/stage.json
    timeout 60 "$E" bench benches/gpu/split/*.eqf --device /tmp/zero.json --json /tmp/split.json
    python3 benches/gpu/fit_latencies.py /tmp/stage.json /tmp/split.json "$BASE" "$OUT/profile.json" "$WHERE"
  } > "$OUT/fit.log" 2>&1
  echo "fit exit $?"; tail -3 "$OUT/fit.log"
fi
step done
