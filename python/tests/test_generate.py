"""Compiled text generation with a static key/value cache, through the backend.

The recipe `transformers` documents for compiled generation:

    model.generation_config.cache_implementation = "static"
    model.forward = torch.compile(model.forward, backend=backend, fullgraph=True)
    out = model.generate(input_ids, max_new_tokens=8, do_sample=False, cache_implementation="static")

for Llama (grouped-query attention), GPT-2, Qwen2 (grouped-query attention, biased projections)
and Gemma (one key/value head), small configs with random weights (nothing is downloaded), two
prompts of 6 tokens. TorchDynamo captures two graphs, the prefill (6 positions) and the decode
step (1 position, its shapes the same at every step: the cache is allocated at its full length
once). Each writes the new keys and values into the cache's buffers in place (`index_copy_`
along the positions axis, at `arange(n) + cumulative_length` in transformers 5, a 0-d count of
the positions written that the cache keeps in a buffer and advances in place, `add_`):
AOTAutograd functionalizes the writes into `index_put` (what PyTorch's core decompositions make
of `index_copy`) and `add`, whose results the graph returns, and copies them into the buffers
itself. Both
graphs are exported, planned and run by eqfuse's plan on the CPU reference (the stand-in of
`test_runtime.py`), the decode step's plan at each of the 7 steps after the prefill: the greedy
tokens are eager generation's, and the logits of every step within 1e-4 relative of eager's.

Run from the repository root: `python3 -m pytest python/tests/test_generate.py`.
"""

import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "StaticCache"):
    pytest.skip("this transformers has no static cache", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eqfuse_torch.backend import EqfuseBackend  # noqa: E402
from test_models import assert_all_on_eqfuse  # noqa: E402
from test_runtime import CpuReferencePlan  # noqa: E402
from test_training import relative  # noqa: E402

T = transformers
VOCAB, PROMPT, NEW = 128, 6, 8
RTOL = 1e-4
SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def llama():
    return T.LlamaForCausalLM(T.LlamaConfig(num_key_value_heads=2, **SIZES))


def gpt2():
    cfg = T.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=VOCAB, resid_pdrop=0.0,
                       embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return T.GPT2LMHeadModel(cfg)


def qwen2():
    return T.Qwen2ForCausalLM(T.Qwen2Config(num_key_value_heads=2, **SIZES))


def gemma():
    return T.GemmaForCausalLM(T.GemmaConfig(num_key_value_heads=1, head_dim=16, **SIZES))


MODELS = {"llama": llama, "gpt2": gpt2, "qwen2": qwen2, "gemma": gemma}


def generate(model, ids):
    """Greedy generation of `NEW` tokens with a static cache: the sequences and each step's logits."""
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                             cache_implementation="static", output_logits=True, return_dict_in_generate=True)
    return out.sequences, out.logits


@pytest.mark.parametrize("name", sorted(MODELS))
def test_static_cache_generation_on_eqfuse_plans(name, monkeypatch):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    ids = torch.randint(1, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(1))
    want_tokens, want_logits = generate(model, ids)

    plans = []

    def build(self, graph, example_inputs):
        plans.append(CpuReferencePlan(graph))
        return plans[-1]

    monkeypatch.setattr(EqfuseBackend, "_build", build)
    torch._dynamo.reset()
    backend = EqfuseBackend(report=None)
    model.generation_config.cache_implementation = "static"
    model.forward = torch.compile(model.forward, backend=backend, fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got_tokens, got_logits = generate(model, ids)

    assert torch.equal(got_tokens, want_tokens), (got_tokens, want_tokens)
    assert len(got_logits) == len(want_logits) == NEW
    for step, (g, w) in enumerate(zip(got_logits, want_logits)):
        assert relative(g, w) <= RTOL, (step, relative(g, w))
    assert_all_on_eqfuse(backend)
    # The prefill and the decode step, each captured once; eqfuse's plan ran every step. Each
    # step reads the keys and values the plans wrote before (the outputs AOTAutograd copies
    # into the cache): its logits above are eager's only if those writes were.
    assert [p.kind for p in backend.plans] == ["forward", "forward"], [(p.kind, p.why_eager) for p in backend.plans]
    assert [p.calls for p in plans] == [1, NEW - 1]
