# Per-kernel predicted against measured for the calibrated and committed profiles' bench runs.
import json, math, sys
runs = {k: json.load(open(f"bench-{k}.json")) for k in ["calibrated", "committed"]}
def rows(d):
    out = {}
    for p in d["programs"]:
        name = p["program"].split("/")[-1]
        for plan in ["fused", "unfused"]:
            for i, k in enumerate(p[plan]["per_kernel"]):
                out[(name, plan, i, k["name"])] = (k["predicted_us"], k["measured_us"])
            out[(name, plan, -1, "total")] = (p[plan]["predicted_us"], p[plan]["measured_us"])
    return out
c, m = rows(runs["calibrated"]), rows(runs["committed"])
print(f"{'program':<24} {'plan':<8} {'kernel':<26} {'cal pred':>9} {'cal meas':>9} {'err':>6} | {'com pred':>9} {'com meas':>9} {'err':>6}")
errs = {"cal": [], "com": []}
for key in sorted(set(c) | set(m), key=lambda k: (k[0], k[1], k[2])):
    a, b = c.get(key), m.get(key)
    f = lambda x: (f"{x[0]:9.1f} {x[1]:9.1f} {100*(x[0]/x[1]-1):+5.0f}%" if x else f"{'-':>9} {'-':>9} {'':>6}")
    print(f"{key[0]:<24} {key[1]:<8} {key[3]:<26} {f(a)} | {f(b)}")
    if key[2] >= 0:
        if a: errs["cal"].append(abs(math.log(a[0]/a[1])))
        if b: errs["com"].append(abs(math.log(b[0]/b[1])))
for k, v in errs.items():
    v.sort()
    print(f"{k}: {len(v)} kernels, mean |log(pred/meas)| {sum(v)/len(v):.3f}, median {v[len(v)//2]:.3f}, within 15%: {sum(1 for x in v if x < math.log(1.15))}")
for p in runs["calibrated"]["programs"]:
    q = [x for x in runs["committed"]["programs"] if x["program"] == p["program"]][0]
    print(f"{p['program'].split('/')[-1]:<24} speedup measured {p['speedup_measured']:.2f}x/{q['speedup_measured']:.2f}x predicted cal {p['speedup_predicted']:.2f}x (err {100*p['speedup_error']:.0f}%) com {q['speedup_predicted']:.2f}x (err {100*q['speedup_error']:.0f}%)")
