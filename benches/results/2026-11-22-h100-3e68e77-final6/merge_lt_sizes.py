#!/usr/bin/env python3
"""Takes cuBLASLt's call overhead and rate by size from a profile `eqfuse calibrate` wrote into
another profile (the committed one), leaving every other figure as it is, and appends to its
`source` where they came from. Deterministic: the same inputs give the same file.

Usage: merge_lt_sizes.py BASE.json CALIBRATED.json OUT.json "where (commit, results folder)"
"""
import json
import sys

base_path, cal_path, out_path, where = sys.argv[1:5]
base = json.load(open(base_path))
cal = json.load(open(cal_path))
lt_base = base["templates"]["gemm"]["implementations"]["cublaslt"]
lt_cal = cal["templates"]["gemm"]["implementations"]["cublaslt"]
lt_base["rate_by_size"] = lt_cal["rate_by_size"]
lt_base["call_overhead_us"] = lt_cal["call_overhead_us"]
base["source"] = base["source"].rstrip(".") + (
    "; cuBLASLt's call overhead and its rates by size (rate_by_size: 512^3, 1024^3, 2048^3 and "
    f"4096^3 products, net of the call overhead) measured by `eqfuse calibrate` {where}"
)
with open(out_path, "w") as f:
    f.write(json.dumps(base, indent=2) + "\n")
