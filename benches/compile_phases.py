"""Where the eqfuse backend's compile time goes, without a GPU: for the models of `models.py`,
forward or a training step, the captured graphs' export, `eqfuse optimize`, `eqfuse codegen` and
NVRTC compiles of the generated kernels, each timed.

    eval "$(.ci/install-nvrtc)"        # NVRTC for the compile phase (no GPU needed)
    EQFUSE=target/release/eqfuse python3 benches/compile_phases.py --models gpt2,bert,llama [--train]
        [--batch 2 --seq 128] [--dtype bf16] [--workers N] [--cupy] [--json OUT]

The models are traced on the CPU at a small batch (planning and code generation depend on the
graph, not on its sizes); the backend plans without running (`execute=False`). Per graph: its
operators, the export, the planning, then `eqfuse codegen` into a folder, and NVRTC compiles of its
kernels' distinct canonical sources (`runtime.canonical_source`, the backend's own dedup; sources
seen in an earlier graph of the same model are compiled once, as the backend's process does):
serial, and in `--workers` threads (NVRTC releases the GIL, as CuPy's compile does); with `--cupy`
(on the GPU machine) through CuPy as the backend compiles, serial and by `runtime.compile_all`.
`tracing_s` is the first call's time less the export and planning (Dynamo and AOTAutograd, and
the eager run).

Per model, `before_s` adds what the backend did before 2026-11-26 on the compile path (export,
`eqfuse optimize` and `eqfuse codegen` of each graph it runs, the joint graph's export and
`optimize`, serial compiles) and `after_s` what it does now (export, `codegen` alone, the joint
graph's export only: its planning runs on a thread meanwhile, and the threaded compile, which
on a machine with fewer free cores than `--workers` is `nvrtc_bound_s`: the longest compile, or
the serial time over the workers, whichever is larger).
"""

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benches"))

import eqfuse_torch.backend as backend_mod  # noqa: E402
import eqfuse_torch.export as export_mod  # noqa: E402
from eqfuse_torch.backend import EqfuseBackend, find_eqfuse  # noqa: E402
from eqfuse_torch.runtime import canonical_source, compile_workers  # noqa: E402
from models import DTYPES, build, first  # noqa: E402


class CupyCompile:
    """Compiles as the backend does, through CuPy (`runtime._compile`, `runtime.compile_all`); a
    `#define` naming the run keeps CuPy's caches (in memory and on disk) from answering."""

    def __init__(self, arch: str, workers: int):
        import cupy

        from eqfuse_torch import runtime

        self.cp, self.runtime, self.arch, self.workers, self.run = cupy, runtime, arch, workers, 0
        self.lib = True

    def _mark(self, sources):
        self.run += 1
        return [f"#define EQ_COMPILE_PHASES_RUN {self.run}\n{c}" for c in sources]

    def serial(self, sources) -> list[float]:
        times = []
        for c in self._mark(sources):
            t0 = time.perf_counter()
            self.runtime._compile(self.cp, c, "EQK", self.arch, torch.cuda.current_device())
            times.append(time.perf_counter() - t0)
        return times

    def threaded(self, sources) -> float:
        marked = {f"k{i}": c for i, c in enumerate(self._mark(sources))}
        t0 = time.perf_counter()
        self.runtime.compile_all(self.cp, marked, self.arch, torch.cuda.current_device(), workers=self.workers)
        return time.perf_counter() - t0


class Nvrtc:
    """NVRTC through ctypes: `compile(source)` -> seconds (raises on a compile error)."""

    def __init__(self, arch: str):
        self.arch = arch.encode()
        self.lib = None
        for name in ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"):
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue

    def serial(self, sources) -> list[float]:
        return [self.compile(c) for c in sources]

    def threaded(self, sources, workers) -> float:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(self.compile, sources))
        return time.perf_counter() - t0

    def compile(self, source: str) -> float:
        lib = self.lib
        prog = ctypes.c_void_p()
        t0 = time.perf_counter()
        if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None, None) != 0:
            raise RuntimeError("nvrtcCreateProgram failed")
        opts = (ctypes.c_char_p * 1)(b"--gpu-architecture=" + self.arch)
        status = lib.nvrtcCompileProgram(prog, 1, opts)
        if status == 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetCUBIN(prog, buf)
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        if status != 0:
            raise RuntimeError(f"NVRTC error {status}")
        return time.perf_counter() - t0


def capture(name, args):
    """Traces model `name` through the backend (plans only); returns the records with each
    graph's export and planning seconds, and the first call's seconds."""
    model, kw = build(name, SimpleNamespace(batch=args.batch, seq=args.seq, llama_layers=args.llama_layers))
    model = model.to(DTYPES[args.dtype])
    kw = {k: (v.to(DTYPES[args.dtype]) if v.is_floating_point() else v) if isinstance(v, torch.Tensor) else v
          for k, v in kw.items()}
    model.train(args.train)
    timings = []
    real_export, real_plan = export_mod.export_graph_module, backend_mod.plan_graph

    by_graph = {}

    def export(*a, **k):
        t0 = time.perf_counter()
        out = real_export(*a, **k)
        timings.append({"export_s": time.perf_counter() - t0})
        by_graph[id(out.graph)] = timings[-1]
        return out

    def plan(graph, **k):  # (the joint graph's on a thread, while the next graph exports)
        t0 = time.perf_counter()
        out = real_plan(graph, **k)
        by_graph[id(graph)]["optimize_s"] = time.perf_counter() - t0
        return out

    export_mod.export_graph_module, backend_mod.plan_graph = export, plan
    try:
        torch._dynamo.reset()
        backend = EqfuseBackend(report=None, execute=False, joint=args.joint)
        compiled = torch.compile(model, backend=backend, dynamic=False)
        t0 = time.perf_counter()
        if args.train:
            first(compiled(**kw)).float().mean().backward()
        else:
            with torch.no_grad():
                first(compiled(**kw))
        total = time.perf_counter() - t0
        plans = backend.plans  # (waits for the joint graph's)
    finally:
        export_mod.export_graph_module, backend_mod.plan_graph = real_export, real_plan
    return plans, timings, total


def codegen(graph, exe, device):
    """`eqfuse codegen` of `graph`: (seconds, [(kernel name, source)])."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "graph.json").write_text(json.dumps(graph))
        t0 = time.perf_counter()
        r = subprocess.run([exe, "codegen", str(d / "graph.json"), "-o", str(d / "k"), "--device", device],
                           capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
        manifest = json.loads((d / "k" / "launch.json").read_text())
        sources = [(k["name"], (d / "k" / k["file"]).read_text()) for k in manifest["kernels"] if k.get("file")]
    return seconds, sources


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2,bert,llama")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--llama-layers", type=int, default=4)
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--no-joint", dest="joint", action="store_false", help="don't plan the joint graph")
    ap.add_argument("--workers", type=int, default=compile_workers(), help="compile threads (default: as the backend)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--device", default="h100")
    ap.add_argument("--cupy", action="store_true", help="compile through CuPy, as the backend does (needs a GPU)")
    ap.add_argument("--json", help="append one JSON record per model")
    args = ap.parse_args()
    exe = find_eqfuse()
    nvrtc = CupyCompile(args.arch, args.workers) if args.cupy else Nvrtc(args.arch)
    for name in args.models.split(","):
        plans, timings, total = capture(name, args)
        rec = {"model": name, "dtype": args.dtype, "train": args.train, "first_call_s": round(total, 2), "graphs": []}
        seen = set()
        for p, t in zip(plans, timings):
            g = {"kind": p.kind, "operators": len(p.graph["nodes"]) if p.graph else None,
                 "kernels": p.plan["total"]["kernels"] if p.plan else None, **{k: round(v, 2) for k, v in t.items()}}
            if p.plan is not None and p.kind != "joint":
                g["codegen_s"], sources = codegen(p.graph, exe, args.device)
                g["codegen_s"] = round(g["codegen_s"], 2)
                canon = []
                for kname, src in sources:
                    c = canonical_source(src, kname)
                    if c not in seen:
                        seen.add(c)
                        canon.append(c)
                g["sources"], g["distinct_new"] = len(sources), len(canon)
                if nvrtc.lib is not None and canon:
                    times = nvrtc.serial(canon)
                    g["nvrtc_serial_s"] = round(sum(times), 2)
                    g["nvrtc_median_s"] = round(statistics.median(times), 3)
                    g["nvrtc_max_s"] = round(max(times), 3)  # the least a parallel compile can take
                    g["nvrtc_bound_s"] = round(max(max(times), sum(times) / args.workers), 2)
                    threaded = nvrtc.threaded(canon) if args.cupy else nvrtc.threaded(canon, args.workers)
                    g[f"nvrtc_{args.workers}_threads_s"] = round(threaded, 2)
            elif p.plan is None:
                g["error"] = p.error
            rec["graphs"].append(g)
        rec["tracing_s"] = round(total - sum(t.get("export_s", 0) + t.get("optimize_s", 0) for t in timings), 2)
        parallel = "nvrtc_bound_s" if os.cpu_count() < args.workers else f"nvrtc_{args.workers}_threads_s"
        rec["before_s"] = round(sum(g.get("export_s", 0) + g.get("optimize_s", 0) + g.get("codegen_s", 0)
                                    + g.get("nvrtc_serial_s", 0) for g in rec["graphs"]), 2)
        rec["after_s"] = round(sum(g.get("export_s", 0) + (g.get("codegen_s", 0) + g.get(parallel, 0)
                                                           if g["kind"] != "joint" else 0) for g in rec["graphs"]), 2)
        print(json.dumps(rec), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
