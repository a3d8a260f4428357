#!/usr/bin/env python3
"""PyTorch eager baseline of softmax regression, softmax(x @ w, -1) in f32: one cuBLAS product
and one fused softmax kernel, at issue 6's sizes (B x F x K). Same timing method as
benches/torch_baselines.py (CUDA events around each call, warm-up, L2 flushed before each
call, median), with many repetitions because the small sizes are launch-bound; and the same
two kernels replayed as one CUDA graph (`eager_graph_ms`), which takes the host's launch
overhead out of the timing.

Usage: python3 softmax_regression_eager.py [--repeat N]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_baselines import time_fn  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--repeat", type=int, default=500)
args = ap.parse_args()
assert not torch.backends.cuda.matmul.allow_tf32, "f32 products must not use TF32"
flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4 + 1, device="cuda")
for b, f, k in [(64, 128, 10), (256, 512, 50), (1024, 1024, 100)]:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(b, f, generator=g, device="cuda")
    w = torch.randn(f, k, generator=g, device="cuda")
    fn = lambda x, w: torch.softmax(x @ w, -1)  # noqa: E731
    ms = time_fn(fn, [x, w], args.repeat, flush)
    # The same two kernels replayed as one CUDA graph: no host launch overhead in the timing.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(x, w)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(x, w)
    graph_ms = time_fn(graph.replay, [], args.repeat, flush)
    print(json.dumps({"program": f"softmax_regression {b}x{f}x{k}", "eager_ms": ms, "eager_graph_ms": graph_ms,
                      "device": torch.cuda.get_device_name(0)}))
