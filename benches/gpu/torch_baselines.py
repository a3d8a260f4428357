#!/usr/bin/env python3
"""PyTorch eager and torch.compile times for the programs eqfuse's GPU bench measures, on the
same GPU, with the same method: CUDA events, warm-up, median of many runs, fresh random inputs
(never zeros), inputs large enough that L2 does not serve repeats (or L2 flushed for small ones).

Prints one JSON document (and writes it with --out).
"""
import argparse, json, math, statistics, sys, time

import torch
import torch.nn.functional as F


def add_mul(x, y, z):
    return (x + y) * z


def softplus(x):
    return torch.log(torch.exp(x) + 1)


def bias_gelu_dropout(x, b):
    return F.dropout(F.gelu(x + b), p=0.1, training=True)


def layernorm(x, g, b):
    mu = x.mean(-1, keepdim=True)
    xc = x - mu
    var = (xc * xc).mean(-1, keepdim=True)
    return xc * torch.rsqrt(var + 1e-5) * g + b


def rmsnorm(x, g):
    ms = (x * x).mean(-1, keepdim=True)
    return x * torch.rsqrt(ms + 1e-6) * g


def softmax(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def cross_entropy(logits, targets):
    n, v = logits.shape
    z = logits - logits.amax(-1, keepdim=True)
    logp = z - torch.log(torch.exp(z).sum(-1, keepdim=True))
    oh = F.one_hot(targets, v).to(logits.dtype)
    picked = (logp * oh).sum(-1, keepdim=True)
    loss = (-picked.sum(0) / n).reshape(())
    dlogits = (torch.exp(logp) - oh) / n
    return loss, dlogits


def cases(dev):
    f32, bf16 = torch.float32, torch.bfloat16
    r = lambda *s, dt=f32: torch.randn(*s, device=dev, dtype=dt)
    n = 1 << 28
    return [
        ("add_mul", add_mul, lambda: (r(n), r(n), r(n)), 4 * n * 4),
        ("softplus", softplus, lambda: (r(n),), 2 * n * 4),
        ("bias_gelu_dropout", bias_gelu_dropout, lambda: (r(8192, 8192), r(8192)), 2 * 8192 * 8192 * 4),
        ("layernorm", layernorm, lambda: (r(16384, 4096), r(4096), r(4096)), 2 * 16384 * 4096 * 4),
        ("rmsnorm_bf16", rmsnorm, lambda: (r(16384, 4096, dt=bf16), r(4096, dt=bf16)), 2 * 16384 * 4096 * 2),
        ("softmax", softmax, lambda: (r(16384, 4096),), 2 * 16384 * 4096 * 4),
        ("softmax_small", softmax, lambda: (r(1024, 512),), 2 * 1024 * 512 * 4),
        ("cross_entropy", cross_entropy,
         lambda: (r(8192, 32000), torch.randint(0, 32000, (8192,), device=dev)), 2 * 8192 * 32000 * 4),
    ]


def time_it(fn, args, reps, flush):
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(*args)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--only")
    a = ap.parse_args()
    dev = "cuda"
    props = torch.cuda.get_device_properties(0)
    flush = torch.empty(2 * props.L2_cache_size, dtype=torch.uint8, device=dev) if hasattr(props, "L2_cache_size") else torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    doc = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "programs": []}
    for name, fn, make, bytes_ in cases(dev):
        if a.only and name not in a.only.split(","):
            continue
        args = make()
        small = bytes_ < 4 * 60 * (1 << 20)
        row = {"program": name, "bytes": bytes_}
        try:
            row["eager_us"] = time_it(fn, args, a.reps, flush if small else None)
            t0 = time.time()
            cfn = torch.compile(fn)
            cfn(*args)
            torch.cuda.synchronize()
            row["compile_s"] = time.time() - t0
            row["compiled_us"] = time_it(cfn, args, a.reps, flush if small else None)
        except Exception as e:  # a failure of one program is recorded, not fatal
            row["error"] = repr(e)[:300]
        print(json.dumps(row), flush=True)
        doc["programs"].append(row)
        del args
        torch.cuda.empty_cache()
    text = json.dumps(doc, indent=1)
    if a.out:
        open(a.out, "w").write(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
