"""Where a model's time goes under the eqfuse backend: each kernel's measured time (torch
profiler, CUDA activity, kernels launched one by one) beside the plan's prediction for it, and
Inductor's kernels for the same model, in one process on one GPU.

    python3 benches/profile_model.py --model gpt2 [--dtype bf16] [--batch 8 --seq 1024] [--top 25]

Models as in benches/models.py. eqfuse's kernels are named `<template>_<dtype>_k<ID>_g<N>` after the
plan kernel they run (`EQFUSE_KERNEL_NAMES=1`); cuBLASLt-planned products show as PyTorch's gemm kernels.
"""

import argparse
import collections
import os
import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benches"))

from eqfuse_torch.backend import EqfuseBackend  # noqa: E402
from models import DTYPES, build, first  # noqa: E402


def kernel_times(fn, reps=3):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times = collections.defaultdict(float)
    counts = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name] += e.device_time / reps
            counts[e.name] += 1
    return times, {k: c // reps for k, c in counts.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--llama-layers", type=int, default=4)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--train", action="store_true")
    args = ap.parse_args()
    os.environ["EQFUSE_CUDA_GRAPH"] = "0"
    # Each kernel compiled under its own name (`_k<ID>`), not shared by canonical source, so
    # that the profile maps every launch to its plan kernel.
    os.environ["EQFUSE_KERNEL_NAMES"] = "1"
    model, kw = build(args.model, args)
    model = model.cuda().to(DTYPES[args.dtype]).train(args.train)
    kw = {k: (v.cuda().to(DTYPES[args.dtype]) if v.is_floating_point() else v.cuda()) if isinstance(v, torch.Tensor)
          else v for k, v in kw.items()}
    for mode in ("eqfuse", "inductor"):
        torch._dynamo.reset()
        backend = EqfuseBackend(report=None) if mode == "eqfuse" else "inductor"
        compiled = torch.compile(model, backend=backend, dynamic=False)

        def step():
            if not args.train:
                with torch.no_grad():
                    return first(compiled(**kw))
            out = first(compiled(**kw))
            out.float().square().mean().backward()
            return out

        times, counts = kernel_times(step)
        total = sum(times.values())
        print(f"== {mode}: {total:.0f} us of kernels, {sum(counts.values())} launches")
        # Kernels are named `<template>_<dtype>_k<ID>_g<N>`: plan kernel ID of the N-th runner
        # built, runners built in the order the backend planned the graphs that run.
        predicted = {}
        if mode == "eqfuse":
            ran = [p for p in backend.plans if p.plan is not None and p.kind != "joint"]
            for n, p in enumerate(ran):
                for k in p.plan["kernels"]:
                    predicted[(k["id"], n)] = (k["predicted_us"], k["template"], " ".join(k["ops"])[:60])
            print(f"   predicted {sum(v[0] for v in predicted.values()):.0f} us over {len(predicted)} kernels")
        by_kind = collections.defaultdict(lambda: [0.0, 0.0, 0])
        for name, t in sorted(times.items(), key=lambda kv: -kv[1])[: args.top]:
            m = re.search(r"_k(\d+)_g(\d+)$", name)
            pred = predicted.get((int(m.group(1)), int(m.group(2)))) if m else None
            extra = f"  predicted {pred[0]:8.1f}  {pred[1]} [{pred[2]}]" if pred else ""
            print(f"{t:9.1f} us x{counts[name]:<3} {name[:70]}{extra}")
        for name, t in times.items():
            m = re.search(r"^([a-z]+)_.*_k(\d+)_g(\d+)$", name)
            kind = m.group(1) if m else "other (gemm libraries, torch ops)"
            by_kind[kind][0] += t
            by_kind[kind][2] += counts[name]
            key = (int(m.group(2)), int(m.group(3))) if m else None
            if key in predicted:
                by_kind[kind][1] += predicted[key][0]
        for kind, (t, p, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
            print(f"   {kind:<36} {t:9.1f} us measured, {p:9.1f} predicted, {n} launches")


if __name__ == "__main__":
    main()
