#!/usr/bin/env python3
# How far PyTorch's own f32 autograd of transformer_block_grad.eqf lies from eqfuse's CPU
# reference (same inputs, seed 0), by eqfuse run's metric: max |got - ref| / max |ref|.
# Usage: tbg_torch_f32.py DIR [B S E H Dh], DIR holding the inputs and the outputs of
# `eqfuse run --cpu examples/transformer_block_grad.eqf --outputs DIR` (CPU only).
import sys, numpy as np, torch
d = sys.argv[1]
L = lambda n: torch.from_numpy(np.load(f"{d}/{n}.npy"))
B, S, E, H, Dh = [int(v) for v in (sys.argv[2:] or [2, 512, 768, 12, 64])]
def run(dt):
    t = {n: L(n).to(dt) for n in "x ln1_g ln1_b wq wk wv wo ln2_g ln2_b w1 b1 w2 b2 dy".split()}
    for n in t:
        if n != "dy": t[n].requires_grad_(True)
    ln = lambda x, g, b: torch.nn.functional.layer_norm(x, (E,), g, b, 1e-5)
    x = t["x"]; h = ln(x, t["ln1_g"], t["ln1_b"])
    q = (h @ t["wq"]).reshape(B, S, H, Dh).transpose(1, 2)
    k = (h @ t["wk"]).reshape(B, S, H, Dh).transpose(1, 2)
    v = (h @ t["wv"]).reshape(B, S, H, Dh).transpose(1, 2)
    s = q @ k.transpose(-1, -2) * 0.125
    e = torch.exp(s - s.amax(-1, keepdim=True)); p = e / e.sum(-1, keepdim=True)
    a = (p @ v).transpose(1, 2).reshape(B, S, E)
    x1 = x + a @ t["wo"]
    h2 = ln(x1, t["ln2_g"], t["ln2_b"])
    y = x1 + torch.nn.functional.gelu(h2 @ t["w1"] + t["b1"]) @ t["w2"] + t["b2"]
    (y * t["dy"]).sum().backward()
    g = {"y": y.detach(), "dx": x.grad}
    for n in "wq wk wv wo w1 b1 w2 b2".split(): g["d" + n] = t[n].grad
    for n in "ln1_g ln1_b ln2_g ln2_b".split(): g["d" + n] = t[n].grad
    return g
torch.set_num_threads(2)
f32, f64 = run(torch.float32), run(torch.float64)
print(f"{'output':8} {'torch f32 vs eqfuse ref':>24} {'torch f64 vs eqfuse ref':>24}")
for n in f32:
    ref = np.load(f"{d}/{n}.npy").astype(np.float64); sc = np.abs(ref).max()
    e32 = np.abs(f32[n].double().numpy() - ref).max() / sc
    e64 = np.abs(f64[n].numpy() - ref).max() / sc
    print(f"{n:8} {e32:24.2e} {e64:24.2e}")
