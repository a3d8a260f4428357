#!/usr/bin/env python3
"""A GPT-2 block from `transformers`, exported to eqfuse, run on the GPU, compared with PyTorch.

Two steps, so that the GPU machine only does GPU work:

    # here (CPU): build the block, export it, save its inputs and PyTorch's outputs, plan it
    python3 python/gpt2_block.py prepare --dir gpt2 [--batch 4 --seq 256 --embd 768 --heads 12]
        [--cpu-check]    # also evaluate the graph on eqfuse's CPU reference (`run --cpu`)

    # on the GPU machine: eqfuse run on the GPU, compare, count torch.compile's kernels
    python3 python/gpt2_block.py gpu --dir gpt2 --eqfuse PATH/eqfuse --out RESULTS_DIR

`prepare` writes into DIR: `graph.json` (the `eqfuse.graph/1` export of
`GPT2Block(GPT2Config(...))`, eval mode, random weights seeded, nothing downloaded),
`inputs/NAME.npy` (the activation `x` and every weight, named as the graph's inputs),
`torch/out0.npy` (PyTorch's output on the CPU, f32), `torch/block.pt` (the block's state), `plan.json` (`eqfuse optimize --format
json`) and `config.json` (the sizes and seed, so that the `gpu` step rebuilds the same block).

`gpu` runs `eqfuse run graph.json --inputs DIR/inputs --outputs ...` (eqfuse checks every output
against its own f64 CPU reference), compares eqfuse's output with PyTorch's (the CPU output
saved by `prepare`, and the same block run by PyTorch eager on the GPU), and counts the kernels
`torch.compile` launches for one call of the same block on the same GPU, after warm-up, with
`torch.profiler` (every CUDA kernel event of the call; memory copies and memsets are not kernels
and are counted apart). The bytes of torch.compile's kernels are read from Inductor's generated
code where Inductor annotates them (`kernel_bytes` from its Triton kernels' metadata when present),
and otherwise left out (null). It writes `gpt2.json` and `gpt2.md` into the results folder.

Tolerance: eqfuse's output passes when max |eqfuse - torch| <= ATOL + RTOL * |torch| holds for every
element, with ATOL = RTOL = 1e-3 by default (f32 products with K up to 3072 accumulate in a
different order than cuBLAS; TF32 is off on both sides).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def build_block(cfg: dict):
    import torch
    import transformers
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    torch.manual_seed(cfg["seed"])
    config = transformers.GPT2Config(n_embd=cfg["embd"], n_head=cfg["heads"], n_layer=1, n_positions=max(1024, cfg["seq"]),
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config._attn_implementation = cfg["attention"]
    block = GPT2Block(config).eval()
    x = torch.randn(cfg["batch"], cfg["seq"], cfg["embd"])
    return block, x


def first(y):
    return y[0] if isinstance(y, tuple) else y


def prepare(args) -> int:
    import numpy as np
    import torch
    from eqfuse_torch import export_program
    from eqfuse_torch.backend import find_eqfuse

    d = Path(args.dir)
    (d / "inputs").mkdir(parents=True, exist_ok=True)
    (d / "torch").mkdir(parents=True, exist_ok=True)
    cfg = {"batch": args.batch, "seq": args.seq, "embd": args.embd, "heads": args.heads, "seed": args.seed,
           "attention": args.attention}
    block, x = build_block(cfg)
    with torch.no_grad():
        want = first(block(x))
    t0 = time.time()
    exported = export_program(torch.export.export(block, (x,)))
    export_s = time.time() - t0
    exported.save(d / "graph.json", values_dir=d / "inputs")
    user = [n for n in exported.input_names if n and n not in exported.values]
    if len(user) != 1:
        print(f"error: expected one user input, got {user}", file=sys.stderr)
        return 1
    cfg["input"] = user[0]
    np.save(d / "inputs" / f"{user[0]}.npy", x.numpy())
    np.save(d / "torch" / "out0.npy", want.numpy())
    torch.save(block.state_dict(), d / "torch" / "block.pt")
    cfg["outputs"] = [o["name"] for o in exported.graph["outputs"]]
    cfg["export_s"] = round(export_s, 2)
    cfg["graph_nodes"] = len(exported.graph["nodes"])
    cfg["graph_inputs"] = len(exported.graph["inputs"])
    exe = find_eqfuse(args.eqfuse)
    t0 = time.time()
    r = subprocess.run([exe, "optimize", str(d / "graph.json"), "--format", "json", "--device", args.device],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return 1
    cfg["plan_s"] = round(time.time() - t0, 2)
    (d / "plan.json").write_text(r.stdout)
    plan = json.loads(r.stdout)
    print(f"exported: {cfg['graph_nodes']} nodes, {cfg['graph_inputs']} inputs ({export_s:.1f} s); "
          f"plan: {summary(plan)} ({cfg['plan_s']} s)")
    if args.cpu_check:
        out = d / "cpu-out"
        t0 = time.time()
        r = subprocess.run([exe, "run", "--cpu", str(d / "graph.json"), "--inputs", str(d / "inputs"), "--outputs",
                            str(out)], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return 1
        got = np.load(out / f"{cfg['outputs'][0]}.npy")
        cmp = compare(got, want.numpy(), args.atol, args.rtol)
        cfg["cpu_check"] = cmp
        print(f"eqfuse CPU reference vs PyTorch CPU: {fmt_cmp(cmp)} ({time.time() - t0:.1f} s)")
    (d / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return 0 if not args.cpu_check or cfg["cpu_check"]["pass"] else 1


def summary(plan: dict) -> str:
    t, u = plan["total"], plan["unfused"]
    templates = {}
    for k in plan["kernels"]:
        templates[k["template"]] = templates.get(k["template"], 0) + 1
    tmpl = ", ".join(f"{n} {t_}" for t_, n in sorted(templates.items()))
    return (f"{t['kernels']} kernels ({tmpl}), {t['bytes']} bytes, {t['predicted_us']} us predicted; "
            f"unfused {u['kernels']} kernels, {u['bytes']} bytes")


def compare(got, want, atol: float, rtol: float) -> dict:
    import numpy as np

    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return {"pass": False, "error": f"shape {got.shape} != {want.shape}"}
    err = np.abs(got - want)
    rel = err / np.maximum(np.abs(want), 1e-30)
    ok = bool(np.all(err <= atol + rtol * np.abs(want))) and bool(np.all(np.isfinite(got)))
    return {"pass": ok, "max_abs": float(err.max()), "max_rel_where_abs_gt_1e-3": float(rel[np.abs(want) > 1e-3].max()),
            "max_abs_want": float(np.abs(want).max()), "atol": atol, "rtol": rtol}


def fmt_cmp(c: dict) -> str:
    if "error" in c:
        return f"FAIL ({c['error']})"
    return (f"{'pass' if c['pass'] else 'FAIL'}: max abs err {c['max_abs']:.3g} (max |y| {c['max_abs_want']:.3g}), "
            f"max rel err {c['max_rel_where_abs_gt_1e-3']:.3g} where |y| > 1e-3; tolerance {c['atol']:g} + {c['rtol']:g}*|y|")


def torch_compile_kernels(block, x, reps: int = 50) -> dict:
    """torch.compile's kernels for one call after warm-up, counted with torch.profiler, its time
    (CUDA events, median of `reps`), and eager's."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def counted(fn):
        with torch.no_grad():
            for _ in range(3):
                fn(x)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn(x)
                torch.cuda.synchronize()
        kernels, other = [], []
        for e in prof.events():
            if e.device_type != torch.autograd.DeviceType.CUDA:
                continue
            name = e.name
            (other if re.match(r"(?i)^(memcpy|memset)", name) else kernels).append(name)
        return kernels, other

    eager_k, eager_o = counted(block)
    compiled = torch.compile(block)
    with torch.no_grad():
        compiled(x)
    comp_k, comp_o = counted(compiled)
    return {
        "eager": {"kernels": len(eager_k), "names": eager_k, "other_events": eager_o, "median_us": timed(block, x, reps)},
        "compile": {"kernels": len(comp_k), "names": comp_k, "other_events": comp_o, "median_us": timed(compiled, x, reps)},
    }


def timed(fn, x, reps: int = 50) -> float:
    """Median microseconds of `fn(x)` over `reps` calls (CUDA events, after 5 warm-up calls)."""
    import torch

    with torch.no_grad():
        for _ in range(5):
            fn(x)
        ts = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn(x)
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def through_backend(block, x, want_gpu, args) -> dict:
    """The block through `torch.compile(backend=EqfuseBackend())`: which graphs ran eqfuse's
    kernels, the output against PyTorch eager on the GPU, and the time of one call."""
    import torch
    from eqfuse_torch.backend import EqfuseBackend

    be = EqfuseBackend(binary=args.eqfuse, device=args.device, report=None)
    compiled = torch.compile(block, backend=be)
    with torch.no_grad():
        got = first(compiled(x)).float().cpu().numpy()
    return {"graphs": [{"kind": p.kind, "runs": p.runs, "why_eager": p.why_eager,
                        "kernels": p.plan["total"]["kernels"] if p.plan else None} for p in be.plans],
            "vs_torch_gpu": compare(got, want_gpu, args.atol, args.rtol), "median_us": timed(compiled, x)}


def inductor_bytes(code_dir: Path) -> dict | None:
    """Sums the `kernel_num_gb` Inductor writes into its Triton kernels' metadata (bytes read and
    written by each kernel, Inductor's estimate) over the generated files of this process, once
    per kernel name (a kernel's source can appear in more than one cached file)."""
    seen: dict[str, float] = {}
    for f in code_dir.rglob("*.py"):
        text = f.read_text(errors="replace")
        for m in re.finditer(r"'kernel_num_gb':\s*([0-9.eE+-]+)", text):
            names = re.findall(r"'kernel_name':\s*'([^']+)'", text[max(0, m.start() - 3000):m.end() + 3000])
            key = names[0] if names else f"{f.name}:{m.start()}"
            seen[key] = float(m.group(1))
    return {"triton_kernels_annotated": len(seen), "bytes": int(sum(seen.values()) * 1e9)} if seen else None


def gpu(args) -> int:
    import numpy as np
    import torch

    d = Path(args.dir)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((d / "config.json").read_text())
    plan = json.loads((d / "plan.json").read_text())
    result = {"config": cfg, "device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "eqfuse_plan": {"total": plan["total"], "unfused": plan["unfused"],
                              "templates": [k["template"] for k in plan["kernels"]]}}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    want_cpu = np.load(d / "torch" / "out0.npy")

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    eq_out = work / "eqfuse-out"
    cmd = [args.eqfuse, "run", str(d / "graph.json"), "--inputs", str(d / "inputs"), "--outputs", str(eq_out),
           "--repeat", str(args.repeat), "--device", args.device]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    (out_dir / "eqfuse-run.log").write_text(f"$ {' '.join(cmd)}\nexit {r.returncode}\n{r.stdout}\n{r.stderr}")
    result["eqfuse_run"] = {"exit": r.returncode, "seconds": round(time.time() - t0, 1)}
    print(r.stdout[-4000:])
    print(r.stderr[-4000:], file=sys.stderr)
    if r.returncode == 0:
        got = np.load(eq_out / f"{cfg['outputs'][0]}.npy")
        result["eqfuse_vs_torch_cpu"] = compare(got, want_cpu, args.atol, args.rtol)
    else:
        result["eqfuse_run"]["error"] = (r.stderr.strip().splitlines() or ["?"])[-1]

    # PyTorch on the same GPU: eager output (a second reference), and torch.compile's kernels.
    cache = work / "inductor-cache"
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache))
    block, _ = build_block(cfg)
    # The weights and input `prepare` used (the GPU machine's transformers may initialise
    # differently): every parameter must load.
    state = torch.load(d / "torch" / "block.pt")
    missing, _unexpected = block.load_state_dict(state, strict=False)
    params = {n for n, _ in block.named_parameters()}
    if params & set(missing):
        raise SystemExit(f"error: parameters not in the saved state: {sorted(params & set(missing))}")
    x = torch.from_numpy(np.load(d / "inputs" / f"{cfg['input']}.npy"))
    block, x = block.eval().cuda(), x.cuda()
    with torch.no_grad():
        want_gpu = first(block(x)).float().cpu().numpy()
    result["torch_gpu_vs_torch_cpu"] = compare(want_gpu, want_cpu, args.atol, args.rtol)
    if r.returncode == 0:
        result["eqfuse_vs_torch_gpu"] = compare(got, want_gpu, args.atol, args.rtol)
    try:
        import torch._inductor.config as inductor_config

        inductor_config.benchmark_kernel = True  # Inductor then records each Triton kernel's bytes (kernel_num_gb)
        tc = torch_compile_kernels(block, x)
        tc["compile"]["inductor_bytes"] = inductor_bytes(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]))
        result["torch"] = tc
    except Exception as e:  # report, do not lose the eqfuse result
        result["torch"] = {"error": f"{type(e).__name__}: {e}"}
    if not args.skip_backend:
        try:
            result["backend"] = through_backend(block, x, want_gpu, args)
        except Exception as e:
            result["backend"] = {"error": f"{type(e).__name__}: {e}"}
    m = re.search(r"total[^\n]*", r.stdout)
    result["eqfuse_run"]["total_line"] = m.group(0) if m else None
    (out_dir / "gpt2.json").write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / "gpt2.md").write_text(report(result))
    print(report(result))
    ok = r.returncode == 0 and result["eqfuse_vs_torch_cpu"]["pass"]
    return 0 if ok else 1


def report(res: dict) -> str:
    c = res["config"]
    p = res["eqfuse_plan"]
    lines = [f"# GPT-2 block: eqfuse vs PyTorch ({res['device']}, {res['date']})", "",
             f"GPT2Block(n_embd={c['embd']}, n_head={c['heads']}), batch {c['batch']}, sequence {c['seq']}, f32, "
             f"attention `{c['attention']}`, eval, random weights (seed {c['seed']}).", ""]
    run = res["eqfuse_run"]
    if run["exit"] == 0:
        lines.append(f"- eqfuse run on the GPU: exit 0; vs PyTorch CPU: {fmt_cmp(res['eqfuse_vs_torch_cpu'])}")
        lines.append(f"- eqfuse vs PyTorch eager on this GPU: {fmt_cmp(res['eqfuse_vs_torch_gpu'])}")
    else:
        lines.append(f"- eqfuse run on the GPU FAILED (exit {run['exit']}): {run.get('error')}")
    lines.append(f"- PyTorch GPU vs PyTorch CPU: {fmt_cmp(res['torch_gpu_vs_torch_cpu'])}")
    t, u = p["total"], p["unfused"]
    lines += ["", "| | kernels | bytes (device memory) | time |", "|---|---|---|---|",
              f"| eqfuse plan | {t['kernels']} | {t['bytes']} (planned) | {t['predicted_us']} us predicted |",
              f"| eqfuse unfused | {u['kernels']} | {u['bytes']} (planned) | {u['predicted_us']} us predicted |"]
    tc = res.get("torch", {})
    if "error" in tc:
        lines.append(f"\ntorch.compile failed: {tc['error']}")
    else:
        ib = tc["compile"].get("inductor_bytes")
        b = f"{ib['bytes']} (Inductor's kernel_num_gb over {ib['triton_kernels_annotated']} Triton kernels; extern gemms not counted)" if ib else "n/a"
        lines.append(f"| torch.compile | {tc['compile']['kernels']} | {b} | {tc['compile']['median_us']:.1f} us measured |")
        lines.append(f"| PyTorch eager | {tc['eager']['kernels']} | n/a | {tc['eager']['median_us']:.1f} us measured |")
        lines += ["", "torch.compile kernels (one call after warm-up, torch.profiler CUDA kernel events):", ""]
        lines += [f"- `{n}`" for n in tc["compile"]["names"]]
    be = res.get("backend", {})
    if "error" in be:
        lines.append(f"\ntorch.compile(backend=EqfuseBackend()) failed: {be['error']}")
    elif be:
        runs = ", ".join(f"{g['kind']}: {g['runs']}" + (f" ({g['why_eager']})" if g["why_eager"] else "") for g in be["graphs"])
        lines += ["", f"torch.compile(backend=EqfuseBackend()): {runs}; vs PyTorch eager on this GPU: "
                      f"{fmt_cmp(be['vs_torch_gpu'])}; {be['median_us']:.1f} us per call (median)"]
    if run.get("total_line"):
        lines += ["", f"eqfuse run: `{run['total_line']}`"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--dir", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--device", default="h100")
    p.add_argument("--eqfuse", default=None)
    p.add_argument("--cpu-check", action="store_true")
    g = sub.add_parser("gpu")
    g.add_argument("--dir", required=True)
    g.add_argument("--eqfuse", required=True)
    g.add_argument("--out", required=True, help="results: gpt2.json, gpt2.md, eqfuse-run.log")
    g.add_argument("--work", default="gpt2-work", help="eqfuse's outputs and Inductor's cache")
    g.add_argument("--device", default="h100")
    g.add_argument("--repeat", type=int, default=20)
    g.add_argument("--skip-backend", action="store_true",
                   help="leave out the torch.compile(backend=EqfuseBackend()) run (it compiles the block again)")
    for q in (p, g):
        q.add_argument("--atol", type=float, default=1e-3)
        q.add_argument("--rtol", type=float, default=1e-3)
    args = ap.parse_args()
    return prepare(args) if args.cmd == "prepare" else gpu(args)


if __name__ == "__main__":
    sys.exit(main())
