#!/usr/bin/env python3
"""Takes the figures at the given JSON paths from a profile `eqfuse calibrate` wrote into
another profile (the committed one), leaving every other figure as it is, and appends to its
`source` which figures came from where. Deterministic: the same inputs give the same file.

Usage: merge_profile.py BASE.json CALIBRATED.json OUT.json "where" PATH [PATH ...]
  PATH: dot-separated keys, e.g. templates.rowreduce.stage_latency_us
"""
import json
import sys

base_path, cal_path, out_path, where, *paths = sys.argv[1:]
base = json.load(open(base_path))
cal = json.load(open(cal_path))
for path in paths:
    keys = path.split(".")
    src, dst = cal, base
    for k in keys[:-1]:
        src, dst = src[k], dst.setdefault(k, {})
    dst[keys[-1]] = src[keys[-1]]
base["source"] = base["source"].rstrip(".") + f"; {', '.join(paths)} measured by `eqfuse calibrate` {where}"
with open(out_path, "w") as f:
    f.write(json.dumps(base, indent=2) + "\n")
