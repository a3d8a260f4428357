"""Attention written out (`transformers`' eager attention) trains as flash attention.

The backend rewrites `softmax(q @ k^T * scale + mask) @ v` in each graph TorchDynamo captures
into `scaled_dot_product_attention` before AOTAutograd traces it (`eqfuse_torch/attention.py`),
so the backward is SDPA's (eqfuse's flash backward), not `_softmax_backward_data` of the saved
`[B, H, L, S]` probabilities. Checked here:

- the rewrite on small modules, one spelling each, against eager, and the spellings it must
  leave alone (probabilities used twice, a softmax along another axis, a scale that is not a
  constant, a fill that is not very negative, a mask that would enlarge the scores);
- GPT-2, BERT (padding mask) and Llama (grouped-query heads) with `attn_implementation="eager"`:
  a training step through the backend on the CPU reference gives eager's loss and gradients,
  and no graph holds `_softmax_backward_data` or saves a `[B, H, S, S]` tensor for the backward.

Run from the repository root: `python3 -m pytest python/tests/test_eager_attention.py`.
"""

import math
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eqfuse_torch.attention import rewrite_attention  # noqa: E402
from eqfuse_torch.backend import EqfuseBackend  # noqa: E402
from test_models import VOCAB, _ids, _padding, assert_training_step_on_eqfuse  # noqa: E402

T = transformers
F = torch.nn.functional
B, H, S, D = 2, 2, 16, 32  # D != S: the probabilities' shape is no operand's


def _rewritten(fn, *args):
    """`fn` compiled with only the rewrite: (how many attentions it rewrote, its outputs, whether
    the rewritten graph calls SDPA)."""
    counts = []

    def backend(gm, example_inputs):
        counts.append(rewrite_attention(gm))
        sdpa = any(n.target is F.scaled_dot_product_attention for n in gm.graph.nodes)
        counts.append(sdpa)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, dynamic=False, fullgraph=True)(*args)
    return counts[0], out, counts[1]


def _qkv(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, S, D, generator=g).to(dtype) for _ in range(3)]


def _causal():
    return torch.ones(S, S, dtype=torch.bool).tril()


SPELLINGS = {
    "mul, transpose(-1, -2)": lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * D**-0.5, dim=-1) @ v,
    "div, transpose(2, 3), F.softmax": lambda q, k, v: F.softmax(torch.matmul(q, k.transpose(2, 3)) / math.sqrt(D),
                                                                  dim=-1).matmul(v),
    "constant tensor scale, permute": lambda q, k, v: (
        (torch.matmul(q, k.permute(0, 1, 3, 2)) / torch.full([], D**0.5)).softmax(-1) @ v),
    "two scales, no transpose to undo": lambda q, k, v: torch.softmax(
        q @ k.transpose(-1, -2).contiguous() / 2.0 * 0.25, dim=3) @ v,
    "no scale": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v,
    "additive mask": lambda q, k, v: torch.softmax(
        q @ k.transpose(-2, -1) * 0.2 + torch.zeros(S, S).masked_fill(~_causal(), float("-inf")), -1) @ v,
    "where -inf": lambda q, k, v: torch.softmax(
        torch.where(_causal(), q @ k.transpose(-2, -1) * 0.2, float("-inf")), -1) @ v,
    "masked_fill finfo.min, then a mask": lambda q, k, v: torch.softmax(
        (q @ k.transpose(-2, -1) * 0.2).masked_fill(~_causal(), torch.finfo(torch.float32).min)
        + torch.linspace(-1, 0, S), -1) @ v,
    "softmax upcast and cast back": lambda q, k, v: F.softmax(
        q @ k.transpose(-2, -1) * 0.2, dim=-1, dtype=torch.float32).to(q.dtype) @ v,
    "dropout in eval": lambda q, k, v: F.dropout(torch.softmax(q @ k.transpose(-2, -1), -1), 0.1, False) @ v,
    "constant tensors for scale and fill (older GPT-2)": lambda q, k, v: torch.softmax(
        torch.where(_causal(), q @ k.transpose(-1, -2) / torch.full([], D**0.5, dtype=q.dtype),
                    torch.full([], torch.finfo(q.dtype).min, dtype=q.dtype)), dim=-1).type(v.dtype) @ v,
    "torch.softmax with its dtype": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1, torch.float32) @ v,
    "einsum, the key as given": lambda q, k, v: torch.einsum(
        "bhqk,bhkd->bhqd", torch.softmax(torch.einsum("bhqd,bhkd->bhqk", q, k) * D**-0.5, dim=-1), v),
    "einsum of a list, the key transposed, other letters": lambda q, k, v: torch.einsum(
        "nhij,nhjd->nhid", [torch.softmax(torch.einsum("nhid,nhdj->nhij", [q, k.transpose(-2, -1)]) / 4.0, -1), v]),
    "scores as 3-d batches": lambda q, k, v: torch.softmax(q[0] @ k[0].transpose(-2, -1), -1) @ v[0],
    "bmm of heads flattened, masked": lambda q, k, v: torch.bmm(torch.softmax(
        torch.bmm(q.reshape(B * H, S, D), k.reshape(B * H, S, D).transpose(1, 2)) * D**-0.5
        + torch.zeros(S, S).masked_fill(~_causal(), float("-inf")), -1), v.reshape(B * H, S, D)).reshape(B, H, S, D),
    "3-d einsum": lambda q, k, v: torch.einsum(
        "bqk,bkd->bqd", torch.softmax(torch.einsum("bqd,bkd->bqk", q[1], k[1]) * 0.3, -1), v[1]),
}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_spellings_are_rewritten_to_sdpa(spelling):
    fn = SPELLINGS[spelling]
    q, k, v = _qkv()
    count, got, sdpa = _rewritten(fn, q, k, v)
    assert count == 1 and sdpa
    want = fn(q, k, v)
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_keys_given_transposed():
    """A key given as `[B, H, D, S]` is transposed back for SDPA (the result is the same)."""
    q, k, v = _qkv()
    kt = k.transpose(-2, -1).contiguous()
    count, got, _ = _rewritten(lambda q, kt, v: torch.softmax(q @ kt * 0.3, -1) @ v, q, kt, v)
    assert count == 1
    want = torch.softmax(q @ kt * 0.3, -1) @ v
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_one_attention_feeding_the_next():
    """Two attentions, the first's output the second's queries: both rewritten."""

    def fn(q, k, v):
        a = torch.softmax(q @ k.transpose(-2, -1) * 0.2, -1) @ v
        return torch.softmax(a @ k.transpose(-2, -1) * 0.2, -1) @ v

    q, k, v = _qkv()
    count, got, _ = _rewritten(fn, q, k, v)
    assert count == 2
    want = fn(q, k, v)
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


LEFT_ALONE = {
    "probabilities also returned": lambda q, k, v: (lambda p: (p @ v, p))(torch.softmax(q @ k.transpose(-2, -1), -1)),
    "softmax along the queries": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), dim=2) @ v,
    "scale read from a tensor": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) * q.mean(), -1) @ v,
    "negative scale": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) * -0.5, -1) @ v,
    "fill that is not very negative": lambda q, k, v: torch.softmax(
        torch.where(_causal(), q @ k.transpose(-2, -1), -5.0), -1) @ v,
    "mask after the scale applied before it": lambda q, k, v: torch.softmax(
        (q @ k.transpose(-2, -1) + torch.linspace(-1, 0, S)) * 0.5, -1) @ v,
    "mask enlarging the scores": lambda q, k, v: torch.softmax(
        q[:1] @ k[:1].transpose(-2, -1) + torch.zeros(B, H, S, S), -1) @ v,
    "an einsum of the scores transposed (softmax along the queries)": lambda q, k, v: torch.einsum(
        "bhqk,bhkd->bhqd", torch.softmax(torch.einsum("bhqd,bhkd->bhkq", q, k), -1), v),
    "an einsum with a summed batch axis": lambda q, k, v: torch.softmax(
        torch.einsum("bhqd,bhkd->bqk", q, k), -1) @ v[:, 0],
}


@pytest.mark.parametrize("spelling", sorted(LEFT_ALONE))
def test_spellings_left_alone(spelling):
    fn = LEFT_ALONE[spelling]
    count, _, sdpa = _rewritten(fn, *_qkv())
    assert count == 0 and not sdpa


def test_dropout_becomes_sdpa_dropout():
    q, k, v = _qkv()
    seen = []

    def backend(gm, example_inputs):
        rewrite_attention(gm)
        seen.extend(n.kwargs.get("dropout_p") for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(lambda q, k, v: F.dropout(torch.softmax(q @ k.transpose(-2, -1), -1), p=0.25) @ v,
                  backend=backend, dynamic=False)(q, k, v)
    assert seen == [0.25]


def gpt2():
    cfg = T.GPT2Config(n_layer=2, n_embd=H * D, n_head=H, n_positions=64, vocab_size=VOCAB, resid_pdrop=0.0,
                       embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    return T.GPT2LMHeadModel(cfg), {"input_ids": _ids(), "use_cache": False}


def bert():
    cfg = T.BertConfig(vocab_size=VOCAB, hidden_size=H * D, num_hidden_layers=2, num_attention_heads=H,
                       intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return T.BertModel(cfg), {"input_ids": _ids(), "attention_mask": _padding()}


def llama():
    cfg = T.LlamaConfig(vocab_size=VOCAB, hidden_size=2 * H * D, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=2 * H, num_key_value_heads=H, max_position_embeddings=64, bos_token_id=0,
                        eos_token_id=0, pad_token_id=0, attn_implementation="eager")
    return T.LlamaForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


MODELS = {"gpt2": gpt2, "bert": bert, "llama": llama}


def _recorded_graphs(monkeypatch) -> list:
    """The (kind, ATen graph) of every graph the backend compiles from now on, in order."""
    graphs = []
    compile_graph = EqfuseBackend.compile

    def recording(self, kind, aten_gm, example_inputs, constants=None):
        graphs.append((kind, aten_gm))
        return compile_graph(self, kind, aten_gm, example_inputs, constants)

    monkeypatch.setattr(EqfuseBackend, "compile", recording)
    return graphs


@pytest.mark.parametrize("name", sorted(MODELS))
def test_eager_attention_trains_as_flash_attention(name, monkeypatch):
    """A training step of a model with eager attention, every graph on eqfuse's plans (CPU
    reference), equals eager; its attention is SDPA's forward and backward: no
    `_softmax_backward_data`, and nothing of the probabilities' shape saved for the backward."""
    torch.manual_seed(0)
    model, kw = MODELS[name]()
    heads = model.config.num_attention_heads
    graphs = _recorded_graphs(monkeypatch)
    assert_training_step_on_eqfuse(model, kw, monkeypatch)
    kinds = [kind for kind, _ in graphs]
    assert "backward" in kinds, kinds
    probabilities = (B, heads, S, S)
    for kind, gm in graphs:
        targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
        assert not any("_softmax_backward_data" in t for t in targets), kind
        assert any("scaled_dot_product" in t for t in targets), (kind, sorted(targets))
        if kind == "backward":
            saved = [(n.name, tuple(n.meta["val"].shape)) for n in gm.graph.nodes
                     if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
                     and n.meta["val"].is_floating_point()]
            assert not [s for s in saved if s[1] == probabilities], saved


# --- SDPA that PyTorch would run as its math fallback (attention.route_math_sdpa) ----------------


def _routed(fn, *args):
    """`fn` compiled with only `route_math_sdpa`: (how many calls it routed, its outputs)."""
    from eqfuse_torch.attention import route_math_sdpa

    counts = []

    def backend(gm, example_inputs):
        counts.append(route_math_sdpa(gm))
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, dynamic=False, fullgraph=True)(*args)
    return counts[0], out


def _position_bias(dtype):
    """A T5-style bias `[1, H, S, S]` permuted from an `[S, S, H]` lookup (last axis strided)."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(S, S, H, generator=g).to(dtype).permute(2, 0, 1).unsqueeze(0)


@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16])
def test_sdpa_with_a_bias_pytorch_runs_as_math_stays_one_op(bias_dtype):
    q, k, v = _qkv(torch.bfloat16)
    bias = _position_bias(bias_dtype)

    def fn(q, k, v, bias):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)

    n, out = _routed(fn, q, k, v, bias)
    assert n == 1
    torch.testing.assert_close(out, fn(q, k, v, bias), rtol=0, atol=0)  # the op runs PyTorch's call


@pytest.mark.parametrize("mask", [None, "bias", "bool"])
def test_f32_sdpa_stays_one_op(mask):
    """f32 heads: PyTorch's CUDA dispatch runs SDPA as math wherever its memory-efficient kernel
    refuses it (ViT's 197 keys, T5's permuted bias), so every f32 call without a gradient is kept
    one op, with a mask of either kind or none, causal or not."""
    q, k, v = _qkv(torch.float32)
    keep = torch.rand(1, 1, S, S, generator=torch.Generator().manual_seed(2)) > 0.2
    m = {None: None, "bias": _position_bias(torch.float32), "bool": keep}[mask]

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=m is None)

    n, out = _routed(fn, q, k, v, m)
    assert n == 1
    torch.testing.assert_close(out, fn(q, k, v, m), rtol=0, atol=0)


def test_f32_sdpa_under_autocast_is_left_to_pytorch():
    """Under `torch.autocast` an f32 SDPA runs in 16 bits: the opaque op would keep f32 in the
    traced graph (a result of another dtype than eager's), so it is not routed, whether autocast
    is entered inside the compiled function or around it."""
    q, k, v = _qkv(torch.float32)

    def inside(q, k, v):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.scaled_dot_product_attention(q, k, v)

    assert _routed(inside, q, k, v)[0] == 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _routed(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)[0] == 0


@pytest.mark.parametrize("form", ["plain", "causal", "bias", "bool", "gqa"])
def test_routed_f32_sdpa_runs_as_eqfuses_attention(form, monkeypatch):
    """Through the backend, each routed f32 form reaches eqfuse as one attention operator (the
    planner then prices it against products: at this size it takes products) and its plan, run
    by the CPU reference (`eqfuse run --cpu`), gives PyTorch's result."""
    from test_runtime import CpuReferencePlan

    monkeypatch.setattr(EqfuseBackend, "_build", lambda self, graph, ex: CpuReferencePlan(graph))
    q, k, v = _qkv(torch.float32)
    if form == "gqa":
        k, v = k[:, :1], v[:, :1]
    m = {"bias": _position_bias(torch.float32),
         "bool": torch.rand(1, 1, S, S, generator=torch.Generator().manual_seed(3)) > 0.3}.get(form)

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=form == "causal",
                                              enable_gqa=form == "gqa") * 2.0

    backend = EqfuseBackend(report=None)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch.compile(fn, backend=backend, dynamic=False, fullgraph=True)(q, k, v, m)
    plans = [p for p in backend.plans if p.kind != "joint"]
    assert [p.runs for p in plans] == ["eqfuse"], [(p.runs, p.why_eager) for p in plans]
    ops = [n.get("op") for n in plans[0].graph["nodes"]]
    assert sum(op in ("attention", "attention_bias") for op in ops) == 1, ops
    assert "softmax" not in ops and "amax" not in ops, ops
    torch.testing.assert_close(got, fn(q, k, v, m), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spelling", ["ones", "expand"])
def test_a_mask_of_all_true_is_no_bias(spelling):
    """`transformers` 5.17's ViT passes SDPA a bool mask of all true (`ones` expanded to the
    scores), which the exporter turns into the bias `where(m, 0, FILL)`: the plan's attention
    reads no bias (`attention-zero-bias`): on the H100 the f32 kernel took 103 us a ViT-B/16 layer
    reading that bias and 58 without it."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 12, 197, 64, generator=g) for _ in range(3))

    def fn(q, k, v):
        if spelling == "ones":
            m = torch.ones(2, 1, 197, 197, dtype=torch.bool)
        else:
            m = torch.ones((), dtype=torch.bool).expand(2, 1, 197, 197)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    be = EqfuseBackend(report=None, execute=False)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(fn, backend=be, dynamic=False, fullgraph=True)(q, k, v)
    planned = [p for p in be.plans if p.plan is not None]
    assert planned, [p.error for p in be.plans]
    kernels = [kern for p in planned for kern in p.plan["kernels"]]
    att = [kern for kern in kernels if kern["template"] == "attention"]
    assert len(att) == 1 and att[0]["ops"][-1] == "attention", kernels
    assert len(att[0]["reads"]) == 3, att[0]["reads"]
    assert len(kernels) == 1, [kern["ops"] for kern in kernels]


def test_sdpa_left_to_pytorch_where_its_fused_kernels_take_the_mask_or_a_gradient_is_needed():
    q, k, v = _qkv(torch.bfloat16)

    def fn(q, k, v, bias):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    assert _routed(fn, q, k, v, _position_bias(torch.bfloat16).contiguous())[0] == 0  # fused kernels take it
    assert _routed(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)[0] == 0  # flash takes it
    q.requires_grad_(True)
    assert _routed(fn, q, k, v, _position_bias(torch.float32))[0] == 0  # no backward for the op


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_t5_position_bias_attention_is_planned_as_attention(dtype):
    """T5's encoder adds an `[S, S, H]` position bias permuted to `[1, H, S, S]`: PyTorch's CUDA
    dispatch runs that SDPA as math in f32 (`transformers` 5.17), in bf16 and in f32; the backend
    keeps it one op, planned as eqfuse's attention kernel with the bias read in place."""

    cfg = T.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                     dropout_rate=0.0)
    model = T.T5EncoderModel(cfg).eval().to(dtype)
    ids = _ids()
    be = EqfuseBackend(report=None, execute=False)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=be, dynamic=False)(input_ids=ids)
    planned = [p for p in be.plans if p.plan is not None]
    assert planned, [p.error for p in be.plans]
    templates = [k["template"] for p in planned for k in p.plan["kernels"]]
    assert templates.count("attention") == cfg.num_layers, templates


class _FlatHeadsAttention(torch.nn.Module):
    """Self-attention as older code writes it: heads flattened into the batch and `bmm` (OPT,
    BART before SDPA), or `einsum` over `[B, H, S, D]`; a causal mask, a residual and a norm."""

    def __init__(self, spelling):
        super().__init__()
        self.spelling = spelling
        self.qkv = torch.nn.Linear(H * D, 3 * H * D)
        self.out = torch.nn.Linear(H * D, H * D)
        self.norm = torch.nn.LayerNorm(H * D)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, H, D).permute(2, 0, 3, 1, 4)
        mask = torch.zeros(s, s).masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
        if self.spelling == "bmm":
            q, k, v = (t.reshape(b * H, s, D) for t in (q, k, v))
            p = torch.softmax(torch.bmm(q * D**-0.5, k.transpose(1, 2)) + mask, dim=-1)
            a = torch.bmm(p, v).view(b, H, s, D)
        else:
            p = torch.softmax(torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(D) + mask, dim=-1)
            a = torch.einsum("bhij,bhjd->bhid", p, v)
        return self.norm(x + self.out(a.transpose(1, 2).reshape(b, s, H * D)))


@pytest.mark.parametrize("spelling", ["bmm", "einsum"])
def test_bmm_and_einsum_attention_train_as_flash_attention(spelling, monkeypatch):
    """A training step of attention written with `bmm` over flattened heads, or with `einsum`,
    through the backend (CPU reference): eager's loss and gradients, and SDPA's forward and
    backward in its graphs, no `_softmax_backward_data`."""
    torch.manual_seed(0)
    graphs = _recorded_graphs(monkeypatch)
    x = torch.randn(B, S, H * D, generator=torch.Generator().manual_seed(4))
    assert_training_step_on_eqfuse(_FlatHeadsAttention(spelling), {"x": x}, monkeypatch)
    assert {kind for kind, _ in graphs} >= {"forward", "backward"}
    for kind, gm in graphs:
        targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
        assert not any("_softmax_backward_data" in t for t in targets), kind
        assert any("scaled_dot_product" in t for t in targets), (kind, sorted(targets))
