#!/usr/bin/env python3
"""The eqfuse torch.compile backend running its own kernels, against eager and Inductor, once.

A layernorm + GELU + residual function (`python/tests/test_runtime.py`'s) at ROWSxCOLS f32 is run
by PyTorch eager, `torch.compile(backend=EqfuseBackend())` (eqfuse's generated kernels launched
from Python through CuPy) and `torch.compile()` (Inductor). Each is checked against eager
(max abs error), then timed: warm-up (compile time excluded), CUDA events around each call, the L2
cache flushed before every timed call by writing a buffer larger than L2, median of REPS calls.
The eqfuse time includes the Python launch path (argument mapping, then a CUDA graph replayed,
or with EQFUSE_CUDA_GRAPH=0 torch allocations and CuPy launches kernel by kernel): that is what a
user of the backend gets. `eqfuse_launches` counts graph captures and replays.

Usage: python3 benches/py_backend_speed.py [--rows 16384 --cols 4096 --reps 50] [--json OUT]
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from eqfuse_torch.backend import EqfuseBackend  # noqa: E402


def f(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)) + x


def median_us(fn, args, reps):
    flush = torch.empty(256 * 1024 * 1024 // 4, device="cuda")
    with torch.no_grad():
        for _ in range(5):
            fn(*args)
        ts = []
        for _ in range(reps):
            flush.fill_(1.0)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn(*args)
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.manual_seed(0)
    x = torch.randn(a.rows, a.cols, device="cuda")
    w, b = torch.randn(a.cols, device="cuda"), torch.randn(a.cols, device="cuda")
    backend = EqfuseBackend(report=print)
    runs = {"eager": f, "eqfuse": torch.compile(f, backend=backend), "inductor": torch.compile(f)}
    with torch.no_grad():
        want = f(x, w, b)
        res = {"rows": a.rows, "cols": a.cols, "device": torch.cuda.get_device_name(), "torch": torch.__version__}
        for name, fn in runs.items():
            got = fn(x, w, b)
            torch.cuda.synchronize()
            res[name] = {"max_abs_err_vs_eager": float((got - want).abs().max()), "median_us": median_us(fn, (x, w, b), a.reps)}
    res["eqfuse_runs"] = [p.runs for p in backend.plans]
    res["eqfuse_why_eager"] = [p.why_eager for p in backend.plans]
    res["eqfuse_plan_kernels"] = [p.plan["total"]["kernels"] if p.plan else None for p in backend.plans]
    res["eqfuse_launches"] = [dict(p.launches) if p.launches is not None else None for p in backend.plans]
    res["bytes_floor"] = 2 * a.rows * a.cols * 4 + 2 * a.cols * 4
    for name in runs:
        res[name]["GBps_of_floor"] = res["bytes_floor"] / (res[name]["median_us"] * 1e-6) / 1e9
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    ok = res["eqfuse_runs"] == ["eqfuse"] and res["eqfuse"]["max_abs_err_vs_eager"] < 1e-4
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
