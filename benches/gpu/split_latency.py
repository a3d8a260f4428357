#!/usr/bin/env python3
"""Sets the generated gemm's split-K latency of a profile from a bench of the split-K probes
(benches/gpu/split/*.eqf, each one generated gemm kernel split along K) planned with that
profile at split latency 0: the mean over the probes of the fused kernel's measured time less
its predicted time. Appends the figure's origin to the profile's `source`.

Usage: split_latency.py BENCH.json PROFILE_IN.json PROFILE_OUT.json "where"
"""
import json
import sys

bench_path, in_path, out_path, where = sys.argv[1:]
bench = json.load(open(bench_path))
residuals = []
for p in bench["programs"]:
    kernels = p["fused"]["per_kernel"]
    assert len(kernels) == 1 and kernels[0]["name"].startswith("gemm_"), p["program"]
    k = kernels[0]
    residuals.append(k["measured_us"] - k["predicted_us"])
    print(f"{p['program']}: measured {k['measured_us']:.2f} us, predicted {k['predicted_us']:.2f} us")
latency = round(max(0.0, sum(residuals) / len(residuals)), 2)
print(f"split latency {latency} us (mean of {len(residuals)} residuals)")
profile = json.load(open(in_path))
profile["templates"]["gemm"]["implementations"]["generated"]["split_latency_us"] = latency
profile["source"] = profile["source"].rstrip(".") + (
    f"; templates.gemm.implementations.generated.split_latency_us: the mean residual of the split-K probes "
    f"(benches/gpu/split) against this profile's tiles, measured {where}"
)
with open(out_path, "w") as f:
    f.write(json.dumps(profile, indent=2) + "\n")
