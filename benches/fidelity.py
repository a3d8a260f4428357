#!/usr/bin/env python3
"""The cost model's fidelity on random programs at the sizes models run at (issue 22, item 5).

Reads the bench JSONs (`eqfuse bench --json`, schema eqfuse.bench/1) that benches/gpu/fidelity.sh
wrote, and the plans that `examples/gen_programs.rs` saved beside each program
(`gSEED.plan.json`: the fused plan, `gSEED.unfused.json`: the unfused one, both
docs/plan-schema.md), joined by program name and kernel id (`per_kernel[].id`). Reports, over
every timed kernel (fused and unfused plans) and over every plan:

- predicted against measured: the share within 15% (|predicted - measured| <= 0.15 measured) and
  Spearman's rank correlation (ties get their mean rank);
- the same by template, dtype, and feature: strided view (a `transpose` or `slice` in the body),
  broadcast read, wide row (a last domain axis of 4096 or more), masked (`where`), reduction axis
  (last: rowreduce, leading: colreduce), a gemm's epilogue and implementation, and predicted size;
- the 20 kernels furthest off (measured / predicted), with program and kernel id;
- programs whose fused outputs did not match the CPU reference, and plans measured under 50 us.

Usage: python3 benches/fidelity.py RESULTS [--programs DIR] [--repredict DIR] [--out-md F] [--out-json F]
RESULTS: a folder of bench-*.json (fidelity.sh's, unpacked) or the JSON files themselves.
`--repredict DIR`: the measured kernels re-priced by the cost model as it is now, from the plans
`examples/replan_programs.rs` wrote to DIR for the same programs: a kernel counts where the
re-planned plan has a kernel of the same id, template and bytes, and for a product the same
implementation, as the saved plan (the unfused plan's always do, unless a product changes
implementation; a fused plan the model now plans otherwise loses its changed kernels), with that kernel's
prediction and features; a plan counts where all its kernels do. A re-prediction of old
measurements, not a measurement.
`--self-test` checks the analysis on a fabricated bench JSON in the real schema.
Python 3, standard library and numpy only.
"""
import argparse
import glob
import json
import os
import sys
import tempfile

import numpy as np

TOL = 0.15
TARGET_WITHIN = 0.90
TARGET_RHO = 0.95
VIEWS = {"reshape", "broadcast", "transpose", "slice"}
ROW_OPS = {"sum", "mean", "amax", "amin", "softmax", "log_softmax", "layernorm", "rmsnorm", "cross_entropy"}


def spearman(a, b):
    """Spearman's rho with mean ranks for ties; None with fewer than 2 points or no spread."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) != len(b) or len(a) < 2:
        return None
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else None


def ranks(v):
    order = np.argsort(v, kind="mergesort")
    r = np.empty(len(v))
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return r


def dtype_of(name):
    """`{template}_{dtype}_k{id}` (codegen's kernel_name)."""
    parts = name.split("_")
    return parts[-2] if len(parts) >= 3 else "?"


def features(k):
    """A plan kernel's features, from its plan JSON entry."""
    ops = k.get("ops", [])
    domain = k.get("domain", [])
    t = k.get("template", "?")
    f = {
        "template": t,
        "strided": "transpose" in ops or "slice" in ops,
        "broadcast": "broadcast" in ops,
        "wide_row": bool(domain) and domain[-1] >= 4096,
        # (Rows of a few elements: `rowreduce.row_ns` prices those read one element a lane.)
        "narrow_row": t == "rowreduce" and bool(domain) and domain[-1] <= 32,
        "masked": "where" in ops,
        "reduction_axis": {"rowreduce": "last", "colreduce": "leading"}.get(t, "none"),
        "epilogue": "-",
    }
    if t == "gemm":
        rest = [o for o in ops if o not in VIEWS and o != "@"]
        if not rest:
            kind = "none"
        elif set(rest) <= {"+"}:
            kind = "bias"
        elif set(rest) & ROW_OPS:
            kind = "row"
        else:
            kind = "pointwise"
        f["epilogue"] = f"{k.get('implementation', '?')}:{kind}"
    return f


def stem(program):
    return os.path.splitext(os.path.basename(program))[0]


def load_plan(programs_dir, name, which):
    if not programs_dir:
        return None
    path = os.path.join(programs_dir, f"{name}.{'plan' if which == 'fused' else 'unfused'}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def repriced(plan, k):
    """The re-planned kernel that is benched kernel `k` (same id, template and bytes), or None."""
    pk = {q["id"]: q for q in plan["kernels"]}.get(k.get("id")) if plan else None
    if pk is None or not k["name"].startswith(pk["template"] + "_"):
        return None
    return pk if pk["bytes_read"] + pk["bytes_written"] == k["bytes"] else None


def collect(bench_files, programs_dir, repredict_dir=None):
    """Kernel rows and plan rows from the bench JSONs (a program benched twice counts once)."""
    kernels, plans, seen = [], [], set()
    notes = {"mismatch": [], "plan_differs": [], "untimed": 0, "not_repriced": 0}
    for path in bench_files:
        with open(path) as f:
            bench = json.load(f)
        if bench.get("schema") != "eqfuse.bench/1":
            raise SystemExit(f"{path}: not an eqfuse.bench/1 JSON")
        for p in bench["programs"]:
            name = stem(p["program"])
            if name in seen:
                continue
            seen.add(name)
            if not p["fused"]["ok"]:
                notes["mismatch"].append(name)
            for which in ("fused", "unfused"):
                r = p[which]
                replan = load_plan(repredict_dir, name, which) if repredict_dir else None
                if repredict_dir:
                    matched = [repriced(replan, k) for k in r["per_kernel"]]
                    if all(matched) and len(matched) == len(replan["kernels"]):
                        plans.append({"program": name, "plan": which, "predicted_us": replan["total"]["predicted_us"],
                                      "measured_us": r["measured_us"], "kernels": r["kernels"]})
                else:
                    plans.append({"program": name, "plan": which, "predicted_us": r["predicted_us"],
                                  "measured_us": r["measured_us"], "kernels": r["kernels"]})
                plan = load_plan(programs_dir, name, which)
                by_id = {k["id"]: k for k in plan["kernels"]} if plan else {}
                for k in r["per_kernel"]:
                    pk = by_id.get(k.get("id"))
                    # The saved plan must be the one benched: same kernel, same prediction.
                    if pk is not None and abs(pk["predicted_us"] - k["predicted_us"]) > 0.002:
                        notes["plan_differs"].append(f"{name} {which} k{k.get('id')}")
                        pk = None
                    if repredict_dir:
                        saved = pk
                        pk = repriced(replan, k)
                        # A product now planned in another implementation (cuBLASLt against the
                        # generated kernel) is not the kernel measured.
                        if pk is not None and saved is not None and saved.get("implementation") != pk.get("implementation"):
                            pk = None
                        if pk is None:
                            notes["not_repriced"] += 1
                            continue
                        k = {**k, "predicted_us": pk["predicted_us"]}
                    feats = features(pk) if pk else {"template": k["name"].split("_")[0]}
                    feats["dtype"] = dtype_of(k["name"])
                    m = k["measured_us"]
                    if m is None or not np.isfinite(m):
                        notes["untimed"] += 1
                        continue
                    kernels.append({"program": name, "plan": which, "id": k.get("id"), "name": k["name"],
                                    "predicted_us": k["predicted_us"], "measured_us": m, **feats})
    return kernels, plans, notes


def stats(rows):
    if not rows:
        return {"n": 0}
    p = np.array([r["predicted_us"] for r in rows])
    m = np.array([r["measured_us"] for r in rows])
    err = np.abs(p - m) / m
    ratio = m / p
    return {"n": len(rows), "within_15": float((err <= TOL).mean()), "spearman": spearman(p, m),
            "median_ratio": float(np.median(ratio)), "p10_ratio": float(np.percentile(ratio, 10)),
            "p90_ratio": float(np.percentile(ratio, 90)), "median_abs_err": float(np.median(err)),
            "predicted_us": float(p.sum()), "measured_us": float(m.sum())}


def size_bucket(r):
    p = r["predicted_us"]
    return "<10 us" if p < 10 else "10-50 us" if p < 50 else ">=50 us"


def group(rows, key):
    out = {}
    for r in rows:
        v = key(r)
        if v is None:
            continue
        out.setdefault(str(v), []).append(r)
    return {k: stats(v) for k, v in sorted(out.items())}


def analyse(bench_files, programs_dir, repredict_dir=None):
    kernels, plans, notes = collect(bench_files, programs_dir, repredict_dir)
    fused = [k for k in kernels if k["plan"] == "fused"]
    by = {}
    for feat in ("template", "dtype", "strided", "broadcast", "wide_row", "narrow_row", "masked", "reduction_axis", "epilogue"):
        by[feat] = group(kernels, lambda r, f=feat: r.get(f))
    by["predicted size"] = group(kernels, size_bucket)
    by["plan"] = group(kernels, lambda r: r["plan"])
    worst = sorted(kernels, key=lambda r: -abs(np.log(r["measured_us"] / r["predicted_us"])))[:20]
    summary = {
        "schema": "eqfuse.fidelity/1",
        "bench_files": [os.path.basename(f) for f in bench_files],
        "programs": len({p["program"] for p in plans}),
        "kernels": stats(kernels),
        "fused_kernels": stats(fused),
        "plans": stats(plans),
        "fused_plans": stats([p for p in plans if p["plan"] == "fused"]),
        "by": by,
        "worst": [{k: r[k] for k in ("program", "plan", "id", "name", "predicted_us", "measured_us")} for r in worst],
        "fused_measured_under_50us": sorted(p["program"] for p in plans if p["plan"] == "fused" and p["measured_us"] < 50),
        "reference_mismatch": notes["mismatch"],
        "plan_differs": notes["plan_differs"],
        "untimed_kernels": notes["untimed"],
        "repredicted_from": repredict_dir,
        "kernels_not_repriced": notes["not_repriced"],
        "without_features": sum(1 for k in kernels if "strided" not in k),
    }
    k = summary["kernels"]
    summary["targets"] = {
        "within_15_at_least_0.90": k.get("within_15", 0) >= TARGET_WITHIN,
        "spearman_at_least_0.95": (k.get("spearman") or 0) >= TARGET_RHO,
    }
    return summary


def fmt(x, pct=False):
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" if pct else f"{x:.3f}"


def markdown(s):
    lines = ["# Cost-model fidelity on generated programs", ""]
    lines.append(f"{s['programs']} programs; bench files: {len(s['bench_files'])}. Every kernel of the fused and "
                 "the unfused plan that `eqfuse bench` timed; a kernel is within 15% when "
                 "|predicted - measured| <= 0.15 x measured.")
    lines.append("")
    lines.append("| set | n | within 15% | Spearman | median measured/predicted | p10 | p90 |")
    lines.append("|---|---|---|---|---|---|---|")
    for label, key in (("all kernels", "kernels"), ("fused kernels", "fused_kernels"), ("all plans", "plans"),
                       ("fused plans", "fused_plans")):
        st = s[key]
        if st["n"]:
            lines.append(f"| {label} | {st['n']} | {fmt(st['within_15'], True)} | {fmt(st['spearman'])} | "
                         f"{fmt(st['median_ratio'])} | {fmt(st['p10_ratio'])} | {fmt(st['p90_ratio'])} |")
    t = s["targets"]
    lines += ["", f"Targets (all kernels): within 15% >= 90%: **{'met' if t['within_15_at_least_0.90'] else 'NOT met'}**; "
              f"Spearman >= 0.95: **{'met' if t['spearman_at_least_0.95'] else 'NOT met'}**.", ""]
    for feat, groups in s["by"].items():
        lines += [f"## By {feat}", "", "| value | kernels | within 15% | Spearman | median measured/predicted | p10 | p90 |",
                  "|---|---|---|---|---|---|---|"]
        for v, st in groups.items():
            lines.append(f"| {v} | {st['n']} | {fmt(st['within_15'], True)} | {fmt(st['spearman'])} | "
                         f"{fmt(st['median_ratio'])} | {fmt(st['p10_ratio'])} | {fmt(st['p90_ratio'])} |")
        lines.append("")
    lines += ["## The 20 kernels furthest off", "", "| program | plan | kernel | predicted us | measured us | measured/predicted |",
              "|---|---|---|---|---|---|"]
    for r in s["worst"]:
        lines.append(f"| {r['program']} | {r['plan']} | {r['name']} | {r['predicted_us']:.2f} | {r['measured_us']:.2f} | "
                     f"{r['measured_us'] / r['predicted_us']:.2f} |")
    lines += ["", "## Notes", ""]
    lines.append(f"- fused outputs that did not match the CPU reference: {len(s['reference_mismatch'])} "
                 f"{' '.join(s['reference_mismatch'][:20])}")
    lines.append(f"- fused plans measured under 50 us: {len(s['fused_measured_under_50us'])}")
    lines.append(f"- kernels whose saved plan differs from the benched one (features unknown): {len(s['plan_differs'])}")
    lines.append(f"- kernels without features (no saved plan): {s['without_features']}; untimed kernels: {s['untimed_kernels']}")
    if s.get("repredicted_from"):
        lines.insert(2, f"**Re-predicted**: the measured kernels priced by the plans in `{s['repredicted_from']}` "
                        f"(not a measurement); {s['kernels_not_repriced']} measured kernels left out (planned otherwise now).")
        lines.insert(3, "")
    return "\n".join(lines) + "\n"


def bench_files_of(paths):
    files = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "bench-*.json"))) if os.path.isdir(p) else [p]
    return files


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="*")
    ap.add_argument("--programs", help="the folder gen_programs wrote (plans beside programs)")
    ap.add_argument("--repredict", help="re-price the measured kernels by the plans replan_programs wrote here")
    ap.add_argument("--out-md", default="fidelity.md")
    ap.add_argument("--out-json", default="fidelity.json")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args(argv)
    if a.self_test:
        return self_test()
    files = bench_files_of(a.results)
    if not files:
        ap.error("no bench JSON found")
    s = analyse(files, a.programs, a.repredict)
    with open(a.out_md, "w") as f:
        f.write(markdown(s))
    with open(a.out_json, "w") as f:
        json.dump(s, f, indent=1)
        f.write("\n")
    k = s["kernels"]
    print(f"{s['programs']} programs, {k['n']} kernels: {fmt(k.get('within_15'), True)} within 15%, "
          f"Spearman {fmt(k.get('spearman'))}; wrote {a.out_md} and {a.out_json}")
    return 0


# ---- self-test: a fabricated bench JSON in the eqfuse.bench/1 schema (a test fixture, not a
# measurement) and two plans in the eqfuse.plan/1 schema.

def _kernel(i, name, pred, meas):
    return {"name": name, "id": i, "bytes": 1 << 20, "predicted_us": pred, "measured_us": meas, "copy_share": 0.9}


def _report(kernels, ok=True):
    return {"kernels": len(kernels), "bytes": len(kernels) << 20, "predicted_us": sum(k["predicted_us"] for k in kernels),
            "measured_us": sum(k["measured_us"] for k in kernels), "ok": ok, "near_decisions": 0,
            "within_reference_error": False, "per_kernel": kernels}


def _plan_kernel(i, template, ops, domain, pred, impl=None):
    k = {"id": i, "template": template, "ops": ops, "reads": ["x0"], "writes": [f"t{i}"], "bytes_read": 1,
         "bytes_written": 1, "flops": 1, "predicted_us": round(pred, 3), "domain": domain, "body": "x0", "rejected": []}
    if impl:
        k["implementation"] = impl
    return k


def self_test():
    import unittest

    class T(unittest.TestCase):
        def test_spearman(self):
            self.assertAlmostEqual(spearman([1, 2, 3, 4], [1, 3, 2, 4]), 0.8)
            self.assertEqual(spearman([1, 2, 3], [3, 2, 1]), -1.0)
            self.assertAlmostEqual(spearman([1, 1, 2], [1, 2, 3]), 0.8660254037844387)
            self.assertIsNone(spearman([1], [1]))

        def test_analysis(self):
            d = tempfile.mkdtemp()
            fused = [_kernel(0, "gemm_bf16_k0", 40.0, 44.0), _kernel(1, "rowreduce_f32_k1", 20.0, 30.0)]
            unfused = [_kernel(0, "elementwise_f32_k0", 10.0, 10.5), _kernel(1, "gemm_bf16_k1", 30.0, 31.0),
                       _kernel(2, "colreduce_f32_k2", 5.0, 4.9), _kernel(3, "elementwise_f16_k3", 8.0, float("nan"))]
            plan = {"schema": "eqfuse.plan/1", "kernels": [
                _plan_kernel(0, "gemm", ["transpose", "@", "+", "gelu"], [4096, 1024], 40.0, "generated"),
                _plan_kernel(1, "rowreduce", ["where", "softmax"], [64, 50257], 20.0)]}
            unf = {"schema": "eqfuse.plan/1", "kernels": [
                _plan_kernel(0, "elementwise", ["broadcast", "*"], [8, 768], 10.0),
                _plan_kernel(1, "gemm", ["@"], [4096, 1024], 30.0, "cublaslt"),
                _plan_kernel(2, "colreduce", ["sum"], [1, 768], 5.0),
                _plan_kernel(3, "elementwise", ["exp"], [8, 768], 8.0)]}
            with open(os.path.join(d, "g7.plan.json"), "w") as f:
                json.dump(plan, f)
            with open(os.path.join(d, "g7.unfused.json"), "w") as f:
                json.dump(unf, f)
            # A second program whose saved fused plan predicts otherwise: its features are unknown.
            with open(os.path.join(d, "g9.plan.json"), "w") as f:
                json.dump({"kernels": [_plan_kernel(0, "elementwise", ["exp"], [4], 99.0)]}, f)
            bench = {"schema": "eqfuse.bench/1", "device": "fixture", "copy_bandwidth_gbs": 1.0,
                     "profile_copy_bandwidth_gbs": 1.0, "rank_correlation": None, "programs": [
                         {"program": ".gpu/fidelity/g7.eqf", "fused": _report(fused), "unfused": _report(unfused),
                          "speedup_measured": 1.0, "speedup_predicted": 1.0, "speedup_error": 0.0, "copy_share": 0.9},
                         {"program": ".gpu/fidelity/g9.eqf", "fused": _report([_kernel(0, "elementwise_f32_k0", 60.0, 61.0)], ok=False),
                          "unfused": _report([_kernel(0, "elementwise_f32_k0", 60.0, 62.0)]),
                          "speedup_measured": 1.0, "speedup_predicted": 1.0, "speedup_error": 0.0, "copy_share": 0.9}]}
            path = os.path.join(d, "bench-0000.json")
            with open(path, "w") as f:
                json.dump(bench, f)
            s = analyse(bench_files_of([d]), d)
            k = s["kernels"]
            # 7 timed kernels (one NaN left out): within 15%: 44/40, 10.5/10, 31/30, 4.9/5, 61/60, 62/60.
            self.assertEqual(k["n"], 7)
            self.assertEqual(s["untimed_kernels"], 1)
            self.assertAlmostEqual(k["within_15"], 6 / 7)
            self.assertFalse(s["targets"]["within_15_at_least_0.90"])
            self.assertEqual(s["worst"][0]["name"], "rowreduce_f32_k1")
            self.assertEqual(s["reference_mismatch"], ["g9"])
            self.assertEqual(s["plan_differs"], ["g9 fused k0"])
            by = s["by"]
            self.assertEqual(by["epilogue"]["generated:pointwise"]["n"], 1)
            self.assertEqual(by["epilogue"]["cublaslt:none"]["n"], 1)
            self.assertEqual(by["strided"]["True"]["n"], 1)
            self.assertEqual(by["wide_row"]["True"]["n"], 1)
            self.assertEqual(by["masked"]["True"]["within_15"], 0.0)
            self.assertEqual(by["reduction_axis"]["leading"]["n"], 1)
            self.assertEqual(by["dtype"]["bf16"]["n"], 2)
            self.assertEqual(s["without_features"], 2)  # g9's two kernels (no unfused plan saved, one differs)
            # Re-predicted: g7's unfused kernel 2 re-priced at 4.9 us; its kernel 1 planned otherwise
            # now (other bytes) is left out, and so is the plan; g9 has no re-planned plan.
            r = tempfile.mkdtemp()
            replanned = json.loads(json.dumps(unf))
            for q in replanned["kernels"]:
                q["bytes_read"] = (1 << 20) - 1  # the fixture's benched bytes
            replanned["kernels"][2]["predicted_us"] = 4.9
            replanned["kernels"][1]["bytes_read"] = 7
            replanned["total"] = {"predicted_us": 1.0}
            with open(os.path.join(r, "g7.unfused.json"), "w") as f:
                json.dump(replanned, f)
            rs = analyse(bench_files_of([d]), d, r)
            self.assertEqual(rs["kernels"]["n"], 2)  # g7 unfused k0 and k2 (k3 untimed)
            self.assertAlmostEqual(rs["kernels"]["within_15"], 1.0)
            self.assertEqual(rs["kernels_not_repriced"], 5)  # g7 fused (2), g9 (2), g7 unfused k1
            self.assertEqual(rs["plans"]["n"], 0)
            self.assertIn("Re-predicted", markdown(rs))
            md = markdown(s)
            self.assertIn("NOT met", md)
            self.assertIn("| g7 | fused | rowreduce_f32_k1 | 20.00 | 30.00 | 1.50 |", md)

    suite = unittest.defaultTestLoader.loadTestsFromTestCase(T)
    ok = unittest.TextTestRunner(verbosity=2).run(suite).wasSuccessful()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
