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

`--overhead` (no GPU needed): the backend's own Python per call, in the steady state, on a GPT-2
training step's graphs (`transformers`, random weights: LAYERS blocks of a small width, since the
Python work is per tensor, not per element). The graphs are exported as the backend exports them;
`plan_graph` and the kernels are stubbed: each plan is a `LaunchPlan` with no kernels (its outputs
zeroed once) replayed by `GraphedLaunch` through `NullGraphs`, a stand-in for CUDA graphs whose
replay does nothing. After warm-up steps (graphs captured), REPS/10 training steps (SGD, gradients set to None):
`in_steps_us`, the median time of each graph's calls within them; then each compiled graph is
called again with its last step's arguments, results dropped: microseconds per call of the
whole path (`runner_us`, `backend._Runner`: arguments mapped, outputs cast, padded, relaid and
viewed) and of `GraphedLaunch` alone (`graphed_launch_us`: signature, input keys, output set,
copies, replay, results), medians of REPS calls;
`--profile` prints the cProfile of the training steps (forward and backward), and of the
largest backward's calls alone.

Usage: python3 benches/py_backend_speed.py --overhead [--layers 12 --reps 200] [--profile] [--json OUT]
"""

import argparse
import json
import sys
import time
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


class NullGraphs:
    """`runtime.CudaGraphs` without a device: the capture launches once (so that the first
    replay's outputs are the reference's), a replay does nothing."""

    def reference(self, fn):
        return fn()

    def capture(self, env, launch):
        launch(env)
        return lambda: None

    def before_replay(self):
        pass

    def synchronize(self):
        pass

    def recover(self):
        pass


def null_plan(graph: dict):
    """A `LaunchPlan` of `graph`'s inputs and outputs whose one "kernel" zeroes the outputs,
    replayed by `GraphedLaunch` through `NullGraphs`."""
    from eqfuse_torch.runtime import GraphedLaunch, LaunchPlan

    inputs = {i["name"]: (i["dtype"], tuple(i["shape"])) for i in graph["inputs"]}
    outs = [o["name"] for o in graph["outputs"]]

    def arg(name, role, dtype, shape):
        return {"name": name, "role": role, "dtype": dtype, "shape": list(shape), "bytes": 0}

    written = [o for o in dict.fromkeys(outs) if o not in inputs]
    manifest = {
        "inputs": [[n, f"{d}[{','.join(map(str, s))}]"] for n, (d, s) in inputs.items()],
        "outputs": [[o, o] for o in outs],
        "kernels": [{"name": "k0", "args": [arg(n, "read", *inputs[n]) for n in inputs]
                     + [arg(o, "write", *graph_output_type(graph, o)) for o in written]}],
    }

    class NullKernels(LaunchPlan):
        def launch(self, env):
            for o in written:
                env[o].zero_()

    plan = NullKernels(manifest, torch.device("cpu"))
    plan.graphed = GraphedLaunch(plan, manifest["kernels"], NullGraphs())
    return plan


OUTPUT_TYPES: dict = {}
"""id(graph JSON) -> {output name: (dtype, shape)}, recorded by `record_output_types`."""


def record_output_types() -> None:
    """Makes every exported graph leave its outputs' types (the graph JSON has none) in `OUTPUT_TYPES`."""
    from eqfuse_torch.graph import GraphBuilder

    to_json = GraphBuilder.to_json

    def recorded(self):
        graph = to_json(self)
        OUTPUT_TYPES[id(graph)] = {o["name"]: self.types[o["node"]] for o in self.outputs}
        return graph

    GraphBuilder.to_json = recorded


def graph_output_type(graph: dict, name: str):
    return OUTPUT_TYPES[id(graph)][name]


def overhead(a) -> int:
    import cProfile
    import pstats
    import warnings

    import transformers

    import eqfuse_torch.backend as backend_mod
    from eqfuse_torch.backend import EqfuseBackend

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=a.layers, n_embd=64, n_head=4, n_positions=64, vocab_size=128,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                                  attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(cfg).to(torch.bfloat16).train()
    ids = torch.randint(1, 128, (2, 16))
    fake_plan = {"total": {}, "unfused": {}, "kernels": []}
    backend_mod.plan_graph = lambda graph, **kw: fake_plan
    runners = []  # (kind, runner, last args)

    def build(self, graph, example_inputs):
        return null_plan(graph)

    def compile_graph(self, kind, aten_gm, example_inputs, constants=None, _compile=EqfuseBackend.compile):
        runner = _compile(self, kind, aten_gm, example_inputs, constants)
        entry = [kind, runner, None, []]
        runners.append(entry)

        def call(*args):
            entry[2] = args
            t0 = time.perf_counter()
            out = runner(*args)
            entry[3].append((time.perf_counter() - t0) * 1e6)
            return out

        return call

    record_output_types()
    EqfuseBackend._build = build
    EqfuseBackend.compile = compile_graph
    backend = EqfuseBackend(report=None, joint=False, verify=False)
    run = torch.compile(model, backend=backend, dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(8):
            loss = run(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for entry in runners:
            entry[3].clear()
        t0 = time.perf_counter()
        steps = max(a.reps // 10, 5)
        prof = cProfile.Profile() if a.profile else None
        for _ in range(steps):
            if prof is not None:
                prof.enable()
            loss = run(input_ids=ids, labels=ids).loss
            loss.backward()
            if prof is not None:
                prof.disable()
            opt.step()
            opt.zero_grad(set_to_none=True)
        step_us = (time.perf_counter() - t0) / steps * 1e6
    if prof is not None:
        print("training steps (forward and backward):")
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    res = {"layers": a.layers, "torch": torch.__version__, "train_step_us": step_us, "graphs": []}
    assert [p.runs for p in backend.plans] == ["eqfuse"] * len(backend.plans), [p.why_eager for p in backend.plans]
    biggest = max((r for k, r, _, _ in runners if k == "backward"), key=lambda r: len(r.plan.inputs), default=None)
    for kind, runner, args, in_steps in runners:
        plan = runner.plan
        inputs = {}

        def launch_only():
            plan(inputs)

        with torch.no_grad():
            run_us = median_call_us(lambda: runner(*args), a.reps)
            # The inputs `_Runner` gives the plan, then the plan alone.
            inputs = runner.exported.arguments(args)
            launch_us = median_call_us(launch_only, a.reps)
        stats = dict(plan.stats)
        res["graphs"].append({"kind": kind, "args": len(args), "plan_inputs": len(plan.inputs),
                              "plan_outputs": len(plan.outputs), "outputs": len(runner.outputs),
                              "in_steps_us": sorted(in_steps)[len(in_steps) // 2], "in_steps_all_us": [round(t) for t in in_steps],
                              "runner_us": run_us, "graphed_launch_us": launch_us, "stats": stats})
        if a.profile and runner is biggest:
            print(f"the backward alone ({len(plan.inputs)} inputs, {len(plan.outputs)} outputs):")
            prof = cProfile.Profile()
            with torch.no_grad():
                prof.enable()
                for _ in range(a.reps):
                    runner(*args)
                prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


def median_call_us(fn, reps: int) -> float:
    for _ in range(5):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json")
    ap.add_argument("--overhead", action="store_true")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    if a.overhead:
        return overhead(a)
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
