"""Dropout in training graphs: eqfuse's counter-based dropout through the backend.

PyTorch's dropout draws other random numbers than eqfuse's, so a training step with dropout
through the backend cannot equal eager's. What it must equal is eager with eqfuse's dropout:
the reference here runs the model eagerly with `torch.nn.functional.dropout` and
`scaled_dot_product_attention` replaced by `rng.dropout` / `rng.attention` (a transcription of
`src/reference/rng.rs`, checked against its known answers), with every site's seed fixed to one
value; the backend's seeds are fixed to the same value. Loss and every gradient are compared, so
the forward and the backward must agree on each dropped element (the backward of attention with
dropout draws the forward's mask again from the seed it returned).
"""

import contextlib
import copy
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eqfuse_torch import rng  # noqa: E402
from eqfuse_torch.backend import EqfuseBackend  # noqa: E402

SEED = 1234
VOCAB, SEQ, BATCH = 128, 16, 2


def test_generator_matches_the_rust_known_answers():
    """The known answers of `src/reference/rng.rs`'s tests."""
    one = lambda seed, i: int(rng.bits(seed, torch.tensor([i], dtype=torch.int64))[0])  # noqa: E731
    assert int(rng._mix32(torch.tensor([1], dtype=torch.int64))[0]) == 0x688990C0
    assert one(0, 0) == 0x944FB554
    assert one(42, 7) == 0x16D0A76E
    assert one(42, (1 << 32) + 7) == 0x39201FD4
    assert rng.bits(1, torch.arange(4)).tolist() == [0xB98A617E, 0xC0951F9F, 0xDBB74C9E, 0x9706D93B]
    assert rng.threshold(0.5) == 1 << 31 and rng.threshold(0.25) == 1 << 30
    assert rng.scale(0.1) == float(torch.tensor(1 / 0.9, dtype=torch.float32))


def test_dropout_keeps_one_minus_p_scaled():
    x = torch.ones(100_000)
    for p in (0.1, 0.5):
        y = rng.dropout(x, p, 7)
        assert abs((y == 0).float().mean().item() - p) < 0.01
        assert set(y.unique().tolist()) == {0.0, rng.scale(p)}
    assert not torch.equal(rng.keep((1000,), 0.5, 1), rng.keep((1000,), 0.5, 2))


@contextlib.contextmanager
def eqfuse_dropout_eagerly(seed):
    """PyTorch's dropout and SDPA replaced by eqfuse's dropout with `seed` at every site."""
    F = torch.nn.functional
    dropout, sdpa = F.dropout, F.scaled_dot_product_attention

    def eq_dropout(x, p=0.5, training=True, inplace=False):
        return rng.dropout(x, p, seed) if training and p > 0 else x

    def eq_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if dropout_p == 0:
            return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return rng.attention(q, k, v, attn_mask, dropout_p, is_causal, scale, seed)[0]

    F.dropout, F.scaled_dot_product_attention = eq_dropout, eq_sdpa
    try:
        yield
    finally:
        F.dropout, F.scaled_dot_product_attention = dropout, sdpa


def fixed_seeds(monkeypatch):
    monkeypatch.setattr(rng.Seeds, "draw", staticmethod(lambda n, device: torch.full((n,), SEED, dtype=torch.int32,
                                                                                       device=device)))


def gpt2(attn, p=0.1):
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=VOCAB,
                                  resid_pdrop=p, embd_pdrop=p, attn_pdrop=p,
                                  bos_token_id=0, eos_token_id=0, attn_implementation=attn)
    return transformers.GPT2LMHeadModel(cfg)


def bert(attn, p=0.1):
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=p,
                                  attention_probs_dropout_prob=p, attn_implementation=attn)
    return transformers.BertForMaskedLM(cfg)


def llama(attn, p=0.1):
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attention_dropout=p, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                   attn_implementation=attn)
    return transformers.LlamaForCausalLM(cfg)


MODELS = {"gpt2": gpt2, "bert": bert, "llama": llama}


def batch(name, device):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    kw = {"input_ids": ids, "labels": ids.clone()}
    if name == "bert":
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        mask[1, SEQ - 5:] = 0
        kw["attention_mask"] = mask
    return {k: v.to(device) for k, v in kw.items()}


def step(model, inputs, backend=None):
    model = copy.deepcopy(model)
    run = torch.compile(model, backend=backend, dynamic=False) if backend else model
    loss = run(**inputs).loss
    loss.backward()
    return loss.detach().double(), {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}


def assert_close_step(got, want, rtol):
    (l1, g1), (l0, g0) = got, want
    assert abs(l1 - l0) <= rtol * abs(l0), (l0.item(), l1.item())
    assert g0.keys() == g1.keys()
    floor = 1e-5 * max(g.abs().max().item() for g in g0.values())
    bad = {n: r for n in g0
           if not (r := ((g1[n] - g0[n]).abs().max() / g0[n].abs().max().clamp_min(floor)).item()) <= rtol}
    assert not bad, f"gradients beyond {rtol} relative: {bad}"


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_with_dropout_on_eqfuse_plans(name, attn, monkeypatch):
    """A training step with dropout everywhere (embeddings, attention probabilities, residuals),
    every graph planned and run by eqfuse's plans on the CPU reference, equals eager with
    eqfuse's dropout."""
    from test_runtime import CpuReferencePlan

    monkeypatch.setattr(EqfuseBackend, "_build", lambda self, graph, ex: CpuReferencePlan(graph))
    fixed_seeds(monkeypatch)
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = MODELS[name](attn).train()
    inputs = batch(name, "cpu")
    backend = EqfuseBackend(report=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = step(model, inputs, backend)
    graphs = [(p.kind, p.runs, p.why_eager) for p in backend.plans if p.kind != "joint"]
    assert {k for k, _, _ in graphs} >= {"forward", "backward"}
    assert all(runs == "eqfuse" for _, runs, _ in graphs), graphs
    fwd = next(p for p in backend.plans if p.kind == "forward")
    assert any(n.get("op") == "dropout" for n in fwd.graph["nodes"]), "no dropout in the forward graph"
    # (On the CPU, PyTorch runs SDPA with dropout as its math decomposition, traced before eqfuse
    # sees it: the fused SDPA ops, and so `attention_dropout`, are for CUDA graphs (the GPU test
    # below; `test_export.py`'s `test_fused_sdpa_with_dropout_draws_eqfuses_dropout` traces them
    # on fake CUDA tensors and checks them on the CPU reference).)
    with eqfuse_dropout_eagerly(SEED):
        want = step(model, inputs)
    assert_close_step(got, want, 1e-4)


def assert_fused_attention_dropout(backend, bias):
    """SDPA with dropout was exported as eqfuse's fused attention with dropout: the forward
    graph holds `attention_dropout` (`attention_bias_dropout` with a mask), the backward graph
    the dropout forms of the flash backward, and neither holds the probabilities written out:
    no `dropout` of an `exp` (the probabilities) or of a product (the backward's dP), and no
    product of a dropout (or of its cast)."""
    fwd_op = "attention_bias_dropout" if bias else "attention_dropout"
    graphs = [(p.kind, p.graph) for p in backend.plans if p.kind in ("forward", "backward")]
    ops = {kind: set() for kind, _ in graphs}
    for kind, g in graphs:
        ops[kind] |= {n.get("op") for n in g["nodes"]}
    assert fwd_op in ops["forward"], " ".join(sorted(o for o in ops["forward"] if o))
    for w in "qkv":
        assert f"{fwd_op}_grad_{w}" in ops["backward"], " ".join(sorted(o for o in ops["backward"] if o))
    for kind, g in graphs:
        nodes = g["nodes"]
        op = lambda i: nodes[i].get("op")  # noqa: E731
        for n in nodes:
            args = n.get("args", [])
            if n.get("op") == "dropout":
                assert op(args[0]) not in ("exp", "@", "softmax"), f"{kind}: dropout of {op(args[0])}"
            if n.get("op") == "@":
                for a in args:
                    below = nodes[a]["args"][0] if op(a) in ("cast", "transpose") else a
                    assert op(below) != "dropout", f"{kind}: a product of dropped probabilities"


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_dropout_graphs_that_run_eagerly_draw_eqfuses_dropout(name, monkeypatch):
    """Where the backend would run eqfuse's kernels but cannot (here: no plan is built), a graph
    with dropout runs eagerly with eqfuse's dropout, so a forward on eqfuse's kernels and a
    backward that is not (or the reverse) still draw the same masks."""
    import eqfuse_torch.backend as backend_module

    def no_kernels(self, graph, ex):
        raise RuntimeError("no kernels in this test")

    monkeypatch.setattr(EqfuseBackend, "_build", no_kernels)
    monkeypatch.setattr(backend_module, "_on_cuda", lambda example_inputs: True)
    fixed_seeds(monkeypatch)
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = MODELS[name]("sdpa").train()
    inputs = batch(name, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = step(model, inputs, EqfuseBackend(report=None))
    with eqfuse_dropout_eagerly(SEED):
        want = step(model, inputs)
    assert_close_step(got, want, 1e-4)


def test_each_call_draws_fresh_masks(monkeypatch):
    """Seeds are drawn on every call (from PyTorch's generator): two calls drop other elements."""
    from test_runtime import CpuReferencePlan

    monkeypatch.setattr(EqfuseBackend, "_build", lambda self, graph, ex: CpuReferencePlan(graph))
    torch._dynamo.reset()
    drop = torch.nn.Dropout(0.5).train()
    f = torch.compile(lambda x: drop(x) * 2, backend=EqfuseBackend(report=None), dynamic=False)
    x = torch.ones(64, 64)
    with torch.no_grad():
        a, b = f(x), f(x)
    assert not torch.equal(a == 0, b == 0)
    for y in (a, b):
        assert abs((y == 0).float().mean().item() - 0.5) < 0.05
        assert set(y.unique().tolist()) == {0.0, 4.0}


def test_export_gives_each_site_a_seed():
    from eqfuse_torch.export import export_graph_module
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, y):
        a, ma = torch.ops.aten.native_dropout(x, 0.1, True)
        b, mb = torch.ops.aten.native_dropout(y, 0.2, True)
        c, mc = torch.ops.aten.native_dropout(y, 0.3, False)
        return a + b + c, ma, mb

    gm = make_fx(f)(torch.randn(4, 8), torch.randn(4, 8))
    ex = export_graph_module(gm)
    assert sorted(ex.seeds.values()) == [0, 1]
    assert ex.seeds == rng.dropout_sites(gm)
    (seeds,) = [i for i in ex.graph["inputs"] if i["name"] == ex.seed_input]
    assert seeds["dtype"] == "i32" and seeds["shape"] == [2]
    assert sum(n.get("op") == "dropout" for n in ex.graph["nodes"]) >= 2


def _cupy():
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(not (torch.cuda.is_available() and _cupy()), reason="needs a CUDA device and CuPy")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_gpu_training_with_dropout_on_eqfuse_kernels(name, attn, dtype, monkeypatch):
    """On the GPU: a training step with dropout (fused SDPA with dropout included) runs every
    graph on eqfuse's kernels and equals eager with eqfuse's dropout (f32 1e-4; bf16 within
    the 16-bit tolerance of the step). With eager attention, the backend's rewrite makes the
    dropout of the written probabilities SDPA's (`eqfuse_torch/attention.py`): the same fused
    attention with dropout, forward and backward."""
    fixed_seeds(monkeypatch)
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = MODELS[name](attn).cuda().to(dtype).train()
    inputs = batch(name, "cuda")
    backend = EqfuseBackend(report=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = step(model, inputs, backend)
    graphs = [(p.kind, p.runs, p.why_eager) for p in backend.plans if p.kind != "joint"]
    print("graphs:", graphs)
    assert all(runs == "eqfuse" for _, runs, _ in graphs), graphs
    assert_fused_attention_dropout(backend, bias=name == "bert")
    with eqfuse_dropout_eagerly(SEED):
        want = step(model, inputs)
    assert_close_step(got, want, 1e-4 if dtype == torch.float32 else 5e-2)
