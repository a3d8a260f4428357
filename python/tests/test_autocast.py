"""Mixed-precision training as people write it: f32 parameters, the step under
`torch.autocast(dtype=torch.bfloat16)` (products in bf16, norms and losses in f32). Every graph
runs on eqfuse's plans (the CPU reference stands in; the first-call check holds the f32 outputs
of 16-bit products to 16-bit tolerance), loss and gradients within bf16's 2e-2 of eager's."""

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_models import assert_all_on_eqfuse, stand_in  # noqa: E402
from test_training import relative  # noqa: E402

VOCAB = 128


def gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_autocast_training_step_runs_on_eqfuse(make, monkeypatch):
    torch.manual_seed(0)
    model = make()
    backend = stand_in(monkeypatch)
    compiled = torch.compile(model, backend=backend)
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))

    def step(run):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = run(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters()}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got_loss, got = step(compiled)
    assert not [w for w in caught if str(w.message).startswith("eqfuse:")], [str(w.message) for w in caught]
    want_loss, want = step(model)
    assert relative(got_loss, want_loss) <= 2e-2
    for name, g in want.items():
        assert got[name].dtype == torch.float32
        assert relative(got[name], g) <= 2e-2, name
    assert_all_on_eqfuse(backend)
