#!/usr/bin/env python3
"""PyTorch baselines for eqfuse programs: eager and torch.compile on the same GPU.

Reads programs as eqfuse JSON graphs (`eqfuse export PROG [--dim N=V]... > prog.json`), runs each
with PyTorch eager, `torch.compile` (default) and `torch.compile(mode="reduce-overhead")`, and
writes one JSON record per program with median times.

Timing method (DESIGN.md §6): CUDA events around each call, warm-up first (compile time excluded),
the L2 cache flushed before every timed call by writing a buffer larger than L2, median of the
repetitions. The ops are the program's own, node for node (a decomposed layernorm stays
decomposed), so the baseline runs the same computation eqfuse plans. `dropout` uses PyTorch's own
generator (a different mask, the same work).

Usage: python3 benches/torch_baselines.py --out results.json prog1.json [prog2.json ...]
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "i32": torch.int32, "bool": torch.bool}

UNARY = {
    "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "recip": torch.reciprocal, "abs": torch.abs, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu, "erf": torch.erf, "sin": torch.sin, "cos": torch.cos, "square": torch.square,
    "not": torch.logical_not,
}


def binary(op, a, b):
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if isinstance(a, torch.Tensor) and not a.is_floating_point():
            return torch.div(a, b, rounding_mode="trunc")
        return a / b
    if op == "pow":
        return torch.pow(a, b)
    if op in ("max", "min"):
        if not isinstance(a, torch.Tensor):
            a, b = b, a
        b = b if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=a.dtype, device=a.device)
        return torch.maximum(a, b) if op == "max" else torch.minimum(a, b)
    return {"<": lambda: a < b, "<=": lambda: a <= b, ">": lambda: a > b, ">=": lambda: a >= b,
            "==": lambda: a == b, "!=": lambda: a != b}[op]()


_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
"""Where the builder makes the tensors a graph creates (literals, `iota`): the GPU when there is one."""


def as_tensor(x):
    """A literal (autodiff's seeds and scales) as an f32 scalar tensor on the GPU."""
    return x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float32, device=_DEVICE)


def build(graph):
    """A Python function of the inputs (in declaration order) computing the graph's outputs."""
    nodes = graph["nodes"]
    names = [i["name"] for i in graph["inputs"]]
    outputs = [o["node"] for o in graph["outputs"]]

    def run(*args):
        env = dict(zip(names, args))
        vals = []
        # Attention's backward (autodiff's attention_lse and attention_grad_{q,k,v}): PyTorch's own
        # SDPA backward through autograd, from the forward the graph's `attention` node ran with
        # gradients on (one backward shared by the three gradients); the log-sum-exp node is the
        # forward's business there, so it computes nothing.
        attn = {}
        for n in nodes:
            op, a = n["op"], [vals[i] for i in n.get("args", [])]
            if op == "input":
                v = env[n["value"]]
            elif op == "const":
                v = n["value"]
            elif op == "dims":
                v = tuple(n["value"])
            elif op == "dtype":
                v = DTYPES[n["value"]]
            elif op in UNARY:
                v = UNARY[op](a[0]) if isinstance(a[0], torch.Tensor) else UNARY[op](torch.tensor(a[0])).item()
            elif op in ("+", "-", "*", "/", "pow", "max", "min", "<", "<=", ">", ">=", "==", "!="):
                v = binary(op, a[0], a[1])
            elif op == "sum":
                v = torch.sum(a[0], dim=int(a[1]), keepdim=True)
            elif op == "mean":
                v = torch.mean(a[0], dim=int(a[1]), keepdim=True)
            elif op == "amax":
                v = torch.amax(a[0], dim=int(a[1]), keepdim=True)
            elif op == "amin":
                v = torch.amin(a[0], dim=int(a[1]), keepdim=True)
            elif op == "where":
                v = torch.where(a[0], a[1], a[2])
            elif op == "cast":
                v = as_tensor(a[0]).to(a[1])
            elif op == "transpose":
                v = a[0].transpose(int(a[1]), int(a[2]))
            elif op == "reshape":
                v = as_tensor(a[0]).reshape(a[1])
            elif op == "broadcast":
                v = as_tensor(a[0]).expand(a[1])
            elif op == "@":
                v = a[0] @ a[1]
            elif op == "iota":
                v = torch.arange(int(a[0]), dtype=torch.int32, device=_DEVICE)
            elif op == "gather":
                ax = int(a[2]) % a[0].dim()
                flat = a[0].index_select(ax, a[1].reshape(-1).long())
                v = flat.reshape(a[0].shape[:ax] + a[1].shape + a[0].shape[ax + 1:])
            elif op == "scatter_add":
                idx, g, n = a[0], a[1], int(a[3])
                ax = int(a[2]) % (g.dim() - idx.dim() + 1)
                rows = g.reshape(g.shape[:ax] + (-1,) + g.shape[ax + idx.dim():])
                v = rows.new_zeros(rows.shape[:ax] + (n,) + rows.shape[ax + 1:])
                v = v.index_add(ax, idx.reshape(-1).long(), rows)
            elif op == "slice":
                ax = int(a[1]) % a[0].dim()
                index = [slice(None)] * a[0].dim()
                index[ax] = slice(int(a[2]), int(a[3]), int(a[4]))
                v = a[0][tuple(index)]
            elif op == "concat":
                v = torch.cat([a[0], a[1]], dim=int(a[2]))
            elif op == "onehot":
                v = F.one_hot(a[0].long(), int(a[1])).float()
            elif op == "dropout":
                v = F.dropout(a[0], p=float(a[1]), training=True)
            elif op == "softmax":
                v = torch.softmax(a[0], dim=int(a[1]))
            elif op == "log_softmax":
                v = torch.log_softmax(a[0], dim=int(a[1]))
            elif op == "layernorm":
                v = F.layer_norm(a[0], (a[0].shape[-1],), a[1].expand(a[0].shape[-1:]), a[2].expand(a[0].shape[-1:]), a[3])
            elif op == "rmsnorm":
                v = a[0] * torch.rsqrt(torch.mean(a[0] * a[0], dim=-1, keepdim=True) + a[2]) * a[1]
            elif op == "cross_entropy":
                v = F.cross_entropy(a[0].reshape(-1, a[0].shape[-1]), a[1].reshape(-1).long())
            elif op == "attention":
                key = (id(a[0]), id(a[1]), id(a[2]), float(a[3]), bool(a[4]))
                if any(n2["op"].startswith("attention_grad") for n2 in nodes):
                    with torch.enable_grad():
                        ins = [x.detach().requires_grad_() for x in a[:3]]
                        out = F.scaled_dot_product_attention(*ins, scale=float(a[3]), is_causal=bool(a[4]))
                    attn[key] = {"ins": ins, "out": out}
                    v = out.detach()
                else:
                    v = F.scaled_dot_product_attention(a[0], a[1], a[2], scale=float(a[3]), is_causal=bool(a[4]))
            elif op == "attention_lse":
                v = None
            elif op.startswith("attention_grad_"):
                key = (id(a[0]), id(a[1]), id(a[2]), float(a[6]), bool(a[7]))
                f = attn[key]
                if "grads" not in f:
                    f["grads"] = torch.autograd.grad(f["out"], f["ins"], a[3])
                v = f["grads"]["qkv".index(op[-1])]
            else:
                raise ValueError(f"op {op} has no PyTorch mapping")
            vals.append(v)
        return tuple(vals[i] for i in outputs)

    return run


def index_bounds(graph):
    """For i32 inputs used as class indices, the class count (so generated targets are in range)."""
    nodes, bounds = graph["nodes"], {}
    for n in nodes:
        if n["op"] in ("onehot", "cross_entropy"):
            t = nodes[n["args"][0 if n["op"] == "onehot" else 1]]
            if t["op"] == "input":
                size = nodes[n["args"][1]]["value"] if n["op"] == "onehot" else None
                bounds[t["value"]] = size
    return bounds


def make_inputs(graph, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    bounds = index_bounds(graph)
    out = []
    for i in graph["inputs"]:
        shape, dt = i["shape"], DTYPES[i["dtype"]]
        if dt.is_floating_point:
            out.append(torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dt))
        elif dt == torch.bool:
            out.append(torch.rand(shape, generator=g, device="cuda") < 0.5)
        else:
            hi = bounds.get(i["name"]) or 100
            out.append(torch.randint(0, hi, shape, generator=g, device="cuda", dtype=torch.int32))
    return out


def time_fn(fn, args, repeat, flush):
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    flush = torch.empty(int(2 * props.L2_cache_size // 4) + (1 << 20), dtype=torch.float32, device="cuda")
    records = []
    for path in args.graphs:
        graph = json.load(open(path))
        fn = build(graph)
        inputs = make_inputs(graph, 0)
        rec = {"graph": path, "device": props.name, "torch": torch.__version__}
        with torch.no_grad():
            try:
                rec["eager_ms"] = time_fn(fn, inputs, args.repeat, flush)
            except Exception as e:  # recorded, and the other graphs still run
                rec["eager_ms"] = None
                rec["eager_error"] = str(e)[:300]
            for key, kw in (("compile_ms", {}), ("compile_reduce_overhead_ms", {"mode": "reduce-overhead"})):
                try:
                    torch._dynamo.reset()
                    t0 = time.time()
                    cf = torch.compile(fn, **kw)
                    cf(*inputs)
                    torch.cuda.synchronize()
                    rec[key.replace("_ms", "_compile_s")] = round(time.time() - t0, 2)
                    rec[key] = time_fn(cf, inputs, args.repeat, flush)
                except Exception as e:  # a baseline that fails is recorded, not fatal
                    rec[key] = None
                    rec[key.replace("_ms", "_error")] = str(e)[:300]
        print(json.dumps(rec), flush=True)
        records.append(rec)
    json.dump(records, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
