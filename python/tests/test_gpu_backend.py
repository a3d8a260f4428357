"""The backend's newer paths on a GPU, with eqfuse's generated kernels (no stand-in).

The CPU tests of these paths run the plans on the CPU reference (`test_dynamic.py`,
`test_autocast.py`, `test_generate.py`, `test_losses.py`, `test_random_torch.py`); here the same
models and programs run on CUDA through `EqfuseBackend` as a user gets it: kernels compiled by
NVRTC, launched from the plan, replayed as CUDA graphs. Every graph must run on eqfuse's kernels
(a graph the first-call check sends to eager fails the test, with its reason) and every result
must be eager's within tolerance: f32 1e-4 of the largest eager value (1e-3 where a product's
accumulation order differs from cuBLAS's), 16-bit 2e-2.

Skipped without a CUDA device and CuPy (the build machine and CI); run on the GPU machine by
`benches/gpu/python.sh` (PYTESTS=python/tests/test_gpu_backend.py)."""

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_training import _cupy, relative  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and _cupy()), reason="needs a CUDA device and CuPy")

from eqfuse_torch.backend import EqfuseBackend  # noqa: E402

VOCAB = 128
DEV = "cuda"


def backend(**kw):
    torch._dynamo.reset()
    return EqfuseBackend(report=None, **kw)


def on_eqfuse(b):
    graphs = [(p.kind, p.runs, p.why_eager) for p in b.plans if p.kind != "joint"]
    assert graphs and all(runs == "eqfuse" for _, runs, _ in graphs), graphs


def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                  eos_token_id=0, pad_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).to(DEV)


def llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg).to(DEV)


def ids(batch, seq, seed):
    return torch.randint(1, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed)).to(DEV)


@pytest.mark.parametrize("dynamic", [None, True])
def test_inference_at_several_lengths(dynamic):
    model = gpt2().eval()
    b = backend()
    compiled = torch.compile(model, backend=b, dynamic=dynamic)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seq in (16, 24, 40):
            x = ids(2, seq, seq)
            got = compiled(input_ids=x, use_cache=False).logits
            want = model(input_ids=x, use_cache=False).logits
            assert relative(got, want) <= 1e-3, (seq, relative(got, want))
    on_eqfuse(b)
    assert len([p for p in b.plans if p.kind == "forward"]) == 3


def test_training_at_several_lengths():
    model = llama()
    b = backend()
    compiled = torch.compile(model, backend=b)
    for seq in (16, 32):
        x = ids(2, seq, seq)
        model.zero_grad()
        compiled(input_ids=x, labels=x, use_cache=False).loss.backward()
        got = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        model(input_ids=x, labels=x, use_cache=False).loss.backward()
        for n, p in model.named_parameters():
            assert relative(got[n], p.grad) <= 1e-3, (seq, n, relative(got[n], p.grad))
    on_eqfuse(b)


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_autocast_training_step(make):
    model = make()
    b = backend()
    compiled = torch.compile(model, backend=b)
    x = ids(2, 32, 3)

    def step(run):
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(input_ids=x, labels=x, use_cache=False).loss
        loss.backward()
        return loss.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters()}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got_loss, got = step(compiled)
    want_loss, want = step(model)
    assert relative(got_loss, want_loss) <= 2e-2
    for n, g in want.items():
        assert relative(got[n], g) <= 2e-2, (n, relative(got[n], g))
    on_eqfuse(b)


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_static_cache_generation(make):
    model = make().eval()
    x = ids(2, 6, 1)

    def generate():
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False,
                                 cache_implementation="static", output_logits=True, return_dict_in_generate=True)
        return out.sequences, out.logits

    want_tokens, want_logits = generate()
    b = backend()
    model.generation_config.cache_implementation = "static"
    model.forward = torch.compile(model.forward, backend=b, fullgraph=True)
    got_tokens, got_logits = generate()
    assert torch.equal(got_tokens, want_tokens)
    for step, (g, w) in enumerate(zip(got_logits, want_logits)):
        assert relative(g, w) <= 1e-3, (step, relative(g, w))
    on_eqfuse(b)


def test_losses_train():
    from test_losses import LOSSES, C, _data

    d = {k: v.to(DEV) for k, v in _data().items()}
    failures = {}
    for name, loss in sorted(LOSSES.items()):
        torch.manual_seed(0)
        layer = torch.nn.Linear(16, C).to(DEV)

        def step(fn):
            layer.zero_grad()
            out = fn(d["x"])
            out.backward()
            return out.detach(), layer.weight.grad.clone(), layer.bias.grad.clone()

        def f(x, loss=loss):
            return loss(layer(x), d)

        b = backend()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = step(torch.compile(f, backend=b, dynamic=False))
        want = step(f)
        errs = [relative(g, w) for g, w in zip(got, want)]
        eager = [(p.kind, p.why_eager) for p in b.plans if p.kind != "joint" and p.runs != "eqfuse"]
        if max(errs) > 1e-4 or eager:
            failures[name] = (errs, eager)
    assert not failures, failures


def test_rounding_kernels():
    x = torch.randn(64, 257, device=DEV) * 4
    x[0, :8] = torch.tensor([2.5, -2.5, 1.5, -0.5, 0.5, -1.7, 3.0, 7.25])
    n = torch.randint(-50, 50, (64, 257), device=DEV, dtype=torch.int32)

    def fn(x, n):
        return (torch.floor(x), torch.ceil(x), torch.round(x), torch.trunc(x), torch.frac(x), x // 0.75,
                torch.remainder(x, 0.75), torch.fmod(x, -0.75), n // 4, n % -4, torch.fmod(n, 4),
                torch.round(x, decimals=1))

    b = backend()
    got = torch.compile(fn, backend=b, dynamic=False)(x, n)
    for i, (g, w) in enumerate(zip(got, fn(x, n))):
        assert torch.allclose(g, w, rtol=1e-6, atol=1e-5), i
    on_eqfuse(b)


def test_random_programs_train():
    from test_random_torch import build, inputs, random_program

    failures = {}
    for seed in range(0, 120, 10):
        p = random_program(seed)
        f = build(p)
        xs = [x.to(DEV).requires_grad_(True) for x in inputs(p, seed)]

        def grads(outs):
            outs = [o for o in outs if o.requires_grad]
            if not outs:
                return []
            loss = sum((o.float() * torch.linspace(0.5, 1.5, o.numel(), device=DEV).reshape(o.shape)).sum()
                       for o in outs)
            return [g for g in torch.autograd.grad(loss, xs, allow_unused=True)]

        b = backend()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = torch.compile(f, backend=b, dynamic=False)(*xs)
                got_g = grads(got)
        except Exception as e:  # a failure to compile or run is a failure of this seed
            failures[seed] = repr(e)[:300]
            continue
        want = f(*xs)
        want_g = grads(want)
        errs = [relative(g.detach().double(), w.detach().double(), 1e-6) for g, w in zip(got, want)
                if w.is_floating_point()]
        errs += [relative(g.double(), w.double(), 1e-6) for g, w in zip(got_g, want_g) if w is not None and g is not None]
        eager = [(p.kind, p.why_eager) for p in b.plans if p.kind != "joint" and p.runs != "eqfuse"]
        if (errs and max(errs) > 1e-3) or eager:
            failures[seed] = (max(errs, default=0), eager)
    print(f"{len(failures)} of 12 random programs failed")
    assert not failures, failures
