"""More `transformers` architectures through the `torch.compile` backend, each for what it
brought that the models of `test_models.py` do not: Phi-3 slices an empty rotary tail (an empty
tensor), GPT-J rotates every other element (its backward a `slice_scatter` with step 2),
RoBERTa numbers positions by a running sum of the mask (`cumsum`), Falcon's backward adds into
a rotary table read at positions along its third axis (`index_put` on axis 2). Random weights,
small configs, the CPU reference standing in for the GPU (as in `test_models.py`): inference
and a training step, every graph on eqfuse's plans, outputs and gradients against eager.

The lowerings themselves are checked on small graphs too (`test_cumsum`, `test_strided_slice_scatter`,
`test_empty_results`), against PyTorch on the CPU reference.

Run from the repository root: `python3 -m pytest python/tests/test_more_models.py`.
"""

import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eqfuse_torch import export_graph_module  # noqa: E402
from test_export import close, run_cpu  # noqa: E402
from test_models import (VOCAB, _ids, _padding, assert_all_on_eqfuse, assert_training_step_on_eqfuse,  # noqa: E402
                         first, stand_in)
from test_training import relative  # noqa: E402

T = transformers
SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64)


def phi3():
    cfg = T.Phi3Config(num_key_value_heads=2, pad_token_id=0, **SIZES)
    return T.Phi3ForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


def gptj():
    cfg = T.GPTJConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=64,
                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return T.GPTJForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


def roberta():
    cfg = T.RobertaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    return T.RobertaModel(cfg), {"input_ids": _ids(), "attention_mask": _padding()}


def falcon():
    cfg = T.FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         hidden_dropout=0.0, attention_dropout=0.0)
    return T.FalconForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


MODELS = {"phi3": phi3, "gptj": gptj, "roberta": roberta, "falcon": falcon}


def make(name):
    torch.manual_seed(0)
    return MODELS[name]()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_backend_inference_on_eqfuse_plans(name, monkeypatch):
    model, kw = make(name)
    model.eval()
    backend = stand_in(monkeypatch)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = first(model(**kw))
        got = first(torch.compile(model, backend=backend, dynamic=False)(**kw))
    assert relative(got, want) <= 1e-4
    assert_all_on_eqfuse(backend)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_backend_training_step_on_eqfuse_plans(name, monkeypatch):
    assert_training_step_on_eqfuse(*make(name), monkeypatch)


def _export_and_run(fn, inputs, tmp_path):
    gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(*inputs)
    exported = export_graph_module(gm)
    return run_cpu(exported, inputs, tmp_path)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum(dim, tmp_path):
    x = torch.randn(3, 5, 7)
    mask = (torch.arange(35).reshape(5, 7) % 3 != 0).int()

    def fn(x, m):
        return torch.cumsum(x, dim), torch.cumsum(m, dim if dim < 2 else -1) * m

    got = _export_and_run(fn, [x, mask], tmp_path)
    want = fn(x, mask)
    close(got[0], want[0])
    assert torch.equal(got[1].to(torch.int64), want[1].to(torch.int64))


@pytest.mark.parametrize("start,end,step", [(0, None, 2), (1, None, 2), (1, 8, 3), (2, 9, 4)])
def test_strided_slice_scatter(start, end, step, tmp_path):
    x = torch.randn(4, 10, 3)
    n = len(range(*slice(start, end, step).indices(10)))
    src = torch.randn(4, n, 3)

    def fn(x, s):
        return torch.slice_scatter(x, s * 2, 1, start, end, step)

    close(_export_and_run(fn, [x, src], tmp_path)[0], fn(x, src))


def test_flip(tmp_path):
    x = torch.randn(3, 4, 5)

    def fn(x):
        return torch.flip(x, [0, -1]) * 2, x.flip(1)

    got = _export_and_run(fn, [x], tmp_path)
    for g, w in zip(got, fn(x)):
        close(g, w)


def test_empty_results(tmp_path):
    """A slice with nothing in it, concatenated back and used elementwise: its results are empty
    tensors, dropped by the concatenation (Phi-3's rotary tail when the rotation covers the head)."""
    x = torch.randn(2, 6)

    def fn(x):
        rot, rest = x[:, :6], x[:, 6:]
        return torch.cat([torch.sin(rot), rest * 2], dim=-1)

    close(_export_and_run(fn, [x], tmp_path)[0], fn(x))
