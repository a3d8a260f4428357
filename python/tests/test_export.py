"""Tests of the PyTorch exporter and the torch.compile backend.

Each exported graph is checked three ways against PyTorch's own result: evaluated by eqfuse's CPU
reference (`eqfuse run --cpu` with the exported weights), rebuilt in PyTorch from the JSON by
`benches/torch_baselines.py` (an independent reader of the schema), and planned by
`eqfuse optimize`. Needs torch and numpy (skipped without them) and an eqfuse binary (found as
`backend.find_eqfuse` says: $EQFUSE, the PATH, or this repository's target/ build).

Run from the repository root: `python3 -m pytest python/tests`.
"""

import math
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from eqfuse_torch import ExportError, export_graph_module, export_program  # noqa: E402
from eqfuse_torch.backend import EqfuseBackend, device_profile, find_eqfuse, plan_graph  # noqa: E402

nn = torch.nn
F = torch.nn.functional


def baselines():
    spec = importlib.util.spec_from_file_location("torch_baselines", ROOT / "benches" / "torch_baselines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Block(nn.Module):
    """Linear + GELU, a decomposed layer norm, nn.LayerNorm, a residual, a softmax head."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.ln = nn.LayerNorm(32)
        self.head = nn.Linear(32, 8)

    def forward(self, x):
        h = F.gelu(self.fc(x))
        mu = h.mean(-1, keepdim=True)
        var = ((h - mu) ** 2).mean(-1, keepdim=True)
        n = (h - mu) / torch.sqrt(var + 1e-5)
        return torch.softmax(self.head(self.ln(n) + h), -1), n.sum(dim=(0, 1))


class Layout(nn.Module):
    """Views, permutations, reductions, comparisons and a mask buffer folded at export."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(6, 6, dtype=torch.bool)))

    def forward(self, q, k):
        s = q @ k.transpose(-1, -2) / 8.0
        s = s.masked_fill(~self.mask[:4, :4], float("-inf"))
        p = torch.softmax(s, -1)
        y = p.permute(2, 0, 1).reshape(5, -1)
        return y, torch.amax(q, dim=-1), (q > 0.5).float().mean(0), torch.where(q > 0, q, 0.1 * q)


def run_cpu(exported, inputs, tmp_path, by_name=None):
    """`eqfuse run --cpu` on the export, with the given inputs (or graph inputs `by_name`) and
    the exported values."""
    graph = tmp_path / "g.json"
    values = tmp_path / "in"
    exported.save(graph, values_dir=values)
    if by_name is None:
        by_name = dict(zip([n for n in exported.input_names if n and n not in exported.values], inputs))
    for name, t in by_name.items():
        np.save(values / f"{name}.npy", t.detach().numpy())
    out = tmp_path / "out"
    r = subprocess.run([find_eqfuse(), "run", "--cpu", str(graph), "--inputs", str(values), "--outputs", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return [torch.from_numpy(np.load(out / f"{o['name']}.npy")) for o in exported.graph["outputs"]]


def rebuilt(exported, inputs):
    """The graph rebuilt in PyTorch by the benches' reader, run on the inputs and values."""
    fn = baselines().build(exported.graph)
    by_name = dict(exported.values)
    by_name.update(zip([n for n in exported.input_names if n and n not in exported.values], inputs))
    args = [by_name[i["name"]] for i in exported.graph["inputs"]]
    return fn(*args)


def close(got, want, tol=1e-5):
    assert got.shape == want.shape, (got.shape, want.shape)
    torch.testing.assert_close(got.to(want.dtype), want, rtol=tol, atol=tol)


class Indexing(nn.Module):
    """An embedding lookup, a rotary half-swap by slices and a concatenation, `select`,
    `narrow`, `chunk`, `stack`, `index_select`, and a cross-entropy with integer targets."""

    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, ids, x, t):
        h = self.e(ids)  # [2, 3, 8]
        rot = torch.cat([-h[..., 4:], h[..., :4]], dim=-1)
        y = h * 0.5 + rot * 0.25
        a, b = y.chunk(2, dim=-1)
        z = torch.stack([a, b], dim=1).sum(1) + x.narrow(1, 1, 3).select(2, 0).unsqueeze(-1)
        picked = torch.index_select(z, 1, torch.tensor([2, 0]))
        loss = F.cross_entropy(self.head(y.reshape(-1, 8)), t)
        return picked, loss


@pytest.mark.parametrize("make", [lambda: (Block(), (torch.randn(4, 16),)),
                                  lambda: (Layout(), (torch.randn(5, 4, 8), torch.randn(5, 4, 8))),
                                  lambda: (Indexing(), (torch.tensor([[1, 2, 9], [0, 4, 4]]), torch.randn(2, 5, 2),
                                                        torch.tensor([0, 4, 1, 3, 2, 2])))])
def test_exported_program_computes_the_model(make, tmp_path):
    torch.manual_seed(0)
    model, inputs = make()
    model.eval()
    want = model(*inputs)
    exported = export_program(torch.export.export(model, inputs))
    for got_all in (run_cpu(exported, inputs, tmp_path), rebuilt(exported, inputs)):
        for got, w in zip(got_all, want):
            close(got, w)
    plan = plan_graph(exported.graph)
    assert plan["schema"] == "eqfuse.plan/1"
    assert plan["total"]["kernels"] < plan["unfused"]["kernels"]


def test_the_backend_plans_for_the_gpu_it_runs_on(monkeypatch):
    """`device="auto"` (the default) takes the built-in profile of the current CUDA device: an
    H200's where it runs on one, an H100's otherwise."""
    assert device_profile("NVIDIA H200") == "h200"
    assert device_profile("NVIDIA H200 NVL") == "h200"
    assert device_profile("NVIDIA H100 80GB HBM3") == "h100"
    assert device_profile("NVIDIA A100-SXM4-80GB") == "h100"
    assert device_profile("") == "h100"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert EqfuseBackend(report=None).device == "h200"
    assert EqfuseBackend(report=None, device="h100").device == "h100"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 PCIe")
    assert EqfuseBackend(report=None).device == "h100"


def test_decomposed_layernorm_plans_as_one_kernel():
    class LN(nn.Module):
        def __init__(self):
            super().__init__()
            self.g = nn.Parameter(torch.randn(64))
            self.b = nn.Parameter(torch.randn(64))

        def forward(self, x):
            mu = x.mean(-1, keepdim=True)
            var = ((x - mu) ** 2).mean(-1, keepdim=True)
            return (x - mu) / torch.sqrt(var + 1e-5) * self.g + self.b

    exported = export_program(torch.export.export(LN(), (torch.randn(32, 64),)))
    plan = plan_graph(exported.graph)
    assert [k["ops"] for k in plan["kernels"]] == [["layernorm"]]


def test_unsupported_operators_are_named_together():
    class Scan(nn.Module):
        def forward(self, x):
            return torch.cummax(x, 0).values.sum() + torch.kthvalue(x, 2).values.sum()

    ep = torch.export.export(Scan(), (torch.randn(3),))
    with pytest.raises(ExportError) as e:
        export_program(ep)
    message = str(e.value)
    assert "aten.cummax.default (node cummax)" in message
    assert "aten.kthvalue.default (node kthvalue)" in message


def test_backend_plans_forward_joint_and_backward_and_runs_eagerly():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    x = torch.randn(3, 8)
    backend = EqfuseBackend(report=None)
    compiled = torch.compile(model, backend=backend)
    y = compiled(x)
    y.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    close(y, model(x))
    for g, p in zip(grads, model.parameters()):
        close(g, p.grad)
    kinds = {p.kind: p for p in backend.plans}
    assert set(kinds) == {"forward", "joint", "backward"}, [(p.kind, p.error) for p in backend.plans]
    for p in backend.plans:
        assert p.plan is not None, (p.kind, p.error)
        assert p.plan["total"]["kernels"] <= p.plan["unfused"]["kernels"]


def test_graph_module_export_skips_missing_gradients():
    def f(x, w):
        return (x @ w).relu().sum(), None

    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(torch.randn(2, 3), torch.randn(3, 4))
    exported = export_graph_module(gm)
    assert [o["name"] for o in exported.graph["outputs"]] == ["out0"]
    json.dumps(exported.graph)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_gpt2_block_exports_and_computes(attention, tmp_path):
    """A GPT-2 block from `transformers` (random weights, nothing downloaded): its fused QKV
    projection is split by slicing the weight, the rest lowers directly."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=64, n_head=4, n_layer=1, n_positions=32)
    config._attn_implementation = attention
    block = GPT2Block(config).eval()
    x = torch.randn(2, 16, 64)
    want = block(x)
    want = want[0] if isinstance(want, tuple) else want
    exported = export_program(torch.export.export(block, (x,)))
    (got,) = run_cpu(exported, [x], tmp_path)
    close(got, want, tol=1e-4)
    plan = plan_graph(exported.graph)
    assert plan["total"]["bytes"] < plan["unfused"]["bytes"]


# --- fused SDPA ops' random-number state (the CUDA variants, traced with fake CUDA tensors)

aten = torch.ops.aten
B, H, S, D = 2, 4, 32, 16


def _sdpa_forward_graph(variant):
    """An AOTAutograd-like forward graph of a CUDA SDPA variant: it returns the result, the
    log-sum-exp and the random-number state saved for the backward (traced on fake CUDA tensors:
    no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def fw(q, k, v):
        if variant == "cudnn":
            r = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False)
            return r[0], r[1], r[6], r[7]
        if variant == "flash":
            r = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False)
            return r[0], r[1], r[6], r[7]
        r = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True)
        return r[0], r[1], r[2], r[3]

    def bw(g, q, k, v, out, lse, seed, offset):
        if variant == "cudnn":
            return aten._scaled_dot_product_cudnn_attention_backward(g, q, k, v, out, lse, seed, offset, None, None,
                                                                     None, S, S, 0.0, True)
        if variant == "flash":
            return aten._scaled_dot_product_flash_attention_backward(g, q, k, v, out, lse, None, None, S, S, 0.0,
                                                                     True, seed, offset)
        return aten._scaled_dot_product_efficient_attention_backward(g, q, k, v, None, out, lse, seed, offset, 0.0,
                                                                     [True, True, True, False], True)[:3]

    with FakeTensorMode():
        q, k, v, g = (torch.empty(B, H, S, D, device="cuda") for _ in range(4))
        fw_gm = make_fx(fw)(q, k, v)
        out, lse, seed, offset = fw(q, k, v)
        bw_gm = make_fx(bw)(g, q, k, v, out, lse, seed, offset)
    for gm in (fw_gm, bw_gm):
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return fw_gm, bw_gm


def _attention_reference(q, k, v):
    s = (q @ k.transpose(-1, -2)) / D ** 0.5
    s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


@pytest.mark.parametrize("variant", ["cudnn", "flash", "efficient"])
def test_fused_sdpa_random_state_is_a_dont_care_constant(variant, tmp_path):
    """Without dropout, the seed and offset a CUDA SDPA op returns mean nothing: the forward
    exports them as constant outputs marked don't-care (not an unsupported output), and the
    backward takes no graph input for them. Both graphs compute attention and its gradients."""
    fw_gm, bw_gm = _sdpa_forward_graph(variant)
    names = {str(n.target) for n in fw_gm.graph.nodes}
    assert any(f"_scaled_dot_product_{variant}" in t for t in names), names
    fw = export_graph_module(fw_gm)
    assert fw.dont_care == {2, 3} and set(fw.constants) == {2, 3}
    want_dtypes = {"flash": torch.uint64}.get(variant, torch.int64)
    assert all(fw.constants[i].dtype == want_dtypes for i in (2, 3))
    assert [o["name"] for o in fw.graph["outputs"]] == ["out0", "out1"]
    torch.manual_seed(0)
    q, k, v, g = (torch.randn(B, H, S, D) for _ in range(4))
    (tmp_path / "fw").mkdir()
    (tmp_path / "bw").mkdir()
    out, lse = run_cpu(fw, [q, k, v], tmp_path / "fw")
    want_out, want_lse = _attention_reference(q, k, v)
    close(out, want_out, 1e-4)
    close(lse.reshape(want_lse.shape), want_lse, 1e-4)

    bw = export_graph_module(bw_gm)
    assert bw.input_names[-2:] == [None, None]  # the seed and the offset: no graph inputs
    assert [i["name"] for i in bw.graph["inputs"]] == [n for n in bw.input_names if n]
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
    o.backward(g)
    lse_in = want_lse.unsqueeze(-1) if variant == "cudnn" else want_lse
    grads = run_cpu(bw, [g, q, k, v, want_out, lse_in], tmp_path / "bw")
    for got, want in zip(grads, (qr.grad, kr.grad, vr.grad)):
        close(got, want, 1e-4)
    for exported in (fw, bw):
        assert plan_graph(exported.graph)["total"]["kernels"] >= 1


@pytest.mark.parametrize("variant,masked,causal", [("cudnn", False, True), ("flash", False, True),
                                                   ("efficient", False, True), ("flash", False, False),
                                                   ("efficient", True, False), ("cudnn", True, True)])
def test_fused_sdpa_with_dropout_draws_eqfuses_dropout(variant, masked, causal, tmp_path):
    """With dropout, a CUDA SDPA forward is attention with eqfuse's dropout of the probabilities
    (a site whose seed is element k of the `eqfuse_seeds` input), returns that seed in its
    random-number state, and its backward draws the same mask again from it. Both are exported
    as the fused composites (`attention_dropout` or, with a mask, `attention_bias_dropout`, and
    their `*_dropout_grad_*` backward), no probability written out (no `dropout` node, no product
    of a dropout). Both graphs, on the CPU reference, equal `rng.attention` and its gradients
    with that seed."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from eqfuse_torch import rng

    p = 0.25

    def fw(q, k, v, m):
        if variant == "cudnn":
            r = aten._scaled_dot_product_cudnn_attention(q, k, v, m, True, p, causal, False)
            return r[0], r[1], r[6], r[7]
        if variant == "flash":
            r = aten._scaled_dot_product_flash_attention(q, k, v, p, causal, False)
            return r[0], r[1], r[6], r[7]
        r = aten._scaled_dot_product_efficient_attention(q, k, v, m, True, p, causal)
        return r[0], r[1], r[2], r[3]

    def bw(g, q, k, v, m, out, lse, seed, offset):
        if variant == "cudnn":
            return aten._scaled_dot_product_cudnn_attention_backward(g, q, k, v, out, lse, seed, offset, m, None,
                                                                     None, S, S, p, causal)
        if variant == "flash":
            return aten._scaled_dot_product_flash_attention_backward(g, q, k, v, out, lse, None, None, S, S, p,
                                                                     causal, seed, offset)
        return aten._scaled_dot_product_efficient_attention_backward(g, q, k, v, m, out, lse, seed, offset, p,
                                                                     [True, True, True, False], causal)[:3]

    with FakeTensorMode():
        q, k, v, g = (torch.empty(B, H, S, D, device="cuda") for _ in range(4))
        m = torch.empty(B, 1, S, S, device="cuda") if masked else None
        fw_gm = make_fx(fw)(q, k, v, m)
        out, lse, seed, offset = fw(q, k, v, m)
        bw_gm = make_fx(bw)(g, q, k, v, m, out, lse, seed, offset)
    fwx = export_graph_module(fw_gm)
    assert len(fwx.seeds) == 1 and fwx.seeds == rng.dropout_sites(fw_gm)
    assert fwx.seed_outputs == {2: 0, 3: 0} and not fwx.dont_care
    torch.manual_seed(0)
    q, k, v, g = (torch.randn(B, H, S, D) for _ in range(4))
    m = torch.randn(B, 1, S, S) if masked else None
    seed_value = 987654
    for d in ("fw", "bw"):
        (tmp_path / d).mkdir()
    fwx.values[fwx.seed_input] = torch.tensor([seed_value], dtype=torch.int32)  # (the backend draws it)
    got_out, got_lse = run_cpu(fwx, [q, k, v] + ([m] if masked else []), tmp_path / "fw")
    want_out, want_lse = rng.attention(q, k, v, m, p, causal, None, seed_value)
    close(got_out, want_out, 1e-4)
    close(got_lse.reshape(want_lse.shape), want_lse, 1e-4)
    no_drop, _ = rng.attention(q, k, v, m, 0.0, causal, None, seed_value)
    assert (want_out - no_drop).abs().max() > 1e-2  # dropout changed the result

    bwx = export_graph_module(bw_gm)
    fused = "attention_bias_dropout" if masked else "attention_dropout"
    for exported, ops in ((fwx, [fused]), (bwx, [f"{fused}_grad_{w}" for w in "qkv"])):
        nodes = exported.graph["nodes"]
        names = {n.get("op") for n in nodes}
        assert set(ops) <= names, sorted(o for o in names if o)
        assert "dropout" not in names and "softmax" not in names, sorted(o for o in names if o)
    state = rng.rng_state(seed_value, fwx.constants[2].dtype, tuple(fwx.constants[2].shape), "cpu")
    lse_in = want_lse.unsqueeze(-1) if variant == "cudnn" else want_lse
    offset = rng.rng_state(seed_value, fwx.constants[3].dtype, tuple(fwx.constants[3].shape), "cpu")
    ordered = [g, q, k, v, m, want_out, lse_in, state, offset]  # the backward's placeholders, in order
    assert len(bwx.input_names) == len(ordered)
    inputs = [t for t, n in zip(ordered, bwx.input_names) if n]
    grads = run_cpu(bwx, [t.to(torch.int64) if t.dtype == torch.uint64 else t for t in inputs], tmp_path / "bw")
    want = rng.attention_grads(g, q, k, v, m, p, causal, None, seed_value)
    for got, w in zip(grads, want):
        close(got, w, 1e-4)


def test_first_call_check_skips_dont_care_outputs():
    """The backend's first-call comparison with eager ignores don't-care outputs (PyTorch leaves
    them unset), and still compares the rest."""
    from test_runtime import CpuReferencePlan

    from eqfuse_torch.backend import CapturedPlan, _Runner, results_agree

    fw_gm, _ = _sdpa_forward_graph("cudnn")
    exported = export_graph_module(fw_gm)

    def eager(q, k, v):  # what the CUDA op returns, on the CPU: the seed and offset are garbage
        out, lse = _attention_reference(q, k, v)
        return out, lse.unsqueeze(-1), torch.tensor(123456789), torch.tensor(-42)

    cpu_gm = torch.fx.experimental.proxy_tensor.make_fx(eager)(*(torch.randn(B, H, S, D) for _ in range(3)))
    torch.manual_seed(1)
    args = [torch.randn(B, H, S, D) for _ in range(3)]
    plan = CpuReferencePlan(exported.graph)
    record = CapturedPlan("forward", exported.graph, {})
    record.runs = "eqfuse"
    got = _Runner(cpu_gm, exported, plan, record)(*args)
    assert record.runs == "eqfuse", record.why_eager
    assert plan.calls == 1 and len(got) == 4
    want = eager(*args)
    close(got[0], want[0], 1e-4)
    assert results_agree(got, want) is not None  # compared, the garbage would differ
    assert results_agree(got, want, skip={2, 3}) is None


def test_efficient_sdpa_log_sum_exp_padding(tmp_path):
    """The efficient SDPA kernel rounds its log-sum-exp rows up to 32 (+inf past the last, as
    ViT's 197 tokens would have it): the forward's graph computes the rows there are and
    `Exported.pads` asks the caller to pad; the backward reads the rows there are."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    s = 20

    def fw(q, k, v):
        r = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, False)
        return r[0], r[1], r[2], r[3]

    def bw(g, q, k, v, out, lse, seed, offset):
        return aten._scaled_dot_product_efficient_attention_backward(g, q, k, v, None, out, lse, seed, offset, 0.0,
                                                                     [True, True, True, False], False)[:3]

    with FakeTensorMode():
        q, k, v, g = (torch.empty(B, H, s, D, device="cuda") for _ in range(4))
        fw_gm = make_fx(fw)(q, k, v)
        out, lse, seed, offset = fw(q, k, v)
        assert tuple(lse.shape) == (B, H, 32)
        bw_gm = make_fx(bw)(g, q, k, v, out, lse, seed, offset)
    fwx = export_graph_module(fw_gm)
    assert fwx.pads == {1: (32, math.inf)}
    torch.manual_seed(0)
    q, k, v, g = (torch.randn(B, H, s, D) for _ in range(4))
    for d in ("fw", "bw"):
        (tmp_path / d).mkdir()
    got_out, got_lse = run_cpu(fwx, [q, k, v], tmp_path / "fw")
    sc = (q @ k.transpose(-1, -2)) / D ** 0.5
    close(got_out, torch.softmax(sc, -1) @ v, 1e-4)
    close(got_lse.reshape(B, H, s), torch.logsumexp(sc, -1), 1e-4)
    padded = torch.nn.functional.pad(torch.logsumexp(sc, -1), (0, 32 - s), value=math.inf)
    bwx = export_graph_module(bw_gm)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr)
    o.backward(g)
    grads = run_cpu(bwx, [g, q, k, v, o.detach(), padded], tmp_path / "bw")
    for got, want in zip(grads, (qr.grad, kr.grad, vr.grad)):
        close(got, want, 1e-4)


class KeyMask(nn.Module):
    """A padding mask combined with a constant `True` of the scores' query axis (as
    transformers' mask functions build it), turned into an additive bias of the scores."""

    def forward(self, q, k, v, m):
        keep = torch.ones(1, 1, q.shape[2], 1, dtype=torch.bool) & m[:, None, None, :]
        bias = torch.where(keep, 0.0, float("-inf")).to(q.dtype)
        s = q @ k.transpose(2, 3) / 8.0 + bias
        return torch.softmax(s, 3) @ v, keep | torch.zeros(1, 1, 1, 1, dtype=torch.bool)


def test_constant_true_masks_fold_to_a_mask_by_key(tmp_path):
    """`True & m` and `where(True, ...)` fold to a broadcast of `m`: no `where` reads a constant
    condition (tests/attention.rs checks that such a mask plans as a bias by key)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    m = torch.rand(2, 16) > 0.3
    model = KeyMask()
    want = model(q, k, v, m)
    exported = export_program(torch.export.export(model, (q, k, v, m)))
    nodes = exported.graph["nodes"]
    for n in nodes:
        if n["op"] == "where":
            c = nodes[n["args"][0]]
            while c["op"] in ("broadcast", "reshape", "cast"):
                c = nodes[c["args"][0]]
            assert c["op"] != "const", n
    for got, w in zip(run_cpu(exported, (q, k, v, m), tmp_path), want):
        close(got, w)


@pytest.mark.parametrize("bool_mask", [False, True])
def test_masked_sdpa_log_sum_exp_from_flash_statistics(bool_mask, tmp_path):
    """A fused SDPA forward with a mask returns its log-sum-exp from `attention_bias_lse`'s
    statistics (m + log l, no score matrix written): equal to the log-sum-exp of the masked
    scores, a row with every key masked by an additive fill included (a bool mask's such rows
    are PyTorch's `-inf` and eqfuse's fill, not compared here)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def fw(q, k, v, m):
        r = aten._scaled_dot_product_efficient_attention(q, k, v, m, True, 0.0, False)
        return r[0], r[1]

    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, 32, D) for _ in range(3))
    keep = torch.rand(B, 1, 1, 32) > 0.3
    keep[0, 0, 0, 0] = True
    if not bool_mask:
        keep[0, 0, 0, :] = False  # (every row of batch 0 keeps no key: rows of fills)
    m = keep if bool_mask else torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    with FakeTensorMode():
        fq, fk, fv = (torch.empty(B, H, 32, D, device="cuda") for _ in range(3))
        fm = torch.empty(m.shape, dtype=m.dtype, device="cuda")
        fw_gm = make_fx(fw)(fq, fk, fv, fm)
    fwx = export_graph_module(fw_gm)
    assert not any(n["op"] == "@" for n in fwx.graph["nodes"]), "the scores are written out"
    got_out, got_lse = run_cpu(fwx, [q, k, v, m], tmp_path)
    sc = (q @ k.transpose(-1, -2)) / D ** 0.5 + torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    close(got_lse.reshape(B, H, 32), torch.logsumexp(sc, -1), 1e-4)
    close(got_out, torch.softmax(sc, -1) @ v, 1e-4)


@pytest.mark.parametrize("traced", ["expanded", "dense"])
def test_saved_attention_bias_stays_a_bias_by_key(traced, tmp_path):
    """The efficient SDPA kernel's bias as PyTorch's CUDA path spells it: a padding mask by key,
    expanded to `[B, H, S, S]`, saved for the backward. The forward's graph returns it (a tensor
    saved for the backward: its layout is free) as the `[B, 1, 1, S]` tensor it is a broadcast
    of; the backward's graph takes that as its input, whether its placeholder was traced
    expanded (stride 0) or dense (as a `where` AOTAutograd saves is: the forward says what it
    returned, `broadcasts`). Both compute attention and its gradients."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def fw(q, k, v, pad):
        bias = (pad * -1e4)[:, None, None, :].expand(B, H, S, S)
        r = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, False)
        return r[0], r[1], r[2], r[3], bias

    def bw(g, q, k, v, bias, out, lse, seed, offset):
        return aten._scaled_dot_product_efficient_attention_backward(g, q, k, v, bias, out, lse, seed, offset, 0.0,
                                                                     [True, True, True, False], False)[:3]

    with FakeTensorMode():
        fq, fk, fv, fg = (torch.empty(B, H, S, D, device="cuda") for _ in range(4))
        fpad = torch.empty(B, S, device="cuda")
        fw_gm = make_fx(fw)(fq, fk, fv, fpad)
        out, lse, seed, offset, bias = fw(fq, fk, fv, fpad)
        if traced == "dense":
            bias = torch.empty(B, H, S, S, device="cuda")
        bw_gm = make_fx(bw)(fg, fq, fk, fv, bias, out, lse, seed, offset)
    fwx = export_graph_module(fw_gm, free_layout_from=2)
    assert fwx.broadcast_outputs == {4: (B, 1, 1, S)}
    bias_name = [n.name for n in bw_gm.graph.nodes if n.op == "placeholder"][4]
    bwx = export_graph_module(bw_gm, broadcasts={bias_name: fwx.broadcast_outputs[4]})
    assert list(bwx.broadcast_inputs.values()) == [(B, 1, 1, S)]
    assert [i["shape"] for i in bwx.graph["inputs"] if len(i["shape"]) == 4 and i["shape"][-1] == S] == [[B, 1, 1, S]]

    torch.manual_seed(0)
    q, k, v, g = (torch.randn(B, H, S, D) for _ in range(4))
    pad = (torch.rand(B, S) < 0.3).float()
    pad[:, 0] = 0.0
    (tmp_path / "fw").mkdir()
    got_out, got_lse, got_bias = run_cpu(fwx, [q, k, v, pad], tmp_path / "fw")
    dense = (pad * -1e4)[:, None, None, :].expand(B, H, S, S)
    assert tuple(got_bias.shape) == (B, 1, 1, S)
    close(got_bias.expand(B, H, S, S), dense)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=dense)
    o.backward(g)
    close(got_out, o.detach(), 1e-4)
    saved = got_bias.expand(B, H, S, S) if traced == "expanded" else got_bias.expand(B, H, S, S).contiguous()
    args = [g, q, k, v, saved, o.detach(), got_lse.reshape(B, H, S), torch.zeros(()), torch.zeros(())]
    (tmp_path / "bw").mkdir()
    grads = run_cpu(bwx, None, tmp_path / "bw", bwx.arguments(args))
    for got, want in zip(grads, (qr.grad, kr.grad, vr.grad)):
        close(got, want, 1e-4)


# --- the backward of masked SDPA reads the forward's log-sum-exp (issue 21) ---------------------

MASK_FILLS = {"bool": None, "f32 finfo.min": torch.finfo(torch.float32).min,
              "bf16 finfo.min": torch.finfo(torch.bfloat16).min, "-1e4": -1e4, "-1e9": -1e9}


def _masked_rows_keep(s):
    """A bool mask `[B, 1, S, S]` (true: kept) with rows of fills: batch entry 1 pads its last 5
    keys; batch entry 0 hides every key of rows 2 and 7, and keys 0..3 of row 3 (a row of fills
    only under the causal mask, where it includes 4 keys)."""
    keep = torch.ones(B, 1, s, s, dtype=torch.bool)
    keep[1, :, :, s - 5:] = False
    keep[0, :, 2, :] = False
    keep[0, :, 7, :] = False
    keep[0, :, 3, :4] = False
    return keep


def _mask_of(keep, fill):
    """`keep` as a mask: itself, or additive with `fill` (an f32 tensor: the reference's inputs
    are saved by NumPy, which has no bf16; bf16's finfo.min is an f32 value, read exactly)."""
    return keep if fill is None else torch.where(keep, 0.0, fill)


def _masked_sdpa_graphs(variant, mask, causal, s, kv):
    """The forward and backward graphs of a fused SDPA op with a mask (traced on fake tensors, on
    CUDA for the CUDA kernels' ops): q with H heads, k and v with `kv`."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def fw(q, k, v, m):
        if variant == "cudnn":
            r = aten._scaled_dot_product_cudnn_attention(q, k, v, m, True, 0.0, causal, False)
        elif variant == "cpu":
            r = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=m)
        else:
            r = aten._scaled_dot_product_efficient_attention(q, k, v, m, True, 0.0, causal)
        return r[0], r[1]

    def bw(g, q, k, v, m, out, lse):
        if variant == "cudnn":
            return aten._scaled_dot_product_cudnn_attention_backward(g, q, k, v, out, lse, torch.zeros(()),
                                                                     torch.zeros(()), m, None, None, s, s, 0.0,
                                                                     causal)
        if variant == "cpu":
            return aten._scaled_dot_product_flash_attention_for_cpu_backward(g, q, k, v, out, lse, 0.0, causal,
                                                                             attn_mask=m)
        return aten._scaled_dot_product_efficient_attention_backward(g, q, k, v, m, out, lse, torch.zeros(()),
                                                                     torch.zeros(()), 0.0,
                                                                     [True, True, True, False], causal)[:3]

    device = "cpu" if variant == "cpu" else "cuda"
    with FakeTensorMode():
        q, g = (torch.empty(B, H, s, D, device=device) for _ in range(2))
        k, v = (torch.empty(B, kv, s, D, device=device) for _ in range(2))
        m = torch.empty(mask.shape, dtype=mask.dtype, device=device)
        fw_gm = make_fx(fw)(q, k, v, m)
        out, lse = fw(q, k, v, m)
        bw_gm = make_fx(bw)(g, q, k, v, m, out, lse)
    return export_graph_module(fw_gm), export_graph_module(bw_gm), tuple(lse.shape)


def _eager_masked_grads(q, k, v, g, mask, causal):
    """Eager f32 attention written out (softmax of the masked scores; a bool mask as eqfuse reads
    it, the additive fill -3e38, whose rows of fills weigh their keys equally) and its gradients."""
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    rep = H // k.shape[1]
    kk, vv = kr.repeat_interleave(rep, 1), vr.repeat_interleave(rep, 1)
    sc = qr @ kk.transpose(-1, -2) / D ** 0.5
    sc = sc + (torch.where(mask, 0.0, -3.0e38) if mask.dtype == torch.bool else mask.float())
    if causal:
        sc = sc.masked_fill(~torch.ones(sc.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    o = torch.softmax(sc, -1) @ vv
    o.backward(g)
    return o.detach(), (qr.grad, kr.grad, vr.grad)


def _grads_close(got, want, tol):
    """Gradients within `tol` of the largest of each (per-element tolerance relative to the
    gradient's scale: rows of fills weigh many keys, each small)."""
    for a, w in zip(got, want):
        assert a.shape == w.shape, (a.shape, w.shape)
        scale = float(w.abs().max())
        torch.testing.assert_close(a, w, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("fill", sorted(MASK_FILLS))
@pytest.mark.parametrize("variant,causal,kv", [("efficient", False, H), ("efficient", True, H // 2),
                                               ("cudnn", True, H), ("cudnn", False, H // 2), ("cpu", False, H),
                                               ("cpu", True, H)])
def test_masked_sdpa_backward_reads_the_forward_log_sum_exp(variant, causal, kv, fill, tmp_path):
    """The backward of SDPA with a mask builds the flash backward's row statistics from the
    log-sum-exp the forward returned (elementwise operations on it; no `attention_bias_lse`, a
    pass over the scores): through eqfuse's forward and backward, the gradients are eager's, rows
    of fills included (every key masked: weights 1 / keys, not PyTorch's 1), under the causal
    mask (a row of 4 included keys, all masked), grouped-query heads, the efficient kernel's
    log-sum-exp padded to 32 rows and cuDNN's `[B, H, S, 1]`."""
    if variant == "cpu" and MASK_FILLS[fill] is None:
        pytest.skip("PyTorch's CPU kernel takes no bool mask")
    s = 20
    keep = _masked_rows_keep(s)
    mask = _mask_of(keep, MASK_FILLS[fill])
    fwx, bwx, lse_shape = _masked_sdpa_graphs(variant, mask, causal, s, kv)
    ops = {n.get("op") for n in bwx.graph["nodes"]}
    assert "attention_bias_lse" not in ops and "attention_bias_grad_q" in ops, sorted(o for o in ops if o)
    torch.manual_seed(0)
    q, g = (torch.randn(B, H, s, D) for _ in range(2))
    k, v = (torch.randn(B, kv, s, D) for _ in range(2))
    for d in ("fw", "bw"):
        (tmp_path / d).mkdir()
    out, lse = run_cpu(fwx, [q, k, v, mask], tmp_path / "fw")
    want_out, want = _eager_masked_grads(q, k, v, g, mask, causal)
    # (A -1e4 mask's row of fills: its scores are -1e4 + x, held to 2^-11 by an f32, so their
    # weights are only that close to eager's, in eqfuse's forward and in its log-sum-exp.)
    tol = 2e-3 if fill == "-1e4" else 1e-4
    _grads_close([out], [want_out], tol)
    if 1 in fwx.pads:
        lse = F.pad(lse.reshape(B, H, s), (0, fwx.pads[1][0] - s), value=fwx.pads[1][1])
    lse = lse.reshape(lse_shape)
    grads = run_cpu(bwx, [g, q, k, v, mask, out, lse], tmp_path / "bw")
    _grads_close(grads, want, tol)


@pytest.mark.parametrize("fill", ["bool", "f32 finfo.min", "-1e9"])
def test_masked_sdpa_backward_of_pytorchs_forward(fill, tmp_path):
    """Given the log-sum-exp of PyTorch's own forward (a graph eqfuse did not run), the backward
    gives PyTorch's gradients: a row of a bool mask's fills is `-inf` there (log-sum-exp 0 on the
    CPU, output 0) and gets zero gradients, not those of eqfuse's fill; an additive fill's row
    weighs its keys 1 / keys (eager softmax; PyTorch's fused backward itself gives them 1)."""
    s = 20
    keep = _masked_rows_keep(s)
    mask = _mask_of(keep, MASK_FILLS[fill])
    _, bwx, _ = _masked_sdpa_graphs("efficient", mask, False, s, H)
    torch.manual_seed(0)
    q, k, v, g = (torch.randn(B, H, s, D) for _ in range(4))
    additive = torch.where(keep, 0.0, float("-inf")) if mask.dtype == torch.bool else mask
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=additive)
    if mask.dtype == torch.bool:
        assert float(lse[0, 0, 2]) == 0.0 and float(out[0, 0, 2].abs().max()) == 0.0  # (a row of -inf)
        qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
        F.scaled_dot_product_attention(qr, kr, vr, attn_mask=keep).backward(g)
        want = (qr.grad, kr.grad, vr.grad)
        assert float(want[0][0, :, 2].abs().max()) == 0.0
    else:
        _, want = _eager_masked_grads(q, k, v, g, mask, False)
    padded = F.pad(lse, (0, 32 - s), value=math.inf)
    grads = run_cpu(bwx, [g, q, k, v, mask, out, padded], tmp_path)
    _grads_close(grads, want, 1e-4)


def test_masked_sdpa_backward_without_a_log_sum_exp_computes_its_statistics(tmp_path):
    """Where the log-sum-exp is of no shape eqfuse reads, the backward computes the statistics
    again (`attention_bias_lse`) and its gradients are eager's."""
    from eqfuse_torch.export import GraphBuilder, Lowering, Value, _attention_bias_grads

    b = GraphBuilder()
    s = 12
    q, k, v, g, out = (b.input(n, "f32", (B, H, s, D)) for n in ("q", "k", "v", "g", "o"))
    m = b.input("m", "bool", (B, 1, s, s))
    odd = b.input("lse", "f32", (B, H, s + 1, 1))  # (no rows eqfuse reads)

    class Node:
        meta = {}
        name = "sdpa"

    L = Lowering(b, Node())
    grads = _attention_bias_grads(L, g, q, k, v, out, 1 / D ** 0.5, False, m, None, odd)
    assert all(isinstance(x, Value) for x in grads)
    assert "attention_bias_lse" in {n.get("op") for n in b.nodes}


def test_base_of_a_broadcast_computes_the_same_values():
    """`GraphBuilder.base_shape` and `base`: a padding mask built as `where` of a broadcast, a
    reshape that only adds axes of size 1, and an element-by-element operator of broadcasts have
    a smaller base, which broadcast back equals the value (checked by the benches' PyTorch reader
    of the graph); an operator with a full operand, or a reduction, has none; `base` at a shape
    between the two broadcasts the base to it."""
    from eqfuse_torch import GraphBuilder

    b = GraphBuilder()
    m = b.input("m", "bool", (2, 8))
    x = b.input("x", "f32", (2, 4, 8, 8))
    keep = b.op("broadcast", [b.op("reshape", [m.node, b.dims((2, 1, 1, 8))], "bool", (2, 1, 1, 8)).node,
                              b.dims((2, 1, 8, 8))], "bool", (2, 1, 8, 8))
    zero = b.op("cast", [b.const(0).node, b.dtype("f32")], "f32", ())
    mask = b.op("where", [keep.node, zero.node, b.const(-1e4).node], "f32", (2, 1, 8, 8))
    wide = b.op("reshape", [mask.node, b.dims((2, 1, 1, 8, 8))], "f32", (2, 1, 1, 8, 8))
    scaled = b.op("*", [b.op("broadcast", [mask.node, b.dims((2, 4, 8, 8))], "f32", (2, 4, 8, 8)).node,
                        b.const(0.5).node], "f32", (2, 4, 8, 8))
    full = b.op("+", [x.node, mask.node], "f32", (2, 4, 8, 8))
    total = b.op("sum", [mask.node, b.const(-1).node], "f32", (2, 1, 8, 1))
    assert b.base_shape(mask) == (2, 1, 1, 8)
    assert b.base_shape(wide) == (2, 1, 1, 1, 8)
    assert b.base_shape(scaled) == (2, 1, 1, 8)
    assert b.base_shape(full) == full.shape and b.base_shape(total) == total.shape
    assert b.base(full) == full
    between = b.base(scaled, (2, 4, 1, 8))
    with pytest.raises(ExportError):
        b.base(scaled, (2, 4, 8, 1))
    assert between.shape == (2, 4, 1, 8)
    cases = [(mask, b.base(mask)), (wide, b.base(wide)), (scaled, b.base(scaled)), (scaled, between)]
    for k, (v, small) in enumerate(cases):
        assert small.shape == (b.base_shape(v) if small is not between else (2, 4, 1, 8))
        b.output(f"v{k}", v)
        b.output(f"small{k}", small)
    torch.manual_seed(0)
    got = baselines().build(b.to_json())(torch.rand(2, 8) > 0.3, torch.randn(2, 4, 8, 8))
    for k, (v, small) in enumerate(cases):
        assert tuple(got[2 * k + 1].shape) == small.shape
        assert torch.equal(got[2 * k + 1].expand(v.shape), got[2 * k])
