"""More `transformers` architectures through the `torch.compile` backend, each for what it
brought that the models of `test_models.py` do not: Phi-3 slices an empty rotary tail (an empty
tensor), GPT-J rotates every other element (its backward a `slice_scatter` with step 2),
RoBERTa numbers positions by a running sum of the mask (`cumsum`), Falcon's backward adds into
a rotary table read at positions along its third axis (`index_put` on axis 2), BART shifts its
tokens into a slice (`copy`, `fill`, `select_scatter`), CLIP's text tower pools at each
sequence's `argmax` (its backward an `index_put` with two index tensors), SigLIP's vision tower
tiles its pooling probe (`repeat`), Swin restrides a pooled tensor (`as_strided`, its backward
`as_strided_scatter`) and shifts windows (`roll`). The convolutional ones: ResNet brings padded
and strided convolutions (3x3, 1x1, a 7x7 stem), batch norm (eval, and in training the functional
form whose running statistics AOTAutograd writes back) and max pooling with indices; ConvNeXt a
depthwise 7x7 convolution; Segformer overlapping patch convolutions and a depthwise 3x3; Funnel
average pooling (ceil mode) and `new_empty_strided` in its backward; Whisper's encoder 1-d
convolutions; wav2vec2 strided 1-d convolutions, group norm and a grouped positional convolution
under weight norm. Then: Qwen3 (normed queries and keys), Gemma 3 (sliding and global layers),
Mixtral (a mixture of experts: `topk` routing, an unstable `sort` of the choices, `histc`,
`transformers`' grouped product and its backward), DeepSeek-V3 (latent attention, routing
limited to groups of experts), GPT-OSS (attention sinks: `max` along an axis; experts with
biases), OPT, GPT-Neo (local attention), MPT (ALiBi),
XGLM (scores clamped at f32's lowest value, which the eqfuse binary must read exactly), Mamba 2
(a state-space model, chunked scan, no attention), Longformer (`as_strided` chunks of a
transposed tensor), LongT5 (`logical_and` of i32 masks), FNet (Fourier transforms as products
with the Fourier matrices), DeBERTa (disentangled attention), LeViT (attention biases, hardswish)
BEiT (relative position biases), VideoMAE (3-d tubelet convolutions) and ViT-MAE (patches kept by an `argsort` of the noise, a
`gather`, whose backward is a `scatter_add`). Random weights, small configs, the CPU reference standing in for the GPU (as
in `test_models.py`): inference and a training step, every graph on eqfuse's plans, outputs and
gradients against eager.

The lowerings themselves are checked on small graphs too (`test_cumsum`, `test_strided_slice_scatter`,
`test_empty_results`, convolutions (transposed ones too), poolings (adaptive ones too) and norms
with their backward ops, `index_copy` and the `index_put` that writes, as a static key/value cache
is written, `topk`, `sort`, `histc`, integer `//`, `scatter` of several indices a row, the grouped
product, Fourier transforms, `as_strided` of a transposed tensor), against PyTorch on the CPU
reference.

Run from the repository root: `python3 -m pytest python/tests/test_more_models.py`.
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


def resnet():
    cfg = T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1])
    return T.ResNetModel(cfg), {"pixel_values": _pixels()}


def convnext():
    cfg = T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, drop_path_rate=0.0)
    return T.ConvNextModel(cfg), {"pixel_values": _pixels()}


def segformer():
    cfg = T.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                            patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                            decoder_hidden_size=32, drop_path_rate=0.0)
    return T.SegformerModel(cfg), {"pixel_values": _pixels()}


def funnel():
    cfg = T.FunnelConfig(vocab_size=VOCAB, d_model=64, n_head=4, d_head=16, d_inner=128, block_sizes=[1, 1],
                         num_decoder_layers=1, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    return T.FunnelModel(cfg), {"input_ids": _ids(), "attention_mask": _padding()}


def whisper_encoder():
    cfg = T.WhisperConfig(vocab_size=VOCAB, num_mel_bins=8, d_model=64, encoder_layers=1, decoder_layers=1,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                          decoder_ffn_dim=128, max_source_positions=16, max_target_positions=64,
                          pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    features = torch.randn(BATCH, 8, 32, generator=torch.Generator().manual_seed(1))
    return T.WhisperModel(cfg).get_encoder(), {"input_features": features}


def wav2vec2():
    cfg = T.Wav2Vec2Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                           intermediate_size=128, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                           num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, hidden_dropout=0.0,
                           attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0, layerdrop=0.0,
                           mask_time_prob=0.0)
    audio = torch.randn(BATCH, 400, generator=torch.Generator().manual_seed(1))
    return T.Wav2Vec2Model(cfg), {"input_values": audio}


def qwen3():
    cfg = T.Qwen3Config(num_key_value_heads=2, head_dim=16, **SIZES)
    return T.Qwen3ForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


def gemma3_text():
    cfg = T.Gemma3TextConfig(num_key_value_heads=2, head_dim=16, sliding_window=8, **SIZES)
    return T.Gemma3ForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


def mixtral():
    cfg = T.MixtralConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **SIZES)
    return T.MixtralForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


def deepseek_v3():
    cfg = T.DeepseekV3Config(num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                             moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                             qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, **SIZES)
    return T.DeepseekV3ForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


def gpt_oss():
    cfg = T.GptOssConfig(num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                         sliding_window=8, **SIZES)
    return T.GptOssForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


def opt():
    cfg = T.OPTConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
                      max_position_embeddings=64, word_embed_proj_dim=64, dropout=0.0)
    return T.OPTForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


def gpt_neo():
    cfg = T.GPTNeoConfig(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4,
                         attention_types=[[["global", "local"], 1]], window_size=8, max_position_embeddings=64,
                         embed_dropout=0.0, attention_dropout=0.0, resid_dropout=0.0)
    return T.GPTNeoForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


def mpt():
    cfg = T.MptConfig(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=2, max_seq_len=64)
    return T.MptForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


def xglm():
    cfg = T.XGLMConfig(vocab_size=VOCAB, d_model=64, num_layers=2, attention_heads=4, ffn_dim=128,
                       max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    return T.XGLMForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


def mamba2():
    cfg = T.Mamba2Config(vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=1, expand=2, head_dim=16,
                         num_heads=4, n_groups=1, conv_kernel=4, chunk_size=8)
    return T.Mamba2ForCausalLM(cfg), {"input_ids": _ids(), "use_cache": False}


def longformer():
    cfg = T.LongformerConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                             intermediate_size=128, max_position_embeddings=64, attention_window=4,
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return T.LongformerModel(cfg), {"input_ids": _ids(), "attention_mask": _padding()}


def longt5():
    cfg = T.LongT5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                         dropout_rate=0.0, local_radius=4)
    return T.LongT5EncoderModel(cfg), {"input_ids": _ids(), "attention_mask": _padding()}


def fnet():
    cfg = T.FNetConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                       max_position_embeddings=64, hidden_dropout_prob=0.0)
    return T.FNetModel(cfg), {"input_ids": _ids()}


def deberta():
    cfg = T.DebertaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    return T.DebertaModel(cfg), {"input_ids": _ids(), "attention_mask": _padding()}


def levit():
    cfg = T.LevitConfig(image_size=64, hidden_sizes=[32, 48], num_attention_heads=[2, 3], depths=[1, 1],
                        key_dim=[8, 8], down_ops=[["Subsample", 8, 2, 4, 2, 2]], drop_path_rate=0)
    return T.LevitModel(cfg), {"pixel_values": _pixels(64)}


def videomae():
    cfg = T.VideoMAEConfig(image_size=32, patch_size=8, num_frames=4, tubelet_size=2, hidden_size=64,
                           num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
    video = torch.randn(BATCH, 4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return T.VideoMAEModel(cfg), {"pixel_values": video}


def beit():
    cfg = T.BeitConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                       image_size=32, patch_size=8, use_relative_position_bias=True, drop_path_rate=0.0,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return T.BeitModel(cfg), {"pixel_values": _pixels()}


def vit_mae():
    cfg = T.ViTMAEConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                         image_size=32, patch_size=8, mask_ratio=0.5, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
    # The masking noise given (drawn inside, eager and compiled would draw other noise).
    noise = torch.rand(BATCH, 16, generator=torch.Generator().manual_seed(2))
    return T.ViTMAEModel(cfg), {"pixel_values": _pixels(), "noise": noise}


MODELS = {"phi3": phi3, "gptj": gptj, "roberta": roberta, "falcon": falcon, "bart": bart, "clip_text": clip_text,
          "siglip_vision": siglip_vision, "swin": swin, "resnet": resnet, "convnext": convnext,
          "segformer": segformer, "funnel": funnel,
          "whisper_encoder": whisper_encoder, "wav2vec2": wav2vec2,
          "qwen3": qwen3, "gemma3_text": gemma3_text, "mixtral": mixtral, "opt": opt, "gpt_neo": gpt_neo, "mpt": mpt,
          "xglm": xglm, "mamba2": mamba2, "longformer": longformer, "longt5": longt5, "fnet": fnet,
          "deberta": deberta, "levit": levit, "beit": beit, "vit_mae": vit_mae,
          "deepseek_v3": deepseek_v3, "gpt_oss": gpt_oss, "videomae": videomae}



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


def _check(fn, inputs, tmp_path, functional=False, rtol=1e-5, atol=1e-6):
    """`fn` exported (functionalized first where it writes in place) and run on the CPU
    reference, each result against PyTorch's (integers exactly, NaN where PyTorch has NaN)."""
    got = _export_and_run(torch.func.functionalize(fn) if functional else fn, inputs, tmp_path)
    want = fn(*inputs)
    for g, w in zip(got, want if isinstance(want, (tuple, list)) else [want]):
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.is_floating_point():
            assert torch.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True), (g, w)
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


CONVS = [  # (input shape, weight shape, stride, padding, dilation, groups)
    ((2, 3, 9, 8), (4, 3, 3, 3), 1, 1, 1, 1),
    ((2, 3, 9, 8), (4, 3, 3, 3), 2, 1, 1, 1),
    ((2, 3, 11, 10), (5, 3, 7, 7), 2, 3, 1, 1),  # ResNet's stem
    ((2, 4, 7, 9), (6, 4, 1, 1), 1, 0, 1, 1),
    ((2, 4, 7, 9), (6, 4, 1, 1), 2, 0, 1, 1),  # a strided 1x1 shortcut
    ((2, 4, 9, 9), (6, 2, 3, 2), (2, 1), (1, 0), (2, 1), 2),  # groups, dilation, uneven sizes
    ((2, 6, 9, 7), (6, 1, 3, 3), 1, 1, 1, 6),  # depthwise
    ((2, 4, 11, 11), (4, 1, 7, 7), 1, 3, 1, 4),  # ConvNeXt's depthwise 7x7
    ((2, 4, 10, 10), (8, 1, 3, 3), 2, 1, 1, 4),  # a channel multiplier of 2
    ((2, 3, 13, 11), (8, 3, 7, 7), 4, 3, 1, 1),  # Segformer's overlapping patches
    ((2, 3, 12, 12), (8, 3, 4, 4), 4, 0, 1, 1),  # patches
    ((2, 3, 17), (5, 3, 3), 1, 1, 1, 1),  # 1-d: Whisper's
    ((2, 3, 17), (5, 3, 3), 2, 1, 1, 1),
    ((2, 4, 20), (4, 2, 5), 3, 2, 2, 2),  # 1-d grouped, wav2vec2's
    ((1, 2, 5, 6, 4), (3, 2, 3, 2, 3), (2, 1, 1), (1, 0, 1), 1, 1),  # 3-d
]


@pytest.mark.parametrize("case", range(len(CONVS)))
def test_convolution_and_its_backward(case, tmp_path):
    """`aten.convolution` and `aten.convolution_backward` (all three gradients) against PyTorch:
    1-d, 2-d and 3-d, strides, padding, dilation, groups, depthwise, odd sizes."""
    xs, ws, stride, padding, dilation, groups = CONVS[case]
    gen = torch.Generator().manual_seed(case)
    x, w, b = torch.randn(xs, generator=gen), torch.randn(ws, generator=gen), torch.randn(ws[0], generator=gen)
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d, 5: torch.nn.functional.conv3d}[len(xs)]
    y = conv(x, w, b, stride, padding, dilation, groups)
    g = torch.randn(y.shape, generator=gen)
    n = len(xs) - 2

    def fn(x, w, b, g):
        def ints(v):
            return [v] * n if isinstance(v, int) else list(v)

        y = torch.ops.aten.convolution(x, w, b, ints(stride), ints(padding), ints(dilation), False, [0] * n, groups)
        dx, dw, db = torch.ops.aten.convolution_backward(g, x, w, [ws[0]], ints(stride), ints(padding),
                                                         ints(dilation), False, [0] * n, groups, [True, True, True])
        return y, dx, dw, db

    _check(fn, [x, w, b, g], tmp_path, rtol=1e-4, atol=1e-4)


POOLS = [  # (input shape, kernel, stride, padding, dilation, ceil_mode)
    ((2, 3, 8, 8), 3, 2, 1, 1, False),  # ResNet's
    ((2, 3, 9, 7), 2, 2, 0, 1, False),
    ((2, 3, 9, 7), 2, 2, 0, 1, True),  # ceil mode: a last window past the input
    ((2, 3, 10, 9), (3, 2), (2, 1), (1, 1), (1, 2), True),
    ((3, 7, 6), 3, 1, 1, 1, False),  # unbatched
    ((2, 3, 9, 1), (2, 1), (2, 1), 0, 1, True),  # Funnel's pooling of a sequence
]


@pytest.mark.parametrize("case", range(len(POOLS)))
def test_max_pool_and_its_backward(case, tmp_path):
    """`max_pool2d_with_indices` (the values and PyTorch's flat indices, ties to the first) and
    its backward against PyTorch."""
    shape, k, s, p, d, ceil = POOLS[case]
    gen = torch.Generator().manual_seed(case)
    x = torch.randn(shape, generator=gen).round(decimals=0)  # ties in windows
    y, i = torch.ops.aten.max_pool2d_with_indices(x, k, s, p, d, ceil)
    g = torch.randn(y.shape, generator=gen)

    def fn(x, g):
        y, i = torch.ops.aten.max_pool2d_with_indices(x, k, s, p, d, ceil)
        return y, i, torch.ops.aten.max_pool2d_with_indices_backward(g, x, k, s, p, d, ceil, i)

    _check(fn, [x, g], tmp_path)


@pytest.mark.parametrize("case", range(len(POOLS)))
def test_avg_pool_and_its_backward(case, tmp_path):
    """`avg_pool2d` and its backward against PyTorch: padding counted or not, a divisor
    override, ceil mode."""
    shape, k, s, p, _, ceil = POOLS[case]
    gen = torch.Generator().manual_seed(case)
    x = torch.randn(shape, generator=gen)
    g = torch.randn(torch.ops.aten.avg_pool2d(x, k, s, p, ceil).shape, generator=gen)

    def fn(x, g):
        out = ()
        for include_pad, divisor in [(True, None), (False, None), (True, 3)]:
            y = torch.ops.aten.avg_pool2d(x, k, s, p, ceil, include_pad, divisor)
            out += (y, torch.ops.aten.avg_pool2d_backward(g, x, k, s, p, ceil, include_pad, divisor))
        return out

    _check(fn, [x, g], tmp_path)


@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (6, 5), (3, 4, 7)])
def test_batch_norm_and_its_backward(shape, tmp_path):
    """Batch norm in eval mode, in training (the functional form: batch statistics, running
    ones moved by the momentum towards the unbiased variance; without running statistics, BiT's
    weight standardisation) and its backward, both modes."""
    gen = torch.Generator().manual_seed(len(shape))
    c = shape[1]
    x, g = torch.randn(shape, generator=gen) * 2 + 1, torch.randn(shape, generator=gen)
    w, b = torch.randn(c, generator=gen), torch.randn(c, generator=gen)
    rm, rv = torch.randn(c, generator=gen), torch.rand(c, generator=gen) + 0.5

    def fn(x, g, w, b, rm, rv):
        ev = torch.ops.aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5)[0]
        tr = torch.ops.aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)
        back = torch.ops.aten.native_batch_norm_backward(g, x, w, rm, rv, tr[1], tr[2], True, 1e-5,
                                                         [True, True, True])
        back_eval = torch.ops.aten.native_batch_norm_backward(g, x, w, rm, rv, None, None, False, 1e-5,
                                                              [True, True, True])
        legit = torch.ops.aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5)
        legit_eval = torch.ops.aten._native_batch_norm_legit(x, w, b, rm, rv, False, 0.1, 1e-5)[0]
        return (ev,) + tuple(tr) + tuple(back) + tuple(back_eval) + tuple(legit) + (legit_eval,)

    _check(fn, [x, g, w, b, rm, rv], tmp_path, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 4), 3), ((3, 4, 7), 4), ((2, 6, 9), 1)])
def test_group_norm_and_its_backward(shape, groups, tmp_path):
    """`native_group_norm` and its backward (all three gradients) against PyTorch."""
    gen = torch.Generator().manual_seed(len(shape) + groups)
    n, c = shape[:2]
    hw = math.prod(shape[2:])
    x, g = torch.randn(shape, generator=gen) * 2 + 1, torch.randn(shape, generator=gen)
    w, b = torch.randn(c, generator=gen), torch.randn(c, generator=gen)

    def fn(x, g, w, b):
        y, mean, rstd = torch.ops.aten.native_group_norm(x, w, b, n, c, hw, groups, 1e-5)
        back = torch.ops.aten.native_group_norm_backward(g, x, mean, rstd, w, n, c, hw, groups, [True, True, True])
        return (y, mean, rstd) + tuple(back)

    _check(fn, [x, g, w, b], tmp_path, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm_and_its_backward(dim, tmp_path):
    """`_weight_norm_interface` (wav2vec2's positional convolution normalises along axis 2) and
    its backward against PyTorch."""
    gen = torch.Generator().manual_seed(dim)
    v = torch.randn(6, 3, 5, generator=gen)
    gshape = [1, 1, 1]
    gshape[dim] = v.shape[dim]
    g, gw = torch.randn(gshape, generator=gen), torch.randn(6, 3, 5, generator=gen)

    def fn(v, g, gw):
        w, norm = torch.ops.aten._weight_norm_interface(v, g, dim)
        return (w, norm) + tuple(torch.ops.aten._weight_norm_interface_backward(gw, v, g, norm, dim))

    _check(fn, [v, g, gw], tmp_path, rtol=1e-4, atol=1e-5)


def test_batch_norm_running_statistics_of_a_training_step(monkeypatch):
    """A training forward of ResNet through the backend moves every batch norm's running mean
    and variance (and counts its batches) as eager does: the functional batch norm's new running
    statistics are graph outputs that AOTAutograd writes back into the buffers."""
    import copy

    model, kw = make("resnet")
    model.train()
    eager, compiled = copy.deepcopy(model), copy.deepcopy(model)
    backend = stand_in(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager(**kw)
        torch.compile(compiled, backend=backend, dynamic=False)(**kw)
    assert_all_on_eqfuse(backend)
    want, got = dict(eager.named_buffers()), dict(compiled.named_buffers())
    assert any("running_var" in n for n in want)
    for name, w in want.items():
        assert not torch.equal(w, dict(model.named_buffers())[name]), name  # the step moved it
        assert torch.allclose(got[name].to(w.dtype), w, rtol=1e-5, atol=1e-6), name


def test_half_precision_norms(tmp_path):
    """Batch norm and group norm of f16 inputs compute their statistics in f32 and return the
    traced dtypes, as PyTorch does."""
    gen = torch.Generator().manual_seed(9)
    x = (torch.randn(4, 6, 3, 5, generator=gen) * 2 + 1).half()
    w, b = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    rm, rv = torch.randn(6, generator=gen), torch.rand(6, generator=gen) + 0.5

    def fn(x, w, b, rm, rv):
        tr = torch.ops.aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)
        gn = torch.ops.aten.native_group_norm(x, w.half(), b.half(), 4, 6, 15, 3, 1e-5)
        return tuple(tr) + tuple(gn)

    got = _export_and_run(fn, [x, w, b, rm, rv], tmp_path)
    for g, want in zip(got, fn(x, w, b, rm, rv)):
        assert g.dtype == want.dtype and g.shape == want.shape
        assert torch.allclose(g.float(), want.float(), rtol=2e-2, atol=2e-2)


TRANSPOSED = [  # (input shape, weight shape [C_in, C_out/G, *K], stride, padding, output padding, dilation, groups)
    ((2, 4, 5, 6), (4, 3, 3, 3), 2, 1, 1, 1, 1),
    ((2, 4, 5, 5), (4, 2, 2, 2), 2, 0, 0, 1, 1),  # upsampling by 2 (DPT's, SAM's)
    ((2, 4, 4, 5), (4, 1, 3, 2), (1, 2), (1, 0), (0, 1), (2, 1), 2),
    ((2, 3, 7), (3, 5, 4), 3, 1, 2, 1, 1),  # 1-d
]


@pytest.mark.parametrize("case", range(len(TRANSPOSED)))
def test_transposed_convolution_and_its_backward(case, tmp_path):
    """A transposed convolution (`aten.convolution` with `transposed`) and its backward against
    PyTorch: strides, padding, output padding, dilation, groups, 1-d and 2-d."""
    xs, ws, stride, padding, out_pad, dilation, groups = TRANSPOSED[case]
    gen = torch.Generator().manual_seed(case)
    x, w = torch.randn(xs, generator=gen), torch.randn(ws, generator=gen)
    b = torch.randn(ws[1] * groups, generator=gen)
    n = len(xs) - 2

    def ints(v):
        return [v] * n if isinstance(v, int) else list(v)

    args = (ints(stride), ints(padding), ints(dilation), True, ints(out_pad), groups)
    y = torch.ops.aten.convolution(x, w, b, *args)
    g = torch.randn(y.shape, generator=gen)

    def fn(x, w, b, g):
        y = torch.ops.aten.convolution(x, w, b, *args)
        return (y,) + tuple(torch.ops.aten.convolution_backward(g, x, w, [b.shape[0]], *args, [True, True, True]))

    _check(fn, [x, w, b, g], tmp_path, rtol=1e-4, atol=1e-4)


def test_hardtanh_and_its_backward(tmp_path):
    """`hardtanh` (ReLU6) and its backward, the gradient zero at the ends of the range."""
    x = torch.tensor([-2.0, -1.0, 0.0, 0.5, 3.0, 6.0, 7.5, -0.5])
    g = torch.arange(8.0) + 1

    def fn(x, g):
        return (torch.ops.aten.hardtanh(x, 0.0, 6.0), torch.ops.aten.hardtanh(x),
                torch.ops.aten.hardtanh_backward(g, x, 0.0, 6.0), torch.ops.aten.hardtanh_backward(g, x, -1.0, 1.0))

    _check(fn, [x, g], tmp_path)


@pytest.mark.parametrize("shape,out", [((2, 3, 7, 7), (3, 2)), ((2, 3, 8, 6), (4, 3)), ((3, 5, 4), (6, 1)),
                                       ((2, 3, 9, 5), (1, 1))])
def test_adaptive_pools_and_their_backward(shape, out, tmp_path):
    """`_adaptive_avg_pool2d` and `adaptive_max_pool2d` with their backward ops against
    PyTorch: windows of uneven sizes (7 into 3), of one size, more outputs than inputs."""
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen).round(decimals=0)  # ties in windows
    g = torch.randn(shape[:-2] + out, generator=gen)

    def fn(x, g):
        avg = torch.ops.aten._adaptive_avg_pool2d(x, out)
        mx, i = torch.ops.aten.adaptive_max_pool2d(x, out)
        return (avg, torch.ops.aten._adaptive_avg_pool2d_backward(g, x), mx, i,
                torch.ops.aten.adaptive_max_pool2d_backward(g, x, i))

    _check(fn, [x, g], tmp_path)


def test_index_copy_writes_a_static_cache(tmp_path):
    """`index_copy_` as `transformers`' static cache writes keys and values at `cache_position`,
    functionalized: as `aten.index_copy` (no decompositions) and as the non-accumulating
    `index_put` PyTorch's core decompositions make of it; a prefill's positions, a decode
    step's one position, positions out of order, a 0-d index, a negative axis, integers."""
    from eqfuse_torch.backend import decompositions

    cache = torch.randn(1, 2, 13, 4)

    def write(x, pos, v):
        y = x.clone()
        y.index_copy_(2, pos, v)
        return y * 1

    def write_last(x, pos, v):
        return x.index_copy(-1, pos, v)

    cases = [(write, [cache, torch.arange(6), torch.randn(1, 2, 6, 4)]),
             (write, [cache, torch.tensor([7]), torch.randn(1, 2, 1, 4)]),
             (write, [cache, torch.tensor([12, 0, 5]), torch.randn(1, 2, 3, 4)]),
             (write, [cache, torch.tensor(4), torch.randn(1, 2, 1, 4)]),
             (write_last, [torch.randint(0, 9, (3, 5)), torch.tensor([4, 1]), torch.randint(0, 9, (3, 2))]),
             (lambda x, i, v: x.index_copy(0, i, v), [torch.randn(6), torch.tensor(2), torch.tensor(5.0)])]
    for k, (fn, inputs) in enumerate(cases):
        for decomposed in (False, True):
            gm = torch.fx.experimental.proxy_tensor.make_fx(
                torch.func.functionalize(fn), decomposition_table=decompositions() if decomposed else None)(
                *inputs)
            ops = {n.target.__name__ for n in gm.graph.nodes if n.op == "call_function"}
            assert ("index_put.default" if decomposed else "index_copy.default") in ops, ops
            d = tmp_path / f"{k}-{decomposed}"
            d.mkdir()
            got = run_cpu(export_graph_module(gm), inputs, d)[0]
            want = fn(*inputs)
            assert got.shape == want.shape and torch.equal(got.to(want.dtype), want), (k, decomposed, got, want)


def test_index_put_that_writes(tmp_path):
    """Non-accumulating `index_put` (`x[..., i, j] = v`): one index tensor and two broadcast
    ones, negative indices, values broadcast to the indexed shape; where indices repeat, the
    last write wins (as PyTorch's CPU loop, in order, writes them)."""
    x = torch.randn(4, 6, 5)

    def fn(x, i, j, v, row):
        a = x.index_put((i,), v)  # x[i] = v, v [2, 6, 5]
        b = x.index_put((torch.arange(4), j), row)  # x[arange(4), j] = row, row [5] broadcast
        c = torch.ops.aten.index_put(x, [None, j[:2]], torch.tensor(-3.0))  # x[:, j[:2]] = -3
        d = x.index_put((i.reshape(2, 1), j.reshape(1, 4)), v[0, :1, :].reshape(5))  # a [2, 4] grid
        return a, b, c, d

    inputs = [x, torch.tensor([3, -4]), torch.tensor([5, 0, -1, 2]), torch.randn(2, 6, 5), torch.randn(5)]
    _check(fn, inputs, tmp_path)

    def repeated(x, i, v):
        return torch.ops.aten.index_put(x, [None, i], v)

    x, i, v = torch.randn(3, 5), torch.tensor([1, 3, 1, 4, 3]), torch.randn(3, 5)
    want = x.clone()
    for k in range(i.shape[0]):  # in order: the last write of a position is what it holds
        want[:, i[k]] = v[:, k]
    (tmp_path / "repeated").mkdir()
    got = _export_and_run(repeated, [x, i, v], tmp_path / "repeated")[0]
    assert torch.equal(got, want), (got, want)


def test_index_put_refusals():
    """What a write at index tensors cannot be lowered as is refused with the reason: a boolean
    mask (a data-dependent set of positions), index tensors on axes apart."""
    x = torch.randn(3, 4, 5)
    for fn, why in [(lambda x, m: torch.ops.aten.index_put(x, [m], torch.tensor(0.5)), "boolean mask"),
                    (lambda x, m: torch.ops.aten.index_put(x, [torch.tensor([0]), None, torch.tensor([1])],
                                                           torch.tensor(0.5)), "not consecutive")]:
        gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(x, torch.randn(3, 4, 5) > 0)
        with pytest.raises(ExportError, match=why):
            export_graph_module(gm)


@pytest.mark.parametrize("mask_type", [None, 0, 1, 2])
def test_native_multi_head_attention_decomposition(mask_type):
    """`aten._native_multi_head_attention` (nn.MultiheadAttention's inference fast path) as the
    exporter's decomposition writes it, against PyTorch's op: no mask, an `[L, L]` mask (type 0),
    key padding `[B, S]` (type 1) with one sequence's keys all hidden (its rows give NaN, as
    PyTorch's op does), and a `[B, H, L, L]` mask (type 2); bool and float masks."""
    from eqfuse_torch.export import decompositions

    g = torch.Generator().manual_seed(0)
    b, s, e, h = 3, 8, 32, 4
    x = torch.randn(b, s, e, generator=g)
    w, bias = torch.randn(3 * e, e, generator=g) * 0.2, torch.randn(3 * e, generator=g)
    pw, pb = torch.randn(e, e, generator=g) * 0.2, torch.randn(e, generator=g)
    masks = {None: None, 0: torch.ones(s, s, dtype=torch.bool).triu(1),
             1: torch.zeros(b, s, dtype=torch.bool).index_fill(1, torch.tensor([5, 6, 7]), True),
             2: torch.rand(b, h, s, s, generator=g) < 0.3}
    mask = masks[mask_type]
    if mask_type == 1:
        mask[2] = True  # every key of the third sequence hidden
    op = torch.ops.aten._native_multi_head_attention.default
    decomposed = decompositions()[op]
    for m in ([mask] if mask is None else [mask, torch.zeros(mask.shape).masked_fill(mask, float("-inf"))]):
        want = op(x, x, x, e, h, w, bias, pw, pb, m, False, True, mask_type)[0]
        got = decomposed(x, x, x, e, h, w, bias, pw, pb, m, False, True, mask_type)[0]
        assert torch.equal(got.isnan(), want.isnan())
        assert (got - want).nan_to_num().abs().max() <= 1e-5 * want.nan_to_num().abs().max()


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_inference_fast_path_on_eqfuse_plans(norm_first, monkeypatch):
    """`nn.TransformerEncoder` in eval mode without gradients takes PyTorch's fast path
    (`_transformer_encoder_layer_fwd` a layer), which the backend decomposes into the layer's
    parts: every graph on eqfuse's plans (CPU reference), eager's results, with no mask, a key
    padding mask and a causal mask."""
    from test_models import assert_all_on_eqfuse, stand_in

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=norm_first,
                                             activation="gelu")
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1))
    pad = torch.zeros(2, 16, dtype=torch.bool)
    pad[1, 12:] = True
    for kw in ({}, {"src_key_padding_mask": pad},
               {"mask": torch.nn.Transformer.generate_square_subsequent_mask(16), "is_causal": True}):
        backend = stand_in(monkeypatch)
        with torch.no_grad():
            got = torch.compile(encoder, backend=backend, dynamic=False)(x, **kw)
            want = encoder(x, **kw)
        assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item(), list(kw)
        assert_all_on_eqfuse(backend)


def test_logical_and_or_of_integers(tmp_path):
    """`logical_and`/`logical_or` of integer and float tensors count nonzero as true (LongT5
    ands i32 masks); `bitwise_and` of bools stays one too."""
    a = torch.tensor([[0, 1, 2, -3], [5, 0, 0, 7]], dtype=torch.int32)
    b = torch.tensor([[1, 0, 4, 2], [0, 0, 3, 1]])
    f = torch.tensor([[0.0, 0.5, -1.0, 0.0], [2.0, 0.0, 0.0, 1e-3]])

    def fn(a, b, f):
        return (torch.logical_and(a, b), torch.logical_or(a, f), torch.logical_and(a > 0, b),
                (a > 0) & (b > 0))

    _check(fn, [a, b, f], tmp_path)


def test_topk_and_sort(tmp_path):
    """`topk` (largest and smallest, along any axis) and `sort` (both directions, stable),
    values and indices as PyTorch's: NaN the largest, integers too. Values are distinct where
    indices are compared (PyTorch's `topk` orders equal values its own way); with ties, the
    values match and the indices point at them (unsorted `topk`: the same values, in some order)."""
    x = torch.randn(3, 9, 5, generator=torch.Generator().manual_seed(6))
    x[1, 4, 2] = float("nan")
    ids = torch.randperm(40, generator=torch.Generator().manual_seed(7))[:24].reshape(2, 12)

    def fn(x, ids):
        return (*torch.topk(x, 3), *torch.topk(x, 2, dim=1, largest=False), *torch.topk(ids, 2, dim=0),
                *torch.sort(x, dim=1), *torch.sort(ids, descending=True), *torch.sort(ids.flatten(), stable=True))

    _check(fn, [x, ids], tmp_path)

    ties = torch.tensor([[1.0, 3, 3, 2, 3, 0, 0], [0, 0, 0, 1, 1, -1, 0]])

    def tied(t):
        return (*torch.topk(t, 4), *torch.sort(t, stable=True), *torch.sort(t, descending=True, stable=True),
                *torch.topk(t, 3, sorted=False))

    (tmp_path / "ties").mkdir()
    got = _export_and_run(tied, [ties], tmp_path / "ties")
    want = tied(ties)
    assert torch.equal(got[0], want[0])
    assert torch.equal(ties.gather(1, got[1].long()), want[0])
    for g, w in zip(got[2:6], want[2:6]):
        assert torch.equal(g.to(w.dtype), w)
    assert torch.equal(got[6].sort(descending=True).values, want[6].sort(descending=True).values)
    assert torch.equal(ties.gather(1, got[7].long()), got[6])


def test_histc(tmp_path):
    """`histc` as PyTorch's CPU kernel bins floats (edges, the maximum in the last bin, values
    outside the range dropped), and expert ids counted as a grouped mixture of experts counts
    them (as floats on the CPU, as integers on CUDA)."""
    x = torch.tensor([0.0, 1, 2, 3, 3.0, -1, 4, 1.5, 0.75, 2.25, 2.9999, 1e-7])
    ids = torch.randint(0, 6, (40,), generator=torch.Generator().manual_seed(8))

    def fn(x, ids):
        return (torch.histc(x, bins=4, min=0, max=3), torch.histc(x, bins=7, min=-0.5, max=2.5),
                torch.histc(ids.float(), bins=6, min=0, max=5), torch.histc(x * 3.3, bins=5, min=-1, max=9))

    _check(fn, [x, ids], tmp_path, rtol=0, atol=0)


def test_histc_over_the_data_range_is_refused():
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x: torch.histc(x, bins=4))(torch.randn(8))
    with pytest.raises(ExportError, match="histc with min == max"):
        export_graph_module(gm)


def test_grouped_mm_fallback_and_its_backward(tmp_path):
    """`transformers`' grouped product of a mixture of experts (rows sorted by expert, groups
    ending at cumulative offsets: an empty group, rows past the last offset left zero) and its
    backward op, against theirs."""
    from transformers.integrations import moe  # noqa: F401 - registers torch.ops.transformers

    g = torch.Generator().manual_seed(9)
    x, w = torch.randn(10, 6, generator=g), torch.randn(4, 6, 5, generator=g)
    grad = torch.randn(10, 5, generator=g)
    offs = torch.tensor([3, 3, 7, 9], dtype=torch.int32)

    def fn(x, w, offs, grad):
        return (torch.ops.transformers.grouped_mm_fallback(x, w, offs),
                *torch.ops.transformers.grouped_mm_fallback_backward(x, w, offs, grad))

    _check(fn, [x, w, offs, grad], tmp_path)


def test_integer_division_with_rounding(tmp_path):
    """`//` and `div(rounding_mode=...)` of integers, negative ones too (floor and trunc
    differ there); of floats: test_losses.py."""
    a = torch.tensor([[7, -7, 6, -6, 0, 13], [1, -1, 5, -5, 9, -9]])
    b = torch.tensor([2, 2, -4, -4, 3, 5])

    def fn(a, b):
        return (a // 2, torch.div(a, b, rounding_mode="floor"), torch.div(a, b, rounding_mode="trunc"),
                torch.div(a, -3, rounding_mode="floor"))

    _check(fn, [a, b], tmp_path)


def test_scatter_of_several_indices_a_row(tmp_path):
    """`scatter` of a tensor at k indices a row (the backward of `topk`), along the last axis
    and another, and of a number."""
    g = torch.Generator().manual_seed(10)
    x = torch.randn(5, 7, generator=g)
    idx = torch.stack([torch.randperm(7, generator=g)[:3] for _ in range(5)])
    src = torch.randn(5, 3, generator=g)
    idx0 = torch.stack([torch.randperm(5, generator=g)[:2] for _ in range(7)], 1)

    def fn(x, idx, src, idx0):
        return (torch.zeros_like(x).scatter(1, idx, src), x.scatter(-1, idx, 2.5),
                x.scatter(0, idx0, src[:2, :1].expand(2, 7).contiguous()))

    _check(fn, [x, idx, src, idx0], tmp_path)


def test_as_strided_of_a_transposed_tensor(tmp_path):
    """`as_strided` and its scatter over a tensor laid out densely in another order of its axes
    (Longformer chunks a head-major view of its queries so): positions in its memory order."""
    x = torch.randn(2, 4, 3)
    a = torch.randn(3, 4)

    def fn(x, a):
        y = (x * 2).permute(1, 0, 2)  # [4, 2, 3], strides (3, 12, 1)
        return (y.as_strided((3, 4), (6, 1), 2), y.as_strided((2, 3, 4), (12, 4, 1)),
                y.as_strided((3, 2, 3), (6, 3, 1), 5), torch.as_strided_scatter(y, a, (3, 4), (6, 1), 2) + 1)

    _check(fn, [x, a], tmp_path)


def test_scores_compared_with_the_lowest_float(tmp_path):
    """XGLM clamps its masked scores at f32's lowest value (`max(scores + mask, lowest)`), and
    the backward of that `max` compares the scores with it: the literal must reach eqfuse
    exactly (the binary reads numbers with serde_json's `float_roundtrip`)."""
    lowest = torch.finfo(torch.float32).min
    x = torch.randn(4, 6)
    keep = torch.rand(4, 6, generator=torch.Generator().manual_seed(11)) > 0.5

    def fn(x, keep):
        s = x + torch.where(keep, torch.zeros(()), torch.tensor(lowest))
        return s == torch.tensor(lowest), torch.maximum(s, torch.tensor(lowest))

    _check(fn, [x, keep], tmp_path)


def test_unordered_outputs():
    """`Exported.unordered`: outputs computed from an unstable sort's or a `topk`'s indices
    (which PyTorch orders its own way among equal values), not from a stable sort's or from
    values alone."""
    ids, x = torch.randint(0, 4, (24,)), torch.randn(24, 3)

    def fn(ids, x):
        order = torch.sort(ids).indices
        stable = torch.sort(ids, stable=True).indices
        top = torch.topk(x, 2, dim=0)
        return x[order], x[stable], top.values, top.indices * 2, torch.sort(ids).values

    gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(ids, x)
    assert export_graph_module(gm).unordered == {0, 3}


def test_fourier_transforms_of_complex_tensors(tmp_path):
    """`_fft_c2c` (forward and inverse, each normalization, one or two axes) between a real
    tensor's conversion to complex and `view_as_real`, and `view_as_complex` of a `[..., 2]`
    tensor (FNet mixes tokens with `fftn(x, dim=(1, 2)).real`): products with the Fourier
    matrices, within rounding of PyTorch's FFT."""
    g = torch.Generator().manual_seed(12)
    x, y = torch.randn(2, 6, 8, generator=g), torch.randn(2, 5, 2, generator=g)

    def fn(x, y):
        c = x.to(torch.complex64)
        return (torch.view_as_real(torch.fft.fftn(c, dim=(1, 2))), torch.view_as_real(torch.fft.ifft(c, dim=1)),
                torch.view_as_real(torch.fft.fft(c, norm="ortho")),
                torch.view_as_real(torch.fft.ifft(torch.view_as_complex(y), dim=-1, norm="forward")))

    _check(fn, [x, y], tmp_path, rtol=1e-4, atol=1e-5)


def test_scatter_add_and_the_backward_of_gather(tmp_path):
    """`scatter_add` along an axis, with indices that repeat and indices smaller than the
    target on the other axes, and the gradient of `torch.gather` (ViT-MAE keeps patches so)."""
    g = torch.Generator().manual_seed(13)
    x, src = torch.randn(3, 6, 4, generator=g), torch.randn(3, 5, 4, generator=g)
    idx = torch.randint(0, 6, (3, 5, 4), generator=g)
    small = torch.randint(0, 3, (2, 4, 2), generator=g)
    last = torch.randint(0, 4, (3, 5, 2), generator=g)

    def fn(x, src, idx, small, last):
        return (x.scatter_add(1, idx, src), x.scatter_add(0, small, src),
                torch.zeros_like(x).scatter_add(-1, last, src))

    _check(fn, [x, src, idx, small, last], tmp_path)

    keep = torch.argsort(torch.rand(3, 6, generator=g), dim=1)[:, :4]
    (tmp_path / "gather").mkdir()
    gm = torch.fx.experimental.proxy_tensor.make_fx(
        lambda x, i, gy: torch.autograd.grad(torch.gather(x, 1, i), x, gy)[0])(
        x.requires_grad_(), keep.unsqueeze(-1).repeat(1, 1, 4), torch.ones(3, 4, 4))
    assert "scatter_add" in str(gm.graph)
    gy = torch.randn(3, 4, 4, generator=g)
    got = run_cpu(export_graph_module(gm), [x.detach(), keep.unsqueeze(-1).repeat(1, 1, 4), gy], tmp_path / "gather")
    want = torch.zeros_like(x).scatter_add(1, keep.unsqueeze(-1).repeat(1, 1, 4), gy)
    close(got[0], want)


def test_max_and_min(tmp_path):
    """`torch.max`/`torch.min` along an axis (values and the first index of ties; a row with a
    NaN gives NaN at its index), of all elements, and of two tensors; `empty` (values
    unspecified) written whole."""
    x = torch.randn(4, 7, 5)
    x[1, 3, 2] = float("nan")
    x[2, :, 1] = 1.5

    def fn(x):
        e = torch.empty(4, 5)
        e.copy_(x[:, 0])
        return (*torch.max(x, 1), *torch.min(x, -1, keepdim=True), torch.max(x[0]), torch.min(x, x * 0.5), e)

    _check(fn, [x], tmp_path, functional=True)
