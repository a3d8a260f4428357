"""Graphs Dynamo captures with symbolic shapes (a model called at a second size, or
`torch.compile(..., dynamic=True)`): the backend lowers and plans them per shape, every graph
on eqfuse's kernels (the CPU reference stands in), outputs and gradients as eager's."""

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_models import assert_all_on_eqfuse, stand_in  # noqa: E402
from test_training import relative  # noqa: E402

VOCAB = 128


def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def ids(batch, seq, seed):
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dynamic", [None, True])
def test_inference_at_several_lengths_runs_on_eqfuse(monkeypatch, dynamic):
    """Called at three sequence lengths: Dynamo recaptures with symbolic shapes at the second
    (or from the first, `dynamic=True`); each length is planned and runs on eqfuse's kernels."""
    model = gpt2().eval()
    backend = stand_in(monkeypatch)
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no graph may run eagerly
        warnings.filterwarnings("ignore", message=".*(config|TypedStorage|deprecated).*")
        for seq in (16, 24, 40):
            x = ids(2, seq, seq)
            got = compiled(input_ids=x, use_cache=False).logits
            want = model(input_ids=x, use_cache=False).logits
            assert got.shape == want.shape
            assert relative(got, want) <= 1e-4, seq
    assert_all_on_eqfuse(backend)
    # One plan per length the graph was called at (the static first capture's included).
    assert len([p for p in backend.plans if p.kind == "forward"]) == 3


def test_training_at_several_lengths_runs_on_eqfuse(monkeypatch):
    """A training step at three lengths: forward and backward graphs of each on eqfuse's
    kernels, gradients as eager's."""
    model = llama()
    backend = stand_in(monkeypatch)
    compiled = torch.compile(model, backend=backend)
    for seq in (16, 24, 32):
        x = ids(2, seq, seq)
        model.zero_grad()
        compiled(input_ids=x, labels=x, use_cache=False).loss.backward()
        got = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        model(input_ids=x, labels=x, use_cache=False).loss.backward()
        for n, p in model.named_parameters():
            assert relative(got[n], p.grad) <= 1e-4, (seq, n)
    assert_all_on_eqfuse(backend)
    assert len([p for p in backend.plans if p.kind == "backward"]) == 3


def test_shapes_past_the_limit_run_eagerly(monkeypatch):
    """With `shapes=2`, the first two shapes are planned and rerun on eqfuse's kernels; a third
    runs the captured graph eagerly (warned once), and every result stays right."""
    from eqfuse_torch.backend import EqfuseBackend

    stand_in(monkeypatch)
    backend = EqfuseBackend(report=None, shapes=2)

    def f(x, w):
        return torch.softmax(x @ w, dim=-1) * x.shape[0]

    compiled = torch.compile(f, backend=backend, dynamic=True)
    w = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (3, 5, 3, 7, 5, 9):
            x = torch.randn(rows, 8, generator=torch.Generator().manual_seed(rows))
            assert relative(compiled(x, w), f(x, w)) <= 1e-5, rows
    assert len([w for w in caught if "more than 2 shapes" in str(w.message)]) == 1
    # 3 and 5 lowered and planned (each once); 7 and 9 eager.
    assert len([p for p in backend.plans if p.kind == "forward"]) == 2
    assert_all_on_eqfuse(backend)
