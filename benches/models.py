"""Real `transformers` models by eager PyTorch, Inductor and the eqfuse backend, in one process
on one GPU: forward (inference) and, with --train, a training step (forward, a loss, backward).

Models are built from configs at the sizes people run (random weights; nothing is downloaded):
GPT-2 (12 layers, 768 wide), BERT-base, a Llama of the 1B class (2048 wide, GQA 32/8 heads,
SwiGLU 8192, RMSNorm, RoPE; `--llama-layers`, default 4), ViT-B/16 at 224x224 and T5-base's
encoder. Each is timed with CUDA events (warm-up calls first, `--reps` timed calls, the median),
its first compiled call timed separately as compile time, and its output (and gradients with
--train) compared with eager's. For the eqfuse backend the record also says on which graphs
eqfuse's kernels ran and why any ran eagerly, and how (`launches`: CUDA graphs captured and
replayed, calls launched kernel by kernel; EQFUSE_CUDA_GRAPH=0 turns graphs off).

Each compiled mode runs in a process of its own (with eager beside it, for its reference), one
after the other on the same GPU; `--same-process` runs them all in one. In one process the
order mattered: the eqfuse backend's GPT-2 training step took 27.5 ms measured after Inductor's
and 18.3 ms measured first (H100, 2026-11-26), so results of one process are not comparable.

Compile times are cold: each child process gets empty cache folders of its own for Inductor
(TORCHINDUCTOR_CACHE_DIR), Triton (TRITON_CACHE_DIR) and CuPy (CUPY_CACHE_DIR, where the eqfuse
backend's NVRTC builds go), so that no mode compiles from an earlier process's disk cache (the
seventh session's ViT and T5 Inductor compiles, 2.5 and 3.7 s, read the caches of earlier runs);
`--warm-caches` keeps the default folders.

    python3 benches/models.py [--models gpt2,bert,llama,vit,t5] [--dtypes bf16,f32]
        [--batch 8 --seq 1024] [--train [--truth]] [--reps 10] [--json OUT]

With --truth, the training step also runs once on the model in float64 (the same weights and
inputs), and every mode's gradients, eager's among them, are measured against it as well
(`*_grad_truth_*`): the gradient error against eager is the sum of both sides' rounding, and
on parameters whose gradient is zero in exact arithmetic (attention's key bias) it is rounding
noise alone (`*_nonzero_*` leaves them out; `grad_zero_in_exact` counts them).

Needs a CUDA device, CuPy and the eqfuse binary (`$EQFUSE`, or as `backend.find_eqfuse` says).
"""

import argparse
import copy
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from eqfuse_torch.backend import EqfuseBackend  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def build(name, args):
    import transformers as T

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 30000, (args.batch, args.seq), generator=g)
    if name == "gpt2":
        cfg = T.GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=max(1024, args.seq), resid_pdrop=0.0,
                           embd_pdrop=0.0, attn_pdrop=0.0)
        return T.GPT2Model(cfg), {"input_ids": ids, "use_cache": False}
    if name == "bert":
        cfg = T.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                           max_position_embeddings=max(512, args.seq))
        mask = torch.ones_like(ids)
        mask[:, args.seq - args.seq // 8:] = 0  # padded tails
        return T.BertModel(cfg, add_pooling_layer=False), {"input_ids": ids, "attention_mask": mask}
    if name == "llama":
        cfg = T.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=args.llama_layers,
                            num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                            max_position_embeddings=max(2048, args.seq))
        return T.LlamaModel(cfg), {"input_ids": ids, "use_cache": False}
    if name == "vit":
        cfg = T.ViTConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        pixels = torch.randn(args.batch, 3, 224, 224, generator=g)
        return T.ViTModel(cfg, add_pooling_layer=False), {"pixel_values": pixels}
    if name == "t5":
        cfg = T.T5Config(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12, dropout_rate=0.0)
        return T.T5EncoderModel(cfg), {"input_ids": ids}
    raise SystemExit(f"unknown model {name}")


def first(out):
    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if hasattr(out, "values") else out
    return next(t for t in values if isinstance(t, torch.Tensor))


def relative(got, want, floor=1e-30):
    """Largest difference over the largest eager value, or over `floor` where that is larger."""
    got, want = got.float(), want.float()
    return ((got - want).abs().max() / want.abs().max().clamp_min(floor)).item()


def timed(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(times)


def run(name, dtype, args):
    model, kw = build(name, args)
    model = model.cuda().to(DTYPES[dtype])
    kw = {k: (v.cuda().to(DTYPES[dtype]) if v.is_floating_point() else v.cuda()) if isinstance(v, torch.Tensor) else v
          for k, v in kw.items()}
    model.train(args.train)
    probe = None

    def step(m, inputs=None, acc=torch.float32):
        inputs = kw if inputs is None else inputs
        if not args.train:
            with torch.no_grad():
                return first(m(**inputs))
        nonlocal probe
        out = first(m(**inputs))
        if probe is None:
            probe = torch.randn(out.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(2))
        loss = (out.to(acc) * probe.to(acc)).mean()
        loss.backward()
        return out

    rec = {"model": name, "dtype": dtype, "batch": args.batch, "seq": args.seq, "train": args.train}
    want = step(model)
    grads0 = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None} if args.train else {}
    # The f64 truth (--truth): the same weights and inputs in float64, so that each mode's
    # gradients, eager's among them, are measured against exact arithmetic, not only against
    # eager's own rounding.
    truth, zero = {}, set()
    if args.train and args.truth:
        m64 = copy.deepcopy(model).double()
        m64.zero_grad(set_to_none=True)
        step(m64, {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                   for k, v in kw.items()}, torch.float64)
        truth = {n: p.grad for n, p in m64.named_parameters() if p.grad is not None}
        del m64
        top = max(g.abs().max().item() for g in truth.values())
        zero = {n for n, g in truth.items() if g.abs().max().item() <= 1e-9 * top}
        rec["grad_zero_in_exact"] = len(zero)
    if truth:
        grad_errors(rec, "eager", dict(model.named_parameters()), truth, dtype, "truth", zero)
    rec["eager_us"] = timed(lambda: step(model), args.reps)
    for mode in args.modes:
        if mode == "eager":
            continue
        torch._dynamo.reset()
        m = copy.deepcopy(model)
        m.zero_grad(set_to_none=True)
        backend = None
        if mode == "eqfuse":
            backend = EqfuseBackend(report=None)
            compiled = torch.compile(m, backend=backend, dynamic=False)
        elif mode == "inductor":
            compiled = torch.compile(m, dynamic=False)
        else:
            compiled = torch.compile(m, mode="max-autotune-no-cudagraphs", dynamic=False)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = step(compiled)
        torch.cuda.synchronize()
        rec[f"{mode}_compile_s"] = round(time.perf_counter() - t0, 2)
        rec[f"{mode}_rel_err"] = relative(got, want)
        if args.train:
            # A gradient that is zero in exact arithmetic (attention's key bias: softmax ignores a
            # per-query shift) is rounding noise on every side; it is measured against a floor of
            # the step's largest gradient (1e-5 of it in f32, 1e-3 in 16-bit types), as the tests
            # do, not against its own size (Inductor's was 1.4 on BERT without the floor).
            params = dict(m.named_parameters())
            grad_errors(rec, mode, params, grads0, dtype, "rel", zero)
            if truth:
                grad_errors(rec, mode, params, truth, dtype, "truth", zero)
        rec[f"{mode}_us"] = timed(lambda: step(compiled), args.reps)
        if backend is not None:
            rec["eqfuse_graphs"] = [{"kind": p.kind, "runs": p.runs, "why_eager": p.why_eager,
                                     "kernels": p.plan["total"]["kernels"] if p.plan else None,
                                     "predicted_us": p.plan["total"]["predicted_us"] if p.plan else None,
                                     "launches": dict(p.launches) if p.launches is not None else None}
                                    for p in backend.plans if p.kind != "joint"]
        del compiled, m
    for mode in args.modes:
        if mode != "eager" and f"{mode}_us" in rec:
            rec[f"{mode}_speedup_vs_eager"] = round(rec["eager_us"] / rec[f"{mode}_us"], 3)
    if "inductor_us" in rec and "eqfuse_us" in rec:
        rec["inductor_over_eqfuse"] = round(rec["inductor_us"] / rec["eqfuse_us"], 3)
    return rec


def grad_errors(rec, mode, params, want, dtype, key, zero=()):
    """Records `mode`'s gradient errors against `want` (eager's: `key` "rel"; the f64 truth:
    "truth"): `{mode}_grad_{key}_err`, the largest over parameters of `relative` with a floor of
    the step's largest gradient (1e-5 of it in f32, 1e-3 in 16-bit types); the parameter where
    it is largest (`..._worst`); and the largest over parameters of the norm of the difference
    over the norm of `want` (`..._norm_err`). Where `zero` names parameters whose gradient is
    zero in exact arithmetic (attention's key bias), `..._nonzero_err` is the largest over the
    others: on those, every mode's error, eager's against the truth too, is rounding noise over
    the floor."""
    largest = max(g.float().abs().max().item() for g in want.values())
    floor = largest * (1e-5 if dtype == "f32" else 1e-3)
    errs, norms = {}, {}
    for n, p in params.items():
        if n in want and p.grad is not None:
            got, ref = p.grad.double(), want[n].double()
            errs[n] = relative(got, ref, floor)
            norms[n] = ((got - ref).norm() / ref.norm().clamp_min(floor)).item()
    if not errs:
        rec[f"{mode}_grad_{key}_err"] = None
        return
    worst = max(errs, key=errs.get)
    rec[f"{mode}_grad_{key}_err"] = errs[worst]
    rec[f"{mode}_grad_{key}_worst"] = worst
    rec[f"{mode}_grad_{key}_norm_err"] = max(norms.values())
    if zero:
        rest = {n: e for n, e in errs.items() if n not in zero}
        if rest:
            worst = max(rest, key=rest.get)
            rec[f"{mode}_grad_{key}_nonzero_err"] = rest[worst]
            rec[f"{mode}_grad_{key}_nonzero_worst"] = worst


def isolated(name, dtype, args):
    """`run` with each compiled mode in a child process of its own (eager measured in each, its
    reference; the record keeps the first child's eager time)."""
    import subprocess

    import os
    import tempfile

    rec = None
    for mode in [m for m in args.modes if m != "eager"] or ["eager"]:
        env = dict(os.environ)
        cold = None if args.warm_caches else tempfile.TemporaryDirectory(prefix=f"models-{mode}-")
        if cold:
            for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUPY_CACHE_DIR"):
                env[var] = os.path.join(cold.name, var.lower())
        cmd = [sys.executable, __file__, "--models", name, "--dtypes", dtype, "--modes", f"eager,{mode}",
               "--batch", str(args.batch), "--seq", str(args.seq), "--llama-layers", str(args.llama_layers),
               "--reps", str(args.reps), "--same-process"] + (["--train"] if args.train else []) + (
                   ["--truth"] if args.truth else [])
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if cold:
            cold.cleanup()
        lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise RuntimeError(f"{mode}: exit {r.returncode}: {r.stderr.strip()[-400:]}")
        child = json.loads(lines[-1])
        if "error" in child:
            raise RuntimeError(f"{mode}: {child['error']}")
        if rec is None:
            rec = child
        else:
            rec.update({k: v for k, v in child.items() if k.startswith(mode) or k == "eqfuse_graphs"})
    if "inductor_us" in rec and "eqfuse_us" in rec:
        rec["inductor_over_eqfuse"] = round(rec["inductor_us"] / rec["eqfuse_us"], 3)
    rec["processes"] = "one per mode"
    rec["compile_caches"] = "warm (default folders)" if args.warm_caches else "cold (empty per process)"
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2,bert,llama,vit,t5")
    ap.add_argument("--dtypes", default="bf16,f32")
    ap.add_argument("--modes", default="eager,inductor,eqfuse")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--llama-layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--json", help="append one JSON record per model and dtype")
    ap.add_argument("--truth", action="store_true",
                    help="with --train: every mode's gradients (eager's too) against the model in float64 as well")
    ap.add_argument("--same-process", action="store_true", help="every mode in this process")
    ap.add_argument("--warm-caches", action="store_true", help="compile caches of earlier runs kept")
    args = ap.parse_args()
    args.modes = args.modes.split(",")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for name in args.models.split(","):
        for dtype in args.dtypes.split(","):
            try:
                rec = run(name, dtype, args) if args.same_process else isolated(name, dtype, args)
            except Exception as e:  # one model's failure must not hide the others'
                rec = {"model": name, "dtype": dtype, "error": f"{type(e).__name__}: {str(e)[:500]}"}
            print(json.dumps(rec), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(rec) + "\n")
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
