"""eqfuse's counter-based dropout in PyTorch, bit for bit (`src/reference/rng.rs`), and the
reference the backend checks and falls back to for graphs with dropout.

Dropout in a training graph cannot be checked against eager: PyTorch draws other random numbers.
The backend gives every dropout site of a graph its own seed, fresh on every call (`Seeds`), and
checks eqfuse's kernels against the ATen graph run with PyTorch's dropout replaced by eqfuse's
(`SeededInterpreter`): `native_dropout` and the fused SDPA ops with `dropout_p > 0`, forward and
backward. The same interpreter runs such a graph when eqfuse's kernels cannot, so the forward and
the backward of one training step always agree on which elements were dropped.

A fused SDPA forward with dropout returns its seed in its random-number state (element 0 of
`philox_seed` / `rng_state`, the rest zero), and its backward reads it from there.
"""

from __future__ import annotations

import math

import torch

MASK32 = 0xFFFF_FFFF


def _mix32_int(x: int) -> int:
    x &= MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    x ^= x >> 16
    return x


def stream_key(seed: int, hi: int = 0) -> int:
    """`key(seed, hi)` of rng.rs."""
    return _mix32_int(_mix32_int((seed & MASK32) ^ 0x9E3779B9) ^ hi)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """mix32 on an int64 tensor of values in [0, 2^32) (products wrap; the low 32 bits are kept)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def threshold(p: float) -> int:
    """`floor(p * 2^32)`, at most 2^32 - 1."""
    t = math.floor(min(max(p, 0.0), 1.0) * 4294967296.0)
    return min(t, MASK32)


def scale(p: float) -> float:
    """`1 / (1 - p)` rounded to f32."""
    return float(torch.tensor(1.0 / (1.0 - p), dtype=torch.float32))


def bits(seed: int, index: torch.Tensor) -> torch.Tensor:
    """`bits(seed, index)` of rng.rs for an int64 tensor of element indices (as int64 values in
    [0, 2^32))."""
    lo, hi = index & MASK32, index >> 32
    if index.numel() == 0 or int(hi.max()) == 0:
        return _mix32(lo ^ stream_key(seed, 0))
    keys = torch.tensor([stream_key(seed, h) for h in range(int(hi.max()) + 1)], dtype=torch.int64,
                        device=index.device)
    return _mix32(lo ^ keys[hi])


def keep(shape, p: float, seed: int, device=None) -> torch.Tensor:
    """The bool mask of the elements `dropout(x, p, seed)` keeps, for `x` of `shape` (row-major
    flat index, as every eqfuse kernel numbers elements)."""
    index = torch.arange(math.prod(shape), dtype=torch.int64, device=device)
    return (bits(seed, index) >= threshold(p)).reshape(tuple(shape))


def dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """eqfuse's `dropout(x, p, seed)`: kept elements times `scale(p)` in one f32 multiply, then
    rounded to `x`'s dtype; dropped elements 0."""
    k = keep(x.shape, p, seed, x.device)
    y = (x.float() * torch.tensor(scale(p), dtype=torch.float32, device=x.device)).to(x.dtype)
    return torch.where(k, y, torch.zeros((), dtype=x.dtype, device=x.device))


class Seeds:
    """Fresh seeds for the dropout sites of one graph, drawn from PyTorch's generator of the
    device (so `torch.manual_seed` makes a run repeatable), in `[0, 2^31)`."""

    @staticmethod
    def draw(n: int, device) -> torch.Tensor:
        return torch.randint(0, 2**31 - 1, (n,), dtype=torch.int32, device=device)


def rng_state(seed, dtype: torch.dtype, shape, device) -> torch.Tensor:
    """A fused SDPA op's random-number state carrying `seed` (an int or a one-element tensor):
    element 0, the rest zero, in PyTorch's dtype and shape for that output."""
    wide = torch.int64 if dtype in (torch.uint64, torch.int64) else dtype
    t = torch.zeros(tuple(shape), dtype=wide, device=device)
    if t.numel():
        if isinstance(seed, torch.Tensor):
            t.view(-1)[:1].copy_(seed.reshape(1))
        else:
            t.view(-1)[0] = int(seed)
    return t.view(dtype) if wide != dtype else t


def seed_of(state: torch.Tensor) -> int:
    """The seed a fused SDPA backward reads from its random-number state argument."""
    return int(state.reshape(-1)[0].to(torch.int64).item()) & MASK32


SDPA_FORWARD = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                "scaled_dot_product_attention")
SDPA_BACKWARD = tuple(name + "_backward" for name in SDPA_FORWARD[:4])
RNG_STATE = ("philox_seed", "philox_offset", "rng_state", "unused")
"""The names fused SDPA ops give the random-number state (their outputs, their backward's arguments)."""


def named_args(node_or_target, args, kwargs) -> dict:
    """An ATen op's arguments by schema name, defaults filled."""
    target = getattr(node_or_target, "target", node_or_target)
    schema = target._schema
    out = {}
    for j, a in enumerate(schema.arguments):
        if j < len(args) and not a.kwarg_only:
            out[a.name] = args[j]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


def dropout_p_of(target, args, kwargs) -> float:
    """The dropout probability of an SDPA op or `native_dropout` call (0 when there is none)."""
    name = _packet(target)
    if name in ("native_dropout", "dropout"):
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        train = args[2] if len(args) > 2 else kwargs.get("train", True)
        return float(p) if train else 0.0
    if name in SDPA_FORWARD or name in SDPA_BACKWARD:
        try:
            p = named_args(target, args, kwargs).get("dropout_p")
        except Exception:  # noqa: BLE001 - an unexpected schema: no dropout known
            return 0.0
        return float(p or 0.0)
    return 0.0


def _packet(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__
    return getattr(target, "__name__", str(target))


def is_random(target, args, kwargs) -> bool:
    """Whether a call draws eqfuse's dropout (a site with a seed) or reads one (an SDPA backward)."""
    return dropout_p_of(target, args, kwargs) > 0.0


def attention(q, k, v, mask, p: float, is_causal: bool, sc: float | None, seed: int):
    """Attention with eqfuse's dropout on the probabilities, in f32: (result in q's dtype,
    log-sum-exp `[..., Sq]` in f32). Grouped-query k and v (fewer heads) are repeated."""
    heads = q.shape[-3] if q.dim() >= 3 else 1
    if q.dim() >= 3 and k.shape[-3] != heads:
        k = k.repeat_interleave(heads // k.shape[-3], dim=-3)
        v = v.repeat_interleave(heads // v.shape[-3], dim=-3)
    s = sc if sc is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = (q.float() @ k.float().transpose(-1, -2)) * s
    big = torch.tensor(-3.0e38, dtype=torch.float32, device=q.device)
    sq, sk = q.shape[-2], k.shape[-2]
    if is_causal:
        rows = torch.arange(sq, device=q.device).reshape(sq, 1)
        cols = torch.arange(sk, device=q.device).reshape(1, sk)
        scores = torch.where(cols <= rows, scores, big)
    if mask is not None:
        scores = torch.where(mask, scores, big) if mask.dtype == torch.bool else scores + mask.float()
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    if p > 0:
        probs = dropout(probs, p, seed)
    return (probs @ v.float()).to(q.dtype), lse


def attention_grads(g, q, k, v, mask, p: float, is_causal: bool, sc: float | None, seed: int):
    """(dq, dk, dv) of `attention` (same dropout), by PyTorch's autograd in f32."""
    with torch.enable_grad():
        q32, k32, v32 = (x.detach().float().requires_grad_(True) for x in (q, k, v))
        out, _ = attention(q32, k32, v32, mask, p, is_causal, sc, seed)
        dq, dk, dv = torch.autograd.grad(out, (q32, k32, v32), g.float())
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class SeededInterpreter(torch.fx.Interpreter):
    """Runs an ATen graph as eqfuse computes it where randomness is concerned: each dropout
    site (a `native_dropout` or a fused SDPA forward with dropout, by node name) draws eqfuse's
    dropout with its seed from `seeds`; a fused SDPA backward with dropout recomputes the
    forward's dropout from the seed in its random-number state. Everything else runs as PyTorch
    runs it. `upcast` runs every 16-bit float in f32 (the exact reference of the first-call check)."""

    def __init__(self, gm, seeds: dict[str, int], upcast: bool = False):
        super().__init__(gm)
        self.seeds = seeds
        self.upcast = upcast

    def run_node(self, n):
        self._node = n
        return super().run_node(n)

    def call_function(self, target, args, kwargs):
        if self.upcast:
            from torch.utils._pytree import tree_map

            args, kwargs = tree_map(_up, args), tree_map(_up, kwargs)
        if not is_random(target, args, kwargs):
            return super().call_function(target, args, kwargs)
        node = self._node
        name = _packet(target)
        p = dropout_p_of(target, args, kwargs)
        if name in ("native_dropout", "dropout"):
            x = args[0]
            if p >= 1.0:
                y, kept = torch.zeros_like(x), torch.zeros(x.shape, dtype=torch.bool, device=x.device)
            else:
                seed = self.seeds[node.name]
                y, kept = dropout(x, p, seed), keep(x.shape, p, seed, x.device)
            return (y, kept) if name == "native_dropout" else y
        a = named_args(target, args, kwargs)
        mask = a.get("attn_mask", a.get("attn_bias"))
        q, k, v = a["query"], a["key"], a["value"]
        if name in SDPA_FORWARD:
            seed = self.seeds[node.name]
            out, lse = attention(q, k, v, mask, p, bool(a.get("is_causal")), a.get("scale"), seed)
            vals = node.meta.get("val")
            out = _as_traced(out, vals[0] if isinstance(vals, (tuple, list)) else vals)
            if name == "scaled_dot_product_attention":
                return out
            return self._forward_outputs(node, out, lse, seed)
        state = a.get("philox_seed", a.get("rng_state"))
        g = a.get("grad_out", a.get("grad_out_"))
        grads = attention_grads(g, q, k, v, mask, p, bool(a.get("is_causal")), a.get("scale"), seed_of(state))
        want = node.meta.get("val")
        if isinstance(want, (tuple, list)):
            grads = tuple(_as_traced(t, w) for t, w in zip(grads, want))
        if isinstance(want, (tuple, list)) and len(want) > 3:
            return grads + (None,) * (len(want) - 3)
        return grads

    def _forward_outputs(self, node, out, lse, seed):
        vals = node.meta.get("val")
        returns = node.target._schema.returns
        result = [out]
        for i in range(1, len(vals)):
            val, rname = vals[i], returns[i].name
            if i == 1 and isinstance(val, torch.Tensor):
                if val.numel() == lse.numel():
                    result.append(lse.reshape(tuple(val.shape)))
                else:  # the efficient kernel's rows padded to a multiple of 32 (+inf there)
                    padded = torch.full(tuple(val.shape), math.inf, dtype=torch.float32, device=out.device)
                    padded[..., : lse.shape[-1]] = lse
                    result.append(padded)
            elif isinstance(val, torch.Tensor) and rname in RNG_STATE:
                result.append(rng_state(seed, val.dtype, tuple(val.shape), out.device))
            elif isinstance(val, torch.Tensor):
                result.append(torch.empty(tuple(val.shape), dtype=val.dtype, device=out.device))
            else:
                result.append(val)
        return tuple(result)


def _as_traced(t: torch.Tensor, val) -> torch.Tensor:
    """`t` with the strides PyTorch's kernel gave the traced value `val` (the graph's later
    views, such as heads merged back by `view`, were traced on that layout)."""
    if not isinstance(val, torch.Tensor) or tuple(val.shape) != tuple(t.shape):
        return t
    try:
        stride = tuple(val.stride())
    except Exception:  # noqa: BLE001 - a layout without strides
        return t
    return relayout(t, stride)


def relayout(t: torch.Tensor, stride: tuple) -> torch.Tensor:
    """`t` with `stride` on every axis longer than 1 (a copy unless it has them already); axes
    of stride 0 (an expanded value) are taken once and expanded back."""
    if all(n <= 1 or a == b for n, a, b in zip(t.shape, t.stride(), stride)):
        return t
    base = t
    for d, (n, st) in enumerate(zip(t.shape, stride)):
        if n > 1 and st == 0:
            base = base.narrow(d, 0, 1)
    laid = torch.empty_strided(tuple(base.shape), stride, dtype=t.dtype, device=t.device)
    laid.copy_(base)
    return laid.expand(tuple(t.shape))


def _up(x):
    if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    if isinstance(x, torch.dtype) and x in (torch.float16, torch.bfloat16):
        return torch.float32
    return x


def dropout_sites(gm) -> dict[str, int]:
    """The dropout sites of an ATen graph (nodes that draw a mask; `native_dropout` with `p`
    of 1 draws none), numbered in graph order, as the export numbers them."""
    sites = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        name = _packet(n.target)
        p = dropout_p_of(n.target, n.args, n.kwargs)
        if p > 0 and (name in SDPA_FORWARD or (name in ("native_dropout", "dropout") and p < 1)):
            sites[n.name] = len(sites)
    return sites


def has_dropout(gm) -> bool:
    """Whether an ATen graph draws or reads dropout (see `is_random`)."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            if is_random(n.target, n.args, n.kwargs):
                return True
    return False
