#!/usr/bin/env python3
"""Fits a profile's two latencies from benches of probe programs planned with that profile at
both latencies 0 (and cuBLASLt priced out, so that each split probe is one generated gemm), so
that the fits answer to the profile's own launch overhead and tile step times (a calibrated
profile's launch overhead, measured back to back, is shorter than a kernel timed between
events after an L2 flush as `eqfuse bench` times it):

- `templates.rowreduce.stage_latency_us`: least squares through the origin of each stage probe's
  time less its predicted time against its stages (benches/gpu/stage/stagesN_*.eqf: one row
  kernel of N dependent reductions, the model's count, over 4 MiB);
- `templates.gemm.implementations.generated.split_latency_us`: the mean of each split probe's
  time less its predicted time (benches/gpu/split/*.eqf: one generated f32 gemm kernel split
  along K; f32 only, whose tile step times calibrate fits within a few percent).

Appends the figures' origin to the profile's `source`.

Usage: fit_latencies.py STAGE_BENCH.json SPLIT_BENCH.json PROFILE_IN.json PROFILE_OUT.json "where"
"""
import json
import re
import sys

stage_path, split_path, in_path, out_path, where = sys.argv[1:]


def one_kernel(p, prefix):
    kernels = p["fused"]["per_kernel"]
    assert len(kernels) == 1 and kernels[0]["name"].startswith(prefix), p["program"]
    k = kernels[0]
    print(f"{p['program']}: measured {k['measured_us']:.2f} us, predicted {k['predicted_us']:.2f} us")
    return k["measured_us"] - k["predicted_us"]


num = den = 0.0
for p in json.load(open(stage_path))["programs"]:
    n = int(re.search(r"stages(\d+)_", p["program"]).group(1))
    num += n * one_kernel(p, "rowreduce_")
    den += n * n
stage = round(max(0.0, num / den), 2)
split_res = [one_kernel(p, "gemm_") for p in json.load(open(split_path))["programs"]]
split = round(max(0.0, sum(split_res) / len(split_res)), 2)
print(f"stage latency {stage} us, split latency {split} us")
profile = json.load(open(in_path))
profile["templates"]["rowreduce"]["stage_latency_us"] = stage
profile["templates"]["gemm"]["implementations"]["generated"]["split_latency_us"] = split
profile["source"] = profile["source"].rstrip(".") + (
    "; templates.rowreduce.stage_latency_us and templates.gemm.implementations.generated."
    "split_latency_us fitted by benches/gpu/fit_latencies.py to probes (benches/gpu/stage, "
    f"benches/gpu/split) timed against this profile {where}"
)
with open(out_path, "w") as f:
    f.write(json.dumps(profile, indent=2) + "\n")
