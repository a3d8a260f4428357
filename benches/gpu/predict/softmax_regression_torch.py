#!/usr/bin/env python3
# PyTorch eager timing of bf16 softmax regression, softmax(x @ w + b, -1) (the probes
# softmax_regression_bf16.eqf of benches/gpu/rowmma.sh): median of CUDA-event timings of the whole
# expression and of the product alone, with L2 flushed before each run as `eqfuse bench` does.
# Usage: softmax_regression_torch.py M,K,N [M,K,N ...]
import sys, torch
torch.manual_seed(0)
flush = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
def timed(f, reps=50):
    for _ in range(5): f()
    ts = []
    for _ in range(reps):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return sorted(ts)[len(ts) // 2]
print(torch.__version__, torch.cuda.get_device_name())
print(f"{'M x K x N':>18} {'softmax(x@w+b) us':>18} {'x@w alone us':>13}")
for arg in sys.argv[1:]:
    m, k, n = (int(v) for v in arg.split(","))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    full = timed(lambda: torch.softmax(x @ w + b, -1))
    mm = timed(lambda: x @ w)
    print(f"{m:>6} x {k:>4} x {n:>4} {full:18.1f} {mm:13.1f}")
