#!/usr/bin/env python3
"""Times hand-edited variants of generated kernels (cross-entropy's row kernel, bias+gelu+dropout's
elementwise kernel) on the GPU with CuPy, to decide which template/codegen change is worth making.

Each variant is a self-contained `.cu` (a generated kernel, edited); this script compiles it
with NVRTC (CuPy's RawModule), runs it on seeded random inputs, checks its outputs (cross-entropy
against an f64 reference computed with CuPy; elementwise variants bit-for-bit against the generated
kernel `EA`) and times it with CUDA events (warm-up, then the median of repeats).

Usage (on the device machine): python3 ce_variants.py DIR [--only A,B] [--once]
DIR holds the variant files; the table below says how each is launched.
"""

import argparse
import json
import math
import sys

import cupy as cp

ROWS, COLS = 8192, 32000
ER, EC = 8192, 8192

# name -> (kind, threads per block, rows per block, pipelined (one wave, dynamic smem), note)
CE = {
    "A0": ("ce", 1024, 1, 131072, "generated cross_entropy (hand-written gradient)"),
    "A": ("ce", 1024, 1, 131072, "generated cross_entropy_grad (autodiff)"),
    "B": ("ce", 1024, 1, 131072, "A + eq_max as max.NaN.f32"),
    "C": ("ce", 1024, 1, 131072, "B + division by a row value as a product with its reciprocal"),
    "D": ("ce", 1024, 1, 131072, "C + __expf (diagnostic: less arithmetic, less accurate)"),
    "H": ("ce", 1024, 1, 131072, "C with the max and the sum of exponentials in two stages (no online pair)"),
    "F": ("ce", 1024, 1, -1, "C cached in registers, not pipelined (one wave)"),
    "G": ("ce", 1024, 1, 0, "C not cached (each stage re-reads the row), one block per row"),
    "G2": ("ce", 512, 1, 0, "G with 512 threads per row"),
    "G3": ("ce", 256, 1, 0, "G with 256 threads per row"),
}
EW = {
    "EA": (8192, "generated bias_gelu_dropout"),
    "EA64": (65536, "EA, one vector per thread (grid 65536)"),
    "EB": (8192, "EA + __ldcs loads of x, __stcs stores of y"),
    "EB64": (65536, "EB, grid 65536"),
    "EB2": (8192, "EA + __stcs stores only"),
    "ED2": (8192, "EB, 2 vectors per thread per iteration, loads first"),
    "ED4": (8192, "EB, 4 vectors per thread per iteration, loads first"),
    "EN": (8192, "EA without dropout (diagnostic: output differs)"),
}


def timeit(fn, reps):
    for _ in range(3):
        fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1000.0)
    ts.sort()
    return ts[len(ts) // 2], ts[0], ts[-1]


def load(path, name, smem):
    src = open(path).read()
    mod = cp.RawModule(code=src, options=("-arch=sm_90", "-std=c++17"))
    k = mod.get_function(name)
    if smem > 48 * 1024:
        k.max_dynamic_shared_size_bytes = smem
    return k


class Harness:
    """What the variant scripts share (ce_cluster.py imports it): the arguments, the device, timing
    (or one untimed run under --once), a 1 GiB copy timed the same way, and the results list."""

    def __init__(self):
        ap = argparse.ArgumentParser()
        ap.add_argument("dir")
        ap.add_argument("--only", default="")
        ap.add_argument("--once", action="store_true")
        ap.add_argument("--reps", type=int, default=20)
        ap.add_argument("--json", default="")
        self.a = ap.parse_args()
        self.only = [x for x in self.a.only.split(",") if x]
        dev = cp.cuda.Device()
        self.props = cp.cuda.runtime.getDeviceProperties(dev.id)
        self.sms = self.props["multiProcessorCount"]
        print(f"device {self.props['name'].decode()} sms {self.sms}", flush=True)
        self.results = []
        # copy bandwidth (bytes read + written)
        if not self.a.once and not self.only:
            n = 1 << 28
            s, d = cp.empty(n, cp.float32), cp.empty(n, cp.float32)
            s.fill(1.0)
            med, lo, hi = timeit(lambda: d.__setitem__(Ellipsis, s), self.a.reps)
            print(f"copy 1 GiB: {med:.1f} us -> {2 * n * 4 / med / 1e6:.3f} TB/s", flush=True)
            self.results.append({"variant": "copy", "us": med, "tbs": 2 * n * 4 / med / 1e6})
            del s, d

    def run(self, fn):
        if self.a.once:
            fn()
            cp.cuda.Device().synchronize()
            return (float("nan"),) * 3
        return timeit(fn, self.a.reps)

    def names(self, table):
        return [n for n in table if not self.only or n in self.only]

    def write_json(self):
        if self.a.json:
            json.dump({"device": self.props["name"].decode(), "results": self.results}, open(self.a.json, "w"), indent=1)


def ce_inputs(checked):
    """Cross-entropy's seeded inputs x [ROWS, COLS] and targets t, and (when `checked`) the f64
    reference: (x, t, want_g, logp_t, scale_g, scale_p)."""
    cp.random.seed(1)
    x = cp.random.standard_normal((ROWS, COLS), dtype=cp.float32) * 2.0
    t = cp.random.randint(0, COLS, ROWS, dtype=cp.int32)
    if not checked:
        return x, t, None, None, None, None
    x64 = x.astype(cp.float64)
    m = x64.max(axis=1, keepdims=True)
    e = cp.exp(x64 - m)
    s = e.sum(axis=1, keepdims=True)
    logp_t = (x64[cp.arange(ROWS), t] - m[:, 0] - cp.log(s[:, 0]))
    want_g = e / s / ROWS
    want_g[cp.arange(ROWS), t] -= 1.0 / ROWS
    return x, t, want_g, logp_t, float(cp.abs(want_g).max()), float(cp.abs(logp_t).max())


def ce_check(g, p, want_g, logp_t, scale_g, scale_p):
    eg = float(cp.abs(g.astype(cp.float64) - want_g).max()) / scale_g
    ep = float(cp.abs(p.astype(cp.float64) - logp_t).max()) / scale_p
    nan = int(cp.isnan(g).sum()) + int(cp.isnan(p).sum())
    return f"err dlogits {eg:.2e} picked {ep:.2e} nan {nan}"


def main():
    h = Harness()
    a, sms, results, run = h.a, h.sms, h.results, h.run

    names = h.names(CE)
    if names:
        x, t, want_g, logp_t, scale_g, scale_p = ce_inputs(not a.once)
        g = cp.empty((ROWS, COLS), cp.float32)
        p = cp.empty((ROWS,), cp.float32)
        for n in names:
            kind, block, rpb, smem, note = CE[n]
            try:
                k = load(f"{a.dir}/{n}.cu", "rowreduce_f32_k0", max(smem, 0))
            except Exception as ex:  # noqa: BLE001
                print(f"{n}: compile failed: {ex}", flush=True)
                continue
            if smem != 0:
                occ = 1
                try:
                    occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(k.kernel.ptr, block, max(smem, 0))
                except Exception as ex:  # noqa: BLE001
                    print(f"  occupancy unknown ({ex}); 1 block per SM", flush=True)
                grid = min(ROWS // rpb, occ * sms)
            else:
                grid = ROWS // rpb
            shm = max(smem, 0)
            g.fill(float("nan"))
            p.fill(float("nan"))
            fn = lambda: k((grid,), (block,), (x, t, p, g), shared_mem=shm)  # noqa: E731
            fn()
            cp.cuda.Device().synchronize()
            err = ""
            if not a.once:
                err = ce_check(g, p, want_g, logp_t, scale_g, scale_p)
            med, lo, hi = run(fn)
            bw = 2 * ROWS * COLS * 4 / med / 1e6 if med == med else float("nan")
            print(f"{n:4} grid {grid:5} block {block:4}: {med:8.1f} us (min {lo:.1f} max {hi:.1f}) "
                  f"{bw:.3f} TB/s  {err}  [{note}]", flush=True)
            results.append({"variant": n, "us": med, "min": lo, "max": hi, "tbs": bw, "check": err, "note": note})
        del x, g

    names = h.names(EW)
    if names:
        cp.random.seed(2)
        x = cp.random.standard_normal((ER, EC), dtype=cp.float32)
        b = cp.random.standard_normal((EC,), dtype=cp.float32)
        y = cp.empty((ER, EC), cp.float32)
        ref = None
        for n in names:
            grid, note = EW[n]
            src = n[:-2] if n.endswith("64") else n
            try:
                k = load(f"{a.dir}/{src}.cu", "elementwise_f32_k0", 0)
            except Exception as ex:  # noqa: BLE001
                print(f"{n}: compile failed: {ex}", flush=True)
                continue
            y.fill(float("nan"))
            fn = lambda: k((grid,), (256,), (x, b, y))  # noqa: E731
            fn()
            cp.cuda.Device().synchronize()
            chk = ""
            if n == "EA":
                ref = y.copy()
            elif ref is not None and not a.once:
                same = bool(cp.array_equal(y.view(cp.uint32), ref.view(cp.uint32)))
                chk = "bit-identical to EA" if same else "DIFFERS from EA"
            med, lo, hi = run(fn)
            bw = 2 * ER * EC * 4 / med / 1e6 if med == med else float("nan")
            print(f"{n:4} grid {grid:5}: {med:8.1f} us (min {lo:.1f} max {hi:.1f}) {bw:.3f} TB/s  {chk}  [{note}]",
                  flush=True)
            results.append({"variant": n, "us": med, "min": lo, "max": hi, "tbs": bw, "check": chk, "note": note})
    h.write_json()


if __name__ == "__main__":
    sys.exit(main())
