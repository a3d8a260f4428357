#!/usr/bin/env python3
"""Times variants of cross-entropy's generated row kernel: the pipelined form against rows split
over thread-block clusters (sm_90) on the GPU with CuPy, to decide which template/codegen change is worth making.

Each variant is a self-contained `.cu` (a generated kernel, edited); this script compiles it
with NVRTC (CuPy's RawModule), runs it on seeded random inputs, checks its outputs (cross-entropy
against an f64 reference computed with CuPy) and times it with CUDA events (warm-up, then the
median of repeats), after a 1 GiB device copy timed the same way; the harness, inputs and check
are ce_variants.py's (staged beside it).

Usage (on the device machine): python3 ce_cluster.py DIR [--only A,B] [--once]
DIR holds the variant files; the table below says how each is launched.
"""

import os
import sys

import cupy as cp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ce_variants import COLS, ROWS, Harness, ce_check, ce_inputs, load  # noqa: E402


# name -> (kind, threads per block, rows per block, launch, note). launch: 131072 etc. = pipelined
# (one wave, that many bytes of dynamic shared memory); "rows" = one row per cluster of K blocks
# (grid = rows * K); "wave" = a persistent grid of the clusters that fit at once (in-register
# prefetch of the next row); "wave2" = half of that.
CE = {
    "A": ("ce", 1024, 1, 131072, "generated cross_entropy_grad row kernel (pipelined, 1024 threads a row)"),
    "K2": ("ce", 512, 2, "rows", "row split over a cluster of 2 blocks of 512"),
    "K4": ("ce", 256, 4, "rows", "cluster of 4 blocks of 256"),
    "K4p": ("ce", 256, 4, "wave", "K4, persistent (clusters that fit), next row prefetched into registers"),
    "K4W3": ("ce", 256, 4, "rows", "K4 with __launch_bounds__(256, 3)"),
    "K4W3p": ("ce", 256, 4, "wave", "K4W3 persistent"),
    "K4M5": ("ce", 256, 4, "rows", "K4 with __launch_bounds__(256, 5) (spills)"),
    "K8": ("ce", 128, 8, "rows", "cluster of 8 blocks of 128"),
    "K8M10": ("ce", 128, 8, "rows", "K8 with __launch_bounds__(128, 10) (spills)"),
    "K8W": ("ce", 256, 8, "rows", "cluster of 8 blocks of 256 (2048 threads a row, 4 chunks)"),
    "K8Wp": ("ce", 256, 8, "wave", "K8W persistent"),
    "K8W6": ("ce", 256, 8, "rows", "K8W with __launch_bounds__(256, 6)"),
    "K8W6p": ("ce", 256, 8, "wave", "K8W6 persistent"),
    "C1": ("ce", 1024, 1, 131072, "A with picked read at the target column (no third stage) and the one-hot sum as a row value"),
    "C2": ("ce", 1024, 1, 131072, "C1 with stage 1 replacing the cached row by exp(x - max), which the epilogue reads"),
    "C2K4": ("ce", 256, 4, "rows", "C2 split over clusters of 4 blocks of 256, __launch_bounds__(256, 4)"),
    "K4H": ("ce", 128, 4, "rows", "cluster of 4 blocks of 128 (512 threads a row, 16 chunks)"),
    "G": ("ce", 1024, 1, 131072, "generated with exp(x - max) kept in the cache and the sum's reciprocal (no eq_div_row)"),
    "GX": ("ce", 1024, 1, 131072, "G with exp(x - max) as ex2.approx.ftz(x * log2 e) (probe, not in codegen)"),
}


def max_clusters(func, csize, block):
    """cuOccupancyMaxActiveClusters for a kernel with compile-time cluster dims (0 if unknown)."""
    import ctypes

    class Cfg(ctypes.Structure):
        _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint),
                    ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("smem", ctypes.c_uint),
                    ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("nattrs", ctypes.c_uint)]
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        cfg = Cfg(csize * 64, 1, 1, block, 1, 1, 0, None, None, 0)
        r = lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), ctypes.c_void_p(func), ctypes.byref(cfg))
        if r != 0:
            print(f"  cuOccupancyMaxActiveClusters: error {r}", flush=True)
            return 0
        return n.value
    except Exception as ex:  # noqa: BLE001
        print(f"  cuOccupancyMaxActiveClusters unavailable: {ex}", flush=True)
        return 0


def main():
    h = Harness()
    a, sms, results, run = h.a, h.sms, h.results, h.run
    names = h.names(CE)
    if names:
        x, t, want_g, logp_t, scale_g, scale_p = ce_inputs(not a.once)
        g = cp.empty((ROWS, COLS), cp.float32)
        p = cp.empty((ROWS,), cp.float32)
        for n in names:
            kind, block, rpb, launch, note = CE[n]
            smem = launch if isinstance(launch, int) else 0
            fname = n[:-1] if n.endswith("p") else n
            try:
                k = load(f"{a.dir}/{fname}.cu", "rowreduce_f32_k0", smem)
            except Exception as ex:  # noqa: BLE001
                print(f"{n}: compile failed: {ex}", flush=True)
                continue
            occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(k.kernel.ptr, block, smem)
            if isinstance(launch, int):
                grid = min(ROWS // rpb, occ * sms)
            elif launch == "rows":
                grid = ROWS * rpb
            else:
                nc = max_clusters(k.kernel.ptr, rpb, block)
                print(f"  {n}: {occ} blocks/SM, {nc} clusters of {rpb} resident", flush=True)
                grid = (nc or (occ * sms) // rpb) * rpb
                if launch == "wave2":
                    grid = grid // (2 * rpb) * rpb
            shm = smem
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
            print(f"{n:5} occ {occ} grid {grid:5} block {block:4}: {med:8.1f} us (min {lo:.1f} max {hi:.1f}) "
                  f"{bw:.3f} TB/s  {err}  [{note}]", flush=True)
            results.append({"variant": n, "us": med, "min": lo, "max": hi, "tbs": bw, "check": err, "note": note})
        del x, g

    h.write_json()


if __name__ == "__main__":
    sys.exit(main())
