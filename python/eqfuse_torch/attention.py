"""Attention written out, rewritten into `scaled_dot_product_attention` before AOTAutograd.

A model with eager attention (`transformers`' `attn_implementation="eager"`) computes
`softmax(q @ k^T * scale + mask) @ v` op by op. Traced by AOTAutograd for training, the joint
graph is partitioned with the `[B, H, L, S]` probabilities saved for the backward, which
differentiates them with `_softmax_backward_data`: eqfuse then sees two halves of attention it
cannot join, and plans the score matrix written to memory and read back. The same attention as
one `F.scaled_dot_product_attention` call is traced as SDPA's forward and backward ops, which the
exporter lowers to eqfuse's flash attention and its flash backward (only q, k, v, the output and
the row statistics are saved).

`rewrite_attention(gm)` rewrites, on the graph TorchDynamo captured (before AOTAutograd), every
chain

    matmul(q, kT)  [* c | / c | c *]...  [+ mask | where(cond, ., fill) | masked_fill]...
        softmax(dim=-1 [, dtype])  [cast]...  [dropout(p, training)]  [cast]...  matmul(., v)

into `F.scaled_dot_product_attention(q, k, v, attn_mask=..., dropout_p=..., scale=...)`, where
`k` is `kT` with its last two axes swapped back, and only where the two are equal up to rounding.
A product is `matmul`, `@`, `bmm`, or a two-operand `einsum` that is a batched product
(`"bhqd,bhkd->bhqk"` gives k itself, `"bhqd,bhdk->bhqk"` kT; `"bhqk,bhkd->bhqd"` the output).

- q, k and v are 4-d, or 3-d with heads flattened into the batch (`[B*H, L, E]`, as `bmm`
  attention writes them: SDPA of one batch of `B*H` heads), of one floating dtype and device,
  their leading axes equal (a repeated key for grouped-query heads is an ordinary operand);
  the output has their dtype;
- the softmax is along the last axis; casts between it and the product are float to float and
  keep the shape (a softmax upcast to f32 and its result cast back, as `transformers` writes it);
- each scale is a positive finite constant (a number, or a constant `torch.full([], c)` /
  `torch.tensor(c)`), and the scales multiply into SDPA's `scale` (none: `scale=1`);
- an additive mask is a tensor of the scores' dtype, not requiring a gradient (a learned
  bias is differentiated by the written form), that broadcasts to the scores without enlarging
  them; a `where` or `masked_fill` mask fills with -inf or a value at most -1e30 (an f32/bf16
  `finfo.min`), so it becomes the additive mask `where(cond, 0, fill)`: `x + fill` rounds to
  `fill`, so fully masked rows stay as eager computes them; several masks are summed;
- every node from the scores' product to the probabilities' product has no other user (a model
  that returns its attention probabilities keeps them written out);
- dropout, if training with `0 < p < 1`, becomes SDPA's `dropout_p`. The backend runs every
  dropout site as eqfuse's counter-based dropout (`rng.py`), whose attention dropout drops the
  same elements of the probabilities as `dropout(softmax(...))` written out with that seed.
"""

from __future__ import annotations

import math
import operator
from typing import Optional

import torch

F = torch.nn.functional

_MATMUL = ({torch.matmul, operator.matmul, torch.bmm}, {"matmul", "bmm"})
_EINSUM = ({torch.einsum}, set())
_SOFTMAX = ({F.softmax, torch.softmax, torch.special.softmax}, {"softmax"})
_DROPOUT = ({F.dropout, torch.dropout}, set())
_MUL = ({operator.mul, torch.mul}, {"mul"})
_DIV = ({operator.truediv, torch.div, torch.true_divide}, {"div", "true_divide"})
_ADD = ({operator.add, torch.add}, {"add"})
_WHERE = ({torch.where}, {"where"})
_MASKED_FILL = ({torch.masked_fill}, {"masked_fill"})
_CASTS = {"to", "type", "float", "half", "bfloat16", "double", "contiguous", "type_as"}
_TRANSPOSE = ({torch.transpose}, {"transpose"})
_PERMUTE = ({torch.permute}, {"permute"})
_CONSTANT_TENSORS = {torch.full, torch.tensor, torch.scalar_tensor, torch.as_tensor}

VERY_NEGATIVE = -1e30
"""A `where`/`masked_fill` fill at most this (or -inf) masks as an additive mask would."""


def _is(n, kinds) -> bool:
    functions, methods = kinds
    if not isinstance(n, torch.fx.Node):
        return False
    if n.op == "call_function":
        return n.target in functions
    return n.op == "call_method" and n.target in methods


def _val(n):
    """The example value Dynamo traced for node `n` (a fake tensor), or None."""
    if not isinstance(n, torch.fx.Node):
        return None
    v = n.meta.get("example_value", n.meta.get("val"))
    return v if isinstance(v, torch.Tensor) else None


def _arg(n, i, name, default=None):
    if len(n.args) > i:
        return n.args[i]
    return n.kwargs.get(name, default)


def _number(x):
    """`x` as a float when it is a constant number (or a node making a constant scalar tensor)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target in _CONSTANT_TENSORS:
        if x.target is torch.full:
            size, value = _arg(x, 0, "size"), _arg(x, 1, "fill_value")
            if not isinstance(size, (list, tuple)) or len(size) != 0:
                return None
        else:
            value = _arg(x, 0, "data" if x.target is not torch.scalar_tensor else "s")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _einsum_operands(n):
    """A two-operand `torch.einsum` node's (equation, a, b), or None."""
    if not _is(n, _EINSUM) or not n.args or not isinstance(n.args[0], str) or n.kwargs:
        return None
    ops = n.args[1:]
    if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
        ops = ops[0]
    if len(ops) != 2:
        return None
    return n.args[0].replace(" ", ""), ops[0], ops[1]


def _einsum_product(n):
    """A two-operand `einsum` that is a batched matrix product, as (a, b, transposed): `a @ b`,
    or `a @ b^T` with `transposed` (`"bhqd,bhkd->bhqk"`). The leading axes are batch axes in the
    same order in both operands and the result, the last two a product's; None otherwise (an
    ellipsis, a repeated or summed batch axis, a broadcast)."""
    found = _einsum_operands(n)
    if found is None:
        return None
    eq, a, b = found
    if "->" not in eq or "." in eq:
        return None
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    if len(terms) != 2:
        return None
    x, y = terms
    if not (len(x) == len(y) == len(out) >= 3) or not (x + y + out).isalpha():
        return None
    if len(set(x)) != len(x) or len(set(y)) != len(y) or len(set(out)) != len(out):
        return None
    batch = x[:-2]
    if y[:-2] != batch or out[:-2] != batch:
        return None
    i, j = x[-2:]
    if out[-2] != i or len({i, j, out[-1], *batch}) != len(batch) + 3:
        return None
    kk = out[-1]
    if y[-2:] == j + kk:
        return a, b, False
    if y[-2:] == kk + j:
        return a, b, True
    return None


def _product(n):
    """A batched matrix product node as (a, b, transposed): `a @ b` (`matmul`, `@`, `bmm`, or an
    `einsum` that is one), `a @ b^T` with `transposed`; None for any other node."""
    if _is(n, _MATMUL) and len(n.args) == 2 and not n.kwargs:
        return n.args[0], n.args[1], False
    return _einsum_product(n)


def _single_use(n) -> bool:
    return len(n.users) == 1


def _float_like(v, like) -> bool:
    return v is not None and v.dtype == like.dtype and v.device == like.device


def _peel_probabilities(a):
    """From the probabilities' product operand back to the softmax: (softmax node, dropout p,
    chain of nodes passed), or None."""
    chain, p, x = [], 0.0, a
    while True:
        if not isinstance(x, torch.fx.Node) or not _single_use(x):
            return None
        if _is(x, _DROPOUT):
            if chain and any(_is(c, _DROPOUT) for c in chain):
                return None
            prob = _arg(x, 1, "p", 0.5)
            training = _arg(x, 2, "training" if x.target is F.dropout else "train", True)
            if not isinstance(prob, (int, float)) or isinstance(prob, bool) or not isinstance(training, bool):
                return None
            if training and prob > 0:
                if not prob < 1:
                    return None
                p = float(prob)
        elif x.op == "call_method" and x.target in _CASTS:
            vin, vout = _val(x.args[0]), _val(x)
            if vin is None or vout is None or vin.shape != vout.shape or vin.device != vout.device:
                return None
            if not (vin.is_floating_point() and vout.is_floating_point()):
                return None
        elif _is(x, _SOFTMAX):
            dim = _arg(x, 1, "dim")
            vin = _val(x.args[0])
            if vin is None or not isinstance(dim, int) or dim not in (-1, vin.dim() - 1):
                return None
            # (`F.softmax(x, dim, _stacklevel, dtype)`; `torch.softmax(x, dim, dtype)`, `x.softmax(dim, dtype)`.)
            at = 3 if x.target is F.softmax else 2
            dtype = x.kwargs.get("dtype", x.args[at] if len(x.args) > at else None)
            if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
                return None
            chain.append(x)
            return x, p, chain
        else:
            return None
        chain.append(x)
        x = x.args[0]


def _peel_scores(x, dtype):
    """From the softmax's operand back to the scores' product: (product node, scale, masks,
    chain), masks as (kind, node, fill) in the order they were applied, or None."""
    masks, chain, scale = [], [], 1.0
    # Masks, outermost first.
    while isinstance(x, torch.fx.Node) and _single_use(x):
        if _is(x, _ADD) and len(x.args) == 2 and _arg(x, 2, "alpha", 1) == 1:
            a, b = x.args
            # The scores are the operand whose chain reaches a product; try the left one first.
            for s, m in ((a, b), (b, a)):
                vm = _val(m)
                if vm is None or vm.dtype != dtype or vm.requires_grad:
                    continue
                found = _peel_scores(s, dtype)
                if found is not None:
                    qk, sc, inner, rest = found
                    return qk, sc, inner + [("add", m, None)] + masks, rest + [x] + chain
            return None
        if _is(x, _WHERE) and len(x.args) == 3:
            cond, t, f = x.args
            branch = "where_true" if _number(f) is not None else "where_false" if _number(t) is not None else None
            fill = _number(f if branch == "where_true" else t) if branch else None
            vc = _val(cond)
            if fill is None or vc is None or vc.dtype != torch.bool or not fill <= VERY_NEGATIVE:
                return None
            masks.insert(0, (branch, cond, fill))
            chain.insert(0, x)
            x = t if branch == "where_true" else f
            continue
        if _is(x, _MASKED_FILL):
            cond, fill = _arg(x, 1, "mask"), _number(_arg(x, 2, "value"))
            vc = _val(cond)
            if fill is None or vc is None or vc.dtype != torch.bool or not fill <= VERY_NEGATIVE:
                return None
            masks.insert(0, ("where_false", cond, fill))
            chain.insert(0, x)
            x = x.args[0]
            continue
        break
    # Scales.
    while isinstance(x, torch.fx.Node) and _single_use(x):
        if _is(x, _MUL) and len(x.args) == 2:
            a, b = x.args
            c = _number(b)
            s = a
            if c is None:
                c, s = _number(a), b
            if c is None:
                return None
            scale *= c
        elif _is(x, _DIV) and len(x.args) == 2 and _arg(x, 2, "rounding_mode") is None:
            c = _number(x.args[1])
            if c is None or c == 0:
                return None
            scale /= c
            s = x.args[0]
        else:
            break
        vs, vx = _val(s), _val(x)
        if vs is None or vx is None or vs.dtype != vx.dtype or vs.shape != vx.shape:
            return None
        chain.insert(0, x)
        x = s
    if _product(x) is None or not _single_use(x) or not (math.isfinite(scale) and scale > 0):
        return None
    chain.insert(0, x)
    return x, scale, masks, chain


def _swapped_back(kt):
    """`k` when `kt` is `k` with its last two (of 3 or 4) axes swapped by a view, else None."""
    vk = _val(kt)
    if vk is None or vk.dim() not in (3, 4):
        return None
    r = vk.dim()
    if _is(kt, _TRANSPOSE):
        dims = sorted(d % r for d in (_arg(kt, 1, "dim0"), _arg(kt, 2, "dim1")) if isinstance(d, int))
        return kt.args[0] if dims == [r - 2, r - 1] else None
    if _is(kt, _PERMUTE):
        perm = list(kt.args[1:]) if kt.op == "call_method" and len(kt.args) > 2 else _arg(kt, 1, "dims")
        if isinstance(perm, (list, tuple)) and [d % r if isinstance(d, int) else d for d in perm] == [
                *range(r - 2), r - 1, r - 2]:
            return kt.args[0]
    return None


def _match(out):
    """The attention whose probabilities' product is `out`, as a dict, or None."""
    product = _product(out)
    if product is None or product[2]:
        return None
    a, v, _ = product
    probs = _peel_probabilities(a)
    if probs is None:
        return None
    sm, p, prob_chain = probs
    vv = _val(v)
    if vv is None:
        return None
    found = _peel_scores(sm.args[0], vv.dtype)
    if found is None:
        return None
    qk, scale, masks, score_chain = found
    q, kt, k_given = _product(qk)
    vq, vkt, vs, vo, vin = _val(q), _val(kt), _val(qk), _val(out), _val(sm.args[0])
    if any(t is None for t in (vq, vkt, vs, vo, vin)) or vq.dim() not in (3, 4):
        return None
    if not all(t.dim() == vq.dim() for t in (vkt, vv, vs, vo)):
        return None
    if vin.shape != vs.shape:  # a mask that broadcast the scores up
        return None
    if not (vq.is_floating_point() and _float_like(vkt, vq) and _float_like(vv, vq) and _float_like(vo, vq)
            and _float_like(vs, vq)):
        return None
    kt_shape = (*vkt.shape[:-2], vkt.shape[-1], vkt.shape[-2]) if k_given else tuple(vkt.shape)
    lead = vq.shape[:-2]
    if kt_shape[:-2] != lead or vv.shape[:-2] != lead or kt_shape[-2] != vq.shape[-1] or vv.shape[-2] != kt_shape[-1]:
        return None
    scores = tuple(vs.shape)
    for kind, m, _ in masks:
        vm = _val(m)
        if vm is None or vm.device != vq.device:
            return None
        try:
            if tuple(torch.broadcast_shapes(tuple(vm.shape), scores)) != scores:
                return None
        except RuntimeError:
            return None
    return dict(out=out, q=q, kt=None if k_given else kt, k=kt if k_given else None, v=v, scale=scale,
                masks=masks, p=p, dtype=vq.dtype, device=vq.device, batched=vq.dim() == 3,
                chain=score_chain + prob_chain[::-1])


def _build_mask(graph, masks, dtype, device):
    """One additive mask node for `masks` (None when there are none)."""
    total = None
    for kind, m, fill in masks:
        if kind == "add":
            term = m
        else:
            zero = graph.call_function(torch.scalar_tensor, (0.0,), {"dtype": dtype, "device": device})
            filled = graph.call_function(torch.scalar_tensor, (fill,), {"dtype": dtype, "device": device})
            # `where(cond, x, fill)` keeps x where cond; `masked_fill(x, cond, fill)` fills there.
            pair = (zero, filled) if kind == "where_true" else (filled, zero)
            term = graph.call_function(torch.where, (m, *pair))
        total = term if total is None else graph.call_function(operator.add, (total, term))
    return total


def _unsqueezed(graph, t):
    """`t.unsqueeze(0)` inserted into `graph`, with its example value where `t` has one."""
    node = graph.call_method("unsqueeze", (t, 0))
    for key in ("example_value", "val"):
        if isinstance(t, torch.fx.Node) and isinstance(t.meta.get(key), torch.Tensor):
            node.meta[key] = t.meta[key].unsqueeze(0)
    return node


def rewrite_attention(gm) -> int:
    """Rewrites written-out attention in a Dynamo-captured GraphModule into
    `F.scaled_dot_product_attention` (module docstring); returns how many were rewritten."""
    graph = gm.graph
    erased, count = set(), 0
    # Matched and rewritten one at a time: an attention's output may be the next one's query.
    for node in list(graph.nodes):
        m = None if node in erased else _match(node)
        if m is None:
            continue
        count += 1
        out = m["out"]
        kt = m["kt"]
        with graph.inserting_before(out):
            k = m["k"] if kt is None else _swapped_back(kt)
            if k is None:
                k = graph.call_method("transpose", (kt, -2, -1))
            mask = _build_mask(graph, m["masks"], m["dtype"], m["device"])
            q, v = m["q"], m["v"]
            if m["batched"]:
                # Heads flattened into one batch axis (`bmm` of `[B*H, L, E]`): SDPA of one
                # batch of those heads (a mask broadcasts to the scores as before).
                q, k, v = (_unsqueezed(graph, t) for t in (q, k, v))
            sdpa = graph.call_function(F.scaled_dot_product_attention, (q, k, v),
                                       {"attn_mask": mask, "dropout_p": m["p"], "scale": m["scale"]})
            result = graph.call_method("squeeze", (sdpa, 0)) if m["batched"] else sdpa
        if m["batched"]:
            for key in ("example_value", "val"):
                if key in out.meta:
                    sdpa.meta[key] = out.meta[key].unsqueeze(0)
        for key in ("example_value", "val", "stack_trace"):
            if key in out.meta:
                result.meta[key] = out.meta[key]
        out.replace_all_uses_with(result)
        # The chain, last first: each is dead once its one user is gone.
        for n in [out, *m["chain"][::-1]]:
            graph.erase_node(n)
            erased.add(n)
        if kt is not None and k is not kt and not kt.users:
            graph.erase_node(kt)
            erased.add(kt)
    if count:
        graph.lint()
        gm.recompile()
    return count


# --- SDPA calls PyTorch would run as its math fallback -------------------------------------------

_SDPA = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
_MATH_SDPA = None


def math_sdpa_op():
    """`eqfuse::sdpa_math_mask(q, k, v, attn_mask, is_causal, scale, enable_gqa)`: an opaque
    `F.scaled_dot_product_attention` (a mask or none), defined once a process. Run eagerly it is
    that call, so eager's result (and the backend's first-call check) is PyTorch's own; traced by
    AOTAutograd it stays one node, which the exporter lowers to eqfuse's `attention_bias`."""
    global _MATH_SDPA
    if _MATH_SDPA is None:
        try:
            @torch.library.custom_op("eqfuse::sdpa_math_mask", mutates_args=())
            def sdpa_math_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor],
                               is_causal: bool, scale: Optional[float], enable_gqa: bool) -> torch.Tensor:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                      scale=scale, enable_gqa=enable_gqa).contiguous()

            @sdpa_math_mask.register_fake
            def _(q, k, v, attn_mask, is_causal, scale, enable_gqa):
                return q.new_empty(q.shape[:-1] + (v.shape[-1],))
        except RuntimeError:  # defined already (this module imported twice)
            pass
        _MATH_SDPA = torch.ops.eqfuse.sdpa_math_mask.default
    return _MATH_SDPA


def _autocast(graph) -> bool:
    """Whether a captured graph may run under `torch.autocast`: autocast on where it is compiled
    (Dynamo guards on it) or entered inside it. An f32 SDPA there runs in 16 bits, which the
    opaque op, whose traced result keeps its inputs' dtype, would not."""
    if any(torch.is_autocast_enabled(d) for d in ("cuda", "cpu")):
        return True
    return any(n.op == "call_function" and "autocast" in getattr(n.target, "__name__", "") for n in graph.nodes)


def _math_fallback(q, mask) -> bool:
    """Whether PyTorch's CUDA dispatch may run SDPA of `q` with this mask as its math fallback,
    which writes the `[B, H, L, S]` scores and traces as matmul, `_safe_softmax`, matmul:
    - f32 heads, with or without a mask: PyTorch runs them as math wherever its memory-efficient
      kernel refuses them (ViT-B/16's 197 keys, T5's permuted bias: `transformers` 5.17,
      PyTorch 2.11 on an H100), and where it would take them the op lowers to the same
      attention;
    - 16-bit heads with a float mask of another dtype (T5's f32 position bias beside bf16 heads)
      or one whose last axis is not contiguous (a bias permuted from `[S, S, H]`): the math
      fallback upcasts q, k and v to f32.
    eqfuse's flash kernel, with a bias read in place, computes the same attention up to the
    rounding every fused SDPA kernel has."""
    if q.dtype == torch.float32:
        return mask is None or mask.dtype in (torch.float32, torch.bool)
    if mask is None or q.dtype not in (torch.float16, torch.bfloat16) or not mask.is_floating_point():
        return False
    return mask.dtype != q.dtype or (mask.dim() > 0 and mask.shape[-1] > 1 and mask.stride(-1) != 1)


def route_math_sdpa(gm) -> int:
    """Rewrites, on a Dynamo-captured GraphModule, each `F.scaled_dot_product_attention` call that
    PyTorch would run as its math fallback (`_math_fallback`) into `math_sdpa_op()`, so that
    AOTAutograd keeps it one attention node instead of the math's matmul, `_safe_softmax`, matmul
    in f32. Only where nothing needs its gradient (q, k, v, mask not requiring grad: the op has no
    backward) and dropout is off. Returns how many calls it rewrote."""
    graph = gm.graph
    count = 0
    autocast = None
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        q, k, v = (_val(_arg(node, i, name)) for i, name in enumerate(("query", "key", "value")))
        mask_node = _arg(node, 3, "attn_mask")
        mask = _val(mask_node)
        dropout = _arg(node, 4, "dropout_p", 0.0)
        is_causal = _arg(node, 5, "is_causal", False)
        scale = node.kwargs.get("scale")
        gqa = node.kwargs.get("enable_gqa", False)
        if None in (q, k, v) or (mask_node is not None and mask is None) or len(node.args) > 6 or set(node.kwargs) - {
                "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"}:
            continue
        grads = any(t.requires_grad for t in (q, k, v, mask) if t is not None)
        if grads or dropout != 0.0 or not isinstance(is_causal, bool):
            continue
        if not isinstance(gqa, bool) or (scale is not None and not isinstance(scale, (int, float))):
            continue
        if not _math_fallback(q, mask):
            continue
        if q.dtype == torch.float32:
            autocast = _autocast(graph) if autocast is None else autocast
            if autocast:
                continue
        with graph.inserting_before(node):
            qkv = tuple(_arg(node, i, name) for i, name in enumerate(("query", "key", "value")))
            new = graph.call_function(math_sdpa_op(),
                                      (*qkv, mask_node, is_causal, None if scale is None else float(scale), gqa))
        new.meta.update({key: node.meta[key] for key in ("example_value", "val", "stack_trace") if key in node.meta})
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count
