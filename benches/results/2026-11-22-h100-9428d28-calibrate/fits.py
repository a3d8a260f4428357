# Re-fits the tile probes of calibrate.log three ways and scores each by the cost model's own
# prediction (launch overhead + K x step + waves x epilogue) on the same probes.
import re, math, sys
import numpy as np
LAUNCH = float(sys.argv[1]) if len(sys.argv) > 1 else 2.84
SMS = 132
tiles, cur = {}, None
for line in open("calibrate.log"):
    m = re.match(r"  (gemm f32|gemm bf16|gemm mma|attention f32)\s+(\S+)\s+lone\s+([-\d.]+) ns, shared\s+([-\d.]+) ns.*epilogue\s+([-\d.]+) us", line)
    if m:
        cur = (m[1], m[2]); tiles[cur] = []
        continue
    m = re.match(r"\s+(calibrate-\S+)\s+(lone|shared)\s+.*?(\d+) steps\s+(\d+) blocks\s+([\d.]+) us", line)
    if m and cur:
        tiles[cur].append((m[2], "softmax" in m[1], int(m[3]), int(m[4]), float(m[5])))
def feats(p):
    form, rows, k, b, us = p
    s = b / SMS
    return [k * 1e-3 if form == "lone" else 0, k * 1e-3 * s if form == "shared" else 0, math.ceil(s) if rows else 0]
def score(coef, ps):
    errs = [abs((LAUNCH + np.dot(coef, feats(p))) / p[4] - 1) for p in ps]
    return np.mean(errs), max(errs)
tot = {"free": [], "fixed": [], "relative": []}
print(f"{'tile':<22} {'free intercept':>26} {'intercept = launch':>26} {'relative, = launch':>26}")
for key, ps in tiles.items():
    X = np.array([feats(p) for p in ps]); y = np.array([p[4] for p in ps])
    used = [c for c in range(3) if X[:, c].any()]
    out = []
    # free: with an intercept column
    A = np.column_stack([np.ones(len(ps)), X[:, used]]); b = np.linalg.lstsq(A, y, rcond=None)[0]
    c = np.zeros(3); c[used] = b[1:]; out.append(("free", c))
    A = X[:, used]; b = np.linalg.lstsq(A, y - LAUNCH, rcond=None)[0]
    c = np.zeros(3); c[used] = b; out.append(("fixed", c))
    w = 1 / y
    b = np.linalg.lstsq(A * w[:, None], (y - LAUNCH) * w, rcond=None)[0]
    c = np.zeros(3); c[used] = b; out.append(("relative", c))
    cells = []
    for name, c in out:
        mean, worst = score(c, ps); tot[name].append(mean)
        cells.append(f"{c[0]:6.1f} {c[1]:6.1f} {mean*100:4.1f}%/{worst*100:4.0f}%")
    print(f"{key[0]+' '+key[1]:<22} " + "  ".join(cells))
for k, v in tot.items():
    print(f"{k}: mean over tiles of the mean relative error {100*np.mean(v):.1f}%")
