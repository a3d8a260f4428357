"""More `transformers` architectures through the `torch.compile` backend, each for what it
brought that the models of `test_models.py` do not: Phi-3 slices an empty rotary tail (an empty
tensor), GPT-J rotates every other element (its backward a `slice_scatter` with step 2),
RoBERTa numbers positions by a running sum of the mask (`cumsum`), Falcon's backward adds into
a rotary table read at positions along its third axis (`index_put` on axis 2), BART shifts its
tokens into a slice (`copy`, `fill`, `select_scatter`), CLIP's text tower pools at each
sequence's `argmax` (its backward an `index_put` with two index tensors), SigLIP's vision tower
tiles its pooling probe (`repeat`), Swin restrides a pooled tensor (`as_strided`, its backward
`as_strided_scatter`) and shifts windows (`roll`). Random weights,
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
from eqfuse_torch.graph import ExportError  # noqa: E402
from test_export import close, run_cpu  # noqa: E402
from test_models import (BATCH, VOCAB, _ids, _padding, assert_all_on_eqfuse, assert_training_step_on_eqfuse,  # noqa: E402
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


def bart():
    cfg = T.BartConfig(vocab_size=VOCAB, d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                       max_position_embeddings=64, dropout=0.0, attention_dropout=0.0)
    return T.BartModel(cfg), {"input_ids": _ids(), "attention_mask": _padding()}


def clip_text():
    cfg = T.CLIPTextConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=64)
    return T.CLIPTextModel(cfg), {"input_ids": _ids(), "attention_mask": _padding()}


def _pixels(size=32):
    return torch.randn(BATCH, 3, size, size, generator=torch.Generator().manual_seed(1))


def siglip_vision():
    cfg = T.SiglipVisionConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                               image_size=32, patch_size=8)
    return T.SiglipVisionModel(cfg), {"pixel_values": _pixels()}


def swin():
    cfg = T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4,
                       drop_path_rate=0.0)
    return T.SwinModel(cfg), {"pixel_values": _pixels()}


MODELS = {"phi3": phi3, "gptj": gptj, "roberta": roberta, "falcon": falcon, "bart": bart, "clip_text": clip_text,
          "siglip_vision": siglip_vision, "swin": swin}


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


def _check(fn, inputs, tmp_path, functional=False):
    """`fn` exported (functionalized first where it writes in place) and run on the CPU
    reference, each result against PyTorch's (integers exactly, NaN where PyTorch has NaN)."""
    got = _export_and_run(torch.func.functionalize(fn) if functional else fn, inputs, tmp_path)
    want = fn(*inputs)
    for g, w in zip(got, want if isinstance(want, (tuple, list)) else [want]):
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.is_floating_point():
            assert torch.allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True), (g, w)
        else:
            assert torch.equal(g.to(w.dtype), w), (g, w)


def test_argmax_and_argmin(tmp_path):
    """The first index of the extreme, as PyTorch picks it: ties take the first, a NaN is the
    extreme, no axis means the flattened tensor; integer ids too."""
    x = torch.randn(4, 7, 5)
    x[1, 3, 2] = float("nan")
    x[2, :, 1] = 1.5  # a tie along axis 1
    ids = torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(3))

    def fn(x, ids):
        return (torch.argmax(x, 1), torch.argmax(x, -1, keepdim=True), torch.argmin(x, 0), torch.argmax(x),
                ids.argmax(-1), ids.argmin(0))

    _check(fn, [x, ids], tmp_path)


def test_repeat(tmp_path):
    x = torch.randn(4, 1, 5)
    _check(lambda x: (x.repeat(2, 1, 3), x.repeat(2, 2, 3, 1)), [x], tmp_path)


def test_in_place_writes(tmp_path):
    """`copy_`, `fill_` and item assignment, functionalized as `torch.compile` hands them over:
    BART's `shift_tokens_right` among them."""
    ids = torch.randint(1, 50, (3, 9), generator=torch.Generator().manual_seed(4))
    x = torch.randn(4, 7, 5)

    def shift(ids):
        s = torch.zeros_like(ids)
        s[:, 1:] = ids[:, :-1].clone()
        s[:, 0] = 7
        return s

    def writes(x):
        y = torch.zeros(4, 7, 5)
        y.copy_(x[:, :1, :])
        z = x.clone()
        z.fill_(x.sum())
        w = x.clone()
        w[:, -1] = x[:, 0] * 2
        w[0] = 3.0
        return y, z, w

    (tmp_path / "shift").mkdir()
    (tmp_path / "writes").mkdir()
    _check(shift, [ids], tmp_path / "shift", functional=True)
    _check(writes, [x], tmp_path / "writes", functional=True)


def test_index_put_with_two_index_tensors(tmp_path):
    ids = torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(5))
    z = torch.randn(3, 4)

    def fn(ids, z):
        r = torch.zeros(3, 9, 4)
        return r.index_put((torch.arange(3), ids.argmax(-1)), z, accumulate=True)

    _check(fn, [ids, z], tmp_path)


def test_as_strided_and_its_scatter(tmp_path):
    x = torch.randn(12)

    def fn(x, a, b):
        y = x * 2
        return (y.as_strided((2, 6, 1, 1), (6, 1, 9, 9)), y.as_strided((3, 4), (1, 3)),
                y.as_strided((2, 3), (3, 1), 4), torch.as_strided_scatter(y, a, (3, 4), (1, 3)),
                torch.as_strided_scatter(y, b, (2, 3), (3, 1), 4))

    _check(fn, [x, torch.randn(3, 4), torch.randn(2, 3)], tmp_path)


def test_as_strided_scatter_of_repeated_positions_is_refused():
    gm = torch.fx.experimental.proxy_tensor.make_fx(
        lambda x, s: torch.as_strided_scatter(x * 1, s, (2, 2), (1, 1)))(torch.randn(12), torch.randn(2, 2))
    with pytest.raises(ExportError, match="positions repeat"):
        export_graph_module(gm)


def test_aten_linear(tmp_path):
    """`aten.linear` as a pre-dispatch graph holds it: `x @ w.T + b`."""

    class Dense(torch.nn.Module):
        def forward(self, x, w, b):
            return torch.ops.aten.linear.default(x, w, b)

    x, w, b = torch.randn(4, 5), torch.randn(3, 5), torch.randn(3)
    gm = torch.fx.symbolic_trace(Dense())
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            n.meta["val"] = {"x": x, "w": w, "b": b}[n.name]
        elif n.op == "call_function":
            n.meta["val"] = Dense()(x, w, b)
    close(run_cpu(export_graph_module(gm), [x, w, b], tmp_path)[0], Dense()(x, w, b))
