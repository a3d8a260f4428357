"""Random PyTorch programs, written the way people write them, through the exporter and the
backend: nobody chose these, so they find what hand-written tests do not.

`random_program(seed)` draws a small function of one to three tensors: elementwise functions,
arithmetic between broadcast operands, comparisons and `where`, reductions over positive and
negative axes (kept or not), softmax and norms, views (transpose, permute, reshape, slices with
steps, flips, `unsqueeze`), concatenation, products, casts, `cumsum`, rounding, divisions and
remainders. Each program is

- exported (functionalized and traced to core ATen by `make_fx`, as the backend's graphs are;
  `export_graph_module`) and run on eqfuse's CPU reference: every output
  as PyTorch computes it (f32 within 1e-4 relative to the output's scale, integers and booleans
  exactly);
- for some seeds, compiled with the backend (plans on the CPU reference) with gradients: the
  outputs and the inputs' gradients as eager's, every graph on eqfuse's plans.

A seed that fails prints its program. `EQFUSE_RANDOM_TORCH=N` runs N seeds instead of the
default few dozen (the CI's budget).
"""

import os
import random
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eqfuse_torch.export import decompositions, export_graph_module  # noqa: E402
from test_export import run_cpu  # noqa: E402
from test_models import assert_all_on_eqfuse, stand_in  # noqa: E402

SEEDS = int(os.environ.get("EQFUSE_RANDOM_TORCH", "48"))


class Program:
    """A drawn program: its source lines (for failure reports), its inputs and its function."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.lines: list[str] = []
        self.steps: list = []  # (name, fn of env -> value)
        self.shapes: dict[str, tuple] = {}
        self.dtypes: dict[str, torch.dtype] = {}
        self.inputs: list[tuple[str, tuple, torch.dtype]] = []
        self.outputs: list[str] = []

    def __str__(self):
        args = ", ".join(f"{n}: {str(d).removeprefix('torch.')}{list(s)}" for n, s, d in self.inputs)
        return f"def f({args}):\n    " + "\n    ".join(self.lines) + f"\n    return {', '.join(self.outputs)}"

    # --- drawing

    def fresh(self, prefix="t"):
        return f"{prefix}{len(self.shapes)}"

    def add_input(self, shape, dtype=torch.float32):
        name = f"x{len(self.inputs)}"
        self.inputs.append((name, tuple(shape), dtype))
        self.shapes[name], self.dtypes[name] = tuple(shape), dtype
        return name

    def emit(self, text, fn, shape, dtype):
        name = self.fresh()
        self.lines.append(f"{name} = {text}")
        self.steps.append((name, fn))
        self.shapes[name], self.dtypes[name] = tuple(shape), dtype
        return name

    def floats(self):
        return [n for n in self.shapes if self.dtypes[n] == torch.float32]

    def pick(self, names):
        # Later values more often: programs that chain.
        return names[min(len(names) - 1, int(len(names) * self.rng.random() ** 0.5))]


def _like_shape(rng, shape):
    """A shape that broadcasts with `shape`: some axes 1, maybe fewer leading axes."""
    out = [d if rng.random() < 0.6 else 1 for d in shape]
    drop = rng.randrange(len(shape) + 1) if rng.random() < 0.3 else 0
    return tuple(out[drop:])


UNARY = {
    "torch.exp({0}.clamp(-5, 5))": lambda x: torch.exp(x.clamp(-5, 5)),
    "torch.log({0}.abs() + 1)": lambda x: torch.log(x.abs() + 1),
    "torch.sqrt({0}.abs())": lambda x: torch.sqrt(x.abs()),
    "torch.tanh({0})": torch.tanh,
    "torch.sigmoid({0})": torch.sigmoid,
    "torch.relu({0})": torch.relu,
    "F.gelu({0})": lambda x: torch.nn.functional.gelu(x),
    "F.gelu({0}, approximate='tanh')": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "F.silu({0})": lambda x: torch.nn.functional.silu(x),
    "torch.sin({0})": torch.sin,
    "{0}.abs()": torch.abs,
    "-{0}": torch.neg,
    "{0} * {0}": lambda x: x * x,
    "torch.rsqrt({0}.abs() + 1)": lambda x: torch.rsqrt(x.abs() + 1),
    "1 / ({0}.abs() + 1)": lambda x: 1 / (x.abs() + 1),
    "torch.erf({0})": torch.erf,
    "F.leaky_relu({0}, 0.2)": lambda x: torch.nn.functional.leaky_relu(x, 0.2),
    "F.elu({0})": lambda x: torch.nn.functional.elu(x),
    "F.softplus({0})": lambda x: torch.nn.functional.softplus(x),
    "torch.floor({0} * 3)": lambda x: torch.floor(x * 3),
    "torch.round({0} * 3)": lambda x: torch.round(x * 3),
    "torch.sign({0})": torch.sign,
    "{0}.clamp(min=-0.5, max=0.7)": lambda x: x.clamp(min=-0.5, max=0.7),
    "torch.remainder({0}, 0.7)": lambda x: torch.remainder(x, 0.7),
    "F.hardtanh({0})": lambda x: torch.nn.functional.hardtanh(x),
}

BINARY = {
    "{0} + {1}": lambda a, b: a + b,
    "{0} - {1}": lambda a, b: a - b,
    "{0} * {1}": lambda a, b: a * b,
    "{0} / ({1}.abs() + 0.5)": lambda a, b: a / (b.abs() + 0.5),
    "torch.maximum({0}, {1})": torch.maximum,
    "torch.minimum({0}, {1})": torch.minimum,
    "torch.where({0} > {1}, {0}, {1} * 0.5)": lambda a, b: torch.where(a > b, a, b * 0.5),
    "({0}.abs() + 0.5) ** 1.5 + {1}": lambda a, b: (a.abs() + 0.5) ** 1.5 + b,
    "{0}.masked_fill({1} < 0, -1.0)": lambda a, b: a.masked_fill(b < 0, -1.0),
    "torch.atan2({0}, {1}) if False else {0} * 2 - {1}": lambda a, b: a * 2 - b,
}

REDUCE = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k),
    "mean": lambda x, d, k: x.mean(d, keepdim=k),
    "amax": lambda x, d, k: x.amax(d, keepdim=k),
    "amin": lambda x, d, k: x.amin(d, keepdim=k),
    "var": lambda x, d, k: x.var(d, keepdim=k),
    "std": lambda x, d, k: x.std(d, keepdim=k, unbiased=False),
    "logsumexp": lambda x, d, k: torch.logsumexp(x, d, keepdim=k),
    "max": lambda x, d, k: x.max(d, keepdim=k).values,
    "norm": lambda x, d, k: torch.linalg.vector_norm(x, dim=d, keepdim=k),
}


def random_program(seed: int) -> Program:
    p = Program(seed)
    rng = p.rng
    rank = rng.randint(1, 4)
    shape = tuple(rng.randint(1, 6) for _ in range(rank))
    p.add_input(shape)
    if rng.random() < 0.6:
        p.add_input(_like_shape(rng, shape))
    for _ in range(rng.randint(3, 9)):
        floats = p.floats()
        x = p.pick(floats)
        sx = p.shapes[x]
        kind = rng.choice(["unary", "unary", "binary", "binary", "reduce", "softmax", "view", "view", "cat",
                           "matmul", "cast", "cumsum", "norm", "compare"])
        if kind == "unary":
            text = rng.choice(list(UNARY))
            f = UNARY[text]
            p.emit(text.format(x), lambda env, x=x, f=f: f(env[x]), sx, torch.float32)
        elif kind == "binary":
            others = [n for n in floats if _broadcast(p.shapes[n], sx) is not None and n != x]
            if others and rng.random() < 0.7:
                y = p.pick(others)
            else:
                y = p.add_input(_like_shape(rng, sx))
            if rng.random() < 0.5:
                x, y = y, x
            text = rng.choice(list(BINARY))
            f = BINARY[text]
            out = _broadcast(p.shapes[x], p.shapes[y])
            p.emit(text.format(x, y), lambda env, x=x, y=y, f=f: f(env[x], env[y]), out, torch.float32)
        elif kind == "reduce" and sx:
            name = rng.choice(list(REDUCE))
            d = rng.randrange(len(sx))
            d = d - len(sx) if rng.random() < 0.5 else d
            k = rng.random() < 0.4
            if name == "var" and sx[d] < 2:
                continue
            out = tuple(1 if i == d % len(sx) else n for i, n in enumerate(sx)) if k else sx[:d % len(sx)] + sx[
                d % len(sx) + 1:]
            p.emit(f"{x}.{name}({d}, keepdim={k})", lambda env, x=x, d=d, k=k, f=REDUCE[name]: f(env[x], d, k), out,
                   torch.float32)
        elif kind == "softmax" and sx:
            d = rng.randrange(len(sx)) - (len(sx) if rng.random() < 0.6 else 0)
            log = rng.random() < 0.4
            fn = torch.log_softmax if log else torch.softmax
            p.emit(f"torch.{'log_' if log else ''}softmax({x}, {d})", lambda env, x=x, d=d, fn=fn: fn(env[x], d), sx,
                   torch.float32)
        elif kind == "norm" and sx and sx[-1] >= 4:
            # (A norm over one or two elements is ill-conditioned: its gradient is a difference of
            # nearly equal terms, rounding noise in eager as in eqfuse. Models normalize wide rows.)
            w = rng.random() < 0.5
            if w:
                p.emit(f"F.layer_norm({x}, ({sx[-1]},), torch.linspace(0.5, 1.5, {sx[-1]}), None)",
                       lambda env, x=x, n=sx[-1]: torch.nn.functional.layer_norm(env[x], (n,), torch.linspace(
                           0.5, 1.5, n), None), sx, torch.float32)
            else:
                p.emit(f"F.rms_norm({x}, ({sx[-1]},), eps=1e-6)",
                       lambda env, x=x, n=sx[-1]: torch.nn.functional.rms_norm(env[x], (n,), eps=1e-6), sx,
                       torch.float32)
        elif kind == "view" and sx:
            _view(p, x, sx)
        elif kind == "cat" and sx:
            d = rng.randrange(len(sx)) - (len(sx) if rng.random() < 0.5 else 0)
            out = list(sx)
            out[d % len(sx)] *= 2
            p.emit(f"torch.cat([{x}, {x} * 2], {d})", lambda env, x=x, d=d: torch.cat([env[x], env[x] * 2], d),
                   tuple(out), torch.float32)
        elif kind == "matmul" and sx:
            n = rng.randint(1, 5)
            w = p.add_input((sx[-1], n))
            p.emit(f"{x} @ {w}", lambda env, x=x, w=w: env[x] @ env[w], sx[:-1] + (n,), torch.float32)
        elif kind == "cast":
            if rng.random() < 0.5:
                p.emit(f"{x}.half().float()", lambda env, x=x: env[x].half().float(), sx, torch.float32)
            else:
                t = p.emit(f"({x} * 4).to(torch.int32)", lambda env, x=x: (env[x] * 4).to(torch.int32), sx,
                           torch.int32)
                p.emit(f"({t} // 3 + {t} % 3).float()", lambda env, t=t: (env[t] // 3 + env[t] % 3).float(), sx,
                       torch.float32)
        elif kind == "cumsum" and sx:
            d = rng.randrange(len(sx)) - (len(sx) if rng.random() < 0.5 else 0)
            p.emit(f"torch.cumsum({x}, {d})", lambda env, x=x, d=d: torch.cumsum(env[x], d), sx, torch.float32)
        elif kind == "compare":
            p.emit(f"({x} > 0.1).float() * {x}.sum()", lambda env, x=x: (env[x] > 0.1).float() * env[x].sum(), sx,
                   torch.float32)
    computed = [n for n in p.shapes if not n.startswith("x")]
    if not computed:
        computed = [p.emit(f"{p.inputs[0][0]} * 2", lambda env, x=p.inputs[0][0]: env[x] * 2, p.inputs[0][1],
                           torch.float32)]
    p.outputs = sorted(set([computed[-1]] + rng.sample(computed, min(len(computed), rng.randint(0, 2)))),
                       key=computed.index)
    return p


def _broadcast(a, b):
    try:
        return tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        return None


def _view(p, x, sx):
    rng = p.rng
    r = len(sx)
    choice = rng.choice(["transpose", "permute", "reshape", "slice", "flip", "unsqueeze", "expand"])
    if choice == "transpose" and r >= 2:
        a, b = rng.sample(range(r), 2)
        a = a - r if rng.random() < 0.5 else a
        out = list(sx)
        out[a % r], out[b] = out[b], out[a % r]
        p.emit(f"{x}.transpose({a}, {b})", lambda env, x=x, a=a, b=b: env[x].transpose(a, b), out, torch.float32)
    elif choice == "permute" and r >= 2:
        perm = list(range(r))
        rng.shuffle(perm)
        p.emit(f"{x}.permute({perm})", lambda env, x=x, perm=perm: env[x].permute(perm),
               tuple(sx[i] for i in perm), torch.float32)
    elif choice == "reshape" and r >= 2:
        a = rng.randrange(r - 1)
        out = sx[:a] + (sx[a] * sx[a + 1],) + sx[a + 2:]
        p.emit(f"{x}.reshape({list(out)})", lambda env, x=x, out=out: env[x].reshape(out), out, torch.float32)
    elif choice == "slice" and sx[-1] >= 2:
        start, step = rng.randrange(sx[-1] - 1), rng.choice([1, 1, 2])
        n = len(range(start, sx[-1], step))
        p.emit(f"{x}[..., {start}::{step}]", lambda env, x=x, s=start, st=step: env[x][..., s::st],
               sx[:-1] + (n,), torch.float32)
    elif choice == "flip":
        d = rng.randrange(r)
        p.emit(f"{x}.flip({d})", lambda env, x=x, d=d: env[x].flip(d), sx, torch.float32)
    elif choice == "unsqueeze":
        d = rng.randrange(r + 1)
        p.emit(f"{x}.unsqueeze({d}) * 1.5", lambda env, x=x, d=d: env[x].unsqueeze(d) * 1.5,
               sx[:d] + (1,) + sx[d:], torch.float32)
    elif choice == "expand":
        out = (rng.randint(2, 3),) + sx
        p.emit(f"{x}.expand({list(out)}) + 0.5", lambda env, x=x, out=out: env[x].expand(out) + 0.5, out,
               torch.float32)


def build(p: Program):
    names = [n for n, _, _ in p.inputs]

    def f(*args):
        env = dict(zip(names, args))
        for name, fn in p.steps:
            env[name] = fn(env)
        return tuple(env[o] for o in p.outputs)

    return f


def inputs(p: Program, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=d) for _, s, d in p.inputs]


def _agrees(got, want, what):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if want.is_floating_point():
        scale = want[torch.isfinite(want)].abs().max().item() if torch.isfinite(want).any() else 0.0
        got = got.to(want.dtype)
        ok = ((got - want).abs() <= 1e-4 * (want.abs() + scale) + 1e-6) | (got.isnan() & want.isnan()) | (got == want)
        assert bool(ok.all()), (what, got, want)
    else:
        assert torch.equal(got.to(want.dtype), want), (what, got, want)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_program_exports_as_pytorch_computes(seed, tmp_path):
    p = random_program(seed)
    f = build(p)
    xs = inputs(p, seed)
    try:
        # As the backend and `export_program` hand graphs over: functional, core ATen.
        make_fx = torch.fx.experimental.proxy_tensor.make_fx
        gm = make_fx(torch.func.functionalize(make_fx(f, decomposition_table=decompositions())(*xs)))(*xs)
        exported = export_graph_module(gm)
        got = run_cpu(exported, xs, tmp_path)
        for i, (g, w) in enumerate(zip(got, f(*xs))):
            _agrees(g, w, f"output {i}")
    except BaseException:
        print(p)
        raise


@pytest.mark.parametrize("seed", range(0, SEEDS, 3))
def test_random_program_trains_through_the_backend(seed, monkeypatch):
    p = random_program(seed)
    f = build(p)
    xs = [x.requires_grad_(True) for x in inputs(p, seed)]

    def loss(outs):
        # Weights of one sign: no gradient is a sum that cancels to zero in exact arithmetic
        # (rounding noise, which the first-call check may hold against eager's noise).
        return sum((o * torch.linspace(0.5, 1.5, o.numel()).reshape(o.shape)).sum() for o in outs if o.requires_grad)

    def gradients(outs):
        # (Outputs through an integer cast only carry no gradient.)
        if not any(o.requires_grad for o in outs):
            return [None] * len(xs)
        return torch.autograd.grad(loss(outs), xs, allow_unused=True)

    try:
        backend = stand_in(monkeypatch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = torch.compile(f, backend=backend, dynamic=False)(*xs)
            grads = gradients(got)
        want = f(*xs)
        want_grads = gradients(want)
        for i, (g, w) in enumerate(zip(got, want)):
            _agrees(g.detach(), w.detach(), f"output {i}")
        largest = max((w.abs().max().item() for w in want_grads if w is not None), default=0.0)
        for i, (g, w) in enumerate(zip(grads, want_grads)):
            if w is None:
                continue
            g = torch.zeros_like(w) if g is None else g
            # Gradients that are zero in exact arithmetic (a norm over one element) are rounding
            # noise on both sides; NaN where eager has NaN (sqrt's gradient at 0).
            ok = (g - w).abs() <= 1e-4 * (w.abs() + w.abs().max()) + 1e-5 * largest + 1e-6
            ok |= g.isnan() & w.isnan()
            assert bool(ok.all()), (f"gradient of {p.inputs[i][0]}", g, w)
        assert_all_on_eqfuse(backend)
    except BaseException:
        print(p)
        raise
