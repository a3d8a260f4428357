"""Losses and optimizer steps as people write them, and the elementwise tests and scatters
their graphs hold.

Each loss of `torch.nn.functional` below, on a linear layer's output, trains through the
backend with its forward and backward graphs on eqfuse's plans (the CPU reference stands in):
loss and gradients within 1e-4 of eager. The lowerings they needed (`sign`, `isnan` and the
other float classes, `scatter_add`, `empty_permuted`) are checked against PyTorch directly.
An optimizer's `step` compiled with the backend (SGD with momentum, Adam and AdamW, whose `lerp`
is `prims.fma`) runs on eqfuse's plans and updates parameters and state as eager's does."""

import warnings

import pytest

torch = pytest.importorskip("torch")

from test_models import assert_all_on_eqfuse, stand_in  # noqa: E402
from test_more_models import _check  # noqa: E402
from test_training import relative  # noqa: E402

F = torch.nn.functional
N, C = 32, 10


def _data():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, C, (N,), generator=g)
    y[3] = -100
    return dict(x=torch.randn(N, 16, generator=g), y=y, soft=torch.rand(N, C, generator=g),
                real=torch.randn(N, C, generator=g), w=torch.rand(C, generator=g) + 0.5)


LOSSES = {
    "cross_entropy": lambda o, d: F.cross_entropy(o, d["y"]),
    "cross_entropy, label smoothing": lambda o, d: F.cross_entropy(o, d["y"], label_smoothing=0.1),
    "cross_entropy, class weights": lambda o, d: F.cross_entropy(o, d["y"], weight=d["w"]),
    "cross_entropy of probabilities": lambda o, d: F.cross_entropy(o, d["soft"].softmax(-1)),
    "nll_loss, summed": lambda o, d: F.nll_loss(F.log_softmax(o, -1), d["y"], reduction="sum"),
    "mse_loss": lambda o, d: F.mse_loss(o, d["real"]),
    "l1_loss": lambda o, d: F.l1_loss(o, d["real"]),
    "smooth_l1_loss": lambda o, d: F.smooth_l1_loss(o, d["real"], beta=0.5),
    "huber_loss": lambda o, d: F.huber_loss(o, d["real"]),
    "binary_cross_entropy_with_logits, pos_weight": lambda o, d: F.binary_cross_entropy_with_logits(
        o, d["soft"], pos_weight=d["w"]),
    "binary_cross_entropy": lambda o, d: F.binary_cross_entropy(o.sigmoid(), d["soft"]),
    "kl_div": lambda o, d: F.kl_div(F.log_softmax(o, -1), d["soft"].softmax(-1), reduction="batchmean"),
    "cosine_embedding_loss": lambda o, d: F.cosine_embedding_loss(o, d["real"], torch.ones(N, device=o.device)),
    "multi_margin_loss": lambda o, d: F.multi_margin_loss(o, d["y"].clamp(min=0)),
    "soft_margin_loss": lambda o, d: F.soft_margin_loss(o, d["real"].sign()),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_trains_on_eqfuse_plans(name, monkeypatch):
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, C)
    d = _data()

    def step(fn):
        layer.zero_grad()
        loss = fn(d["x"])
        loss.backward()
        return loss.detach(), layer.weight.grad.clone(), layer.bias.grad.clone()

    def f(x):
        return LOSSES[name](layer(x), d)

    backend = stand_in(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = step(torch.compile(f, backend=backend, dynamic=False))
    want = step(f)
    for g, w in zip(got, want):
        assert relative(g, w) <= 1e-4, name
    assert_all_on_eqfuse(backend)


def test_sign_and_float_classes(tmp_path):
    x = torch.tensor([[-2.0, -0.0, 0.0, 3.0], [float("nan"), float("inf"), -float("inf"), 1e-30]])
    n = torch.tensor([[-3, 0, 2, 7], [1, -1, 0, 5]], dtype=torch.int32)

    def fn(x, n):
        return (torch.sign(x), torch.sgn(x), torch.sign(n), torch.isnan(x), torch.isinf(x), torch.isfinite(x),
                torch.isposinf(x), torch.isneginf(x), torch.isfinite(n), torch.isnan(n))

    _check(fn, [x, n], tmp_path)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_add(dim, tmp_path):
    """`scatter_add` with repeated indices, indices smaller than the values along another axis,
    and integer values."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, 5, generator=g)
    src = torch.randn(4, 6, 5, generator=g)
    size = list(x.shape)
    size[dim] = 7  # more indices along `dim` than the tensor has positions: repeats
    idx_shape = [min(s, 3) if i != dim % 3 else 7 for i, s in enumerate(x.shape)]
    src = torch.randn(*[max(a, b) for a, b in zip(idx_shape, src.shape)], generator=g)
    index = torch.randint(0, x.shape[dim], idx_shape, generator=g)
    counts = torch.zeros(4, 6, 5, dtype=torch.int32)

    def fn(x, index, src, counts):
        return x.scatter_add(dim, index, src * 2), counts.scatter_add(dim, index, torch.ones_like(index,
                                                                                              dtype=torch.int32))

    _check(fn, [x, index, src, counts], tmp_path)


def test_empty_permuted_is_written_whole(tmp_path):
    """`torch.empty_permuted` (a cosine loss's backward makes one) filled by a copy: its values
    are what was written."""
    x = torch.randn(3, 4)

    def fn(x):
        out = torch.empty_permuted((3, 4), (1, 0))
        out.copy_(x * 3)
        return out + 1

    _check(fn, [x], tmp_path, functional=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
def test_comparisons_with_infinities(dtype, tmp_path):
    """`x op ±inf` for every comparison, either side (eqfuse's literals are finite), NaN and
    the infinities included, and the arithmetic of booleans (`isfinite`'s `a * b`); and a mask
    filled with `-inf` compares equal to `-inf` (its fill is exported as f32's lowest value)."""
    if dtype == torch.int32:
        x = torch.tensor([[-3, 0, 2, 2**30]], dtype=dtype)
    else:
        # Large finite values (f32's largest itself counts as infinite: `_against_infinity`).
        big = torch.finfo(dtype).max if dtype == torch.float16 else 1e38
        x = torch.tensor([[-2.0, 0.0, big, -big, float("nan"), float("inf"), -float("inf")]]).to(dtype)
    inf = float("inf")

    def fn(x):
        out = []
        for c in (inf, -inf):
            out += [x == c, x != c, x < c, x <= c, x > c, x >= c, c < x, c >= x]
        finite = x == x
        out += [finite * (x.abs() != inf), finite + (x > 0)]
        if x.is_floating_point():
            filled = x.float().masked_fill(x > 1, -inf)
            out += [filled == -inf, torch.isinf(filled), torch.isfinite(filled)]
        return tuple(out)

    _check(fn, [x], tmp_path)


OPTIMIZERS = {
    "sgd, momentum": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=1e-3),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=False),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_optimizer_step_runs_on_eqfuse_plans(name, monkeypatch):
    torch.manual_seed(0)

    def model():
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))

    eager_model, model_ = model(), model()
    model_.load_state_dict(eager_model.state_dict())
    eager_opt, opt = OPTIMIZERS[name](eager_model.parameters()), OPTIMIZERS[name](model_.parameters())
    backend = stand_in(monkeypatch)
    step = torch.compile(opt.step, backend=backend)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            for m, o, run in ((eager_model, eager_opt, eager_opt.step), (model_, opt, step)):
                o.zero_grad()
                m(x).pow(2).mean().backward()
                run()
    for a, b in zip(model_.parameters(), eager_model.parameters()):
        assert relative(a, b) <= 1e-5
    assert_all_on_eqfuse(backend)


def test_activations_and_extremes(tmp_path):
    """`leaky_relu`, `elu`/`selu`/`celu` and their backward, `max`/`min` along an axis (values and
    first indices, NaN rows included), of all elements and of two tensors, `log2`, `log10`,
    `exp2`, against PyTorch."""
    x = torch.randn(4, 7, generator=torch.Generator().manual_seed(2))
    x[1, 3] = float("nan")
    x[2, 5] = x[2, 1] = 9.0  # a tie: the first index

    def fn(x):
        mx, imx = x.max(-1)
        mn, imn = torch.min(x, 0, keepdim=True)
        return (F.leaky_relu(x, 0.2), F.elu(x), F.selu(x), F.celu(x, 0.5), mx, imx, mn, imn, x.max(), torch.min(x),
                torch.max(x, x.flip(0)), torch.log2(x.abs() + 1), torch.log10(x.abs() + 1), torch.exp2(x))

    _check(fn, [x], tmp_path)


@pytest.mark.parametrize("act", ["leaky_relu", "elu", "selu", "celu"])
def test_activation_gradients(act, tmp_path):
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(3))
    f = {"leaky_relu": lambda t: F.leaky_relu(t, 0.1), "elu": F.elu, "selu": F.selu,
         "celu": lambda t: F.celu(t, 0.7)}[act]

    def grad(x):
        return torch.func.grad(lambda t: (f(t) * torch.linspace(-1, 1, 6)).sum())(x)

    _check(grad, [x], tmp_path)


def test_rounding_and_remainders(tmp_path):
    """`floor`, `ceil`, `round` (halves to even, and to decimals), `trunc`, `frac`, divisions
    rounded (`//`, `rounding_mode`), `remainder` and `fmod`, of floats and of integers, by
    positive and negative divisors, against PyTorch."""
    x = torch.tensor([[2.5, -2.5, 1.5, -0.5, 0.7, -1.7, 3.0, 7.25]])
    n = torch.tensor([[7, -7, 6, -6, 0, 1, -1, 13]], dtype=torch.int32)

    def fn(x, n):
        return (torch.floor(x), torch.ceil(x), torch.round(x), torch.round(x, decimals=1), torch.trunc(x),
                torch.frac(x), x // 0.75, torch.div(x, -0.75, rounding_mode="trunc"), torch.remainder(x, 0.75),
                torch.remainder(x, -0.75), torch.fmod(x, 0.75), n // 4, n // -4, torch.div(n, 4, rounding_mode="trunc"),
                n % 4, n % -4, torch.fmod(n, 4), torch.floor(n), torch.remainder(x, x.flip(-1)))

    _check(fn, [x, n], tmp_path)
