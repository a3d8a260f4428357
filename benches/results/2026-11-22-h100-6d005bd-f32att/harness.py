#!/usr/bin/env python3
"""Times f32 attention kernel variants (cubins built by mkvar.py) on the GPU and checks each
against a float64 reference: harness.py VARDIR OUT.json"""
import json, sys, time
import cupy as cp
import numpy as np
vard, outp = sys.argv[1], sys.argv[2]
man = json.load(open(f'{vard}/manifest.json'))
probs = {}
for m in man:
    probs.setdefault(m['prob'], []).append(m)
res = []
for pn, ms in probs.items():
    m0 = ms[0]
    nb, sq, sk, d, causal, scale = m0['nb'], m0['sq'], m0['sk'], m0['d'], m0['causal'], m0['scale']
    rs = cp.random.RandomState(7)
    q = rs.standard_normal((nb, sq, d), dtype=cp.float32)
    k = rs.standard_normal((nb, sk, d), dtype=cp.float32)
    v = rs.standard_normal((nb, sk, d), dtype=cp.float32)
    nc = min(nb, 8)
    q64, k64, v64 = (x[:nc].astype(cp.float64) for x in (q, k, v))
    s = cp.matmul(q64, k64.transpose(0, 2, 1)) * scale
    if causal:
        mask = cp.arange(sk)[None, :] > cp.arange(sq)[:, None]
        s = cp.where(mask[None], -cp.inf, s)
    s = s - s.max(-1, keepdims=True)
    p = cp.exp(s)
    ref = cp.matmul(p / p.sum(-1, keepdims=True), v64)
    del s, p
    flops = 4.0 * nb * sq * sk * d * (0.5 if causal else 1.0)
    reps = 50 if flops < 1e9 else 10
    for m in ms:
        mod = cp.RawModule(path=f"{vard}/{m['name']}.cubin")
        f = mod.get_function('attn')
        f.max_dynamic_shared_size_bytes = m['smem']
        o = cp.full((nb, sq, d), cp.nan, dtype=cp.float32)
        grid = (m['grid'][0], m['grid'][1], 1)
        launch = lambda: f(grid, (m['block'], 1, 1), (q, k, v, o), shared_mem=m['smem'])
        launch(); cp.cuda.Device().synchronize()
        written = bool(cp.isfinite(o).all())
        err = float(cp.linalg.norm(o[:nc].astype(cp.float64) - ref) / cp.linalg.norm(ref))
        for _ in range(3):
            launch()
        ts = []
        for _ in range(reps):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(); launch(); b.record(); b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
        ts.sort()
        us = ts[len(ts) // 2]
        r = dict(m, us=us, us_min=ts[0], us_max=ts[-1], err=err, written=written, tflops=flops / us / 1e6)
        res.append(r)
        print(f"{m['name']:28s} {us:9.1f} us (min {ts[0]:8.1f})  err {err:.2e}  written {written}  {r['tflops']:6.2f} TFLOP/s  regs {m['regs']} spill {m['spill']}", flush=True)
json.dump(res, open(outp, 'w'), indent=1)
print()
print(f"{'variant':14s}" + ''.join(f'{p:>14s}' for p in probs))
for vn in dict.fromkeys(m['var'] for m in man):
    row = f'{vn:14s}'
    for pn in probs:
        r = [x for x in res if x['var'] == vn and x['prob'] == pn]
        row += f"{r[0]['us']:14.1f}" if r else f"{'-':>14s}"
    print(row)
bad = [x['name'] for x in res if not (x['written'] and x['err'] < 1e-4)]
print('BAD:', bad if bad else 'none')
