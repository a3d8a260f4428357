#!/usr/bin/env python3
# Predicted against measured for the tensor-core row-tile session (benches/gpu/rowmma.sh).
# For each probe of rowmma-sweeps.txt (one generated gemm kernel, measured by `eqfuse run`):
# the kernel's time by the profile's tile rate (profiles/h100.json tiles_mma; launch overhead +
# max(bytes at the generated gemm's bandwidth, K steps + row epilogue per wave), as
# src/profile.rs times it) and, where the planner would now plan the program otherwise, its
# plan (benches/gpu/predict/generated-only.json); for the batched tails probe, the planner's time of
# its one kernel. Usage, from the repository root:
#   rowmma_predicted.py RESULTS_DIR
import json, re, subprocess, sys
R = sys.argv[1]
P = "benches/gpu/predict"
prof = json.load(open("profiles/h100.json"))
gen = prof["templates"]["gemm"]["implementations"]["generated"]
L, S = prof["launch_overhead_us"], prof["sm_count"]
bw = prof["copy_bandwidth_gbs"] * 1e3 * gen["bandwidth_efficiency"]  # bytes per us

def measured(tag):
    txt = open(f"{R}/probes/{tag}.txt").read()
    m = re.search(r"^\s+gemm_\w+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+) (\w+)", txt, re.M)
    unit = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(4)]
    return float(m.group(2)), float(m.group(3)) * unit

def tile(m, k, n, prog):
    """The tile and staging codegen picks (src/codegen/gemm.rs), for these probe programs."""
    rows = prog.startswith("softmax")
    bn = max(16, 1 << (n - 1).bit_length())
    if rows:
        bm = 64 if bn <= 16 else 32
    elif n <= 64 and -(-m // 128) >= 128:
        bm = 128
    else:
        bm, bn = 64, 128
    wide = k % 8 == 0 and n % 8 == 0
    return bm, bn, rows, wide

def model(m, k, n, prog, nbytes):
    bm, bn, rows, wide = tile(m, k, n, prog)
    key = f"{bm}x{bn}" + ("" if wide else "/e")
    r = gen["tiles_mma"].get(key)
    if r is None:
        return None, key
    b = -(-m // bm) * -(-n // bn)
    us = 1e-3 * k * max(r["lone_ns_per_k"], b / S * r["sm_ns_per_k"]) + (r["row_epilogue_us"] * -(-b // S) if rows else 0)
    return L + max(nbytes / bw, us), key

def plan(prog, args):
    out = subprocess.run(["target/release/eqfuse", "optimize", f"{P}/{prog}", *args, "--device",
                          f"{P}/generated-only.json", "--format", "json"], capture_output=True, text=True, check=True)
    d = json.loads(out.stdout)
    return len(d["kernels"]), d["total"]["predicted_us"]

print("| probe | M x K x N | tile | measured us | model us | error | planner's plan now |")
print("|---|---|---|---|---|---|---|")
for line in open(f"{P}/rowmma-sweeps.txt"):
    tag, _, prog, *args = line.split()
    dims = dict(a.split("=") for a in args if "=" in a)
    if not dims:
        dims = {k: int(v) for k, v in re.findall(r"dim (\w) = (\d+)", open(f"{P}/{prog}").read())}
    m, k, n = int(dims["M"]), int(dims["K"]), int(dims["N"])
    meas, nbytes = measured(tag)
    pred, key = model(m, k, n, prog, nbytes)
    kernels, planned = plan(prog, args)
    other = "" if kernels == 1 else f"{kernels} kernels, {planned:.1f} us"
    if "Z" in dims:  # a batched product (the tails probe): the planner's own time of its kernel
        pred, key = planned, "batched"
    err = "" if pred is None else f"{100 * (pred - meas) / meas:+.0f}%"
    print(f"| {tag} | {m} x {k} x {n} | {key} | {meas:.1f} | {'' if pred is None else f'{pred:.1f}'} | {err} | {other} |")
