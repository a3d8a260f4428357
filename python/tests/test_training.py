"""Training through the backend gives eager's loss and gradients.

A training step of real `transformers` architectures (GPT-2, BERT, Llama with grouped-query
attention; random weights from small configs, nothing downloaded) through
`torch.compile(model, backend=EqfuseBackend())` against the same step run eagerly: the loss and
every parameter's gradient within 1e-4 relative (largest difference over largest eager value).
On a machine without a GPU every graph runs eagerly after AOTAutograd's decompositions, which is
where the wrong gradients came from (`backend.decompositions`); with CUDA the same steps run
on the GPU, where graphs the exporter takes run on eqfuse's kernels. A small model whose graphs
the exporter does take is also trained with its forward and backward graphs evaluated by eqfuse's
CPU reference (`eqfuse run --cpu`, the stand-in of test_runtime.py), so the path that runs
eqfuse's plans is checked for gradients too.

Run from the repository root: `python3 -m pytest python/tests`.
"""

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

from eqfuse_torch.backend import EqfuseBackend, results_agree  # noqa: E402

RTOL = 1e-4
VOCAB, SEQ, BATCH = 128, 16, 2
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def gpt2(attn):
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=VOCAB,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0, attn_implementation=attn)
    return transformers.GPT2LMHeadModel(cfg)


def bert(attn):
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, attn_implementation=attn)
    return transformers.BertForMaskedLM(cfg)


def llama(attn):
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation=attn)
    return transformers.LlamaForCausalLM(cfg)


MODELS = {"gpt2": gpt2, "bert": bert, "llama": llama}


def batch(name, device):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    kw = {"input_ids": ids, "labels": ids.clone()}
    if name == "bert":  # padding in the second sequence: the attention mask matters
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        mask[1, SEQ - 5:] = 0
        kw["attention_mask"] = mask
        kw["labels"][1, SEQ - 5:] = -100
    return {k: v.to(device) for k, v in kw.items()}


def train_step(model, inputs, backend=None):
    """One forward and backward pass; returns the loss and every parameter's gradient."""
    model = copy.deepcopy(model)
    run = torch.compile(model, backend=backend, dynamic=False) if backend else model
    loss = run(**inputs).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def relative(got, want, floor=1e-30):
    """Largest difference over the largest eager value (at least `floor`)."""
    return ((got - want).abs().max() / want.abs().max().clamp_min(floor)).item()


def assert_same_step(eager, compiled):
    (l0, g0), (l1, g1) = eager, compiled
    assert relative(l1, l0) <= RTOL, (l0.item(), l1.item())
    assert g0.keys() == g1.keys()
    # A gradient that is zero in exact arithmetic (attention's key bias: softmax ignores a
    # per-query shift) is rounding noise on both sides, 1e-11 to 4e-8 of the step's largest
    # gradient (SigLIP's vision tower: eager 3.4e-10 from the float64 step, the backend 3.7e-10,
    # 4.6e-10 apart, of a largest gradient of 1.3e-2); it is measured against 1e-3 of that
    # largest gradient instead of its own size, so the two may differ by 1e-7 of it, f32's
    # rounding (every gradient above that is held to 1e-4 of its own size).
    floor = 1e-3 * max(g.abs().max().item() for g in g0.values() if g is not None)
    bad = {}
    for n in g0:
        if g0[n] is None:
            assert g1[n] is None, n
            continue
        assert g1[n] is not None, f"{n}: no gradient through the backend"
        r = relative(g1[n], g0[n], floor)
        if not r <= RTOL:
            bad[n] = r
    assert not bad, f"gradients beyond {RTOL} relative: {bad}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_step_matches_eager(name, attn, device):
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = MODELS[name](attn).to(device).train()
    inputs = batch(name, device)
    backend = EqfuseBackend(report=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = train_step(model, inputs, backend)
    assert_same_step(train_step(model, inputs), compiled)
    kinds = {p.kind for p in backend.plans}
    assert {"forward", "backward"} <= kinds, kinds  # the backend saw the training graphs


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_step_on_eqfuse_plans_matches_eager(name, attn, monkeypatch):
    """Every forward and backward graph of a training step (embeddings, position slices,
    concatenations, fused SDPA and its backward, grouped-query heads, cross-entropy with integer
    targets and ignored positions) is exported, planned and run by eqfuse's plans on the CPU
    reference, and gives eager's loss and gradients."""
    from test_runtime import CpuReferencePlan

    monkeypatch.setattr(EqfuseBackend, "_build", lambda self, graph, ex: CpuReferencePlan(graph))
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = MODELS[name](attn).train()
    inputs = batch(name, "cpu")
    backend = EqfuseBackend(report=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = train_step(model, inputs, backend)
    assert_same_step(train_step(model, inputs), compiled)
    graphs = [(p.kind, p.runs, p.why_eager) for p in backend.plans if p.kind != "joint"]
    assert {k for k, _, _ in graphs} >= {"forward", "backward"}
    assert all(runs == "eqfuse" for _, runs, _ in graphs), graphs
    assert all(p.plan is not None for p in backend.plans), [(p.kind, p.error) for p in backend.plans]


class RecordingPlan:
    """A CpuReferencePlan that keeps the shape and strides of every input it was called with."""

    def __new__(cls, graph):
        from test_runtime import CpuReferencePlan

        class Recording(CpuReferencePlan):
            def __call__(self, inputs):
                self.seen = {k: (tuple(v.shape), tuple(v.stride())) for k, v in inputs.items()}
                return super().__call__(inputs)

        return Recording(graph)


def bert_encoder(dtype=torch.float32):
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
    return transformers.BertModel(cfg, add_pooling_layer=False).to(dtype).train()


def encoder_step(model, inputs, backend=None):
    """One forward and backward pass of a BertModel (a loss on its last hidden state: a fixed
    projection of every position)."""
    model = copy.deepcopy(model)
    run = torch.compile(model, backend=backend, dynamic=False) if backend else model
    h = run(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state
    probe = torch.randn(h.shape, generator=torch.Generator().manual_seed(2)).to(h.device)
    loss = (h.float() * probe).sum()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_bert_mask_is_saved_and_read_by_key(monkeypatch):
    """BERT's padding mask, built in the forward as `[B, 1, S, S]` (a mask by key broadcast along
    the queries) and saved for SDPA's backward, stays `[B, 1, 1, S]`: the forward's graph writes
    that and returns the saved tensor as an expanded view of it, and the backward's graph takes
    it as its input (the attention backward reads a bias by key). The step gives eager's loss
    and gradients."""
    built = []
    monkeypatch.setattr(EqfuseBackend, "_build", lambda self, graph, ex: built.append(RecordingPlan(graph)) or built[-1])
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = bert_encoder()
    inputs = batch("bert", "cpu")
    backend = EqfuseBackend(report=None, joint=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = encoder_step(model, inputs, backend)
    assert_same_step(encoder_step(model, inputs), compiled)
    assert [(p.kind, p.runs) for p in backend.plans] == [("forward", "eqfuse"), ("backward", "eqfuse")], \
        [(p.kind, p.why_eager) for p in backend.plans]
    full, by_key = [BATCH, 1, SEQ, SEQ], [BATCH, 1, 1, SEQ]
    fw, bw = backend.plans
    assert full not in [k["domain"] for k in fw.plan["kernels"]], "the forward writes the [B, 1, S, S] mask"
    assert by_key in [k["domain"] for k in fw.plan["kernels"]]
    # (transformers builds the mask once per layer: one saved tensor each, equal.)
    masks = [i for i in bw.plan["inputs"] if i["shape"] in (full, by_key)]
    assert masks and all(m["shape"] == by_key for m in masks), masks
    # The backward's plan was given views of the forward's expanded outputs, no copies.
    assert all(built[1].seen[m["name"]][0] == tuple(by_key) for m in masks)


def test_bert_bf16_attention_backward_reads_a_bias_by_key():
    """In bf16, where SDPA's backward plans as eqfuse's flash backward kernels, those kernels read
    the mask as the `[B, 1, 1, S]` input, and their row statistics come from the forward's
    log-sum-exp: no kernel computes them again (`attention_bias_lse`, a pass over the scores)
    (planned only: no GPU here)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    backend = EqfuseBackend(report=None, joint=False, execute=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encoder_step(bert_encoder(torch.bfloat16), batch("bert", "cpu"), backend)
    (bw,) = [p for p in backend.plans if p.kind == "backward"]
    shapes = {i["name"]: i["shape"] for i in bw.plan["inputs"]}
    grads = [k for k in bw.plan["kernels"] if any(o.startswith("attention_bias_grad") for o in k["ops"])]
    assert grads, [k["ops"] for k in bw.plan["kernels"]]
    assert not [k for k in bw.plan["kernels"] if "attention_bias_lse" in k["ops"]], [k["ops"] for k in bw.plan["kernels"]]
    for k in grads:
        assert [BATCH, 1, 1, SEQ] in [shapes.get(r) for r in k["reads"]], (k["reads"], shapes)
        assert [BATCH, 1, SEQ, SEQ] not in [shapes.get(r) for r in k["reads"]]


def test_core_decompositions_keep_attention():
    from eqfuse_torch.backend import decompositions

    names = {op.name() for op in decompositions()}
    assert not any("scaled_dot_product" in n for n in names)
    assert "aten::gelu_backward" in names  # the rest of the core table is kept


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.down = torch.nn.Linear(64, 8)

    def forward(self, x, y):
        h = torch.nn.functional.gelu(self.norm(self.up(x)))
        return torch.nn.functional.mse_loss(self.down(h), y)


def test_training_through_eqfuse_plans_matches_eager(monkeypatch):
    """Forward and backward graphs run by eqfuse's plans (on the CPU reference) give eager's
    loss and gradients."""
    from test_runtime import CpuReferencePlan

    from torch._subclasses.fake_tensor import is_fake

    built, fake = [], []

    def build(self, graph, example_inputs):
        fake.append(is_fake(torch.empty(1)))  # a workspace allocated here must be a real one
        built.append(CpuReferencePlan(graph))
        return built[-1]

    monkeypatch.setattr(EqfuseBackend, "_build", build)
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = Mlp()
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    backend = EqfuseBackend(report=None)

    def step(run, m):
        loss = run(x, y)
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in m.named_parameters()}

    m1 = copy.deepcopy(model)
    compiled = step(torch.compile(m1, backend=backend, dynamic=False), m1)
    m0 = copy.deepcopy(model)
    assert_same_step(step(m0, m0), compiled)
    runs = {p.kind: p.runs for p in backend.plans if p.kind != "joint"}
    assert runs == {"forward": "eqfuse", "backward": "eqfuse"}, [(p.kind, p.why_eager) for p in backend.plans]
    assert all(p.calls == 1 for p in built)
    assert fake == [False, False], "kernels were built under AOTAutograd's fake-tensor mode"


def test_a_plan_that_disagrees_with_eager_is_never_returned(monkeypatch):
    """The first call of a graph is checked against eager: a plan whose result differs is
    dropped for eager, with a warning and the reason recorded."""
    from test_runtime import CpuReferencePlan

    class WrongPlan(CpuReferencePlan):
        def __call__(self, inputs):
            return {k: v + 1e-2 * v.abs().max() for k, v in super().__call__(inputs).items()}

    plans = []
    monkeypatch.setattr(EqfuseBackend, "_build", lambda self, graph, ex: plans.append(WrongPlan(graph)) or plans[-1])
    torch._dynamo.reset()

    def f(x, w):
        return torch.tanh(x * w).sum(-1)

    x, w = torch.randn(8, 16), torch.randn(16)
    backend = EqfuseBackend(report=None)
    compiled = torch.compile(f, backend=backend, dynamic=False)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        first = compiled(x, w)
        second = compiled(2 * x, w)
    torch.testing.assert_close(first, f(x, w), rtol=0, atol=0)
    torch.testing.assert_close(second, f(2 * x, w), rtol=0, atol=0)
    (p,) = backend.plans
    assert p.runs == "eager" and "differed from eager" in p.why_eager
    assert any("differed from eager" in str(c.message) for c in caught)
    assert plans[0].calls == 1  # not asked again after the disagreement


def test_results_agree_tolerances():
    w = torch.tensor([1.0, -2.0, 1e-6, float("nan")])
    assert results_agree([w.clone()], [w]) is None
    assert results_agree([w * (1 + 5e-5)], [w]) is None
    assert "differ" in results_agree([w + torch.tensor([1e-3, 0, 0, 0])], [w])
    assert "differ" in results_agree([torch.tensor([1, 2])], [torch.tensor([1, 3])])
    assert "float16" in results_agree([w.half()], [w])
    h = torch.tensor([1.0, 100.0], dtype=torch.bfloat16)
    assert results_agree([h + torch.tensor([0.0, 0.5], dtype=torch.bfloat16)], [h]) is None
    assert results_agree([None], [None]) is None
    stats = torch.tensor([0.264, 0.1])
    assert "differ" in results_agree([stats + 7e-4], [stats])
    assert results_agree([stats + 7e-4], [stats], half_inputs=True) is None


def test_results_agree_measures_against_the_f32_result():
    """Beyond the 16-bit bound, eqfuse's element still agrees when it is no further from the f32
    result than eager's is; not when it is further."""
    from eqfuse_torch.backend import exact_outputs

    exact = torch.tensor([4.0, 1.0])
    eager = torch.tensor([4.25, 1.0], dtype=torch.bfloat16)  # eager rounded its way to 4.25
    near = torch.tensor([4.0, 1.0], dtype=torch.bfloat16)
    far = torch.tensor([3.5, 1.0], dtype=torch.bfloat16)
    assert "differ" in results_agree([near], [eager])
    assert results_agree([near], [eager], exact=[exact]) is None
    assert "differ" in results_agree([far], [eager], exact=[exact])

    # The f32 run of a graph: 16-bit arguments, results and asked-for dtypes all become f32.
    def f(x, w):
        return ((x @ w).to(torch.bfloat16) * 3).sum(-1)

    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(torch.ones(2, 3, dtype=torch.bfloat16), torch.ones(3, 4, dtype=torch.bfloat16))
    x = torch.randn(2, 3).to(torch.bfloat16)
    w = torch.randn(3, 4).to(torch.bfloat16)
    (out,) = exact_outputs(gm, [x, w])
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ((x.float() @ w.float()) * 3).sum(-1))


def test_results_agree_holds_masks_to_eagers_distance_from_the_f32_result():
    """A boolean mask of a comparison (T5's saved ReLU mask) flips where a 16-bit value sits
    within its rounding of the threshold, eager's too: an element that differs from eager's
    agrees where it is the f32 graph's; a mask off the f32 one in at most twice as many
    elements as eager's agrees; one further off does not, nor any difference without the f32
    result."""
    exact = torch.zeros(1000, dtype=torch.bool)
    eager = exact.clone()
    eager[:10] = True  # eager's rounding flipped 10 elements
    same_as_f32 = eager.clone()
    same_as_f32[:3] = False  # differs from eager only where it is the f32 graph's
    assert "differ" in results_agree([same_as_f32], [eager])
    assert results_agree([same_as_f32], [eager], exact=[exact]) is None
    own = exact.clone()
    own[500:515] = True  # 15 flips of its own: off the f32 mask by 15 <= 2 x 10
    assert results_agree([own], [eager], exact=[exact]) is None
    wrong = exact.clone()
    wrong[500:530] = True  # 30 > 2 x 10
    assert "30 of 1000 elements differ" in results_agree([wrong], [eager], exact=[exact])
    assert "differ" in results_agree([own], [exact], exact=[exact])  # eager exact: no slack


def _cupy():
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(not (torch.cuda.is_available() and _cupy()), reason="needs a CUDA device and CuPy")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_training_on_eqfuse_kernels_matches_eager(dtype):
    """The MLP's forward and backward graphs on eqfuse's generated kernels (no stand-in) give
    eager's loss and gradients."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = Mlp().cuda().to(dtype)
    x, y = torch.randn(256, 32, device="cuda", dtype=dtype), torch.randn(256, 8, device="cuda", dtype=dtype)
    backend = EqfuseBackend(report=None)

    def step(run, m):
        loss = run(x, y)
        loss.backward()
        return loss.detach().float(), {n: p.grad.float() for n, p in m.named_parameters()}

    m1 = copy.deepcopy(model)
    compiled = step(torch.compile(m1, backend=backend, dynamic=False), m1)
    m0 = copy.deepcopy(model)
    eager = step(m0, m0)
    runs = {p.kind: (p.runs, p.why_eager) for p in backend.plans if p.kind != "joint"}
    print("graphs:", runs)
    assert runs["forward"][0] == "eqfuse" and runs["backward"][0] == "eqfuse", runs
    if dtype == torch.float32:
        assert_same_step(eager, compiled)
    else:  # bf16: eqfuse's kernels keep f32 inside a fused kernel where eager rounds each op
        (l0, g0), (l1, g1) = eager, compiled
        assert relative(l1, l0) <= 2e-2
        assert all(relative(g1[n], g0[n]) <= 5e-2 for n in g0), {n: relative(g1[n], g0[n]) for n in g0}


class ReplayedReference:
    """A `LaunchPlan` whose one "kernel" evaluates the graph on the CPU reference (test_runtime's
    stand-in) and writes the results into the tensors it is given, replayed as CUDA graphs by
    test_graphs' `PointerGraphs` (on exactly the memory captured): the backend's whole launch
    path, `_Runner` over `GraphedLaunch`, on the CPU."""

    def __new__(cls, graph):
        from test_graphs import PointerGraphs
        from test_runtime import CpuReferencePlan

        from eqfuse_torch.runtime import GraphedLaunch, LaunchPlan

        names = {torch.float32: "f32", torch.int32: "i32", torch.bool: "bool"}
        reference = CpuReferencePlan(graph)
        inputs = {i["name"]: (i["dtype"], list(i["shape"])) for i in graph["inputs"]}
        zeros = {n: torch.zeros(s, dtype={"f32": torch.float32, "i32": torch.int32, "bool": torch.bool}[d])
                 for n, (d, s) in inputs.items()}
        outputs = {n: (names[t.dtype], list(t.shape)) for n, t in reference(zeros).items()}

        def arg(name, role, dtype, shape):
            return {"name": name, "role": role, "dtype": dtype, "shape": shape, "bytes": 0}

        manifest = {
            "inputs": [[n, f"{d}[{','.join(map(str, s))}]"] for n, (d, s) in inputs.items()],
            "outputs": [[n, n] for n in outputs],
            "kernels": [{"name": "reference", "args": [arg(n, "read", *t) for n, t in inputs.items()]
                         + [arg(n, "write", *t) for n, t in outputs.items()]}],
        }

        class Replayed(LaunchPlan):
            def launch(self, env):
                for name, t in reference({n: env[n] for n in inputs}).items():
                    env[name].copy_(t)

        plan = Replayed(manifest, torch.device("cpu"))
        plan.graphed = GraphedLaunch(plan, manifest["kernels"], PointerGraphs())
        return plan


def test_training_steps_through_replayed_plans_match_eager(monkeypatch):
    """Training steps (SGD) whose forward and backward graphs replay as graphs, on the CPU: the
    loss and gradients of every step are eager's, with the forward's outputs held until the
    backward, every step's loss and gradients held to the end (never overwritten by a later
    replay), and parameters changed in place between."""
    built = []
    monkeypatch.setattr(EqfuseBackend, "_build", lambda self, graph, ex: built.append(ReplayedReference(graph)) or built[-1])
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = Mlp()
    m0, m1 = copy.deepcopy(model), copy.deepcopy(model)
    run = torch.compile(m1, backend=EqfuseBackend(report=None), dynamic=False)
    opt0, opt1 = torch.optim.SGD(m0.parameters(), lr=0.1), torch.optim.SGD(m1.parameters(), lr=0.1)

    def step(fn, m, x, y):
        loss = fn(x, y)
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in m.named_parameters()}

    kept = []  # every step's loss and gradients, held by the caller to the end
    for i in range(6):
        x, y = torch.randn(16, 32), torch.randn(16, 8)
        kept.append((step(m0, m0, x, y), step(run, m1, x, y)))
        assert_same_step(*kept[-1])
        for opt in (opt0, opt1):
            opt.step()
            opt.zero_grad(set_to_none=True)
    for eager, compiled in kept:
        assert_same_step(eager, compiled)
    assert len(built) == 2 and all(p.stats["replays"] >= 4 for p in built), [p.stats for p in built]
    assert all("graph_off" not in p.stats for p in built)
