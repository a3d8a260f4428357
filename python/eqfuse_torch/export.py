"""PyTorch graphs to eqfuse JSON graphs (`eqfuse.graph/1`).

Two entry points:

- `export_program(ep)` takes a `torch.export.ExportedProgram` (forward only);
- `export_graph_module(gm)` takes an ATen-level `torch.fx.GraphModule`, such as the forward, the
  backward or the joint forward-backward graph that AOTAutograd hands a `torch.compile` backend
  (see `backend.py`), or `ep.graph_module` after `ep.run_decompositions()`.

Both read shapes and dtypes from each node's `meta["val"]` (the fake tensor PyTorch traced with),
so shapes must be static. Each ATen operator is lowered by one entry of `LOWERINGS` onto eqfuse
operators (docs/graph-schema.md); operators eqfuse has no equivalent for are collected, and the
export fails with one `ExportError` naming every such operator and node, before any lowering.

Values: user inputs become graph inputs. Parameters become graph inputs too, and their tensors
are returned in `Exported.values` (write them with `Exported.save(..., values_dir=...)` and run
`eqfuse run --cpu graph.json --inputs values_dir`). Buffers and constant tensors are *static*: a
node whose inputs are all static (a causal mask sliced from a buffer, an `arange`) is evaluated
here with PyTorch, and its result enters the graph as a literal (one value, or one repeated
value, broadcast) or as an input with its value. Literals are finite: an infinite one (a mask's
`-inf`) becomes the largest finite value of its dtype.

Don't-care values: the random-number state a fused SDPA op returns for its backward
(`philox_seed`, `philox_offset`; flash's `rng_state`, `unused`) means nothing when `dropout_p`
is 0: such an output becomes a constant of its dtype and shape (zeros), listed in
`Exported.dont_care` (the backend's first-call check skips it), and a placeholder read only there
(a backward graph's) is no graph input at all.

Dropout in training (`native_dropout`, SDPA with `dropout_p > 0`) is eqfuse's counter-based
dropout, not PyTorch's (`rng.py`): each such node is a *site* with its own seed, element k of the
graph input `eqfuse_seeds` (i32, one per site, `Exported.seeds` maps node names to k) that the
backend fills with fresh random values on every call. A fused SDPA forward with dropout returns
its seed in its random-number state (`Exported.seed_outputs`), and its backward reads it there.

Invariant: the graph computes what the PyTorch graph computes (up to floating-point rounding) or
the export raises `ExportError`; it never drops an operator silently.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
import torch.fx

from .graph import ExportError, GraphBuilder, Value, broadcast_shapes

TORCH_DTYPES = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.int64: "i32",  # eqfuse's one integer type; values beyond 32 bits do not fit
    torch.int16: "i32",
    torch.int8: "i32",
    torch.uint8: "i32",
    torch.bool: "bool",
    torch.uint64: "i32",  # a fused SDPA op's random-number state (whose element 0 is a seed)
}


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return TORCH_DTYPES[dtype]
    except KeyError:
        raise ExportError(f"dtype {dtype} is not supported (eqfuse holds f32, f16, bf16, integers as i32, bool)")


@dataclass
class Exported:
    """The result of an export."""

    graph: dict
    """The `eqfuse.graph/1` graph."""
    values: dict[str, torch.Tensor] = field(default_factory=dict)
    """Tensors of inputs the model supplies (parameters, folded constants), by graph input name."""
    input_names: list[str] = field(default_factory=list)
    """For each placeholder of the PyTorch graph, in order, its graph input name (None when the
    placeholder is unused or static)."""
    constants: dict[int, torch.Tensor] = field(default_factory=dict)
    """Outputs known at export time (a folded constant the graph returns as it is), by output
    position; they are not in the graph."""
    dont_care: set[int] = field(default_factory=set)
    """Positions of `constants` whose values nothing reads (an SDPA op's random-number state
    without dropout): PyTorch returns unspecified values there, so no check compares them."""
    seeds: dict[str, int] = field(default_factory=dict)
    """The dropout sites: node name -> its element of the seeds input (`seed_input`)."""
    seed_input: str | None = None
    """The graph input (i32 `[len(seeds)]`) the caller fills with fresh seeds on every call."""
    pads: dict[int, tuple[int, float]] = field(default_factory=dict)
    """Outputs PyTorch pads along the last axis (the efficient SDPA kernel's log-sum-exp, rows
    rounded up to 32): position -> (padded length, fill); the graph output is the unpadded value."""
    seed_outputs: dict[int, int] = field(default_factory=dict)
    """Output positions that are an SDPA forward's random-number state: position -> the site
    whose seed it carries (element 0; `rng.rng_state`). Their `constants` entry gives the dtype
    and shape."""
    broadcast_inputs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Graph inputs smaller than their placeholders' tensors, which are broadcasts of them (an
    expanded tensor, stride 0 along some axes): input name -> its shape, the placeholder's with
    size 1 on the broadcast axes. The graph broadcasts the input back, so its kernels read the
    small tensor (a padding mask by key, not `[B, 1, S, S]`); `arguments` passes the view of
    the placeholder's tensor at index 0 along those axes."""
    broadcast_outputs: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Outputs the graph computes as a smaller tensor of which PyTorch's is a broadcast: position
    -> the graph output's shape (PyTorch's, with size 1 on the broadcast axes); the caller
    returns it expanded to PyTorch's shape, a view, rather than the graph writing every element."""
    view_outputs: dict[int, "ViewOf"] = field(default_factory=dict)
    """Outputs saved for the backward alone that are views (reshapes, transposes, slices) of a
    tensor in memory: position -> how to make them (`ViewOf`); not in the graph, so no kernel
    copies them."""
    view_inputs: dict[str, "ViewOf"] = field(default_factory=dict)
    """Graph inputs that are the base of their placeholder's tensor, a view a forward made
    (`view_outputs`): input name -> the view (`ViewOf`, whose chain the graph replays, so its
    kernels read the base in place); `arguments` passes the base (`view_base`)."""
    output_names: dict[int, str] = field(default_factory=dict)
    """The graph output name of each output position the graph computes."""
    unordered: set[int] = field(default_factory=set)
    """Output positions whose values depend on an order PyTorch leaves unspecified: the indices
    an unstable `sort` or a `topk` gives equal values (eqfuse orders them by position; PyTorch's
    CPU sort of more than 16 elements does not), and what is computed from them (a grouped
    mixture of experts' tokens in expert order, saved for its backward). Such an output can
    differ from eager's where values tie while the graph's own results, computed consistently
    from it, agree (`unordered_outputs`)."""

    def arguments(self, args) -> dict[str, torch.Tensor]:
        """The graph's inputs by name from the PyTorch graph's placeholder arguments, in order,
        and the exported values; a broadcast input (`broadcast_inputs`) is a view of its
        argument, no copy."""
        out = dict(self.values)
        for name, a in zip(self.input_names, args):
            if name is not None:
                out[name] = self.argument(name, a)
        return out

    def argument(self, name: str, a: torch.Tensor) -> torch.Tensor:
        """Graph input `name` given its placeholder's tensor `a`: `a`, the tensor it is a
        broadcast of, or the base it is a view of (ValueError when `a` is no such view)."""
        shape = self.broadcast_inputs.get(name)
        if shape is not None:
            return broadcast_base_view(a, shape)
        view = self.view_inputs.get(name)
        if view is not None:
            base = view_base(a, view)
            if base is None:
                raise ValueError(f"input {name}: its tensor is not the view of a base the graph reads")
            return base
        return a

    def save(self, path: str | Path, values_dir: str | Path | None = None) -> None:
        """Writes the graph as JSON, and each value as `values_dir/NAME.npy`."""
        import json

        Path(path).write_text(json.dumps(self.graph, indent=1) + "\n")
        if values_dir is not None:
            import numpy as np

            Path(values_dir).mkdir(parents=True, exist_ok=True)
            for name, t in self.values.items():
                t = t.detach().cpu()
                t = t.float() if t.dtype == torch.bfloat16 else t
                np.save(Path(values_dir) / f"{name}.npy", t.numpy())


def decompositions() -> dict:
    """The decompositions AOTAutograd applies before the graphs reach eqfuse: PyTorch's core ATen
    decompositions, less every `scaled_dot_product*` entry.

    Attention stays the op it is: eqfuse has an attention kernel, and decomposing it gains nothing.
    More importantly, the core table decomposes the forward of `scaled_dot_product_attention`
    (into math, or into `_scaled_dot_product_flash_attention_for_cpu`'s math) while leaving its
    backward op undecomposed, and the gradients AOTAutograd then computes differ from eager by
    factors of 30 to 2000 on models with attention (PyTorch 2.15 on the CPU; a plain
    `aot_autograd` backend with the core table and no eqfuse code reproduces it). The backend must never change a result, whether a graph then
    runs on eqfuse's kernels or eagerly; `python/tests/test_training.py` checks training steps of
    `transformers` models against eager.
    """
    from torch._decomp import core_aten_decompositions

    table = {op: fn for op, fn in core_aten_decompositions().items() if "scaled_dot_product" not in op.name()}
    table.update(_fastpath_decompositions())
    return table


def _fastpath_decompositions() -> dict:
    """`nn.TransformerEncoderLayer`'s and `nn.MultiheadAttention`'s inference fast path
    (`aten._transformer_encoder_layer_fwd`, `aten._native_multi_head_attention`: eval mode, no
    gradient), which `torch.compile` captures as single ops, written as the layer's parts, as
    PyTorch's C++ computes them (`transformer.cpp`, `attention.cpp`): the attention as SDPA with
    the queries scaled by 1/sqrt(head size), a mask marking with nonzero (or true) the scores it
    hides (mask type 0: `[L, S]`, 1: key padding `[B, S]`, 2: `[B, H, L, S]`), and rows whose
    every score is hidden giving NaN, as PyTorch's op does (PyTorch 2.15, CPU)."""
    import torch

    aten = torch.ops.aten
    F = torch.nn.functional

    def mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask=None,
            need_weights=True, average_attn_weights=True, mask_type=None):
        if need_weights:
            return NotImplemented  # the averaged weights too: PyTorch's op stays
        b, lq, _ = query.shape
        d = embed_dim // num_head
        wq, wk, wv = qkv_weight.split(embed_dim)
        bq, bk, bv = qkv_bias.split(embed_dim)

        def heads(x, w, bias):
            return F.linear(x, w, bias).view(b, x.shape[1], num_head, d).transpose(1, 2)

        q, k, v = heads(query, wq, bq), heads(key, wk, bk), heads(value, wv, bv)
        attn_mask = hidden = None
        if mask is not None:
            hidden = mask if mask.dtype == torch.bool else mask != 0
            if mask_type == 1 or (mask_type is None and hidden.dim() == 2 and hidden.shape[0] == b
                                  and hidden.shape[1] == k.shape[2] and hidden.shape[0] != lq):
                hidden = hidden.view(b, 1, 1, k.shape[2])
            attn_mask = torch.where(hidden, torch.finfo(q.dtype).min, 0.0).to(q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        if hidden is not None:
            out = out.masked_fill(hidden.all(-1, keepdim=True), float("nan"))
        out = F.linear(out.transpose(1, 2).reshape(b, lq, embed_dim), proj_weight, proj_bias)
        return out, out.new_empty(0)

    def encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                      norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1,
                      ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
        def norm(x, w, bias):
            return F.layer_norm(x, (embed_dim,), w, bias, eps)

        x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
        x = mha(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, False, True,
                mask_type)[0] + src
        if not norm_first:
            x = norm(x, norm_weight_1, norm_bias_1)
        y = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
        y = F.linear(y, ffn_weight_1, ffn_bias_1)
        y = F.linear(F.gelu(y) if use_gelu else F.relu(y), ffn_weight_2, ffn_bias_2)
        x = x + y
        return x if norm_first else norm(x, norm_weight_2, norm_bias_2)

    return {aten._native_multi_head_attention.default: mha, aten._transformer_encoder_layer_fwd.default: encoder_layer}


def export_program(ep: "torch.export.ExportedProgram") -> Exported:
    """Exports the forward graph of an `ExportedProgram`.

    Parameters become inputs with values; buffers and lifted constants are static. The program's
    user outputs become the graph's outputs, named `out0`, `out1`, ... The program is first
    decomposed to core ATen (`decompositions()`: attention kept whole), so composite modules
    (`nn.RMSNorm`, `einsum`, `unflatten`, fused encoder layers) come through as their parts.
    """
    from torch.export.graph_signature import InputKind, OutputKind

    ep = ep.run_decompositions(decompositions())

    gm = ep.graph_module
    kinds: dict[str, tuple[str, torch.Tensor | None]] = {}
    for spec in ep.graph_signature.input_specs:
        name = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            kinds[name] = ("input", None)
        elif spec.kind == InputKind.PARAMETER:
            kinds[name] = ("parameter", ep.state_dict[spec.target])
        elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            value = ep.state_dict.get(spec.target) if spec.target in ep.state_dict else ep.constants[spec.target]
            kinds[name] = ("static", value)
        else:
            raise ExportError(f"input {name} of kind {spec.kind.name} is not supported")
    for spec in ep.graph_signature.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            raise ExportError(f"output {spec.arg.name} of kind {spec.kind.name} (a mutation) is not supported")
    return Exporter(gm, kinds).run()


def export_graph_module(gm: torch.fx.GraphModule, parameters: dict[str, torch.Tensor] | None = None,
                        statics: dict[str, torch.Tensor] | None = None, *, free_layout_from: int | None = None,
                        broadcasts: dict[str, tuple[int, ...]] | None = None,
                        views: dict[str, ViewOf] | None = None, reshaped_outputs: bool = False,
                        allow_empty: bool = False) -> Exported:
    """Exports an ATen-level graph: every placeholder is an input (`parameters` gives values for
    some, by placeholder name), except those `statics` gives a value that never changes (a
    constant the forward graph returns for its backward), which are folded like `get_attr`
    tensors. Outputs that are `None` (as in a backward graph, for inputs without gradient) are
    skipped.

    Broadcasts (`Exported.broadcast_inputs`, `Exported.broadcast_outputs`): a placeholder whose
    traced tensor has stride 0 along some axes, or that `broadcasts` names (placeholder name ->
    the shape it is a broadcast of: a forward's output returned so), is a smaller graph input
    broadcast back. An output that the graph computes as a broadcast of a smaller value is
    returned as that value, where its layout is free: at positions from `free_layout_from` on
    (a forward's tensors saved for its backward alone), or along axes where the traced tensor
    has stride 0.

    Views (`Exported.view_outputs`, `Exported.view_inputs`): an output saved for the backward
    alone that is a view of a tensor in memory is returned as that view of it, not written; a
    placeholder that `views` names (placeholder name -> `ViewOf`: a forward's output returned
    so) is its base, an input, with the view replayed in the graph. With `reshaped_outputs` (the
    backend, which makes such views), any other output that only reshapes a contiguous value
    the graph computes (a product viewed as `[B, S, N]` logits) is made so too
    (`Exporter.reshaped_output`): the graph's outputs are then not the module's one for one.
    With `allow_empty`, a graph none of whose outputs is computed (each a constant the export
    folds, such as a mask built from `arange` alone, or a view of an argument) exports with
    `graph` None instead of raising."""
    parameters = parameters or {}
    statics = statics or {}
    kinds = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            value = parameters.get(node.name)
            if node.name in statics:
                kinds[node.name] = ("static", statics[node.name])
            else:
                kinds[node.name] = ("parameter", value) if value is not None else ("input", None)
    return Exporter(gm, kinds, free_layout_from, broadcasts, views, reshaped_outputs, allow_empty).run()


def unordered_outputs(gm: torch.fx.GraphModule) -> set[int]:
    """The output positions of `gm` that depend on the order of equal values in an unstable
    `sort`'s or a `topk`'s indices (`Exported.unordered`): those indices and every node computed
    from them."""
    tied: set[str] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and node.args[1] == 1 and isinstance(node.args[0], torch.fx.Node):
            src = node.args[0]
            name = _target_name(src)
            if name == "topk" or (name == "sort" and not src.kwargs.get("stable")):
                tied.add(node.name)
                continue
        if any(a.name in tied for a in node.all_input_nodes):
            tied.add(node.name)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    results = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    return {i for i, r in enumerate(results) if isinstance(r, torch.fx.Node) and r.name in tied}


def _target_name(node: torch.fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return t.overloadpacket.__name__
    if isinstance(t, torch._ops.OpOverloadPacket):
        return t.__name__
    if t is operator.getitem:
        return "getitem"
    return getattr(t, "__name__", str(t))


def _describe(node: torch.fx.Node) -> str:
    return f"{node.target} (node {node.name})"


class Exporter:
    """One export: walks the fx graph in order, lowering each node."""

    def __init__(self, gm: torch.fx.GraphModule, kinds: dict[str, tuple[str, torch.Tensor | None]],
                 free_layout_from: int | None = None, broadcasts: dict[str, tuple[int, ...]] | None = None,
                 views: dict[str, ViewOf] | None = None, reshaped_outputs: bool = False,
                 allow_empty: bool = False):
        self.gm = gm
        self.allow_empty = allow_empty
        self.kinds = kinds
        self.free_layout_from = free_layout_from
        self.reshaped_outputs = reshaped_outputs
        self.broadcasts = broadcasts or {}
        self.broadcast_inputs: dict[str, tuple[int, ...]] = {}
        self.broadcast_outputs: dict[int, tuple[int, ...]] = {}
        self.views = views or {}
        self.view_inputs: dict[str, ViewOf] = {}
        self.view_outputs: dict[int, ViewOf] = {}
        self.output_names: dict[int, str] = {}
        self.positions: dict[str, int] = {}  # placeholder name -> its position
        self.b = GraphBuilder()
        self.env: dict[str, object] = {}  # node name -> Value, tuple of Values, or a static tensor
        self.static: set[str] = set()
        self.brought: dict[str, object] = {}  # static node name -> its value in the graph
        self.values: dict[str, torch.Tensor] = {}
        self.constants: dict[int, torch.Tensor] = {}
        self.dont_care: set[str] = set()  # static nodes whose values nothing may depend on
        self.dont_care_outputs: set[int] = set()
        self.seeds = _Seeds(self.b)
        self.seed_states: dict[str, int] = {}  # static node name -> the site whose seed it carries
        self.seed_outputs: dict[int, int] = {}
        self.pads: dict[int, tuple[int, float]] = {}

    def run(self) -> Exported:
        self.check_supported()
        input_names: list[str | None] = []
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.positions[node.name] = len(input_names)
                input_names.append(self.placeholder(node))
            elif node.op == "get_attr":
                self.env[node.name] = _fetch_attr(self.gm, node.target)
                self.static.add(node.name)
            elif node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                self.outputs(node)
            else:
                raise ExportError(f"fx node {node.name} of kind {node.op} is not supported (export an ATen graph)")
        seed_input = self.seeds.finish()
        graph = None if self.allow_empty and not self.b.outputs else self.b.to_json()
        return Exported(graph, self.values, input_names, self.constants, self.dont_care_outputs,
                        dict(self.seeds.sites), seed_input, self.pads, self.seed_outputs, self.broadcast_inputs,
                        self.broadcast_outputs, self.view_outputs, self.view_inputs, self.output_names,
                        unordered_outputs(self.gm))

    def check_supported(self) -> None:
        """Every operator must have a lowering, except in nodes evaluated here (static ones)."""
        static = {n for n, (kind, _) in self.kinds.items() if kind == "static"}
        missing = []
        for node in self.gm.graph.nodes:
            if node.op == "get_attr":
                static.add(node.name)
            if node.op != "call_function":
                continue
            inputs = [a.name for a in node.all_input_nodes]
            if all(i in static for i in inputs) and _foldable(node):
                static.add(node.name)
            elif _target_name(node) not in LOWERINGS and _target_name(node) not in SPLITS:
                missing.append(_describe(node))
        if missing:
            raise ExportError("eqfuse has no lowering for " + ", ".join(missing))

    def placeholder(self, node: torch.fx.Node) -> str | None:
        kind, value = self.kinds.get(node.name, ("input", None))
        if kind == "static":
            self.env[node.name] = value
            self.static.add(node.name)
            return None
        if node.users and all(_reads_only_rng_state(u, node) for u in node.users):
            # An SDPA backward's seed and offset without dropout: read by nothing eqfuse computes.
            self.env[node.name] = _DontCare(f"placeholder {node.name} (an SDPA op's random-number state)", None)
            return None
        val = node.meta.get("val")
        if val is None or not isinstance(val, torch.Tensor):
            if not node.users:
                return None
            if isinstance(val, (torch.SymInt, torch.SymFloat, int, float)):
                raise ExportError(f"placeholder {node.name} is a size or scalar ({val}), not a tensor: shapes must be "
                                  "static (torch.compile(..., dynamic=False))")
            raise ExportError(f"placeholder {node.name} has no tensor metadata (meta['val'])")
        if not node.users and val.dtype not in TORCH_DTYPES:
            # A tensor nothing reads, of a dtype eqfuse does not hold (the float64 scalars Dynamo
            # passes for a module's Python floats with symbolic shapes): not an input.
            return None
        shape = _static_shape(val, node)
        view = self.views.get(node.name) if value is None else None
        if view is not None:
            v = self.view_input(node, view, shape)
            if v is not None:
                return v
        small = _broadcast_base(val, shape, self.broadcasts.get(node.name)) if value is None else shape
        v = self.b.input(node.name, dtype_name(val.dtype), small)
        name = self.b.input_name(v)
        if small != shape:
            # An expanded tensor: the kernels read its one copy of each value, broadcast.
            self.broadcast_inputs[name] = small
            v = self.b.op("broadcast", [v.node, self.b.dims(shape)], v.dtype, shape)
        self.env[node.name] = v
        if value is not None:
            self.values[name] = value
        return name

    def view_input(self, node: torch.fx.Node, view: ViewOf, shape: tuple[int, ...]) -> str | None:
        """A placeholder whose tensor is a view a forward made (`ViewOf`) as its base, an input,
        and the view's chain replayed in the graph, so the kernels read the base in place; None
        (an ordinary input) where the chain does not lower to the placeholder's shape (tried
        on a scratch graph first)."""
        dtype = dtype_name(view.dtype)
        try:
            scratch = GraphBuilder()
            v = self.lower_chain(scratch, scratch.input("x", dtype, view.shape), view.chain)
            if not isinstance(v, Value) or tuple(v.shape) != shape:
                return None
        except (ExportError, KeyError, IndexError, TypeError):
            return None
        base = self.b.input(node.name, dtype, view.shape)
        name = self.b.input_name(base)
        self.view_inputs[name] = view
        self.env[node.name] = self.lower_chain(self.b, base, view.chain)
        return name

    def lower_chain(self, b: GraphBuilder, base: Value, chain: list):
        """The view operators of `chain` (`ViewOf.chain`) applied to `base` in graph `b`."""
        env: dict[str, object] = {chain[0].args[0].name: base}
        for c in chain:
            L = Lowering(b, c, self.values, self.seeds) if b is self.b else Lowering(b, c)
            if _target_name(c) in SPLITS:
                dim = c.args[2] if len(c.args) > 2 else c.kwargs.get("dim", 0)
                env[c.name] = _split(L, env[c.args[0].name], c.args[1], dim)
            else:
                args, kwargs = torch.fx.node.map_arg((c.args, c.kwargs), lambda n: env[n.name])
                env[c.name] = LOWERINGS[_target_name(c)](L, *args, **kwargs)
        return env[chain[-1].name]

    def call(self, node: torch.fx.Node) -> None:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.numel() == 0:
            # An empty result has no values to compute, whatever its inputs (Phi-3 slices the
            # rotary part `[..., rot:]` of heads it rotates whole): an empty tensor, which a
            # concatenation drops; a lowering that needs its values refuses it.
            self.env[node.name] = torch.empty(tuple(val.shape), dtype=val.dtype)
            self.static.add(node.name)
            return
        if all(a.name in self.static for a in node.all_input_nodes) and _foldable(node):
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: self.env[n.name])
            self.env[node.name] = node.target(*args, **kwargs)
            self.static.add(node.name)
            if any(a.name in self.dont_care for a in node.all_input_nodes):
                self.dont_care.add(node.name)  # computed from a don't-care value: one too
            return
        try:
            if _target_name(node) in SPLITS:
                out = self.split(node)
            else:
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: self.value(n))
                out = LOWERINGS[_target_name(node)](Lowering(self.b, node, self.values, self.seeds), *args, **kwargs)
        except ExportError as e:
            raise ExportError(f"{_describe(node)}: {e}") from None
        if isinstance(out, _Constant):  # a tuple entry known here (`_sdpa_extra`)
            self.env[node.name] = out.tensor
            self.static.add(node.name)
            if isinstance(out, _DontCare):
                self.dont_care.add(node.name)
            if isinstance(out, _SeedState):
                self.seed_states[node.name] = out.site
            return
        if isinstance(out, Value) and self.b.nodes[out.node]["op"] not in ("input", "const"):
            if "name" not in self.b.nodes[out.node]:
                self.b.nodes[out.node]["name"] = self.b.unique_name(node.name)
        self.env[node.name] = out

    def split(self, node: torch.fx.Node) -> tuple[Value, ...]:
        """`split`: along the last axis of a product with a constant weight (a fused QKV
        projection) each part is its own product with the matching columns of the weight and
        bias, which become inputs carrying those values, so each part is a contiguous product
        (views between the product and the split that keep the last axis are replayed on each
        part); any other split is slices of its input."""
        try:
            return self.split_product(node)
        except ExportError:
            x, sizes = node.args[0], node.args[1]
            dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
            return _split(Lowering(self.b, node, self.values, self.seeds), self.value(x), sizes, dim)

    def split_product(self, node: torch.fx.Node) -> tuple[Value, ...]:
        x, sizes = node.args[0], node.args[1]
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
        shape = _static_shape(x.meta["val"], x)
        if dim % len(shape) != len(shape) - 1:
            raise ExportError("split along an axis other than the last")
        n = shape[-1]
        if isinstance(sizes, int):
            sizes = [min(sizes, n - s) for s in range(0, n, sizes)]
        views, prod = [], x
        while _target_name(prod) in ("view", "reshape", "_unsafe_view") and _last(prod.args[0]) == n:
            views.append(prod)
            prod = prod.args[0]
        a, w, bias, w_cols = self._product_operands(prod)
        parts, start = [], 0
        for i, size in enumerate(sizes):
            cols = slice(start, start + size)
            start += size
            L = Lowering(self.b, node, self.values, self.seeds)
            wi = self.constant(f"{w.name}_split{i}", w_cols(cols), literal=False)
            y = L.matmul(a, wi)
            if bias is not None:
                b_i = self.constant(f"{bias.name}_split{i}", self.kinds[bias.name][1][cols], literal=False)
                y = L.apply("+", y, b_i)
            for v in reversed(views):
                y = L.reshape(y, _static_shape(v.meta["val"], v)[:-1] + (size,))
            parts.append(y)
        return tuple(parts)

    def _product_operands(self, prod: torch.fx.Node):
        """(input value, weight node, bias node or None, columns of the weight as [K, cols])."""
        name = _target_name(prod)
        if name == "addmm" and len(prod.args) == 3 and not prod.kwargs:
            bias, a, w = prod.args
            transposed = False
        elif name == "linear":
            a, w = prod.args[0], prod.args[1]
            bias = prod.args[2] if len(prod.args) > 2 else None
            transposed = True
        elif name == "mm":
            (a, w), bias, transposed = prod.args, None, False
        else:
            raise ExportError("split of a value that is not a matrix product")
        for t in (w, bias):
            if t is not None and not isinstance(self.kinds.get(t.name, (None, None))[1], torch.Tensor):
                raise ExportError("split of a product whose weight or bias is not a parameter")
        weight = self.kinds[w.name][1]
        w_cols = (lambda c: weight[c, :].t().contiguous()) if transposed else (lambda c: weight[:, c].contiguous())
        return self.value(a), w, bias, w_cols

    def value(self, node: torch.fx.Node) -> object:
        """A node's lowered value; a static tensor is brought into the graph on first use (and
        stays static, so that other nodes can still be evaluated from it)."""
        v = self.env[node.name]
        if node.name not in self.static:
            return v
        if node.name in self.dont_care:  # never brought into the graph: a lowering may only ignore it
            return _DontCare(f"{node.name} (an SDPA op's random-number state)", v)
        if node.name not in self.brought:
            # An empty static tensor stays a tensor (a concatenation drops it; elsewhere it is an error).
            self.brought[node.name] = _map_tensors(v, lambda t: t if t.numel() == 0 else self.constant(node.name, t))
        return self.brought[node.name]

    def constant(self, name: str, t: torch.Tensor, literal: bool = True) -> Value:
        """A static tensor as a graph value: a literal when it holds one repeated value (and
        `literal` allows it: a slice of a parameter stays an input, whatever its values now),
        else an input carrying it."""
        dtype = dtype_name(t.dtype)
        shape = tuple(t.shape)
        if t.numel() == 0:
            raise ExportError(f"constant {name} is empty")
        from torch._subclasses.fake_tensor import is_fake

        if is_fake(t):  # a graph traced with fake tensors (the joint graph): planned, never run
            return self.b.input(name, dtype, shape)
        first = t.reshape(-1)[0]
        if literal and bool((t == first).all()):
            x = first.item()
            if isinstance(x, float) and math.isinf(x):
                x = math.copysign(torch.finfo(t.dtype).max, x)
            lit = self.b.const(x)
            if shape == () and dtype != "bool":
                return Value(lit.node, dtype if dtype != "f32" else None, ())
            typed = self.b.op("cast", [lit.node, self.b.dtype(dtype)], dtype, ())
            if shape == ():
                return typed
            return self.b.op("broadcast", [typed.node, self.b.dims(shape)], dtype, shape)
        small = _broadcast_base(t, shape, None)
        v = self.b.input(name, dtype, small)
        self.values[self.b.input_name(v)] = broadcast_base_view(t, small)  # (an expanded one: its values once)
        return v if small == shape else self.b.op("broadcast", [v.node, self.b.dims(shape)], dtype, shape)

    def outputs(self, node: torch.fx.Node) -> None:
        results = node.args[0]
        results = results if isinstance(results, (list, tuple)) else [results]
        views = {}
        for i, r in enumerate(results):
            if r is None:
                continue
            view = self.view_output(i, r, results)
            if view is not None:
                views[i] = view
                continue
            if isinstance(r, torch.fx.Node) and r.name in self.static and isinstance(self.env[r.name], torch.Tensor):
                self.constants[i] = self.env[r.name]
                if r.name in self.seed_states:
                    self.seed_outputs[i] = self.seed_states[r.name]
                if r.name in self.dont_care:
                    self.dont_care_outputs.add(i)
                continue
            v = self.value(r) if isinstance(r, torch.fx.Node) else None
            if isinstance(v, _Padded):
                self.pads[i] = (v.length, v.fill)
                v = v.value
            elif isinstance(v, Value):
                v = self.broadcast_output(i, r, v)
            if not isinstance(v, Value):
                raise ExportError(f"output {i} is not a tensor the graph computes")
            self.output_names[i] = self.b.output(f"out{i}", v)
        bases: dict[str, str] = {}
        for i, (base, chain, layout) in views.items():
            if base.op == "placeholder":
                where = ("arg", self.positions[base.name])
            elif base in results and results.index(base) not in views:
                where = ("result", results.index(base))
            else:
                if base.name not in bases:
                    bases[base.name] = self.b.output(f"base_{base.name}", self.value(base))
                where = ("graph", bases[base.name])
            val = base.meta["val"]
            self.view_outputs[i] = ViewOf(where, chain, _static_shape(val, base), val.dtype, *layout)

    def view_output(self, i: int, r, results) -> tuple[torch.fx.Node, list, tuple] | None:
        """(base node, chain, its `view_of` layout) when output `i`, saved for the backward alone,
        is views of a tensor in memory anyway: an input, another output, or a product's result
        (a view that only reshapes or transposes may view any value the graph computes: writing
        its base costs what writing the view would). The output is then made from the base by PyTorch's view
        operators (`replay_views`), and no kernel copies it."""
        if not isinstance(r, torch.fx.Node):
            return None
        if self.free_layout_from is None or i < self.free_layout_from:
            return self.reshaped_output(r) if self.reshaped_outputs else None
        found = view_chain(r)
        if found is None:
            return None
        base, chain = found
        if base.name in self.static or base.name in self.views:
            return None
        if base.op == "placeholder":
            if self.positions.get(base.name) is None or not isinstance(self.env.get(base.name), Value):
                return None
        elif base.op != "call_function" or not isinstance(self.env.get(base.name), Value):
            return None
        elif any(_target_name(c) in _SHRINKING for c in chain) and base not in results \
                and _target_name(base) not in _ALWAYS_WRITTEN:
            return None
        val = base.meta.get("val")
        layout = view_of(chain, _static_shape(val, base), val.dtype) if isinstance(val, torch.Tensor) else None
        return (base, chain, layout) if layout is not None else None

    def reshaped_output(self, r: torch.fx.Node) -> tuple[torch.fx.Node, list, tuple] | None:
        """(base node, chain, layout) when output `r`, one the caller reads as traced, only
        reshapes (`_RESHAPES`) a contiguous value the graph computes into a contiguous tensor: a
        linear layer's product `[B * S, N]` viewed as `[B, S, N]`, as every model ending in a
        classifier or language-model head returns its logits. The view of the written base has
        the traced strides, so no kernel copies the base into the output (a copy of GPT-2's f32
        logits, `[8, 1024, 50257]`, moves 3.3 GB)."""
        found = view_chain(r)
        if found is None:
            return None
        base, chain = found
        if any(_target_name(c) not in _RESHAPES for c in chain) or base.op != "call_function":
            return None
        if base.name in self.static or base.name in self.views or not isinstance(self.env.get(base.name), Value):
            return None
        val, out = base.meta.get("val"), r.meta.get("val")
        if not isinstance(val, torch.Tensor) or not isinstance(out, torch.Tensor):
            return None
        try:
            if not (val.is_contiguous() and out.is_contiguous()):
                return None
        except Exception:  # noqa: BLE001 - a layout without strides
            return None
        layout = view_of(chain, _static_shape(val, base), val.dtype)
        return (base, chain, layout) if layout is not None else None

    def broadcast_output(self, i: int, node: torch.fx.Node, v: Value) -> Value:
        """Output `i` as the smaller value it is a broadcast of (`GraphBuilder.base`), along the
        axes where its layout is free: every axis of a tensor saved for the backward alone, the
        axes of stride 0 of any other (PyTorch's later graphs read it as traced). `v` itself
        when it is no broadcast there."""
        if self.free_layout_from is not None and i >= self.free_layout_from:
            free = set(range(v.rank))
        else:
            val = node.meta.get("val")
            try:
                stride = tuple(val.stride())
            except Exception:  # noqa: BLE001 - no tensor, or a layout without strides
                return v
            free = {d for d, st in enumerate(stride) if st == 0}
        least = self.b.base_shape(v)
        want = tuple(least[d] if d in free else v.shape[d] for d in range(v.rank))
        if math.prod(want) == v.numel:
            return v
        self.broadcast_outputs[i] = want
        return self.b.base(v, want)


class _Seeds:
    """The dropout sites of one graph and their seeds: site k reads element k of one i32 graph
    input, `eqfuse_seeds`, whose length is known once the export is done (`finish`)."""

    def __init__(self, b: GraphBuilder):
        self.b = b
        self.input: Value | None = None
        self.sites: dict[str, int] = {}

    def seed(self, site: str) -> Value:
        if self.input is None:
            self.input = self.b.input("eqfuse_seeds", "i32", (1,))
        k = self.sites.setdefault(site, len(self.sites))
        c = self.b.const
        return self.b.op("slice", [self.input.node, c(0).node, c(k).node, c(k + 1).node, c(1).node], "i32", (1,))

    def finish(self) -> str | None:
        """The seeds input's name, its shape set to the number of sites (None without sites)."""
        if self.input is None:
            return None
        name = self.b.input_name(self.input)
        for entry in self.b.inputs:
            if entry["name"] == name:
                entry["shape"] = [len(self.sites)]
        return name


SPLITS = ("split", "split_with_sizes")
"""Operators the exporter lowers with knowledge of their producer (`Exporter.split`)."""


def _last(node: torch.fx.Node) -> int | None:
    val = node.meta.get("val")
    return int(val.shape[-1]) if isinstance(val, torch.Tensor) and val.dim() else None


def _map_tensors(v: object, f) -> object:
    """`f` applied to a tensor, or to each tensor of a tuple or list."""
    if isinstance(v, torch.Tensor):
        return f(v)
    if isinstance(v, (tuple, list)):
        return type(v)(_map_tensors(x, f) for x in v)
    return v


def _fetch_attr(gm: torch.fx.GraphModule, target: str) -> torch.Tensor:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _foldable(node: torch.fx.Node) -> bool:
    """Whether a node with only static inputs may be evaluated at export time: not random, not
    in place, and producing tensors."""
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return not t._schema.is_mutable and "rand" not in t.__name__ and "dropout" not in t.__name__ and "empty" not in t.__name__
    return t is operator.getitem


def _broadcast_base(val: torch.Tensor, shape: tuple[int, ...], known: tuple[int, ...] | None) -> tuple[int, ...]:
    """The shape of which a placeholder's tensor is a broadcast: size 1 along its axes of stride
    0, and along those where `known` (the shape a forward returned it as a broadcast of) has 1."""
    try:
        stride = tuple(val.stride())
    except Exception:  # noqa: BLE001 - a layout without strides
        stride = (1,) * len(shape)
    if known is not None and (len(known) != len(shape) or any(k not in (1, n) for k, n in zip(known, shape))):
        known = None
    return tuple(1 if st == 0 or (known is not None and known[d] == 1) else n
                 for d, (n, st) in enumerate(zip(shape, stride)))


def broadcast_base_view(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The view of `t` at index 0 along the axes where `shape` has size 1 and `t` does not: the
    tensor `t` is a broadcast of (`Exported.broadcast_inputs`), read in place. `t` itself when
    its rank differs (the plan then says what it needs)."""
    if t.dim() != len(shape):
        return t
    return t[tuple(slice(0, 1) if s == 1 and n != 1 else slice(None) for s, n in zip(shape, t.shape))]


_VIEW_OPS = frozenset({"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "unsqueeze", "squeeze",
                       "alias", "slice", "select", "narrow"})
"""ATen operators whose result is a view of their one tensor argument (no element copied)."""

_PART_OPS = frozenset({"split", "split_with_sizes", "unbind"})
"""Operators returning a tuple of views of their tensor argument (taken by `getitem`)."""

_SHRINKING = frozenset({"slice", "select", "narrow", "getitem"})

_RESHAPES = frozenset({"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "alias"})
"""View operators that keep a contiguous tensor's elements in place (a contiguous result)."""

_ALWAYS_WRITTEN = frozenset({"mm", "addmm", "bmm", "linear"})
"""Operators whose result every plan writes to memory (a product's output is never fused into
its consumer), so a view of it costs no extra write."""


@dataclass
class ViewOf:
    """A tensor that is a chain of views (`_VIEW_OPS`, parts of splits) of a base tensor."""

    base: tuple
    """Where the base is, for a view output: ("arg", placeholder position), ("result", output
    position) or ("graph", graph output name)."""
    chain: list
    """The fx nodes from the base to the view, in order (the first one's tensor argument is the
    base's node)."""
    shape: tuple[int, ...]
    """The base's shape."""
    dtype: torch.dtype
    offset: int
    """The view's element offset in a contiguous base (what `view_base` inverts)."""
    view_shape: tuple[int, ...] = ()
    view_stride: tuple[int, ...] = ()
    """The view's shape and strides on a contiguous base (so that each call makes or checks it
    with one `as_strided`, not the chain)."""

    @cached_property
    def base_layout(self) -> tuple[int, tuple[int, ...]]:
        """(elements, strides) of the contiguous base."""
        return math.prod(self.shape), tuple(math.prod(self.shape[d + 1:]) for d in range(len(self.shape)))

    def of(self, base: torch.Tensor) -> torch.Tensor:
        """The view of `base`: `as_strided` on a contiguous one, else the chain replayed."""
        if base.dtype != self.dtype:
            base = base.to(self.dtype)
        if base.is_contiguous() and tuple(base.shape) == self.shape:
            return base.as_strided(self.view_shape, self.view_stride, base.storage_offset() + self.offset)
        return replay_views(base, self.chain)


def replay_views(base: torch.Tensor, chain: list, copies: bool = True) -> torch.Tensor:
    """`chain` (`ViewOf.chain`) applied to `base` with PyTorch's own operators: the same view
    the traced graph made. With `copies`, a reshape the base's layout cannot view is a copy
    instead; without, it raises (RuntimeError)."""
    env = {chain[0].args[0].name: base}
    for node in chain:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n.name])
        try:
            env[node.name] = node.target(*args, **kwargs)
        except (RuntimeError, ValueError):
            if not copies or _target_name(node) not in ("view", "_unsafe_view"):
                raise
            env[node.name] = args[0].reshape(args[1])
    return env[chain[-1].name]


def view_base(a: torch.Tensor, view: ViewOf) -> torch.Tensor | None:
    """The contiguous base of which `a` is `view` (in `a`'s storage), or None when `a` is not
    that view of one (a forward run eagerly may lay its saved tensors out otherwise)."""
    if a.dtype != view.dtype or a.shape != view.view_shape:
        return None
    stride = a.stride()
    if stride != view.view_stride and any(n > 1 and x != y for n, x, y in zip(view.view_shape, stride, view.view_stride)):
        return None
    start = a.storage_offset() - view.offset
    numel, base_stride = view.base_layout
    if start < 0 or (start + numel) * a.element_size() > a.untyped_storage().nbytes():
        return None
    return a.as_strided(view.shape, base_stride, start)


def view_of(chain: list, shape: tuple[int, ...], dtype: torch.dtype) -> tuple | None:
    """(offset, shape, strides) of `chain`'s view of a contiguous base of `shape` (None when
    the chain does not view it without a copy)."""
    try:
        v = replay_views(torch.empty(shape, dtype=dtype, device="meta"), chain, copies=False)
    except (RuntimeError, ValueError):
        return None
    return v.storage_offset(), tuple(v.shape), tuple(v.stride())


def view_chain(node: torch.fx.Node) -> tuple[torch.fx.Node, list] | None:
    """(base node, chain) when `node` is views (`_VIEW_OPS`, parts of splits) of another node,
    each step reading only the one before it; None otherwise."""
    chain, n = [], node
    while n.op == "call_function":
        name = _target_name(n)
        src = n.args[0] if n.args else None
        if not isinstance(src, torch.fx.Node) or n.all_input_nodes != [src]:
            break
        if name in _VIEW_OPS:
            chain.append(n)
            n = src
        elif name == "getitem" and src.op == "call_function" and _target_name(src) in _PART_OPS \
                and isinstance(src.args[0], torch.fx.Node) and src.all_input_nodes == [src.args[0]]:
            chain += [n, src]
            n = src.args[0]
        else:
            break
    if not chain:
        return None
    chain.reverse()
    return n, chain


def _static_shape(val: torch.Tensor, node: torch.fx.Node) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in val.shape)
    except (TypeError, ValueError):
        raise ExportError(f"{node.name} has a symbolic shape {tuple(val.shape)}; export with static shapes")


class Lowering:
    """Helpers for lowering one node: typed pointwise application, views, reductions. Every
    helper computes the result's dtype and shape as eqfuse will, so that lowerings compose."""

    def __init__(self, b: GraphBuilder, node: torch.fx.Node, values: dict[str, torch.Tensor] | None = None,
                 seeds: "_Seeds | None" = None):
        self.b = b
        self.node = node
        self.values = values if values is not None else {}
        """The values of inputs the export knows (parameters, folded constants), by input name."""
        self.seeds = seeds if seeds is not None else _Seeds(b)
        """The graph's dropout sites (`seed()` gives this node's seed)."""

    def seed(self) -> Value:
        """This node's dropout seed: an i32 `[1]` element of the graph's seeds input."""
        return self.seeds.seed(self.node.name)

    # --- the node's own result type, from PyTorch's metadata

    def out_dtype(self) -> str:
        val = self.node.meta.get("val")
        if isinstance(val, (list, tuple)):
            val = val[0]
        if not isinstance(val, torch.Tensor):
            raise ExportError("no tensor metadata (meta['val'])")
        return dtype_name(val.dtype)

    def out_shape(self) -> tuple[int, ...]:
        val = self.node.meta.get("val")
        return _static_shape(val, self.node)

    # --- values

    def lit(self, x: float) -> Value:
        """A literal. eqfuse literals are finite, so an infinity (a mask's `-inf`) becomes the
        largest finite value of the node's float dtype: the same after `exp`, `max` or `softmax`
        unless a whole row is masked."""
        if math.isinf(x):
            dtype = self.out_dtype() if self.node.meta.get("val") is not None else "f32"
            big = torch.finfo(_torch_dtype(dtype if dtype in ("f32", "f16", "bf16") else "f32")).max
            x = math.copysign(big, x)
        return self.b.const(x)

    def val(self, x: object) -> Value:
        """A tensor argument, or a Python number as a literal."""
        if isinstance(x, Value):
            return x
        if isinstance(x, (bool, int, float)):
            return self.lit(float(x))
        raise ExportError(f"argument {x!r} is not a tensor or a number")

    def cast(self, v: Value, dtype: str) -> Value:
        """`v` converted to `dtype` (a literal becomes a typed scalar)."""
        if v.dtype == dtype:
            return v
        return self.b.op("cast", [v.node, self.b.dtype(dtype)], dtype, v.shape)

    def apply(self, op: str, *args: Value, dtype: str | None = None) -> Value:
        """A pointwise operator; the result dtype is the first strong operand's unless given."""
        shape = broadcast_shapes(*(a.shape for a in args))
        if dtype is None:
            strong = [a.dtype for a in args if not a.weak]
            dtype = strong[0] if strong else None
        return self.b.op(op, [a.node for a in args], dtype, shape)

    def pointwise(self, op: str, *args: object) -> Value:
        """A pointwise operator with PyTorch's type promotion: strong operands are cast to the
        node's result dtype first (so `i32_tensor * 0.5` computes in f32, as PyTorch does)."""
        dtype = self.out_dtype()
        vals = [self.val(a) for a in args]
        vals = [v if v.weak else self.cast(v, dtype) for v in vals]
        if all(v.weak for v in vals):
            vals[0] = self.cast(vals[0], dtype)
        if dtype == "bool" and op in _BOOL_ARITHMETIC and len(vals) == 2:
            # PyTorch's arithmetic of booleans is logic (`isfinite` decomposes to `a * b`).
            return _BOOL_ARITHMETIC[op](self, self.cast(vals[0], "bool"), self.cast(vals[1], "bool"))
        return self.apply(op, *vals, dtype=dtype)

    def compare(self, op: str, a: object, b: object) -> Value:
        """A comparison with PyTorch's promotion: tensors of two dtypes meet in their common one,
        and an integer tensor compared with a fractional number is compared as f32. A comparison
        with an infinite number holds values at f32's largest finite value or beyond infinite
        (`_against_infinity`): eqfuse's literals are finite, an infinity exported as that value."""
        if isinstance(a, float) and math.isinf(a) and not (isinstance(b, float) and math.isinf(b)):
            return self.compare(_FLIPPED[op], b, a)
        if isinstance(b, float) and math.isinf(b):
            return _against_infinity(self, op, self.val(a), b > 0)
        va, vb = self.val(a), self.val(b)
        if not va.weak and not vb.weak and va.dtype != vb.dtype:
            common = dtype_name(torch.promote_types(_torch_dtype(va.dtype), _torch_dtype(vb.dtype)))
            va, vb = self.cast(va, common), self.cast(vb, common)
        fractional = any(isinstance(x, float) and not x.is_integer() for x in (a, b))
        if fractional:
            va = va if va.weak or va.dtype not in ("i32", "bool") else self.cast(va, "f32")
            vb = vb if vb.weak or vb.dtype not in ("i32", "bool") else self.cast(vb, "f32")
        return self.apply(op, va, vb, dtype="bool")

    def reshape(self, v: Value, shape: tuple[int, ...]) -> Value:
        shape = tuple(int(d) for d in shape)
        if v.shape == shape and not v.weak:
            return v
        if math.prod(shape) != v.numel:
            raise ExportError(f"cannot reshape {list(v.shape)} to {list(shape)}")
        return self.b.op("reshape", [v.node, self.b.dims(shape)], v.dtype or "f32", shape)

    def broadcast(self, v: Value, shape: tuple[int, ...]) -> Value:
        shape = tuple(int(d) for d in shape)
        if v.shape == shape and not v.weak:
            return v
        if broadcast_shapes(v.shape, shape) != shape:
            raise ExportError(f"cannot broadcast {list(v.shape)} to {list(shape)}")
        return self.b.op("broadcast", [v.node, self.b.dims(shape)], v.dtype or "f32", shape)

    def axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < max(rank, 1):
            raise ExportError(f"axis {axis} is out of range for rank {rank}")
        return axis % rank if rank else 0

    def axis_lit(self, axis: int, rank: int) -> int:
        """An axis attribute: -1 for the last axis (the spelling eqfuse's rules use)."""
        return self.lit(-1 if axis == rank - 1 else axis).node

    def swap(self, v: Value, a: int, c: int) -> Value:
        shape = list(v.shape)
        shape[a], shape[c] = shape[c], shape[a]
        return self.b.op("transpose", [v.node, self.axis_lit(a, v.rank), self.axis_lit(c, v.rank)], v.dtype, tuple(shape))

    def permute(self, v: Value, perm: list[int]) -> Value:
        perm = [self.axis(p, v.rank) for p in perm]
        if sorted(perm) != list(range(v.rank)):
            raise ExportError(f"{perm} is not a permutation")
        order = list(range(v.rank))
        for i, want in enumerate(perm):
            j = order.index(want)
            if j != i:
                v = self.swap(v, i, j)
                order[i], order[j] = order[j], order[i]
        return v

    def reduce(self, op: str, v: Value, dims: object, keepdim: bool) -> Value:
        """A reduction over several axes (None or [] is all), as a chain of one-axis ones. The
        largest or smallest of integers or booleans is taken in f32 (exact below 2^24) and
        cast back: generated reductions are of floats."""
        if op in ("amax", "amin") and v.dtype in ("i32", "bool"):
            return self.cast(self.reduce(op, self.cast(v, "f32"), dims, keepdim), v.dtype)
        if isinstance(dims, int):
            dims = [dims]
        axes = sorted({self.axis(d, v.rank) for d in dims}) if dims else list(range(v.rank))
        shape = list(v.shape)
        for a in axes:
            shape[a] = 1
            v = self.b.op(op, [v.node, self.axis_lit(a, v.rank)], v.dtype, tuple(shape))
        if not keepdim:
            v = self.reshape(v, tuple(d for i, d in enumerate(shape) if i not in axes))
        return v

    def matmul(self, a: Value, c: Value) -> Value:
        """NumPy matmul; a 1-D operand gains an axis for the product and loses it after."""
        if a.rank == 0 or c.rank == 0:
            raise ExportError("matmul of a scalar")
        a2 = self.reshape(a, (1,) + a.shape) if a.rank == 1 else a
        c2 = self.reshape(c, c.shape + (1,)) if c.rank == 1 else c
        batch = broadcast_shapes(a2.shape[:-2], c2.shape[:-2])
        if a2.shape[-1] != c2.shape[-2]:
            raise ExportError(f"inner sizes differ: {list(a.shape)} @ {list(c.shape)}")
        y = self.b.op("@", [a2.node, c2.node], a.dtype, batch + (a2.shape[-2], c2.shape[-1]))
        shape = list(y.shape)
        if c.rank == 1:
            shape.pop()
        if a.rank == 1:
            shape.pop(-1 if c.rank == 1 else -2)
        return self.reshape(y, tuple(shape))

    def full(self, x: float, dtype: str, shape: tuple[int, ...]) -> Value:
        lit = self.cast(self.lit(x), dtype)
        return self.broadcast(lit, shape) if shape else lit

    def known_bool(self, v: Value) -> bool | None:
        """Whether every element of a bool `v` is true (or false), where `v` is a literal
        broadcast or cast to bool (`torch.ones(..., dtype=bool)`, a mask function's `True`);
        None where it is not known."""
        node = self.b.nodes[v.node]
        while node["op"] in ("broadcast", "reshape") or (node["op"] == "cast" and v.dtype == "bool"):
            node = self.b.nodes[node["args"][0]]
        if node["op"] == "const" and v.dtype == "bool":
            return node["value"] != 0
        return None

    def select_known(self, c: Value, a: Value, b: Value, dtype: str) -> Value | None:
        """`where(c, a, b)` where `c` is known all true or all false: `a` or `b` broadcast to the
        result's shape (a view a kernel reads in place, where the `where` would be a tensor of
        the full shape: a padding mask `[B, 1, 1, S]` combined with a constant `True` of shape
        `[1, 1, S, 1]` stays a mask by key); None where `c` is not known."""
        known = self.known_bool(c)
        if known is None:
            return None
        pick = a if known else b
        shape = broadcast_shapes(c.shape, a.shape, b.shape)
        return self.broadcast(self.cast(pick, dtype), shape)


def _torch_dtype(name: str) -> torch.dtype:
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "i32": torch.int32, "bool": torch.bool}[name]


# ---------------------------------------------------------------------------------------------
# The lowerings: ATen operator packet name -> function(Lowering, *args, **kwargs).


def _scaled(L: Lowering, v: object, alpha: float) -> object:
    return v if alpha == 1 else L.pointwise("*", v, alpha)


def _unary(op):
    return lambda L, x, *rest, **kw: L.pointwise(op, x)


def _and(L, a, b):
    """`a and b` of booleans (`logical_and`'s lowering)."""
    return _logical("and")(L, a, b)


def _or(L, a, b):
    """`a or b` of booleans (`logical_or`'s lowering)."""
    return _logical("or")(L, a, b)


_BOOL_ARITHMETIC = {"*": _and, "+": _or, "max": _or, "min": _and}
"""Arithmetic of booleans as PyTorch computes it: logic."""

_FLIPPED = {"==": "==", "!=": "!=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
"""`a op b` as `b FLIPPED[op] a`."""


def _against_infinity(L, op: str, x, positive: bool):
    """`x op inf` (`-inf` unless `positive`) with literals that are finite: `x`, in f32 (16-bit
    floats are exact there, their infinities too), is infinite where it reaches f32's largest
    finite value `top`, the value an infinite literal is exported as (`Lowering.lit`: a mask
    filled with `-inf` holds `-top`, and compares equal to `-inf` as in PyTorch); NaN compares
    false with all but `!=`."""
    if x.dtype in ("i32", "bool"):
        # Integers are finite: `n < inf` and `n > -inf` hold, as `!=` does; the rest do not.
        holds = op == "!=" or (op in ("<", "<=") and positive) or (op in (">", ">=") and not positive)
        return L.full(1.0 if holds else 0.0, "bool", x.shape)
    xf = L.cast(x, "f32")
    top = float(torch.finfo(torch.float32).max)
    if not positive:  # x op -inf  is  (-x) flipped-op inf
        return _against_infinity(L, _FLIPPED[op], L.apply("neg", xf, dtype="f32"), True)
    beyond = L.apply(">=", xf, L.lit(top), dtype="bool")  # x is +inf
    number = L.apply("==", xf, xf, dtype="bool")  # x is not NaN
    if op == "==" or op == ">=":
        return beyond
    if op == "!=":
        return L.apply("not", beyond, dtype="bool")
    if op == "<":
        return L.apply("<", xf, L.lit(top), dtype="bool")
    if op == "<=":
        return number
    return L.full(0.0, "bool", x.shape)  # x > inf


def _binary(op):
    return lambda L, a, b, **kw: L.pointwise(op, a, b)


def _cmp(op):
    return lambda L, a, b: L.compare(op, a, b)


def _nothing(L, *args, **kw):
    """Run-time assertions on metadata, which the export has already checked by tracing."""
    return None


def _identity(L, x, *rest, **kw):
    return x


class _Complex:
    """A complex tensor as its real and imaginary parts, two f32 values of one shape (`im` None
    where it is zero: a real tensor converted). eqfuse holds no complex dtype; complex tensors
    live only between a conversion of a real tensor and `view_as_real` (FNet's Fourier mixing),
    and any other use is an error naming the node."""

    def __init__(self, re: Value, im: Value | None):
        self.re, self.im = re, im

    @property
    def shape(self):
        return self.re.shape


def _complex_meta(L) -> bool:
    val = L.node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.is_complex()


def _cast(L, x, *rest, **kw):
    if _complex_meta(L):
        if isinstance(x, _Complex):
            return x
        v = L.val(x)
        if v.dtype not in ("f32", "f16", "bf16"):
            raise ExportError(f"conversion of {v.dtype} to a complex dtype")
        return _Complex(L.cast(v, "f32"), None)
    if isinstance(x, _Complex):
        raise ExportError("conversion of a complex tensor (real part only: view_as_real)")
    return L.cast(L.val(x), L.out_dtype())


def _dft_matrices(L, n: int, forward: bool, scale: float) -> tuple[Value, Value]:
    """The cosine and sine parts of the `n`-point discrete Fourier transform's matrix,
    `scale * cos(2 pi jk / n)` and `scale * sin(...)` (sign for the direction applied by the
    caller), computed in f64 and given to the graph as f32 inputs with values."""
    k = torch.arange(n, dtype=torch.float64)
    angle = 2 * math.pi * torch.remainder(torch.outer(k, k), n) / n
    out = []
    for part, t in (("cos", torch.cos(angle)), ("sin", torch.sin(angle))):
        v = L.b.input(f"{L.node.name}_{part}{n}", "f32", (n, n))
        L.values[L.b.input_name(v)] = (t * scale).to(torch.float32)
        out.append(v)
    return out[0], out[1]


def _fft_c2c(L, x, dim, normalization, forward):
    """`torch.fft.fftn`/`ifftn` of a complex tensor (`_fft_c2c`) along `dim`: each axis's
    transform a product with the discrete Fourier matrix's cosine and sine parts (`_dft_matrices`)
    on the real and imaginary parts, `(C re + S im) + i (C im - S re)` forward, the signs of
    `S` flipped for the inverse; `normalization` 0 none, 1 by `1/sqrt(n)`, 2 by `1/n` an axis. A
    product, not a fast transform: exact up to rounding (the FFT's rounding differs), quadratic
    in the axis' length."""
    if not isinstance(x, _Complex):
        raise ExportError("_fft_c2c of a tensor that is not complex")
    re, im = x.re, x.im
    for d in dim:
        a = L.axis(d, re.rank)
        n = re.shape[a]
        scale = {0: 1.0, 1: 1.0 / math.sqrt(n), 2: 1.0 / n}[int(normalization)]
        c, s = _dft_matrices(L, n, forward, scale)
        last = re.rank - 1

        def along(v, m, a=a, last=last):
            # v's axis a contracted with m (symmetric): moved last, multiplied, moved back.
            t = L.swap(v, a, last) if a != last else v
            y = L.matmul(t, m)
            return L.swap(y, a, last) if a != last else y

        cre, sre = along(re, c), along(re, s)
        if im is None:
            new_re, new_im = cre, L.apply("neg", sre) if forward else sre
        else:
            cim, sim = along(im, c), along(im, s)
            if forward:
                new_re, new_im = L.apply("+", cre, sim), L.apply("-", cim, sre)
            else:
                new_re, new_im = L.apply("-", cre, sim), L.apply("+", cim, sre)
        re, im = new_re, new_im
    return _Complex(re, im)


def _view_as_real(L, x):
    """`view_as_real` of a complex tensor (`_Complex`): its parts stacked on a last axis of 2."""
    if not isinstance(x, _Complex):
        raise ExportError("view_as_real of a tensor that is not complex")
    im = x.im if x.im is not None else L.full(0.0, "f32", x.re.shape)
    shape = x.re.shape + (1,)
    return L.cast(_concat(L, [L.reshape(x.re, shape), L.reshape(im, shape)], len(shape) - 1, "f32"), L.out_dtype())


def _view_as_complex(L, x):
    """`view_as_complex` of a real `[..., 2]` tensor: its two parts (`_Complex`)."""
    v = L.val(x)
    if v.rank == 0 or v.shape[-1] != 2:
        raise ExportError(f"view_as_complex of {list(v.shape)} (a last axis of 2 expected)")
    a = v.rank - 1
    part = [L.reshape(_slice(L, v, a, i, i + 1, 1), v.shape[:-1]) for i in range(2)]
    return _Complex(L.cast(part[0], "f32"), L.cast(part[1], "f32"))


def _real(L, x):
    """`torch.real` of a complex tensor: its real part."""
    if not isinstance(x, _Complex):
        return L.val(x)
    return x.re


def _div(L, a, b, rounding_mode=None):
    """`a / b`; with `rounding_mode` `trunc` or `floor` (`//`), the quotient rounded so: of
    floats by `trunc`/`floor` of the quotient, of integers from eqfuse's truncating `i32`
    division, one less where the remainder is nonzero and of the other sign than `b`."""
    if rounding_mode is None:
        return L.pointwise("/", a, b)
    if rounding_mode not in ("trunc", "floor"):
        raise ExportError(f"division with rounding_mode={rounding_mode!r}")
    q = L.pointwise("/", a, b)
    if q.dtype != "i32":
        return L.apply(rounding_mode, q, dtype=q.dtype)
    if rounding_mode == "trunc":
        return q
    va, vb = L.cast(L.val(a), "i32"), L.cast(L.val(b), "i32")
    r = L.apply("-", va, L.apply("*", q, vb, dtype="i32"), dtype="i32")
    return L.apply("where", _other_sign(L, r, vb), L.apply("-", q, L.cast(L.lit(1), "i32"), dtype="i32"), q,
                   dtype="i32")


def _other_sign(L, r, b):
    """Where `r` is nonzero and of the other sign than `b` (bool)."""
    return _and(L, L.compare("!=", r, 0), L.apply("!=", L.compare("<", r, 0), L.compare("<", b, 0), dtype="bool"))


def _rounding(op):
    """`floor`, `ceil`, `round` (halves to even; `decimals` digits: scaled, rounded, scaled
    back, as PyTorch computes it), `trunc`: of integers, the integers themselves."""

    def lower(L, x, decimals=0):
        x = L.val(x)
        if x.dtype in ("i32", "bool"):
            return x
        if decimals:
            scale = 10.0 ** decimals
            return L.apply("/", L.apply("round", L.apply("*", x, L.lit(scale))), L.lit(scale), dtype=x.dtype)
        return L.apply(op, x, dtype=x.dtype)

    return lower


def _remainder(python):
    """`remainder` (`python`: the sign of the divisor, as Python's `%`) and `fmod` (the sign of
    the dividend): `a - q b` with `q` the quotient floored or truncated."""

    def lower(L, a, b):
        q = _div(L, a, b, "floor" if python else "trunc")
        dtype = L.out_dtype()
        return L.apply("-", L.cast(L.val(a), dtype), L.apply("*", q, L.cast(L.val(b), dtype), dtype=dtype), dtype=dtype)

    return lower


def _gelu(L, x, approximate="none"):
    return L.pointwise({"none": "gelu", "tanh": "gelu_tanh"}[approximate], x)


def _clamp(L, x, min=None, max=None):
    y = x
    if min is not None:
        y = L.pointwise("max", y, min)
    if max is not None:
        y = L.pointwise("min", y, max)
    return y


def _sum(L, x, dim=None, keepdim=False, dtype=None):
    out = L.out_dtype()
    if out == "i32" and isinstance(x, Value) and x.dtype == "bool" and x.numel <= 1 << 24:
        # A count (of tokens not ignored, say): summed in f32, exact below 2^24 terms, as the
        # kernels reduce floats.
        return L.cast(L.reduce("sum", L.cast(x, "f32"), dim, keepdim), "i32")
    x = L.cast(x, out)
    return L.reduce("sum", x, dim, keepdim)


def _mean(L, x, dim=None, keepdim=False, dtype=None):
    x = L.cast(x, L.out_dtype())
    return L.reduce("mean", x, dim, keepdim)


def _amax(L, x, dim=(), keepdim=False):
    return L.reduce("amax", x, dim, keepdim)


def _amin(L, x, dim=(), keepdim=False):
    return L.reduce("amin", x, dim, keepdim)


def _var_mean(L, x, dim=None, *, correction=1, keepdim=False):
    mu = L.reduce("mean", x, dim, True)
    xc = L.apply("-", x, mu)
    var = L.reduce("mean", L.apply("*", xc, xc), dim, True)
    n = x.numel // mu.numel
    if correction:
        var = L.apply("*", var, L.lit(n / (n - correction)))
    if not keepdim:
        shape = L.out_shape()
        var, mu = L.reshape(var, shape), L.reshape(mu, shape)
    return (var, mu)


def _var(L, x, dim=None, *, correction=1, keepdim=False):
    return _var_mean(L, x, dim, correction=correction, keepdim=keepdim)[0]


def _softmax(op):
    def lower(L, x, dim, *rest, **kw):
        x = L.cast(x, L.out_dtype())
        return L.b.op(op, [x.node, L.axis_lit(L.axis(dim, x.rank), x.rank)], x.dtype, x.shape)

    return lower


def _layer_norm_parts(L, x, normalized_shape, weight, bias, eps):
    """layernorm over the trailing axes `normalized_shape`, flattened into one when several."""
    k = len(normalized_shape)
    lead, row = x.shape[: x.rank - k], math.prod(normalized_shape)
    x2 = L.reshape(x, lead + (row,))
    params = []
    for p, fill in ((weight, 1.0), (bias, 0.0)):
        if p is None:
            params.append(L.full(fill, x.dtype, ()))
        else:
            params.append(L.reshape(L.broadcast(p, tuple(normalized_shape)), (row,)) if k > 1 else p)
    y = L.b.op("layernorm", [x2.node, params[0].node, params[1].node, L.lit(eps).node], x.dtype, x2.shape)
    return L.reshape(y, x.shape), x2, lead


def _layer_norm(L, x, normalized_shape, weight=None, bias=None, eps=1e-5, *rest, **kw):
    return _layer_norm_parts(L, x, normalized_shape, weight, bias, eps)[0]


def _native_layer_norm(L, x, normalized_shape, weight, bias, eps):
    """(y, mean, rstd), mean and rstd with the normalised axes kept as size 1."""
    y, x2, lead = _layer_norm_parts(L, x, normalized_shape, weight, bias, eps)
    stat_shape = lead + (1,) * len(normalized_shape)
    mu = L.reduce("mean", x2, [-1], True)
    xc = L.apply("-", x2, mu)
    var = L.reduce("mean", L.apply("*", xc, xc), [-1], True)
    rstd = L.apply("rsqrt", L.apply("+", var, L.lit(eps)))
    return (y, L.reshape(mu, stat_shape), L.reshape(rstd, stat_shape))


def _dense(L, x, w, b=None):
    """`aten.linear`: `x @ w^T + b`."""
    y = L.matmul(x, L.swap(w, 0, 1) if w.rank == 2 else w)
    return y if b is None else L.apply("+", y, b)


def _addmm(L, bias, a, c, *, beta=1, alpha=1):
    y = _scaled(L, L.matmul(a, c), alpha)
    return L.pointwise("+", y, _scaled(L, bias, beta)) if beta != 0 else y


def _matmul(L, a, c):
    return L.matmul(a, c)


def _transpose(L, x, a, c):
    if x.rank < 2:
        return x
    return L.swap(x, L.axis(a, x.rank), L.axis(c, x.rank))


def _t(L, x):
    return L.swap(x, 0, 1) if x.rank == 2 else x


def _permute(L, x, dims):
    return L.permute(x, list(dims))


def _view(L, x, shape, *rest):
    return L.reshape(x, L.out_shape())


def _expand(L, x, sizes, *rest, **kw):
    return L.broadcast(x, L.out_shape())


def _strided_positions(L, x, size, stride, storage_offset):
    """The flat positions in a contiguous `x` of `as_strided(size, stride, offset)`'s elements:
    (start, whether they are the output's own contiguous order from `start`: axes of one element
    take any stride, whether no two elements share a position), checked from the sizes alone
    (no tensor is made: the backend exports under fake tensors). Functionalization replays a
    view of a view as one `as_strided` (Swin's restride of a pooled `[B, C, 1, 1]`). An `x`
    that is not contiguous (its storage is not the order eqfuse holds it in), a negative
    stride, or positions outside it, are refused. An `x` laid out densely in another order of
    its axes (a transposed tensor: Longformer chunks a head-major view so) is read in that
    order (`_storage_order`): the positions are in it."""
    meta = L.node.args[0].meta.get("val") if isinstance(L.node.args[0], torch.fx.Node) else None
    if not isinstance(meta, torch.Tensor) or _storage_order(meta) is None:
        raise ExportError("as_strided of a tensor that is not dense (its storage order is unknown)")
    size = [int(d) for d in size]
    stride = [int(d) for d in stride]
    base = meta.storage_offset()
    start = (int(storage_offset) if storage_offset is not None else base) - base
    if any(st < 0 for st in stride):
        raise ExportError(f"as_strided with a negative stride {stride}")
    last = start + sum((n - 1) * st for n, st in zip(size, stride))
    if math.prod(size) and (start < 0 or last >= max(x.numel, 1)):
        raise ExportError(f"as_strided {size} {stride} at {start} reaches outside a tensor of {x.numel} elements")
    own = [math.prod(size[k + 1:]) for k in range(len(size))]
    contiguous = all(n == 1 or st == o for n, st, o in zip(size, stride, own))
    # Distinct where each axis (by stride) steps past everything the finer axes reach.
    reach, distinct = 0, True
    for n, st in sorted(((n, st) for n, st in zip(size, stride) if n > 1), key=lambda p: p[1]):
        distinct = distinct and st > reach
        reach += (n - 1) * st
    return start, contiguous, distinct


def _storage_order(meta: torch.Tensor) -> list[int] | None:
    """The axes of `meta` from outermost to innermost in memory, where its elements fill a
    block of storage without gaps or overlaps (a contiguous tensor: `0, 1, ...`; a transposed
    one: the axes by decreasing stride); None otherwise. Axes of one element stay in place."""
    shape, stride = tuple(meta.shape), tuple(meta.stride())
    if meta.is_contiguous():
        return list(range(len(shape)))
    axes = [a for a in range(len(shape)) if shape[a] != 1]
    order = sorted(axes, key=lambda a: -stride[a])
    expect = 1
    for a in reversed(order):
        if stride[a] != expect:
            return None
        expect *= shape[a]
    ones = [a for a in range(len(shape)) if shape[a] == 1]
    return ones + order


def _in_storage_order(L, v: Value, meta: torch.Tensor) -> Value:
    """`v` flattened in the order its elements lie in memory (`_storage_order` of its traced
    tensor `meta`): the storage `as_strided` positions count in."""
    order = _storage_order(meta)
    if order != list(range(v.rank)):
        v = L.permute(v, order)
    return L.reshape(v, (v.numel,))


def _from_storage_order(L, flat: Value, meta: torch.Tensor) -> Value:
    """The inverse of `_in_storage_order`: the tensor of `meta`'s shape and layout whose memory
    holds `flat`."""
    order = _storage_order(meta)
    shape = tuple(meta.shape)
    v = L.reshape(flat, tuple(shape[a] for a in order))
    if order != list(range(len(shape))):
        v = L.permute(v, [order.index(a) for a in range(len(shape))])
    return v


def _position_tensor(L, size, stride, start):
    """`start + sum(iota_k * stride_k)` over the axes of `size`, an i32 tensor of that shape."""
    coords = [L.reshape(_iota(L, n), tuple(n if j == k else 1 for j in range(len(size))))
              for k, n in enumerate(size) if n > 1 and stride[k] != 0]
    strides = [int(st) for n, st in zip(size, stride) if n > 1 and st != 0]
    pos = _linear(L, coords, strides) if coords else L.cast(L.lit(0), "i32")
    if start:
        pos = L.apply("+", pos, L.cast(L.lit(start), "i32"), dtype="i32")
    return L.broadcast(L.reshape(pos, (1,) * (len(size) - pos.rank) + tuple(pos.shape)), tuple(size))


def _as_strided(L, x, size, stride, storage_offset=None):
    """`x.as_strided(size, stride, offset)` over a contiguous `x` (`_strided_positions`): a
    reshape (or a slice of the flattened `x`) where the elements are in the output's own order,
    a gather from the flattened `x` at their positions otherwise."""
    v = L.val(x)
    out = L.out_shape()
    if v.numel == 0 or math.prod(out) == 0:
        return L.full(0.0, v.dtype, out)
    start, contiguous, _ = _strided_positions(L, v, size, stride, storage_offset)
    flat = _in_storage_order(L, v, L.node.args[0].meta["val"])
    if contiguous:
        n = math.prod(out)
        return L.reshape(flat if n == v.numel else _slice(L, flat, 0, start, start + n, 1), out)
    return L.reshape(_gather(L, flat, _position_tensor(L, size, stride, start), 0), out)


def _as_strided_scatter(L, x, src, size, stride, storage_offset=None):
    """`as_strided_scatter` (the backward of `as_strided`): a contiguous `x` with the elements
    `as_strided(size, stride, offset)` views replaced by `src`'s. A `slice_scatter` of the
    flattened tensors where they are in order; otherwise `src` added at its positions into
    zeros, kept where a position was written (each is written once: positions that repeat, as
    a broadcast's stride 0 does, are refused)."""
    v, w = L.val(x), L.val(src)
    if v.numel == 0 or w.numel == 0:
        return v
    start, contiguous, distinct = _strided_positions(L, v, size, stride, storage_offset)
    meta = L.node.args[0].meta["val"]
    out = L.node.meta.get("val")
    if not isinstance(out, torch.Tensor) or _storage_order(out) != _storage_order(meta):
        raise ExportError("as_strided_scatter whose result is laid out unlike its input")
    flat = _in_storage_order(L, v, meta)
    vals = L.reshape(L.cast(w, v.dtype), (w.numel,))
    if contiguous:
        return _from_storage_order(L, _slice_scatter(L, flat, vals, 0, start, start + w.numel, 1), meta)
    if not distinct:
        raise ExportError("as_strided_scatter whose positions repeat (the result is not defined)")
    at = L.reshape(_position_tensor(L, size, stride, start), (w.numel,))
    added = _scatter_add(L, at, vals, 0, v.numel)
    hit = L.compare(">", _scatter_add(L, at, L.full(1.0, "f32", (w.numel,)), 0, v.numel), 0)
    return _from_storage_order(L, L.apply("where", hit, added, flat, dtype=v.dtype), meta)


def _getitem(L, seq, i):
    if not isinstance(seq, (tuple, list)):
        raise ExportError("getitem of something that is not a tuple of tensors")
    item = seq[i]
    if isinstance(item, _Unsupported):
        raise ExportError(item.what)
    return item


def _where(L, c, a, b):
    va, vb = L.val(a), L.val(b)
    dtype = L.out_dtype()
    va = va if va.weak else L.cast(va, dtype)
    vb = vb if vb.weak else L.cast(vb, dtype)
    if va.weak and vb.weak:
        va = L.cast(va, dtype)
    known = L.select_known(L.val(c), va, vb, dtype)
    if known is not None:
        return known
    y = L.apply("where", L.val(c), va, vb, dtype=dtype)
    if va.rank == 0 and vb.rank == 0 and L.b.base_shape(y) != y.shape:
        # A mask of two constants selected by a broadcast condition (a padding mask by key
        # gathered at [B, 1, 1, S] and expanded over the queries) is that broadcast of the
        # small mask: a kernel reads it in place instead of a [B, 1, S, S] tensor written first.
        return L.broadcast(L.b.base(y), y.shape)
    return y


def _masked_fill(L, x, mask, value):
    return _where(L, mask, value, x)


def _like(fill):
    def lower(L, x, *rest, **kw):
        return L.full(fill if fill is not None else rest[0], L.out_dtype(), L.out_shape())

    return lower


def _new_empty(L, x, *rest, **kw):
    """`new_empty`, `new_empty_strided`, `empty_permuted`, `empty`: a tensor whose values are
    unspecified (Funnel's backward makes one and copies into it whole; a grouped mixture of
    experts writes its inverse permutation into one), zeros of the result's shape and dtype; its
    strides are a layout, which the graph's values do not have."""
    return L.full(0.0, L.out_dtype(), L.out_shape())


def _sdpa(L, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    return _sdpa_forward(L, q, k, v, attn_mask, dropout_p, is_causal, scale, 1)


def _sdpa_math_mask(L, q, k, v, attn_mask, is_causal, scale, enable_gqa):
    """`eqfuse::sdpa_math_mask` (`attention.route_math_sdpa`): SDPA with a mask or none."""
    return _sdpa_forward(L, q, k, v, attn_mask, 0.0, is_causal, scale, 1)


def _threshold_backward(L, grad, x, threshold):
    return _where(L, L.compare("<=", x, threshold), 0.0, grad)


def _hardtanh(L, x, min_val=-1.0, max_val=1.0):
    """`hardtanh` (MobileNet's ReLU6 is `hardtanh(x, 0, 6)`): `x` clamped to the range."""
    return _clamp(L, x, min_val, max_val)


def _hardtanh_backward(L, grad, x, min_val, max_val):
    """The gradient passes where `min_val < x < max_val`, as PyTorch's kernel lets it; zero at
    and beyond the ends."""
    inside = L.apply("where", L.compare(">", x, min_val), L.compare("<", x, max_val), L.cast(L.lit(0), "bool"),
                     dtype="bool")
    return _where(L, inside, grad, 0.0)


def _tanh_backward(L, grad, y):
    return L.apply("*", grad, L.apply("-", L.lit(1), L.apply("*", y, y)))


def _sigmoid_backward(L, grad, y):
    return L.apply("*", grad, L.apply("*", y, L.apply("-", L.lit(1), y)))


def _gelu_backward(L, grad, x, approximate="none"):
    if approximate != "none":
        raise ExportError("the backward of gelu(approximate='tanh')")
    cdf = L.apply("*", L.lit(0.5), L.apply("+", L.lit(1), L.apply("erf", L.apply("*", x, L.lit(math.sqrt(0.5))))))
    pdf = L.apply("*", L.lit(1 / math.sqrt(2 * math.pi)), L.apply("exp", L.apply("*", L.apply("*", x, x), L.lit(-0.5))))
    return L.apply("*", grad, L.apply("+", cdf, L.apply("*", x, pdf)))


def _softmax_backward(L, grad, out, dim, input_dtype):
    a = L.axis(dim, out.rank)
    s = L.reduce("sum", L.apply("*", grad, out), [a], True)
    return L.apply("*", out, L.apply("-", grad, s))


def _log_softmax_backward(L, grad, out, dim, input_dtype):
    a = L.axis(dim, out.rank)
    s = L.reduce("sum", grad, [a], True)
    return L.apply("-", grad, L.apply("*", L.apply("exp", out), s))


def _dropout(L, x, p, train):
    if train and p != 0:
        return _native_dropout(L, x, p, train)[0]
    return x


def _native_dropout(L, x, p, train):
    """(result, kept mask) of dropout: eqfuse's counter-based dropout with this site's seed
    (the mask is where dropout of ones is not zero: the same elements, by the same index)."""
    x = L.val(x)
    if not train or p == 0:
        return x, L.broadcast(L.cast(L.lit(1), "bool"), x.shape)
    if p >= 1:
        return L.apply("*", x, L.lit(0.0)), L.broadcast(L.cast(L.lit(0), "bool"), x.shape)
    return _dropout_of(L, x, p, L.seed()), _kept(L, x.shape, p, L.seed())


def _dropout_of(L, x, p, seed):
    return L.b.op("dropout", [x.node, L.lit(p).node, seed.node], x.dtype, x.shape)


def _kept(L, shape, p, seed):
    ones = L.broadcast(L.cast(L.lit(1.0), "f32"), shape)
    return L.apply("!=", _dropout_of(L, ones, p, seed), L.lit(0.0), dtype="bool")


def _native_dropout_backward(L, grad, mask, scale):
    g = L.val(grad)
    return L.apply("*", L.apply("where", L.val(mask), g, L.cast(L.lit(0.0), g.dtype), dtype=g.dtype), L.lit(scale))


def _unsqueeze(L, x, dim):
    return L.reshape(x, L.out_shape())


def _squeeze(L, x, *dims):
    return L.reshape(x, L.out_shape())



# --- indexing: slices, concatenation, gathers (embeddings) and their backward ops


def _slice(L, x, dim=0, start=None, end=None, step=1):
    a = L.axis(dim, x.rank)
    n = x.shape[a]
    lo, hi, step = slice(start, end, step).indices(n)
    if step < 1:
        raise ExportError(f"a slice with step {step}")
    size = len(range(lo, hi, step))
    if size == n:
        return x
    if size == 0:
        raise ExportError("an empty slice")
    shape = x.shape[:a] + (size,) + x.shape[a + 1:]
    args = [x.node, L.axis_lit(a, x.rank), L.lit(lo).node, L.lit(lo + (size - 1) * step + 1).node, L.lit(step).node]
    return L.b.op("slice", args, x.dtype, shape)


def _select(L, x, dim, index):
    a = L.axis(dim, x.rank)
    i = index % x.shape[a]
    part = _slice(L, x, a, i, i + 1, 1)
    return L.reshape(part, x.shape[:a] + x.shape[a + 1:])


def _narrow(L, x, dim, start, length):
    a = L.axis(dim, x.rank)
    start = start % x.shape[a] if start < 0 else start
    return _slice(L, x, a, start, start + length, 1)


def _concat(L, vals, a, dtype=None):
    """`vals` joined along axis `a`, in `dtype` (the node's result dtype unless given)."""
    vals = [v for v in vals if v.numel > 0]
    if not vals:
        raise ExportError("a concatenation of empty tensors")
    dtype = dtype or L.out_dtype()
    vals = [L.cast(v, dtype) for v in vals]
    out = vals[0]
    for v in vals[1:]:
        if out.shape[:a] != v.shape[:a] or out.shape[a + 1:] != v.shape[a + 1:]:
            raise ExportError(f"cannot concatenate {list(out.shape)} and {list(v.shape)} along axis {a}")
        shape = out.shape[:a] + (out.shape[a] + v.shape[a],) + out.shape[a + 1:]
        out = L.b.op("concat", [out.node, v.node, L.axis_lit(a, out.rank)], dtype, shape)
    return out


def _cat(L, tensors, dim=0):
    vals = [L.val(t) for t in tensors if not (isinstance(t, torch.Tensor) and t.numel() == 0)]
    rank = max(v.rank for v in vals)
    vals = [v for v in vals if v.rank == rank]  # torch.cat skips 1-D empty tensors
    return _concat(L, vals, L.axis(dim, rank))


def _stack(L, tensors, dim=0):
    vals = [L.val(t) for t in tensors]
    a = L.axis(dim, vals[0].rank + 1)
    return _concat(L, [L.reshape(v, v.shape[:a] + (1,) + v.shape[a:]) for v in vals], a)


def _split(L, x, sizes, dim=0):
    a = L.axis(dim, x.rank)
    n = x.shape[a]
    if isinstance(sizes, int):
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)]
    parts, start = [], 0
    for size in sizes:
        parts.append(_slice(L, x, a, start, start + size, 1))
        start += size
    return tuple(parts)


def _chunk(L, x, chunks, dim=0):
    n = x.shape[L.axis(dim, x.rank)]
    return _split(L, x, -(-n // chunks), dim)


def _unbind(L, x, dim=0):
    a = L.axis(dim, x.rank)
    return tuple(_select(L, x, a, i) for i in range(x.shape[a]))


def _index32(L, idx):
    if idx.dtype not in ("i32",):
        raise ExportError(f"indices of dtype {idx.dtype} (integers expected)")
    return idx


def _embedding(L, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return _gather(L, weight, _index32(L, L.val(indices)), 0)


def _gather(L, x, idx, a):
    shape = x.shape[:a] + idx.shape + x.shape[a + 1:]
    return L.b.op("gather", [x.node, idx.node, L.axis_lit(a, x.rank)], x.dtype, shape)


def _index_select(L, x, dim, index):
    return _gather(L, x, _index32(L, L.val(index)), L.axis(dim, x.rank))


def _scatter_add(L, idx, g, a, n):
    """Zeros of size `n` along axis `a` (of the result) with `g`'s slices added at `idx`."""
    rank = g.rank - idx.rank + 1
    shape = g.shape[:a] + (n,) + g.shape[a + idx.rank:]
    return L.b.op("scatter_add", [idx.node, g.node, L.axis_lit(a, rank), L.lit(n).node], g.dtype, shape)


def _sign(L, x):
    """`sign`: 1 above zero, -1 below, 0 at zero and at NaN (as PyTorch gives them)."""
    x = L.val(x)
    zero, one = L.cast(L.lit(0.0), x.dtype), L.cast(L.lit(1.0), x.dtype)
    up = L.apply("where", L.compare(">", x, 0), one, zero, dtype=x.dtype)
    return L.apply("where", L.compare("<", x, 0), L.apply("neg", one, dtype=x.dtype), up, dtype=x.dtype)


def _float_class(kind):
    """`isnan`, `isinf`, `isfinite`, `isposinf`, `isneginf` (integers and booleans: finite),
    through `compare`'s exact comparisons with infinities."""
    def lower(L, x):
        x = L.val(x)
        inf = float("inf")
        if kind == "isnan":
            return L.compare("!=", x, x)
        if kind == "isposinf":
            return L.compare("==", x, inf)
        if kind == "isneginf":
            return L.compare("==", x, -inf)
        infinite = _or(L, L.compare("==", x, inf), L.compare("==", x, -inf))
        if kind == "isinf":
            return infinite
        return _and(L, L.compare("==", x, x), L.apply("not", infinite, dtype="bool"))

    return lower


def _embedding_dense_backward(L, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    if scale_grad_by_freq:
        raise ExportError("embedding's backward with scale_grad_by_freq")
    idx = _index32(L, L.val(indices))
    g = L.val(grad)
    out = _scatter_add(L, idx, g, 0, num_weights)
    if padding_idx is not None and padding_idx >= 0:
        keep = L.compare("!=", _iota(L, num_weights), padding_idx)
        out = L.apply("*", out, L.cast(L.reshape(keep, (num_weights,) + (1,) * (out.rank - 1)), out.dtype))
    return out


def _iota(L, n):
    return L.b.op("iota", [L.lit(n).node], "i32", (n,))


def _index_put(L, x, indices, values, accumulate=False):
    """`x[..., i, j, ..., ...] = values` (`+=` with `accumulate`) with index tensors on
    consecutive axes, as `_index` reads them. Accumulating (embedding's backward: one on the
    first axis; Falcon's backward of a rotary table read at positions: one on the third; CLIP's
    pooled token `h[arange(B), ids.argmax(-1)]`: two): a scatter-add along the merged axes at
    the broadcast indices' linear positions. Writing (a functionalized `index_copy_` as PyTorch's
    core decompositions make it: the static key/value cache of `transformers` written at the
    step's positions): `_put`."""
    x = L.val(x)
    given = [a for a, i in enumerate(indices) if i is not None]
    if not given:
        raise ExportError("index_put without index tensors")
    a, m = given[0], len(given)
    if given != list(range(a, a + m)):
        raise ExportError("index_put with index tensors on axes that are not consecutive")
    ts = [L.val(indices[k]) for k in given]
    if any(t.dtype == "bool" for t in ts):
        raise ExportError("index_put with a boolean mask (a data-dependent set of positions)")
    ts = [_index32(L, t) for t in ts]
    if not accumulate:
        return _put(L, x, ts, L.val(values), a)
    block = x.shape[a:a + m]
    shape = broadcast_shapes(*(t.shape for t in ts))
    i = _linear(L, ts, [math.prod(block[k + 1:]) for k in range(m)]) if m > 1 else ts[0]
    i = L.broadcast(i, shape) if i.shape != shape else i
    merged = x.shape[:a] + (math.prod(block),) + x.shape[a + m:]
    v = L.val(values)
    v = L.broadcast(L.cast(v, x.dtype), merged[:a] + i.shape + merged[a + 1:])
    added = _scatter_add(L, i, v, a, merged[a])
    return L.apply("+", x, L.reshape(added, x.shape) if m > 1 else added)


def _put(L, x, ts, v, a):
    """`x` with `v` written at the index tensors `ts` on the consecutive axes from `a` (PyTorch's
    `x[..., ts, ...] = v`, `v` broadcast to the indexed shape). eqfuse has no scatter that
    overwrites, so each position `p` of the merged indexed axes (size `n`) finds the last of the
    `k` indices that names it, from the `[n, k]` comparison of its position with every index
    (`amax` of the matching index numbers, -1 where none does), and takes `v`'s slice there by
    a gather, `x`'s elsewhere: exact, and where indices repeat the last write wins (PyTorch leaves
    that case undefined; its CPU loop writes in order). The comparison is small for a cache
    written at a few positions (`k` of 1 in a decode step). Negative indices count from the end
    as in PyTorch; an index out of range writes nothing (PyTorch raises)."""
    m = len(ts)
    block = x.shape[a:a + m]
    n = math.prod(block)
    # Each index tensor wrapped into its axis, then the linear position in the merged axes.
    ts = [L.apply("where", L.compare("<", t, 0), L.apply("+", t, L.cast(L.lit(size), "i32"), dtype="i32"), t,
                  dtype="i32") for t, size in zip(ts, block)]
    shape = broadcast_shapes(*(t.shape for t in ts))
    i = _linear(L, ts, [math.prod(block[j + 1:]) for j in range(m)]) if m > 1 else ts[0]
    i = L.broadcast(i, shape) if i.shape != shape else i
    k = math.prod(shape)
    merged = x.shape[:a] + (n,) + x.shape[a + m:]
    indexed = merged[:a] + shape + merged[a + 1:]
    try:
        fits = broadcast_shapes(v.shape, indexed) == indexed
    except ExportError:
        fits = False
    if not fits:
        raise ExportError(f"index_put of values {list(v.shape)} into {list(x.shape)} at indices {list(shape)} "
                          f"(values broadcast to {list(indexed)} expected)")
    v = L.reshape(L.broadcast(L.cast(v, x.dtype), indexed), merged[:a] + (k,) + merged[a + 1:])
    hit = L.apply("==", L.broadcast(L.reshape(i, (1, k)), (n, k)), L.reshape(_iota(L, n), (n, 1)), dtype="bool")
    which = L.apply("where", hit, L.reshape(_iota(L, k), (1, k)), L.cast(L.lit(-1), "i32"), dtype="i32")
    src = L.reduce("amax", which, [1], False)
    written = L.compare(">=", src, 0)
    picked = _gather(L, v, L.apply("max", src, L.cast(L.lit(0), "i32"), dtype="i32"), a)
    written = L.reshape(written, (n,) + (1,) * (len(merged) - a - 1))
    out = L.apply("where", written, picked, L.reshape(x, merged) if m > 1 else x, dtype=x.dtype)
    return L.reshape(out, x.shape) if m > 1 else out


def _index_copy(L, x, dim, index, source):
    """`x.index_copy(dim, index, source)` (a functionalized `index_copy_`, as `transformers`'
    static cache writes keys and values at the step's positions): `source`'s slices along `dim`
    written at `index`, a `_put` on one axis. A 0-d index writes one slice, `source` with or
    without that axis."""
    x, idx, src = L.val(x), _index32(L, L.val(index)), L.val(source)
    if x.rank == 0:
        raise ExportError("index_copy into a 0-d tensor")
    a = L.axis(dim, x.rank)
    if idx.rank > 1:
        raise ExportError(f"index_copy with indices of rank {idx.rank} (one axis of indices expected)")
    if idx.rank == 0:
        idx = L.reshape(idx, (1,))
        if src.rank == x.rank - 1:
            src = L.reshape(src, src.shape[:a] + (1,) + src.shape[a:])
    want = x.shape[:a] + idx.shape + x.shape[a + 1:]
    if tuple(src.shape) != want:
        raise ExportError(f"index_copy of a source {list(src.shape)} into {list(x.shape)} along axis {a} "
                          f"at {idx.shape[0]} indices (source {list(want)} expected)")
    return _put(L, x, [idx], src, a)


def _slice_scatter(L, x, src, dim=0, start=None, end=None, step=1):
    a = L.axis(dim, x.rank)
    n = x.shape[a]
    lo, hi, step = slice(start, end, step).indices(n)
    if step < 1:
        raise ExportError(f"slice_scatter with step {step}")
    if step > 1:
        return _strided_scatter(L, x, L.cast(L.val(src), x.dtype), a, lo, hi, step)
    parts = []
    if lo > 0:
        parts.append(_slice(L, x, a, 0, lo, 1))
    parts.append(L.cast(L.val(src), x.dtype))
    if hi < n:
        parts.append(_slice(L, x, a, hi, n, 1))
    return _concat(L, parts, a) if len(parts) > 1 else parts[0]


def _select_scatter(L, x, src, dim, index):
    """`x` with its `index`-th slice along `dim` replaced by `src` (a functionalized
    `x[:, 0] = v`): a `slice_scatter` of `src` with that axis put back."""
    a = L.axis(dim, x.rank)
    i = index + x.shape[a] if index < 0 else index
    v = L.val(src)
    shape = tuple(x.shape[:a]) + (1,) + tuple(x.shape[a + 1:])
    v = L.broadcast(L.reshape(v, (1,) * (len(shape) - 1 - v.rank) + tuple(v.shape)), shape[:a] + shape[a + 1:])
    return _slice_scatter(L, x, L.reshape(v, shape), a, i, i + 1)


def _fill(L, x, value):
    """`aten.fill(x, value)` (a functionalized `fill_`): `value`, a number or a 0-d tensor, in
    `x`'s shape and dtype."""
    if isinstance(value, Value):
        return L.broadcast(L.reshape(L.cast(value, L.out_dtype()), ()), L.out_shape())
    return L.full(float(value), L.out_dtype(), L.out_shape())


def _strided_scatter(L, x, src, a, lo, hi, step):
    """`x` with every `step`-th element of `[lo, hi)` along axis `a` taken from `src` in order
    (GPT-J's rotation of every other element: `slice_scatter` with step 2 in its backward): an
    element `i` of the slice reads `src` at `(i - lo) // step`, a gather by an index computed
    from `iota`, and a `where` keeps `x` elsewhere."""
    n, m = x.shape[a], src.shape[a]
    i = _iota(L, n)
    rel = L.apply("-", i, L.cast(L.lit(lo), "i32"), dtype="i32")
    pos = L.apply("/", rel, L.cast(L.lit(step), "i32"), dtype="i32")
    f = L.cast(L.lit(0), "bool")
    on_step = L.compare("==", L.apply("-", rel, L.apply("*", pos, L.cast(L.lit(step), "i32"), dtype="i32"),
                                      dtype="i32"), 0)
    inside = L.apply("where", L.compare(">=", i, lo), L.compare("<", i, hi), f, dtype="bool")
    hit = L.apply("where", inside, on_step, f, dtype="bool")
    # Outside the slice the index is clamped into range (the read is discarded by the `where`).
    pos = L.apply("max", L.apply("min", pos, L.cast(L.lit(m - 1), "i32"), dtype="i32"), L.cast(L.lit(0), "i32"),
                  dtype="i32")
    picked = _gather(L, src, pos, a)
    hit = L.reshape(hit, (n,) + (1,) * (x.rank - a - 1))
    return L.apply("where", hit, picked, x, dtype=x.dtype)


def _arg_extreme(op):
    """`argmax` (`op` amax) or `argmin` (amin): the first index along `dim` (of the flattened
    tensor where `dim` is None) whose value is the row's largest (smallest), as PyTorch returns
    it: the smallest position where the value equals the row's `op` or is NaN (PyTorch takes a
    NaN for the extreme), an `amin` over `where(hit, iota, n)`. Integers are compared in f32
    (exact below 2^24), as `reduce` takes their extremes."""

    def lower(L, x, dim=None, keepdim=False):
        return L.cast(_arg_index(L, x, dim, keepdim, op), L.out_dtype())

    return lower


def _arg_index(L, x, dim, keepdim, op):
    """The i32 index `_arg_extreme` lowers (of `op`, amax or amin), in the shape of the
    reduction of `x` along `dim` (None: all of it)."""
    v = L.val(x)
    if v.dtype == "bool":
        v = L.cast(v, "i32")
    if dim is None or v.rank == 0:
        shape = (1,) * v.rank if keepdim else ()
    else:
        a = L.axis(dim, v.rank)
        shape = tuple(1 if i == a else d for i, d in enumerate(v.shape)) if keepdim else v.shape[:a] + v.shape[a + 1:]
    if v.rank == 0:
        return L.full(0.0, "i32", shape)
    if dim is None:
        v = L.reshape(v, (v.numel,))
        a = 0
    n = v.shape[a]
    m = L.reduce(op, v, [a], True)
    hit = L.compare("==", v, m)
    if v.dtype in ("f32", "f16", "bf16"):
        hit = L.apply("where", hit, L.cast(L.lit(1), "bool"), L.compare("!=", v, v), dtype="bool")
    pos = L.reshape(_iota(L, n), tuple(n if i == a else 1 for i in range(v.rank)))
    cand = L.apply("where", hit, pos, L.cast(L.lit(n), "i32"), dtype="i32")
    return L.reshape(L.reduce("amin", cand, [a], True), shape)


def _max_min_dim(op):
    """`torch.max(x, dim)` (`op` amax) or `torch.min(x, dim)` (amin): the extremes along `dim`
    and their indices, the first where values tie and NaN the extreme (`_arg_extreme`), as
    PyTorch documents them (GPT-OSS's attention sinks take a row's largest score so)."""
    def extreme(L, v, dims, keepdim):
        values = L.reduce(op, v, dims, keepdim) if v.rank else v
        if v.dtype in ("f32", "f16", "bf16") and v.rank:
            # A row with a NaN: its extreme is NaN (`amax` of eqfuse need not say so).
            nan = L.reduce("amax", L.cast(L.apply("!=", v, v, dtype="bool"), "f32"), dims, keepdim)
            values = L.apply("where", L.apply(">", nan, L.cast(L.lit(0), "f32"), dtype="bool"),
                             L.apply("/", L.cast(L.lit(0), v.dtype), L.cast(L.lit(0), v.dtype)), values,
                             dtype=v.dtype)
        return values

    def lower(L, x, dim=None, keepdim=False):
        if isinstance(dim, Value):  # `max.other`/`min.other`: the elementwise maximum (minimum)
            return L.pointwise("max" if op == "amax" else "min", x, dim)
        v = L.val(x)
        if dim is None:  # `max.default`: the largest of all
            return extreme(L, v, None, False)
        return extreme(L, v, [dim], keepdim), _arg_index(L, x, dim, keepdim, op)

    return lower


def _leaky_relu(L, x, negative_slope=0.01):
    x = L.val(x)
    return L.apply("where", L.compare(">", x, 0), x, L.apply("*", x, L.lit(negative_slope)), dtype=x.dtype)


def _leaky_relu_backward(L, grad, x, negative_slope, self_is_result):
    """The gradient where `x > 0` (or the result, the same sign), `negative_slope` of it elsewhere."""
    g, x = L.val(grad), L.val(x)
    return L.apply("where", L.compare(">", x, 0), g, L.apply("*", g, L.lit(negative_slope)), dtype=g.dtype)


def _elu(L, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """`elu` (and `selu`, `celu` through its scales): `scale x` above zero, else
    `alpha scale (exp(input_scale x) - 1)`."""
    x = L.val(x)
    neg = L.apply("*", L.apply("-", L.apply("exp", L.apply("*", x, L.lit(input_scale))), L.lit(1.0)),
                  L.lit(alpha * scale))
    return L.apply("where", L.compare(">", x, 0), L.apply("*", x, L.lit(scale)), neg, dtype=x.dtype)


def _elu_backward(L, grad, alpha, scale, input_scale, is_result, self_or_result):
    """`elu`'s gradient from its input, or from its result (`is_result`: below zero the result
    `y` gives `input_scale (y + alpha scale)`), as PyTorch's kernel computes it."""
    g, x = L.val(grad), L.val(self_or_result)
    if is_result:
        below = L.apply("*", L.apply("+", x, L.lit(alpha * scale)), L.lit(input_scale))
    else:
        below = L.apply("*", L.apply("exp", L.apply("*", x, L.lit(input_scale))), L.lit(input_scale * alpha * scale))
    return L.apply("where", L.compare(">", x, 0), L.apply("*", g, L.lit(scale)), L.apply("*", g, below),
                   dtype=g.dtype)


def _copy(L, dst, src, non_blocking=False):
    """`aten.copy(dst, src)` (a functionalized `dst.copy_(src)`, BART's shifted tokens written
    into a slice): `src` in `dst`'s dtype, broadcast to its shape."""
    d, v = L.val(dst), L.val(src)
    return L.broadcast(L.cast(v, d.dtype or L.out_dtype()), L.out_shape())


def _repeat(L, x, repeats):
    """`x.repeat(r)`: `x` (with leading axes of 1 to `len(r)`) tiled `r[i]` times along each
    axis, a broadcast over an axis of `r[i]` put before each axis, then merged with it."""
    v = L.val(x)
    r = [int(n) for n in repeats]
    shape = (1,) * (len(r) - v.rank) + tuple(v.shape)
    v = L.reshape(v, tuple(d for s in shape for d in (1, s)))
    v = L.broadcast(v, tuple(d for n, s in zip(r, shape) for d in (n, s)))
    return L.reshape(v, L.out_shape())


def _flip(L, x, dims):
    """The elements in reverse order along each axis of `dims`: a gather by `n - 1 - iota(n)`."""
    v = L.val(x)
    for d in dims:
        a = L.axis(d, v.rank)
        n = v.shape[a]
        if n > 1:
            rev = L.apply("-", L.cast(L.lit(n - 1), "i32"), _iota(L, n), dtype="i32")
            v = _gather(L, v, rev, a)
    return v


def _cumsum(L, x, dim, dtype=None):
    """A running sum along an axis of n: the sum over j of x[..., j] where j <= i, a row
    reduction over an [..., n, n] space (RoBERTa's position ids are a cumsum of the mask of
    tokens that are not padding). Integers are summed in f32, exact below 2^24."""
    v = L.val(x)
    out = L.out_dtype()
    a = L.axis(dim, v.rank)
    v = L.cast(v, "f32" if out in ("i32", "bool") else out)
    last = v.rank - 1
    if a != last:
        v = L.swap(v, a, last)
    n = v.shape[-1]
    rows = L.broadcast(L.reshape(v, v.shape[:-1] + (1, n)), v.shape[:-1] + (n, n))
    i = L.reshape(_iota(L, n), (n, 1))
    j = L.reshape(_iota(L, n), (1, n))
    upto = L.apply("<=", j, i, dtype="bool")
    zero = L.cast(L.lit(0.0), v.dtype)
    y = L.reduce("sum", L.apply("where", upto, rows, zero, dtype=v.dtype), -1, False)
    if a != last:
        y = L.swap(y, a, last)
    return L.cast(y, out)


def _count(L, cond, axis):
    """The number of true elements of the bool `cond` along `axis` (kept), as i32: summed in
    f32, exact below 2^24 (the generated reductions sum in f32)."""
    return L.cast(L.reduce("sum", L.cast(cond, "f32"), [axis], True), "i32")


def _orders(L, v, descending):
    """Where each element of `v` (`[..., n]`) goes in a stable sort of its last axis: for each
    i, the number of j that come before it, `[..., n]` i32, from the `[..., n, n]` comparisons
    of every pair (quadratic in n; the rows sorted here are a router's experts or a batch's
    expert choices). Ascending puts NaN last and descending first, as PyTorch's `sort` and
    `topk` treat NaN as the largest value; equal values keep their order (`stable`)."""
    n = v.shape[-1]
    xi = L.reshape(v, v.shape[:-1] + (n, 1))
    xj = L.reshape(v, v.shape[:-1] + (1, n))
    before = L.apply(">" if descending else "<", xj, xi, dtype="bool")
    same = L.apply("==", xj, xi, dtype="bool")
    if v.dtype in ("f32", "f16", "bf16"):
        nan_i, nan_j = L.apply("!=", xi, xi, dtype="bool"), L.apply("!=", xj, xj, dtype="bool")
        t = L.cast(L.lit(1), "bool")
        # NaN is the largest: before i when descending (j NaN, i not), after it when ascending.
        first, second = (nan_j, nan_i) if descending else (nan_i, nan_j)
        before = L.apply("where", L.apply("where", first, L.apply("not", second, dtype="bool"),
                                          L.cast(L.lit(0), "bool"), dtype="bool"), t, before, dtype="bool")
        same = L.apply("where", L.apply("where", nan_i, nan_j, L.cast(L.lit(0), "bool"), dtype="bool"), t, same,
                       dtype="bool")
    earlier = L.apply("<", L.reshape(_iota(L, n), (1, n)), L.reshape(_iota(L, n), (n, 1)), dtype="bool")
    tie = L.apply("where", same, earlier, L.cast(L.lit(0), "bool"), dtype="bool")
    ahead = L.apply("where", tie, L.cast(L.lit(1), "bool"), before, dtype="bool")
    return L.reshape(_count(L, ahead, -1), v.shape)


def _first_in_order(L, v, k, descending):
    """The values and i32 indices of the first `k` elements of a stable sort of `v`'s last
    axis (`_orders`): the index whose place is r, for r < k (a one-hot of each place,
    `[..., k, n]`), and the value there."""
    n = v.shape[-1]
    place = L.reshape(_orders(L, v, descending), v.shape[:-1] + (1, n))
    at = L.apply("==", place, L.reshape(_iota(L, k), (k, 1)), dtype="bool")
    pos = L.reshape(L.cast(_iota(L, n), "f32"), (1, n))
    idx = L.reduce("sum", L.apply("where", at, pos, L.cast(L.lit(0), "f32"), dtype="f32"), [-1], False)
    idx = L.cast(idx, "i32")
    return _take_along(L, v, -1, idx), idx


def _sort_like(L, x, dim, k, descending):
    """`_first_in_order` along axis `dim` of `x`: values and indices, the axis put back."""
    v = L.val(x)
    if v.rank == 0:
        raise ExportError("sort or topk of a scalar")
    if v.dtype == "bool":
        v = L.cast(v, "i32")
    a = L.axis(dim, v.rank)
    last = v.rank - 1
    if a != last:
        v = L.swap(v, a, last)
    values, idx = _first_in_order(L, v, k, descending)
    if a != last:
        values, idx = L.swap(values, a, last), L.swap(idx, a, last)
    val = L.node.meta["val"]
    return L.cast(values, dtype_name(val[0].dtype)), L.cast(idx, dtype_name(val[1].dtype))


def _topk(L, x, k, dim=-1, largest=True, sorted=True):
    """`torch.topk`: the `k` largest (smallest) values along `dim`, in order, and their
    indices; equal values in order of index, NaN the largest (as PyTorch's CPU kernel returns
    them). A router picks its experts so (Mixtral, Qwen-MoE). With `sorted=False` PyTorch's
    order is unspecified; this is one."""
    return _sort_like(L, x, dim, int(k), largest)


def _sort(L, x, dim=-1, descending=False, stable=None):
    """`torch.sort` (`stable` or not: a stable sort is one of the unstable ones): values and
    indices along `dim`, NaN the largest. A grouped mixture of experts sorts its tokens'
    expert choices."""
    v = L.val(x)
    a = L.axis(dim, v.rank) if v.rank else 0
    return _sort_like(L, x, a, v.shape[a] if v.rank else 1, descending)


def _histc(L, x, bins=100, min=0, max=0):
    """`torch.histc`: counts of `x`'s elements in `bins` equal bins over `[min, max]`, each
    element's bin as PyTorch's kernels compute it, `trunc((x - min) * bins / (max - min))` in
    the input's dtype (i32 arithmetic, truncating, for integers: the CUDA kernel's), the value
    `max` in the last bin, values outside the range not counted. A grouped mixture of experts
    counts its tokens by expert so. `min == max` (bins over the data's own range) is refused."""
    v = L.val(x)
    lo, hi, bins = float(min), float(max), int(bins)
    if lo == hi:
        raise ExportError("histc with min == max (bins over the data's range, known at run time only)")
    if lo > hi:
        raise ExportError(f"histc with min {lo} > max {hi}")
    if v.dtype == "bool":
        v = L.cast(v, "i32")
    if v.dtype == "i32" and not (lo.is_integer() and hi.is_integer()):
        v = L.cast(v, "f32")
    dt = v.dtype

    def c(y):
        return L.cast(L.lit(y), dt)

    flat = L.reshape(v, (v.numel,))
    pos = L.apply("/", L.apply("*", L.apply("-", flat, c(lo)), c(bins)), L.apply("-", c(hi), c(lo)))
    pos = L.cast(pos, "i32") if dt != "i32" else pos
    pos = L.apply("min", pos, L.cast(L.lit(bins - 1), "i32"))
    inside = L.apply("where", L.apply(">=", flat, c(lo), dtype="bool"), L.apply("<=", flat, c(hi), dtype="bool"),
                     L.cast(L.lit(0), "bool"), dtype="bool")
    hit = L.apply("where", L.reshape(inside, (v.numel, 1)), L.apply("==", L.reshape(pos, (v.numel, 1)),
                                           L.reshape(_iota(L, bins), (1, bins)), dtype="bool"),
                  L.cast(L.lit(0), "bool"), dtype="bool")
    counts = L.reduce("sum", L.cast(hit, "f32"), [0], False)
    return L.cast(counts, L.out_dtype())


def _group_masks(L, offs, rows):
    """`[rows, E]` bool: whether row s belongs to group e of a grouped product whose groups end
    at the cumulative `offs` (`[E]`): `offs[e-1] <= s < offs[e]`. Rows past `offs[-1]` are in
    none."""
    o = L.val(offs)
    if o.rank != 1:
        raise ExportError(f"grouped product offsets of rank {o.rank}")
    e = o.shape[0]
    s = L.reshape(_iota(L, rows), (rows, 1))
    group = _count(L, L.apply(">=", s, L.reshape(L.cast(o, "i32"), (1, e)), dtype="bool"), -1)
    return L.apply("==", group, L.reshape(_iota(L, e), (1, e)), dtype="bool")


def _rows_by_group(L, x, mask):
    """`x` (`[S, K]`) spread over its rows' groups: `[S, E*K]`, row s's values in the columns
    of its group, zeros elsewhere, so that one product with the groups' weights stacked
    (`[E*K, N]`) multiplies each row by its own group's."""
    s, k = x.shape
    e = mask.shape[1]
    spread = L.apply("where", L.reshape(mask, (s, e, 1)), L.reshape(x, (s, 1, k)), L.cast(L.lit(0), x.dtype),
                     dtype=x.dtype)
    return L.reshape(spread, (s, e * k))


def _grouped_mm_fallback(L, input, weight, offs):
    """`transformers`' `grouped_mm_fallback(input [S, K], weight [E, K, N], offs [E])`, a
    mixture of experts' product of each token (sorted by expert) with its expert's weights:
    row s times `weight[e]` for the group e whose rows `offs` bounds, zeros past `offs[-1]`
    (as the fallback leaves them). Lowered as one product with the weights stacked
    (`_rows_by_group`): every expert's columns, zeros where a row is not its expert's (a
    weight that is infinite or NaN reaches every row, which it does not in PyTorch)."""
    x, w = L.val(input), L.val(weight)
    if x.rank != 2 or w.rank != 3 or w.shape[1] != x.shape[1]:
        raise ExportError(f"grouped product of {list(x.shape)} and {list(w.shape)}")
    e, k, n = w.shape
    mask = _group_masks(L, offs, x.shape[0])
    return L.matmul(_rows_by_group(L, L.cast(x, w.dtype), mask), L.reshape(w, (e * k, n)))


def _grouped_mm_fallback_backward(L, input, weight, offs, grad_output):
    """The gradients of `_grouped_mm_fallback` (`transformers`' `grouped_mm_fallback_backward`):
    each row's input gradient `grad[s] @ weight[e]ᵀ` (zeros past `offs[-1]`), one product as
    in the forward, and each expert's weight gradient `input[rows of e]ᵀ @ grad[rows of e]`, a
    product batched over experts of the input with other experts' rows zeroed."""
    x, w, g = L.val(input), L.val(weight), L.val(grad_output)
    e, k, n = w.shape
    s = x.shape[0]
    mask = _group_masks(L, offs, s)
    wt = L.reshape(L.swap(w, 1, 2), (e * n, k))
    grad_input = L.cast(L.matmul(_rows_by_group(L, L.cast(g, w.dtype), mask), wt), x.dtype)
    mine = L.apply("where", L.reshape(L.swap(mask, 0, 1), (e, s, 1)),
                   L.reshape(x, (1, s, k)), L.cast(L.lit(0), x.dtype), dtype=x.dtype)
    grad_weight = L.matmul(L.swap(mine, 1, 2), L.cast(g, x.dtype))
    return grad_input, L.cast(grad_weight, w.dtype)


def _select_backward(L, grad, input_sizes, dim, index):
    shape = tuple(input_sizes)
    a = L.axis(dim, len(shape))
    g = L.val(grad)
    zeros = L.full(0.0, g.dtype, shape)
    i = index % shape[a]
    return _slice_scatter(L, zeros, L.reshape(g, shape[:a] + (1,) + shape[a + 1:]), a, i, i + 1, 1)


def _slice_backward(L, grad, input_sizes, dim, start, end, step):
    shape = tuple(input_sizes)
    g = L.val(grad)
    return _slice_scatter(L, L.full(0.0, g.dtype, shape), g, dim, start, end, step)


def _logical(op, logical=False):
    """`bitwise_and`/`bitwise_or` of bool tensors, and `logical_and`/`logical_or` (`logical`),
    whose operands of any dtype count as true where nonzero (LongT5 ands i32 masks), as a cast
    to bool makes them. Bitwise operators of integers have no eqfuse equivalent: refused."""

    def lower(L, a, b):
        va, vb = L.val(a), L.val(b)
        if logical:
            va, vb = L.cast(va, "bool"), L.cast(vb, "bool")
        if va.dtype != "bool" or vb.dtype != "bool":
            raise ExportError(f"bitwise/logical {op} of {va.dtype} and {vb.dtype} (bool only)")
        f, t = L.cast(L.lit(0), "bool"), L.cast(L.lit(1), "bool")
        if op == "and":
            pair = (va, vb, f) if L.known_bool(va) is not None or L.known_bool(vb) is None else (vb, va, f)
            known = L.select_known(*pair, "bool")
            return known if known is not None else L.apply("where", va, vb, f, dtype="bool")
        pair = (va, t, vb) if L.known_bool(va) is not None or L.known_bool(vb) is None else (vb, t, va)
        known = L.select_known(*pair, "bool")
        return known if known is not None else L.apply("where", va, t, vb, dtype="bool")

    return lower


def _bitwise_not(L, x):
    v = L.val(x)
    if v.dtype != "bool":
        raise ExportError(f"bitwise_not of {v.dtype} (bool only)")
    return L.apply("not", v, dtype="bool")


def _linear(L, coords, strides):
    """The i32 linear position `sum(coords[i] * strides[i])`, broadcast as the coordinates are."""
    pos = None
    for c, stride in zip(coords, strides):
        term = L.apply("*", c, L.cast(L.lit(stride), "i32")) if stride != 1 else c
        pos = term if pos is None else L.apply("+", pos, term)
    return pos


def _take_along(L, x, dim, index):
    """`torch.gather(x, dim, index)` (ONNX GatherElements): each index picks along `dim` at
    its own coordinates, as one take of the flattened `x` at the linear positions."""
    x, idx = L.val(x), _index32(L, L.val(index))
    a = L.axis(dim, x.rank)
    if idx.rank != x.rank:
        raise ExportError(f"gather of rank {x.rank} with indices of rank {idx.rank}")
    strides = [math.prod(x.shape[i + 1:]) for i in range(x.rank)]
    coords = [idx if i == a else L.reshape(_iota(L, idx.shape[i]), tuple(idx.shape[i] if j == i else 1
                                                                           for j in range(x.rank)))
              for i in range(x.rank)]
    pos = _linear(L, coords, strides)
    pos = L.broadcast(pos, idx.shape)
    return _gather(L, L.reshape(x, (x.numel,)), pos, 0)


def _scatter_add_along(L, x, dim, index, src):
    """`x.scatter_add(dim, index, src)` (the backward of `torch.gather`: ViT-MAE gathers the
    patches it keeps): each of `src`'s elements (within `index`'s shape) added to `x` at its
    index along `dim` and its own coordinates elsewhere, one scatter-add into the flattened `x`
    at the linear positions (`_take_along`'s)."""
    x, idx, g = L.val(x), _index32(L, L.val(index)), L.val(src)
    a = L.axis(dim, x.rank)
    if idx.rank != x.rank or g.rank != x.rank:
        raise ExportError(f"scatter_add into rank {x.rank} with indices of rank {idx.rank} and values of rank {g.rank}")
    if any(idx.shape[i] > x.shape[i] for i in range(x.rank) if i != a) or any(
            idx.shape[i] > g.shape[i] for i in range(x.rank)):
        raise ExportError(f"scatter_add into {list(x.shape)} of {list(g.shape)} at {list(idx.shape)}")
    if g.shape != idx.shape:
        for i in range(g.rank):
            if g.shape[i] != idx.shape[i]:
                g = _slice(L, g, i, 0, idx.shape[i], 1)
    strides = [math.prod(x.shape[i + 1:]) for i in range(x.rank)]
    coords = [idx if i == a else L.reshape(_iota(L, idx.shape[i]), tuple(idx.shape[i] if j == i else 1
                                                                           for j in range(x.rank)))
              for i in range(x.rank)]
    pos = L.reshape(L.broadcast(_linear(L, coords, strides), idx.shape), (idx.numel,))
    added = _scatter_add(L, pos, L.reshape(L.cast(g, x.dtype), (idx.numel,)), 0, x.numel)
    return L.apply("+", x, L.reshape(added, x.shape), dtype=x.dtype)


def _scatter_value(L, x, dim, index, value, reduce=None):
    """`x.scatter(dim, index, value)`, `value` a number or a tensor of `index`'s shape (`src`),
    with `index` of `x`'s size along every other axis. One index a row (a one-hot row): `value`
    where the position equals the index, `x` elsewhere. Several (`topk`'s backward scatters its
    gradient at the k indices): each position takes the value of the last index that names it
    (PyTorch leaves the choice among repeated indices unspecified), `x` where none does."""
    if reduce is not None:
        raise ExportError(f"scatter with reduce={reduce!r}")
    x, idx = L.val(x), _index32(L, L.val(index))
    a = L.axis(dim, x.rank)
    if idx.rank != x.rank or idx.shape[:a] + idx.shape[a + 1:] != x.shape[:a] + x.shape[a + 1:]:
        raise ExportError(f"scatter into {list(x.shape)} with indices {list(idx.shape)} (indices must span every "
                          "other axis)")
    v = L.val(value)
    number = v.weak
    if not number and v.shape != idx.shape:
        raise ExportError(f"scatter of values {list(v.shape)} at indices {list(idx.shape)} (one shape expected)")
    v = L.cast(v, x.dtype)
    n, k = x.shape[a], idx.shape[a]
    if k == 1:
        pos = L.reshape(_iota(L, n), tuple(n if i == a else 1 for i in range(x.rank)))
        hit = L.apply("==", L.broadcast(idx, x.shape), pos, dtype="bool")
        return L.apply("where", hit, v, x, dtype=x.dtype)
    last = x.rank - 1
    xl, il = (L.swap(x, a, last), L.swap(idx, a, last)) if a != last else (x, idx)
    vl = L.swap(v, a, last) if a != last and not number else v
    hit = L.apply("==", L.reshape(il, il.shape + (1,)), L.reshape(_iota(L, n), (1, n)), dtype="bool")
    j = L.apply("where", hit, L.reshape(_iota(L, k), (k, 1)), L.cast(L.lit(-1), "i32"), dtype="i32")
    j = L.reduce("amax", j, [-2], False)
    has = L.apply(">=", j, L.cast(L.lit(0), "i32"), dtype="bool")
    if not number:
        vl = _take_along(L, vl, -1, L.apply("max", j, L.cast(L.lit(0), "i32"), dtype="i32"))
    y = L.apply("where", has, vl, xl, dtype=x.dtype)
    return L.swap(y, a, last) if a != last else y


def _constant_pad(L, x, pad, value=0.0):
    """`F.pad(x, pad, value=value)`, constant mode: pairs from the last axis back; a negative
    amount cuts."""
    x = L.val(x)
    for i in range(len(pad) // 2):
        a = x.rank - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if lo < 0 or hi < 0:
            x = _slice(L, x, a, max(-lo, 0), x.shape[a] - max(-hi, 0), 1)
            lo, hi = max(lo, 0), max(hi, 0)
        parts = []
        if lo:
            parts.append(L.full(value, x.dtype, x.shape[:a] + (lo,) + x.shape[a + 1:]))
        parts.append(x)
        if hi:
            parts.append(L.full(value, x.dtype, x.shape[:a] + (hi,) + x.shape[a + 1:]))
        x = _concat(L, parts, a, x.dtype) if len(parts) > 1 else x
    return x


def _index(L, x, indices):
    """`x[i, j, ...]` with index tensors on consecutive axes (after any number of full slices,
    `None`): one take along the merged axes at the broadcast indices' linear positions."""
    x = L.val(x)
    used = [(i, t) for i, t in enumerate(indices) if t is not None]
    if not used:
        return x
    a, m = used[0][0], len(used)
    if [i for i, _ in used] != list(range(a, a + m)):
        raise ExportError("indexing with index tensors on axes that are not consecutive")
    ts = [L.val(t) for _, t in used]
    if any(t.dtype == "bool" for t in ts):
        raise ExportError("indexing with a boolean mask (a data-dependent shape)")
    ts = [_index32(L, t) for t in ts]
    block = x.shape[a:a + m]
    shape = broadcast_shapes(*(t.shape for t in ts))
    pos = _linear(L, ts, [math.prod(block[k + 1:]) for k in range(m)])
    pos = L.broadcast(pos, shape) if pos.shape != shape else pos
    merged = L.reshape(x, x.shape[:a] + (math.prod(block),) + x.shape[a + m:])
    return _gather(L, merged, pos, a)


def _any(L, x, dim=None, keepdim=False):
    v = L.val(x)
    dims = dim if isinstance(dim, (list, tuple)) or dim is None else [dim]
    nonzero = L.cast(L.compare("!=", v, 0), "f32")
    return L.compare("!=", L.reduce("amax", nonzero, dims, keepdim), 0)


def _patches(L, x, p):
    """`[B, C, H, W]` → `[B, (H/p)(W/p), C p p]`: each p x p patch of every channel a row."""
    b, c, h, w = x.shape
    y = L.reshape(x, (b, c, h // p, p, w // p, p))
    y = L.permute(y, [0, 2, 4, 1, 3, 5])
    return L.reshape(y, (b, (h // p) * (w // p), c * p * p))


def _patch_conv(x, weight, stride, padding, dilation, transposed, groups) -> bool:
    """Whether a convolution is non-overlapping square patches (stride equal to the kernel, no
    padding, dilation or groups, sizes divisible: ViT's patch embedding), which `_convolution`
    lowers as one product of the image's patches, no gather."""
    if x.rank != 4 or weight.rank != 4 or transposed or groups != 1:
        return False
    o, c, kh, kw = weight.shape
    return (kh == kw and list(stride) == [kh, kw] and not any(padding) and all(d == 1 for d in dilation)
            and not x.shape[2] % kh and not x.shape[3] % kw)


def _convolution(L, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """`aten.convolution`: patches (stride equal to the kernel) as one product (`_patches`);
    any other 1-d, 2-d or 3-d convolution as windows gathered from the padded input, each
    group's product with its weights, and transposed ones (`_conv_general`)."""
    x, wt = L.val(x), L.val(weight)
    if not _patch_conv(x, wt, stride, padding, dilation, transposed, groups):
        return _conv_general(L, x, wt, bias, stride, padding, dilation, transposed, groups)
    o, c, p, _ = wt.shape
    b, _, h, w = x.shape
    rows = _patches(L, x, p)
    wm = L.swap(L.reshape(wt, (o, c * p * p)), 0, 1)
    y = L.matmul(rows, wm)
    if bias is not None:
        y = L.apply("+", y, L.val(bias))
    y = L.swap(y, 1, 2)
    return L.reshape(y, (b, o, h // p, w // p))


def _convolution_backward(L, grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):
    """`aten.convolution_backward`: (grad_input, grad_weight, grad_bias), each where
    `output_mask` asks for it; patches as products of the patches, any other convolution by
    `_conv_general_backward`."""
    x, wt, g = L.val(x), L.val(weight), L.val(grad)
    if not _patch_conv(x, wt, stride, padding, dilation, transposed, groups):
        return _conv_general_backward(L, g, x, wt, stride, padding, dilation, transposed, groups, output_mask)
    o, c, p, _ = wt.shape
    b, _, h, w = x.shape
    n = (h // p) * (w // p)
    gm = L.swap(L.reshape(g, (b, o, n)), 1, 2)  # [B, N, O]
    dx = dw = db = None
    if output_mask[0]:
        rows = L.matmul(gm, L.reshape(wt, (o, c * p * p)))  # [B, N, C p p]
        y = L.reshape(rows, (b, h // p, w // p, c, p, p))
        y = L.permute(y, [0, 3, 1, 4, 2, 5])
        dx = L.reshape(y, (b, c, h, w))
    if output_mask[1]:
        rows = _patches(L, x, p)  # [B, N, K]
        flat_g = L.reshape(gm, (b * n, o))
        flat_x = L.reshape(rows, (b * n, c * p * p))
        dw = L.reshape(L.matmul(L.swap(flat_g, 0, 1), flat_x), (o, c, p, p))
    if output_mask[2]:
        db = L.reduce("sum", g, [0, 2, 3], False)
    return dx, dw, db


# --- windows: general convolution, pooling (and their backward ops) as gathers of the padded
# input at static positions. A window op over the last n axes reads, along each axis of size S
# padded to P, the positions `o * stride + k * dilation` (o < O outputs, k < K taps): one gather
# per axis by an i32 `[O, K]` table turns `[..., P1, P2]` into `[..., O1, K1, O2, K2]`; the
# backward scatter-adds `[..., O1, K1, O2, K2]` back at the same tables (col2im) and slices the
# padding off. An axis with one tap is a strided slice, no gather. Adaptive pools' windows of
# uneven sizes are K taps (the largest window) with those past a window's end masked.


def _ints(v, n: int, name: str) -> list[int]:
    """A size argument (an int, or a list of one or `n` ints) as `n` ints."""
    v = [int(v)] * n if isinstance(v, int) else [int(a) for a in v]
    if len(v) == 1:
        v = v * n
    if len(v) != n:
        raise ExportError(f"{name} {v} for {n} spatial axes")
    return v


def _i32(L, n: int) -> Value:
    """An i32 scalar (window arithmetic on positions is in i32)."""
    return L.cast(L.lit(n), "i32")


def _window_index(L, out: int, k: int, s: int, d: int) -> Value:
    """The i32 `[out, k]` table of positions `o * s + j * d` (window o, tap j)."""
    o = L.reshape(_iota(L, out), (out, 1))
    j = L.reshape(_iota(L, k), (1, k))
    o = L.apply("*", o, _i32(L, s)) if s != 1 else o
    j = L.apply("*", j, _i32(L, d)) if d != 1 else j
    return L.apply("+", o, j)


@dataclass
class _Windows:
    """A window op over the last `len(kernel)` axes: taps, strides, dilations, output sizes,
    the padding (low, high) and the size of each axis. The high padding is what the last window
    reaches: PyTorch's `ceil_mode` windows may reach past the padding it names, and padding no
    window reaches is left out."""

    kernel: list[int]
    stride: list[int]
    dilation: list[int]
    outs: list[int]
    pads: list[tuple[int, int]]
    sizes: list[int]

    @staticmethod
    def of(shape, kernel, stride, padding, dilation, outs) -> "_Windows":
        n = len(kernel)
        sizes = list(shape[len(shape) - n:])
        pads = []
        for i in range(n):
            if outs[i] < 1 or kernel[i] < 1 or stride[i] < 1 or dilation[i] < 1 or padding[i] < 0:
                raise ExportError(f"windows of kernel {kernel}, stride {stride}, padding {padding}, dilation "
                                  f"{dilation} giving {outs} outputs")
            reach = (outs[i] - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1
            pads.append((padding[i], max(reach - sizes[i] - padding[i], 0)))
        return _Windows(list(kernel), list(stride), list(dilation), list(outs), pads, sizes)

    def index(self, L, i: int) -> Value:
        """The i32 `[O, K]` table of the padded positions the windows read along axis `i`."""
        return _window_index(L, self.outs[i], self.kernel[i], self.stride[i], self.dilation[i])

    def valid(self, L, i: int) -> Value | None:
        """Which taps of the table along axis `i` are in their window (None: all are)."""
        return None

    def sliceable(self, i: int) -> bool:
        """Whether the windows along axis `i` are one tap each, a strided slice."""
        return self.kernel[i] == 1

    def mask(self, L) -> Value | None:
        """Which elements of `[O1, K1, O2, K2]` are in their windows (None: all are)."""
        n = len(self.kernel)
        out = None
        for i in range(n):
            v = self.valid(L, i)
            if v is None:
                continue
            shape = [1] * (2 * n)
            shape[2 * i], shape[2 * i + 1] = self.outs[i], self.kernel[i]
            v = L.reshape(v, tuple(shape))
            out = v if out is None else L.apply("where", out, v, L.cast(L.lit(0), "bool"), dtype="bool")
        return out

    def gather(self, L, x: Value, fill: float) -> Value:
        """`x` `[..., S1, S2]` padded with `fill` and read as `[..., O1, K1, O2, K2]`; taps
        outside their windows (`mask`) read `fill` too."""
        n = len(self.kernel)
        r = x.rank - n
        flat = [p for lo_hi in reversed(self.pads) for p in lo_hi]
        if any(flat):
            x = _constant_pad(L, x, flat, fill)
        for i in range(n):
            a = r + 2 * i
            if self.sliceable(i):
                x = _slice(L, x, a, 0, (self.outs[i] - 1) * self.stride[i] + 1, self.stride[i])
                x = L.reshape(x, x.shape[:a + 1] + (1,) + x.shape[a + 1:])
            else:
                x = _gather(L, x, self.index(L, i), a)
        m = self.mask(L)
        if m is not None:
            x = L.apply("where", m, x, L.cast(L.lit(fill), x.dtype), dtype=x.dtype)
        return x

    def scatter(self, L, cols: Value) -> Value:
        """The backward of `gather`: `[..., O1, K1, O2, K2]` added back at the positions each
        element was read from, the padding sliced off: `[..., S1, S2]`; taps outside their
        windows add nothing."""
        n = len(self.kernel)
        r = cols.rank - 2 * n
        m = self.mask(L)
        if m is not None:
            cols = L.apply("where", m, cols, L.cast(L.lit(0), cols.dtype), dtype=cols.dtype)
        for i in reversed(range(n)):
            a = r + 2 * i
            lo, hi = self.pads[i]
            p = self.sizes[i] + lo + hi
            if self.sliceable(i):
                cols = L.reshape(cols, cols.shape[:a + 1] + cols.shape[a + 2:])
                if self.stride[i] == 1 and self.outs[i] == p:
                    continue
                idx = L.apply("*", _iota(L, self.outs[i]), _i32(L, self.stride[i]))
            else:
                idx = self.index(L, i)
            cols = _scatter_add(L, idx, cols, a, p)
        for i in range(n):
            lo, _ = self.pads[i]
            cols = _slice(L, cols, r + i, lo, lo + self.sizes[i], 1)
        return cols

    def taps_first(self, L, cols: Value) -> Value:
        """`[B, C, O1, K1, O2, K2]` → `[B, C, K1 K2, O1 O2]` (the columns of im2col)."""
        n = len(self.kernel)
        r = cols.rank - 2 * n
        perm = list(range(r)) + [r + 2 * i + 1 for i in range(n)] + [r + 2 * i for i in range(n)]
        y = L.permute(cols, perm)
        return L.reshape(y, cols.shape[:r] + (math.prod(self.kernel), math.prod(self.outs)))

    def taps_back(self, L, cols: Value) -> Value:
        """The inverse of `taps_first`: `[B, C, K, N]` → `[B, C, O1, K1, O2, K2]`."""
        n = len(self.kernel)
        r = cols.rank - 2
        y = L.reshape(cols, cols.shape[:r] + tuple(self.kernel) + tuple(self.outs))
        perm = list(range(r))
        for i in range(n):
            perm += [r + n + i, r + i]
        return L.permute(y, perm)

    def taps_last(self, L, cols: Value) -> Value:
        """`[..., O1, K1, O2, K2]` → `[..., O1, O2, K1 K2]` (a pool's windows as rows)."""
        n = len(self.kernel)
        r = cols.rank - 2 * n
        perm = list(range(r)) + [r + 2 * i for i in range(n)] + [r + 2 * i + 1 for i in range(n)]
        y = L.permute(cols, perm)
        return L.reshape(y, cols.shape[:r] + tuple(self.outs) + (math.prod(self.kernel),))

    def taps_last_back(self, L, rows: Value) -> Value:
        """The inverse of `taps_last`: `[..., O1, O2, K]` → `[..., O1, K1, O2, K2]`."""
        n = len(self.kernel)
        r = rows.rank - n - 1
        y = L.reshape(rows, rows.shape[:r] + tuple(self.outs) + tuple(self.kernel))
        perm = list(range(r))
        for i in range(n):
            perm += [r + i, r + n + i]
        return L.permute(y, perm)


class _AdaptiveWindows(_Windows):
    """An adaptive pool's windows over the last two axes: output o of an axis of S reads
    `[floor(o S / O), ceil((o + 1) S / O))`, windows of uneven sizes, read as K taps (the
    largest size) of which those past a window's end are outside it (`valid`; their positions
    are clamped into the axis for the gather)."""

    @staticmethod
    def of(shape, outs) -> "_AdaptiveWindows":
        sizes = list(shape[-2:])
        if len(outs) != 2 or any(o < 1 for o in outs):
            raise ExportError(f"adaptive pooling of {list(shape)} to {list(outs)}")
        kernel = [max(-(-(o + 1) * s // n) - (o * s // n) for o in range(n)) for s, n in zip(sizes, outs)]
        return _AdaptiveWindows(kernel, [1, 1], [1, 1], list(outs), [(0, 0), (0, 0)], sizes)

    def bounds(self, L, i: int) -> tuple[Value, Value]:
        """The i32 `[O, 1]` start and end of each window along axis `i`."""
        s, n = self.sizes[i], self.outs[i]
        o = L.reshape(_iota(L, n), (n, 1))
        start = L.apply("/", L.apply("*", o, _i32(L, s)), _i32(L, n), dtype="i32")
        end = L.apply("/", L.apply("+", L.apply("*", o, _i32(L, s)), _i32(L, s + n - 1)), _i32(L, n), dtype="i32")
        return start, end

    def index(self, L, i: int) -> Value:
        start, _ = self.bounds(L, i)
        pos = L.apply("+", start, L.reshape(_iota(L, self.kernel[i]), (1, self.kernel[i])))
        return L.apply("min", pos, _i32(L, self.sizes[i] - 1))

    def valid(self, L, i: int) -> Value | None:
        start, end = self.bounds(L, i)
        if self.sizes[i] % self.outs[i] == 0:
            return None  # windows of one size
        pos = L.apply("+", start, L.reshape(_iota(L, self.kernel[i]), (1, self.kernel[i])))
        return L.apply("<", pos, end, dtype="bool")

    def sliceable(self, i: int) -> bool:
        return False

    def counts(self, L) -> Value:
        """The f32 `[O1, O2]` count of elements in each window."""
        c = [L.cast(L.apply("-", *reversed(self.bounds(L, i))), "f32") for i in range(2)]
        return L.apply("*", L.reshape(c[0], (self.outs[0], 1)), L.reshape(c[1], (1, self.outs[1])))


def _conv_windows(L, shape, wt, stride, padding, dilation, groups, outs) -> _Windows:
    """The windows of a convolution of an input of `shape` `[B, C, *S]` by `wt`
    `[O, C/groups, *K]` (1-d to 3-d) giving `outs` outputs along each spatial axis."""
    n = wt.rank - 2
    if n < 1 or n > 3 or len(shape) != n + 2:
        raise ExportError(f"a convolution of {list(shape)} by {list(wt.shape)} (batched 1-d to 3-d expected)")
    c, o = shape[1], wt.shape[0]
    if groups < 1 or c % groups or o % groups or wt.shape[1] * groups != c:
        raise ExportError(f"a convolution of {c} channels into {o} in {groups} groups by {list(wt.shape)}")
    return _Windows.of(shape, list(wt.shape[2:]), _ints(stride, n, "stride"), _ints(padding, n, "padding"),
                       _ints(dilation, n, "dilation"), list(outs))


def _depthwise(wt, groups) -> bool:
    """One input and one output channel a group (a depthwise convolution: ConvNeXt's 7x7,
    Segformer's 3x3): a windowed multiply-and-sum rather than products of K taps."""
    return groups > 1 and wt.shape[1] == 1 and wt.shape[0] == groups


def _conv_product(L, x, wt, w: _Windows, g: int) -> Value:
    """A convolution (no bias) of `x` `[B, C, *S]` by `wt` `[O, C/G, *K]` over windows `w`, as
    `[B, O, N]`: im2col, the windows of the padded input `[B, C, K, N]` (K taps, N outputs),
    then per group the product `[O/G, C/G K] @ [C/G K, N]` (the weight reshaped, no copy); a
    depthwise one multiplies each channel's taps by its weights and sums them."""
    b, c = x.shape[:2]
    o = wt.shape[0]
    k, n = math.prod(w.kernel), math.prod(w.outs)
    cols = w.taps_first(L, w.gather(L, x, 0.0))  # [B, C, K, N]
    if _depthwise(wt, g):
        return L.reduce("sum", L.apply("*", cols, L.reshape(wt, (c, k, 1))), [2], False)  # [B, C, N]
    if g == 1:
        return L.matmul(L.reshape(wt, (o, c * k)), L.reshape(cols, (b, c * k, n)))  # [B, O, N]
    cg, og = c // g, o // g
    y = L.matmul(L.reshape(wt, (g, og, cg * k)), L.reshape(cols, (b, g, cg * k, n)))  # [B, G, O/G, N]
    return L.reshape(y, (b, o, n))


def _conv_input_grad(L, grad, wt, w: _Windows, g: int, shape) -> Value:
    """The gradient of `_conv_product` for its input (of `shape`), given the output's `grad`
    `[B, O, *outs]`: the weights' transposed product with it (per group; a depthwise one
    elementwise), scattered back to the input positions the columns were read from (col2im,
    `_Windows.scatter`)."""
    b, c = shape[:2]
    o = wt.shape[0]
    k, n = math.prod(w.kernel), math.prod(w.outs)
    cg, og = c // g, o // g
    if _depthwise(wt, g):
        dcols = L.apply("*", L.reshape(grad, (b, c, 1, n)), L.reshape(wt, (c, k, 1)))  # [B, C, K, N]
    else:
        wg = L.swap(L.reshape(wt, (g, og, cg * k)), 1, 2)  # [G, C/G K, O/G]
        dcols = L.matmul(wg, L.reshape(grad, (b, g, og, n)))  # [B, G, C/G K, N]
    return w.scatter(L, w.taps_back(L, L.reshape(dcols, (b, c, k, n))))


def _conv_weight_grad(L, grad, x, wt, w: _Windows, g: int) -> Value:
    """The gradient of `_conv_product` for its weight: the output's `grad` times the same
    columns, summed over the batch."""
    b, c = x.shape[:2]
    o = wt.shape[0]
    k, n = math.prod(w.kernel), math.prod(w.outs)
    cg, og = c // g, o // g
    cols = w.taps_first(L, w.gather(L, x, 0.0))  # [B, C, K, N]
    if _depthwise(wt, g):
        dw = L.reduce("sum", L.apply("*", cols, L.reshape(grad, (b, c, 1, n))), [0, 3], False)  # [C, K]
    else:
        cols = L.swap(L.reshape(cols, (b, g, cg * k, n)), 2, 3)  # [B, G, N, C/G K]
        dw = L.reduce("sum", L.matmul(L.reshape(grad, (b, g, og, n)), cols), [0], False)  # [G, O/G, C/G K]
    return L.reshape(dw, wt.shape)


def _conv_general(L, x, wt, bias, stride, padding, dilation, transposed, groups):
    """A convolution as `_conv_product`, the bias added last. A transposed one (ConvTranspose,
    weight `[C_in, C_out/G, *K]`) is the input gradient of the convolution it transposes, that
    of its output's shape by the same weight: `_conv_input_grad` of `x` (`output_padding` is
    in the traced output shape: positions no window reaches get the bias alone)."""
    out = L.out_shape()
    if transposed:
        w = _conv_windows(L, out, wt, stride, padding, dilation, groups, x.shape[2:])
        y = L.reshape(_conv_input_grad(L, x, wt, w, groups, out), (out[0], out[1], math.prod(out[2:])))
    else:
        y = _conv_product(L, x, wt, _conv_windows(L, x.shape, wt, stride, padding, dilation, groups, out[2:]), groups)
    if bias is not None:
        y = L.apply("+", y, L.reshape(L.val(bias), (out[1], 1)))
    return L.reshape(y, out)


def _conv_general_backward(L, grad, x, wt, stride, padding, dilation, transposed, groups, output_mask):
    """The backward of `_conv_general`: grad_input and grad_weight by `_conv_input_grad` and
    `_conv_weight_grad`; of a transposed convolution, the roles swapped (its input gradient is
    the convolution of `grad`, its weight gradient that of the convolution with input `grad`
    and output gradient `x`); grad_bias a sum."""
    dx = dw = db = None
    if transposed:
        w = _conv_windows(L, grad.shape, wt, stride, padding, dilation, groups, x.shape[2:])
        if output_mask[0]:
            dx = L.reshape(_conv_product(L, grad, wt, w, groups), x.shape)
        if output_mask[1]:
            dw = _conv_weight_grad(L, x, grad, wt, w, groups)
    else:
        w = _conv_windows(L, x.shape, wt, stride, padding, dilation, groups, grad.shape[2:])
        if output_mask[0]:
            dx = _conv_input_grad(L, grad, wt, w, groups, x.shape)
        if output_mask[1]:
            dw = _conv_weight_grad(L, grad, x, wt, w, groups)
    if output_mask[2]:
        db = L.reduce("sum", grad, [0] + list(range(2, grad.rank)), False)
    return dx, dw, db


def _pool_windows(L, x, kernel_size, stride, padding, dilation, outs) -> _Windows:
    """The windows of a 2-d pooling over the last two axes of `x` (`stride` empty: the
    kernel's)."""
    if x.rank not in (3, 4):
        raise ExportError(f"2-d pooling of a tensor of shape {list(x.shape)}")
    k = _ints(kernel_size, 2, "kernel_size")
    s = _ints(stride, 2, "stride") if stride else k
    return _Windows.of(x.shape, k, s, _ints(padding, 2, "padding"), _ints(dilation, 2, "dilation"), list(outs))


def _window_max(L, w: _Windows, x: Value, out: tuple[int, ...]) -> tuple[Value, Value]:
    """Each window's largest value (padding and taps outside the window are `-inf`, so never
    picked) and, as PyTorch numbers it, the flat position `h * W + w` within the input plane of
    the first element that equals it (an `amin` of the positions where the window equals its
    max: positions grow in the window's order)."""
    rows = w.taps_last(L, w.gather(L, x, -math.inf))  # [..., O1, O2, K]
    m = L.reduce("amax", rows, [-1], True)
    hit = L.compare("==", rows, m)
    (h_lo, _), (w_lo, _) = w.pads
    width = w.sizes[1]
    kh, kw = w.kernel
    oh, ow = w.outs
    hs = L.apply("-", w.index(L, 0), _i32(L, h_lo)) if h_lo else w.index(L, 0)
    ws = L.apply("-", w.index(L, 1), _i32(L, w_lo)) if w_lo else w.index(L, 1)
    pos = L.apply("+", L.apply("*", L.reshape(hs, (oh, 1, kh, 1)), _i32(L, width)), L.reshape(ws, (1, ow, 1, kw)))
    pos = L.reshape(pos, (oh, ow, kh * kw))
    big = _i32(L, w.sizes[0] * width)
    idx = L.reduce("amin", L.apply("where", hit, pos, big, dtype="i32"), [-1], False)
    return L.reshape(m, out), L.cast(idx, dtype_name(L.node.meta["val"][1].dtype))


def _max_pool2d_with_indices(L, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """`max_pool2d_with_indices` (`_window_max`). `ceil_mode` is in the output sizes: the last
    windows read `-inf` past the padding."""
    x = L.val(x)
    out = _static_shape(L.node.meta["val"][0], L.node)
    return _window_max(L, _pool_windows(L, x, kernel_size, stride, padding, dilation, out[-2:]), x, out)


def _adaptive_max_pool2d(L, x, output_size):
    """`adaptive_max_pool2d` (`_AdaptiveWindows`, `_window_max`)."""
    x = L.val(x)
    if x.rank not in (3, 4):
        raise ExportError(f"2-d pooling of a tensor of shape {list(x.shape)}")
    out = _static_shape(L.node.meta["val"][0], L.node)
    return _window_max(L, _AdaptiveWindows.of(x.shape, out[-2:]), x, out)


def _max_pool2d_with_indices_backward(L, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """Each window's gradient added at the input position its max came from: one scatter-add
    into the flattened input at `plane * i + index` (i the plane: batch and channel)."""
    return _adaptive_max_pool2d_backward(L, grad, x, indices)


def _adaptive_max_pool2d_backward(L, grad, x, indices):
    """The backward of a max pool by its indices (`_max_pool2d_with_indices_backward`)."""
    g, x, idx = L.val(grad), L.val(x), _index32(L, L.val(indices))
    lead = x.shape[:-2]
    planes, plane = math.prod(lead), x.shape[-2] * x.shape[-1]
    per = g.numel // planes
    base = L.apply("*", L.reshape(_iota(L, planes), (planes, 1)), _i32(L, plane))
    flat = L.apply("+", L.reshape(idx, (planes, per)), base)
    out = _scatter_add(L, L.reshape(flat, (planes * per,)), L.reshape(g, (planes * per,)), 0, planes * plane)
    return L.reshape(out, x.shape)


def _pool_divisor(L, w: _Windows, count_include_pad: bool, divisor_override) -> Value:
    """An average pool's divisor for each output `[O1, O2]`, as PyTorch's kernel counts it: the
    window clipped to the padded input (`count_include_pad`) or to the input (not), or
    `divisor_override`; per axis a count from the window's start, their product."""
    if divisor_override:
        return L.lit(float(divisor_override))
    counts = []
    for i in range(2):
        lo, _ = w.pads[i]
        size = w.sizes[i]
        start = L.apply("-", L.apply("*", _iota(L, w.outs[i]), _i32(L, w.stride[i])), _i32(L, lo))
        end = L.apply("min", L.apply("+", start, _i32(L, w.kernel[i])), _i32(L, size + lo))
        if not count_include_pad:
            start = L.apply("max", start, _i32(L, 0))
            end = L.apply("min", end, _i32(L, size))
        counts.append(L.cast(L.apply("-", end, start), "f32"))
    return L.apply("*", L.reshape(counts[0], (w.outs[0], 1)), L.reshape(counts[1], (1, w.outs[1])))


def _avg_pool2d(L, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    """`avg_pool2d`: each window's sum (padding is zeros) over `_pool_divisor`."""
    x = L.val(x)
    out = L.out_shape()
    w = _pool_windows(L, x, kernel_size, stride, padding, 1, out[-2:])
    s = L.reduce("sum", w.taps_last(L, w.gather(L, x, 0.0)), [-1], False)
    return L.apply("/", s, L.cast(_pool_divisor(L, w, count_include_pad, divisor_override), x.dtype))


def _adaptive_avg_pool2d(L, x, output_size):
    """`_adaptive_avg_pool2d`: each window's sum (`_AdaptiveWindows`) over its count."""
    x = L.val(x)
    if x.rank not in (3, 4):
        raise ExportError(f"2-d pooling of a tensor of shape {list(x.shape)}")
    w = _AdaptiveWindows.of(x.shape, L.out_shape()[-2:])
    s = L.reduce("sum", w.taps_last(L, w.gather(L, x, 0.0)), [-1], False)
    return L.apply("/", s, L.cast(w.counts(L), x.dtype))


def _adaptive_avg_pool2d_backward(L, grad, x):
    """Each output's gradient over its window's count, added back over the window."""
    g, x = L.val(grad), L.val(x)
    w = _AdaptiveWindows.of(x.shape, g.shape[-2:])
    share = L.apply("/", g, L.cast(w.counts(L), g.dtype))
    k = math.prod(w.kernel)
    rows = L.broadcast(L.reshape(share, share.shape + (1,)), share.shape + (k,))
    return w.scatter(L, w.taps_last_back(L, rows))


def _avg_pool2d_backward(L, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """Each output's gradient over its divisor, spread over its window and added back at the
    input positions (`_Windows.scatter`)."""
    g, x = L.val(grad), L.val(x)
    w = _pool_windows(L, x, kernel_size, stride, padding, 1, g.shape[-2:])
    k = math.prod(w.kernel)
    share = L.apply("/", g, L.cast(_pool_divisor(L, w, count_include_pad, divisor_override), g.dtype))
    rows = L.broadcast(L.reshape(share, share.shape + (1,)), share.shape + (k,))
    return w.scatter(L, w.taps_last_back(L, rows))


# --- batch norm: the channels are axis 1, statistics over every other axis


def _as_traced(L, outs: tuple) -> tuple:
    """Each computed entry of a tuple result in the dtype PyTorch traced it with (a norm of a
    half-precision input computes its statistics in f32, as PyTorch's kernels do, and returns
    the output in the input's dtype)."""
    val = L.node.meta["val"]
    return tuple(L.cast(v, dtype_name(t.dtype)) if isinstance(v, Value) and isinstance(t, torch.Tensor) else v
                 for v, t in zip(outs, val))


def _f32(L, x) -> Value:
    """A norm's input in its computation dtype: f32 for half precision, as PyTorch computes."""
    x = L.val(x)
    return L.cast(x, "f32") if x.dtype in ("f16", "bf16") else x


def _per_channel(L, v, rank: int) -> Value:
    """A `[C]` tensor as `[1, C, 1, ...]` (in f32 if of half precision), to broadcast against a
    rank-`rank` input."""
    v = _f32(L, v)
    return L.reshape(v, (1, v.numel) + (1,) * (rank - 2))


def _batch_norm_affine(L, y, weight, bias):
    if weight is not None:
        y = L.apply("*", y, _per_channel(L, weight, y.rank))
    if bias is not None:
        y = L.apply("+", y, _per_channel(L, bias, y.rank))
    return y


def _saved_stats(L, first: int, mean: Value, invstd: Value) -> tuple:
    """The saved mean and inverse standard deviation outputs of an eval-mode batch norm: empty
    on the CPU (PyTorch's `[0]` tensors), the running statistics elsewhere, as the traced
    outputs say."""
    val = L.node.meta["val"]
    return tuple(torch.empty(0, dtype=val[first + i].dtype) if val[first + i].numel() == 0 else v
                 for i, v in enumerate((mean, invstd)))


def _batch_norm_eval(L, x, weight, bias, running_mean, running_var, eps):
    x = _f32(L, x)
    if x.rank < 2:
        raise ExportError(f"batch norm of a tensor of shape {list(x.shape)}")
    mean, var = _f32(L, running_mean), _f32(L, running_var)
    invstd = L.apply("rsqrt", L.apply("+", var, L.lit(eps)))
    y = L.apply("*", L.apply("-", x, _per_channel(L, mean, x.rank)), _per_channel(L, invstd, x.rank))
    return _batch_norm_affine(L, y, weight, bias), mean, invstd


def _batch_norm_no_training(L, x, weight, bias, running_mean, running_var, momentum, eps):
    """`_native_batch_norm_legit_no_training` (eval mode): `(x - mean) * rsqrt(var + eps) * w + b`
    with the running statistics; (out, save_mean, save_invstd)."""
    y, mean, invstd = _batch_norm_eval(L, x, weight, bias, running_mean, running_var, eps)
    return _as_traced(L, (y,) + _saved_stats(L, 1, mean, invstd))


def _batch_norm_train(L, x, weight, bias, eps):
    """Batch norm by the batch's statistics: the mean and biased variance over every axis but
    the channels; (out, save_mean `[C]`, save_invstd `[C]`, the variance `[C]`, the count of
    elements a channel)."""
    x = _f32(L, x)
    if x.rank < 2:
        raise ExportError(f"batch norm of a tensor of shape {list(x.shape)}")
    c = x.shape[1]
    axes = [0] + list(range(2, x.rank))
    mean = L.reduce("mean", x, axes, True)
    xc = L.apply("-", x, mean)
    var = L.reduce("mean", L.apply("*", xc, xc), axes, True)
    invstd = L.apply("rsqrt", L.apply("+", var, L.lit(eps)))
    y = _batch_norm_affine(L, L.apply("*", xc, invstd), weight, bias)
    return (y,) + tuple(L.reshape(v, (c,)) for v in (mean, invstd, var)) + (x.numel // c,)


def _batch_norm_legit(L, x, weight, bias, *rest):
    """`_native_batch_norm_legit`: `.no_stats` (no running statistics: BiT's weight
    standardisation normalises each filter so) by the batch's statistics in training; `.default`
    in eval mode by the running ones. In training `.default` writes the running statistics in
    place, which a graph cannot: refused (a functionalized graph holds the `_functional` form).
    (out, save_mean, save_invstd)."""
    if L.node.target._overloadname == "no_stats":
        training, momentum, eps = rest
        if not training:
            raise ExportError("batch norm in eval mode without running statistics")
        return _as_traced(L, _batch_norm_train(L, x, weight, bias, eps)[:3])
    running_mean, running_var, training, momentum, eps = rest
    if training:
        raise ExportError("batch norm in training that updates its running statistics in place")
    return _batch_norm_no_training(L, x, weight, bias, running_mean, running_var, momentum, eps)


def _batch_norm_functional(L, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """`_native_batch_norm_legit_functional`, as PyTorch's decomposition computes it: in training,
    normalised by the batch's mean and biased variance over every axis but the channels, and
    the running statistics moved by `momentum` towards the batch's mean and *unbiased* variance;
    (out, save_mean, save_invstd, new_running_mean, new_running_var)."""
    if not training:
        y, mean, invstd = _batch_norm_eval(L, x, weight, bias, running_mean, running_var, eps)
        return _as_traced(L, (y,) + _saved_stats(L, 1, mean, invstd) + (L.val(running_mean), L.val(running_var)))
    y, save_mean, save_invstd, var_c, n = _batch_norm_train(L, x, weight, bias, eps)
    keep = L.lit(1 - momentum)
    new_mean = L.apply("+", L.apply("*", save_mean, L.lit(momentum)), L.apply("*", _f32(L, running_mean), keep))
    if n < 2:
        raise ExportError("batch norm in training with one value a channel (no unbiased variance)")
    unbiased = L.apply("*", var_c, L.lit(n / (n - 1)))
    new_var = L.apply("+", L.apply("*", unbiased, L.lit(momentum)), L.apply("*", _f32(L, running_var), keep))
    return _as_traced(L, (y, save_mean, save_invstd, new_mean, new_var))


def _batch_norm_backward(L, grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                         output_mask):
    """`native_batch_norm_backward`, as PyTorch's decomposition computes it: with `s = sum(g)`
    and `d = sum(g * (x - mean))` over every axis but the channels (N elements each),
    grad_input `= (g - (x - mean) * d / N * invstd^2 - s / N) * invstd * w` in training
    (`g * invstd * w` in eval, from the running statistics), grad_weight `d * invstd`,
    grad_bias `s`."""
    g, x = _f32(L, grad), _f32(L, x)
    r = x.rank
    axes = [0] + list(range(2, r))
    n = x.numel // x.shape[1]
    if train:
        mean, invstd = _f32(L, save_mean), _f32(L, save_invstd)
    else:
        mean = _f32(L, running_mean)
        invstd = L.apply("rsqrt", L.apply("+", _f32(L, running_var), L.lit(eps)))
    xc = L.apply("-", x, _per_channel(L, mean, r))
    s = L.reduce("sum", g, axes, False)
    d = L.reduce("sum", L.apply("*", g, xc), axes, False)
    dx = dw = db = None
    if output_mask[0]:
        scale = invstd if weight is None else L.apply("*", invstd, _f32(L, weight))
        if train:
            proj = L.apply("*", L.apply("*", d, L.lit(1 / n)), L.apply("*", invstd, invstd))
            inner = L.apply("-", L.apply("-", g, L.apply("*", xc, _per_channel(L, proj, r))),
                            _per_channel(L, L.apply("*", s, L.lit(1 / n)), r))
        else:
            inner = g
        dx = L.apply("*", inner, _per_channel(L, scale, r))
    if output_mask[1]:
        dw = L.apply("*", d, invstd)
    if output_mask[2]:
        db = s
    return _as_traced(L, (dx, dw, db))


def _group_norm(L, x, weight, bias, n, c, hw, group, eps):
    """`native_group_norm`: each sample's channels in `group` groups, each normalised by its
    mean and biased variance (over its channels and positions), then the per-channel affine;
    (out, mean `[N, group]`, rstd `[N, group]`)."""
    x = _f32(L, x)
    if c % group or x.numel != n * c * hw:
        raise ExportError(f"group norm of {list(x.shape)} in {group} groups")
    v = L.reshape(x, (n, group, (c // group) * hw))
    mean = L.reduce("mean", v, [-1], True)
    xc = L.apply("-", v, mean)
    rstd = L.apply("rsqrt", L.apply("+", L.reduce("mean", L.apply("*", xc, xc), [-1], True), L.lit(eps)))
    y = L.reshape(L.apply("*", xc, rstd), (n, c, hw))
    if weight is not None:
        y = L.apply("*", y, L.reshape(_f32(L, weight), (c, 1)))
    if bias is not None:
        y = L.apply("+", y, L.reshape(_f32(L, bias), (c, 1)))
    return _as_traced(L, (L.reshape(y, x.shape), L.reshape(mean, (n, group)), L.reshape(rstd, (n, group))))


def _group_norm_backward(L, grad, x, mean, rstd, weight, n, c, hw, group, output_mask):
    """`native_group_norm_backward`, as PyTorch's decomposition computes it: from the sums
    `ds = sum(g * x)` and `db = sum(g)` over each channel's positions, grad_input
    `= g * rstd * w + x * c2 + c3` per group, grad_weight `sum_N (ds - db * mean) * rstd`,
    grad_bias `sum_N db`."""
    g, x = _f32(L, grad), _f32(L, x)
    mean, rstd = _f32(L, mean), _f32(L, rstd)
    cpg = c // group
    g3, x3 = L.reshape(g, (n, c, hw)), L.reshape(x, (n, c, hw))
    ds = L.reduce("sum", L.apply("*", g3, x3), [2], False)  # [N, C]
    db = L.reduce("sum", g3, [2], False)
    dx = dw = dbias = None
    if output_mask[0]:
        s = 1.0 / (hw * cpg)
        gamma = L.reshape(_f32(L, weight), (1, c)) if weight is not None else None
        ds_w = L.apply("*", ds, gamma) if gamma is not None else ds
        db_w = L.apply("*", db, gamma) if gamma is not None else db
        ds_val = L.reduce("sum", L.reshape(ds_w, (n, group, cpg)), [2], False)  # [N, G]
        db_val = L.reduce("sum", L.reshape(db_w, (n, group, cpg)), [2], False)
        c1 = L.reshape(rstd, (n, group, 1, 1))
        if gamma is not None:
            c1 = L.apply("*", c1, L.reshape(gamma, (1, group, cpg, 1)))
        r3 = L.apply("*", L.apply("*", rstd, rstd), rstd)
        c2 = L.apply("*", L.apply("*", L.apply("-", L.apply("*", db_val, mean), ds_val), r3), L.lit(s))
        c3 = L.apply("-", L.apply("neg", L.apply("*", c2, mean)), L.apply("*", L.apply("*", db_val, rstd), L.lit(s)))
        dx = L.apply("+", L.apply("+", L.apply("*", L.reshape(g, (n, group, cpg, hw)), c1),
                                  L.apply("*", L.reshape(x, (n, group, cpg, hw)), L.reshape(c2, (n, group, 1, 1)))),
                     L.reshape(c3, (n, group, 1, 1)))
        dx = L.reshape(dx, x.shape)
    if output_mask[1]:
        centred = L.apply("-", L.reshape(ds, (n, group, cpg)),
                          L.apply("*", L.reshape(db, (n, group, cpg)), L.reshape(mean, (n, group, 1))))
        dw = L.reshape(L.reduce("sum", L.apply("*", centred, L.reshape(rstd, (n, group, 1))), [0], False), (c,))
    if output_mask[2]:
        dbias = L.reduce("sum", db, [0], False)
    return _as_traced(L, (dx, dw, dbias))


def _weight_norm(L, v, g, dim=0):
    """`_weight_norm_interface` (`nn.utils.weight_norm`, wav2vec2's positional convolution):
    `v * g / |v|`, the norm over every axis but `dim`, kept as `g`'s shape; (weight, norm)."""
    v, g = L.val(v), L.val(g)
    a = L.axis(dim, v.rank)
    axes = [i for i in range(v.rank) if i != a]
    if not axes:
        raise ExportError("weight norm of a 1-d tensor")
    norm = L.apply("sqrt", L.reduce("sum", L.apply("*", v, v), axes, True))
    return L.apply("*", v, L.apply("/", g, norm)), norm


def _weight_norm_backward(L, grad_w, v, g, norm, dim=0):
    """`_weight_norm_interface_backward`, as PyTorch's kernel computes it: with
    `s = sum(grad_w * v)` over every axis but `dim`, grad_g `= s / |v|` and grad_v
    `= g / |v| * (grad_w - v * s / |v|^2)`."""
    gw, v, g, norm = L.val(grad_w), L.val(v), L.val(g), L.val(norm)
    a = L.axis(dim, v.rank)
    s = L.reduce("sum", L.apply("*", gw, v), [i for i in range(v.rank) if i != a], True)
    grad_g = L.apply("/", s, norm)
    grad_v = L.apply("*", L.apply("/", g, norm),
                     L.apply("-", gw, L.apply("*", v, L.apply("/", s, L.apply("*", norm, norm)))))
    return grad_v, grad_g

# --- attention as PyTorch's fused SDPA kernels spell it (forward and backward)


def _attention_args(L, q, k, v, attn_mask, dropout_p, scale, enable_gqa=False):
    if not 0.0 <= dropout_p < 1.0:
        raise ExportError(f"attention dropout with probability {dropout_p}")
    for x in (k, v):
        if x.rank != q.rank or x.shape[:-3] != q.shape[:-3] or q.rank < 3 or q.shape[-3] % x.shape[-3]:
            raise ExportError(f"attention of q {list(q.shape)} with k or v {list(x.shape)}")
    return scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])


def _heads(L, x, heads):
    """k or v with `heads` heads: each of its heads repeated for the query heads that share it
    (grouped-query attention: query head h reads key head h // (heads / kv heads))."""
    kv = x.shape[-3]
    if kv == heads:
        return x
    g = heads // kv
    lead = x.shape[:-3]
    wide = L.broadcast(L.reshape(x, lead + (kv, 1) + x.shape[-2:]), lead + (kv, g) + x.shape[-2:])
    return L.reshape(wide, lead + (heads,) + x.shape[-2:])


def _group_sum(L, dx, kv):
    """The gradient of `_heads`: the query heads' gradients summed over each group."""
    heads = dx.shape[-3]
    if kv == heads:
        return dx
    lead = dx.shape[:-3]
    grouped = L.reshape(dx, lead + (kv, heads // kv) + dx.shape[-2:])
    return L.reduce("sum", grouped, [len(lead) + 1], False)


def _scores(L, q, k, s, is_causal, mask):
    """Attention's scaled scores with the causal mask and `mask` (additive, or bool: keep where
    true) applied, in f32, and the log-sum-exp of each row (`[..., S, 1]`)."""
    k = _heads(L, k, q.shape[-3])
    kt = L.swap(k, k.rank - 2, k.rank - 1)
    sc = L.apply("*", L.b.op("@", [q.node, kt.node], q.dtype, q.shape[:-1] + (k.shape[-2],)), L.lit(s))
    sc = L.cast(sc, "f32")
    sq, sk = q.shape[-2], k.shape[-2]
    big = L.cast(L.lit(-3.0e38), "f32")
    if is_causal:
        rows = L.reshape(_iota(L, sq), (sq, 1))
        cols = L.reshape(_iota(L, sk), (1, sk))
        keep = L.apply("<=", cols, rows, dtype="bool")
        sc = L.apply("where", L.broadcast(keep, sc.shape), sc, big, dtype="f32")
    if mask is not None:
        m = L.val(mask)
        if m.dtype == "bool":
            sc = L.apply("where", L.broadcast(m, sc.shape), sc, big, dtype="f32")
        else:
            sc = L.apply("+", sc, L.cast(m, "f32"))
    top = L.reduce("amax", sc, [-1], True)
    lse = L.apply("+", top, L.apply("log", L.reduce("sum", L.apply("exp", L.apply("-", sc, top)), [-1], True)))
    return sc, lse


def _seed_in(L, state):
    """The seed (i32 `[1]`) in element 0 of a random-number state argument."""
    flat = L.reshape(state, (state.numel,))
    return flat if state.numel == 1 else _slice(L, flat, 0, 0, 1, 1)


def _lse_shape(L, i):
    """The shape PyTorch gives output `i` of the node (None when the node has one output)."""
    val = L.node.meta.get("val")
    if not isinstance(val, (tuple, list)) or not isinstance(val[i], torch.Tensor):
        return None
    return tuple(int(d) for d in val[i].shape)


def _known_mask(L, mask, is_causal, sq, sk):
    """(mask, is_causal) with a mask whose values the export knows (a folded constant, as the
    causal masks `transformers` builds from positions are) replaced by what it is: no mask where
    it keeps every score, the causal flag where it keeps exactly the scores of keys j <= query i
    (PyTorch's `is_causal`). A bool mask keeps where true; an additive one where it is 0, and
    masks where it is at most -1e4 (whose exp is 0 beside any score). Other masks are kept."""
    if not isinstance(mask, Value):
        return mask, is_causal
    node = L.b.nodes[mask.node]
    if node["op"] == "broadcast":  # (an expanded constant: its values once, broadcast)
        node = L.b.nodes[node["args"][0]]
    t = L.values.get(node["value"]) if node.get("op") == "input" else None
    if t is None:
        return mask, is_causal
    t = t.expand(mask.shape)
    if t.dtype == torch.bool:
        keep = t
    else:
        keep = t == 0
        if not bool((keep | (t <= -1e4)).all()):
            return mask, is_causal
    keep = keep.expand(*keep.shape[:-2], sq, sk) if keep.dim() >= 2 else keep.expand(sq, sk)
    if bool(keep.all()):
        return None, is_causal
    if bool((keep == torch.ones(sq, sk, dtype=torch.bool, device=keep.device).tril()).all()):
        return None, True
    return mask, is_causal


def _bias_of(L, mask):
    """A mask tensor as `attention_bias`'s bias: an additive mask as it is, a bool mask (true
    where a key is kept) as `where(m, 0, FILL)`, which the kernels select from the mask they read."""
    m = L.val(mask)
    if m.dtype != "bool":
        return m
    return L.apply("where", m, L.cast(L.lit(0.0), "f32"), L.cast(L.lit(-3.0e38), "f32"), dtype="f32")


def _bias_stats(L, q, k, s, is_causal, bias):
    """`attention_bias_lse` of q, k (heads repeated to q's, as views) and a bias: f32
    `[..., SQ, 2]`, each row's maximum and log of its sum of exponentials."""
    kk = _heads(L, k, q.shape[-3])
    causal = L.lit(1 if is_causal else 0).node
    return L.b.op("attention_bias_lse", [q.node, kk.node, bias.node, L.lit(s).node, causal], "f32",
                  q.shape[:-1] + (2,))


def _attention_bias(L, q, k, v, s, is_causal, mask, dropout=None):
    """Attention with a mask tensor as the `attention_bias` composite, whose kernel reads the
    mask in place: an additive mask is the bias; a bool mask (true where a key is kept) the bias
    `where(m, 0, FILL)`, which the kernel selects from the mask it reads. With `dropout` ((p,
    seed)), `attention_bias_dropout`."""
    bias = _bias_of(L, mask)
    kk, vv = _heads(L, k, q.shape[-3]), _heads(L, v, q.shape[-3])
    causal = L.lit(1 if is_causal else 0).node
    args = [q.node, kk.node, vv.node, bias.node, L.lit(s).node, causal] + _dropout_args(L, dropout)
    return L.b.op("attention_bias_dropout" if dropout else "attention_bias", args, q.dtype,
                  q.shape[:-1] + (v.shape[-1],))


def _dropout_args(L, dropout):
    """The trailing arguments (probability, seed) of attention's dropout forms; none without."""
    if dropout is None:
        return []
    p, seed = dropout
    return [L.lit(p).node, seed.node]


def _sdpa_forward(L, q, k, v, mask, dropout_p, is_causal, scale, n_out):
    """The outputs of a fused SDPA op (result, log-sum-exp, then what eqfuse cannot give): the
    `attention` and `attention_lse` composites, `attention_bias` with a mask tensor, and with
    dropout their dropout forms (`attention_dropout`, `attention_bias_dropout`: the kernels
    compute eqfuse's dropout mask of the probabilities from this site's seed, no score matrix
    is written); the log-sum-exp reshaped to PyTorch's `[B, H, S]` (flash) or `[B, H, S, 1]`
    (cuDNN)."""
    s = _attention_args(L, q, k, v, mask, dropout_p, scale)
    mask, is_causal = _known_mask(L, mask, is_causal, q.shape[-2], k.shape[-2])
    dropout = (dropout_p, L.seed()) if dropout_p > 0 else None
    if mask is not None:
        # The log-sum-exp for the backward from attention_bias_lse's statistics (a flash-style
        # kernel, not the scores written out): m + log l.
        lse = None
        if n_out > 1:
            stats = _bias_stats(L, q, k, s, is_causal, _bias_of(L, mask))
            lse = L.apply("+", _slice(L, stats, stats.rank - 1, 0, 1, 1), _slice(L, stats, stats.rank - 1, 1, 2, 1))
        out = _attention_bias(L, q, k, v, s, is_causal, mask, dropout)
    else:
        causal = L.lit(1 if is_causal else 0).node
        kk, vv = _heads(L, k, q.shape[-3]), _heads(L, v, q.shape[-3])
        out = L.b.op("attention_dropout" if dropout else "attention",
                     [q.node, kk.node, vv.node, L.lit(s).node, causal] + _dropout_args(L, dropout), q.dtype,
                     q.shape[:-1] + (v.shape[-1],))
        lse = L.b.op("attention_lse", [q.node, kk.node, L.lit(s).node, causal], "f32", q.shape[:-1] + (1,))
    if n_out == 1:
        return out
    want = _lse_shape(L, 1)
    if want in (q.shape[:-1], q.shape[:-1] + (1,)):
        lse = L.reshape(lse, want)
    elif want is not None and want[:-1] == q.shape[:-2] and want[-1] == -(-q.shape[-2] // 32) * 32:
        # The efficient kernel's rows rounded up to 32; it writes +inf past the last row.
        lse = _Padded(L.reshape(lse, q.shape[:-1]), want[-1], math.inf)
    else:
        lse = _Unsupported(f"the log-sum-exp of shape {want} (eqfuse gives {list(q.shape[:-1])})")
    return (out, lse, *(_sdpa_extra(L, i) for i in range(2, n_out)))


RNG_STATE = ("philox_seed", "philox_offset", "rng_state", "unused")
"""The names fused SDPA ops give the random-number state they return for their backward (the
forward's outputs, the backward's arguments)."""


def _sdpa_extra(L, i):
    """Output `i` (past the result and the log-sum-exp) of a fused SDPA op: its random-number
    state is a don't-care constant (the lowering has refused any dropout), an empty tensor (a
    debug mask not asked for) a constant, an undefined tensor None and a length its static
    value; anything else is unsupported."""
    val = L.node.meta.get("val")
    val = val[i] if isinstance(val, (tuple, list)) and i < len(val) else None
    name = L.node.target._schema.returns[i].name if isinstance(L.node.target, torch._ops.OpOverload) else ""
    if isinstance(val, torch.Tensor) and name in RNG_STATE and L.node.name in L.seeds.sites:
        return _SeedState(L.seeds.sites[L.node.name], torch.zeros(tuple(val.shape), dtype=val.dtype))
    if isinstance(val, torch.Tensor) and name in RNG_STATE:
        return _DontCare(f"{name} of {L.node.name}", torch.zeros(tuple(val.shape), dtype=val.dtype))
    if isinstance(val, torch.Tensor) and val.numel() == 0:
        return _Constant(torch.empty(tuple(val.shape), dtype=val.dtype))
    if val is None or (isinstance(val, int) and not isinstance(val, bool)):
        return val  # an undefined tensor (cumulative lengths of a dense batch), a static length
    return _Unsupported(f"the SDPA output {name or i}")


def _reads_only_rng_state(user: torch.fx.Node, node: torch.fx.Node) -> bool:
    """Whether `user` is a fused SDPA backward without dropout that reads `node` only as its
    random-number state (which it then ignores)."""
    t = user.target
    if not isinstance(t, torch._ops.OpOverload) or not _target_name(user).startswith("_scaled_dot_product"):
        return False
    try:
        bound = t._schema.arguments
        named = {a.name: (user.args[j] if j < len(user.args) else user.kwargs.get(a.name, a.default_value))
                 for j, a in enumerate(bound)}
    except Exception:  # noqa: BLE001 - an unexpected schema: not the case handled here
        return False
    if "dropout_p" not in named or named["dropout_p"] not in (0, 0.0, None):
        return False
    reads = [n for n, v in named.items() if v is node]
    return bool(reads) and all(n in RNG_STATE for n in reads)


class _Unsupported:
    """A tuple entry eqfuse cannot give; using it is an error naming what it is."""

    def __init__(self, what: str):
        self.what = what


class _Constant:
    """A tuple entry known at export time (a tensor the graph returns as it is)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class _Padded:
    """An output PyTorch pads along its last axis to `length` with `fill` (the graph computes
    `value`; `Exported.pads` tells the caller)."""

    def __init__(self, value: Value, length: int, fill: float):
        self.value, self.length, self.fill = value, length, fill


class _SeedState(_Constant):
    """A fused SDPA forward's random-number state with dropout: it carries the seed of `site`
    (the backend fills it on every call; `tensor` gives its dtype and shape)."""

    def __init__(self, site: int, tensor: torch.Tensor):
        super().__init__(tensor)
        self.site = site


class _DontCare(_Constant):
    """A tuple entry whose value nothing may depend on (an SDPA op's random-number state without
    dropout): a constant output that no check compares; a lowering that reads it is an error."""

    def __init__(self, what: str, tensor: torch.Tensor | None):
        super().__init__(tensor)
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what}: a don't-care value>"


def _sdpa_flash_cpu(L, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    return _sdpa_forward(L, q, k, v, attn_mask, dropout_p, is_causal, scale, 2)


def _sdpa_flash(L, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    return _sdpa_forward(L, q, k, v, None, dropout_p, is_causal, scale, 9)


def _sdpa_efficient(L, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    return _sdpa_forward(L, q, k, v, attn_bias, dropout_p, is_causal, scale, 4)


def _sdpa_cudnn(L, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                *, scale=None):
    return _sdpa_forward(L, q, k, v, attn_bias, dropout_p, is_causal, scale, 9)


def _sdpa_backward(L, g, q, k, v, out, lse, mask, dropout_p, is_causal, scale, state=None):
    """(dq, dk, dv) of a fused SDPA op's backward; with dropout, the seed is element 0 of the
    random-number state `state` the forward returned."""
    s = _attention_args(L, q, k, v, mask, dropout_p, scale)
    mask, is_causal = _known_mask(L, mask, is_causal, q.shape[-2], k.shape[-2])
    dropout = None
    if dropout_p > 0:
        if not isinstance(state, Value):
            raise ExportError("an attention backward with dropout whose random-number state is not an input")
        dropout = (dropout_p, _seed_in(L, state))
    if mask is not None:
        return _attention_bias_grads(L, g, q, k, v, out, s, is_causal, mask, dropout, lse)
    return _sdpa_grads(L, g, q, k, v, out, lse, s, is_causal, dropout)


def _attention_bias_grads(L, g, q, k, v, out, s, is_causal, mask, dropout=None, lse=None):
    """(dq, dk, dv) of attention with a mask tensor by eqfuse's flash-style backward composites
    of `attention_bias` (the mask needs no gradient here): their row statistics built from the
    forward's log-sum-exp `lse` by elementwise operations (`_stats_of_lse`), or, where there is
    none of a shape eqfuse reads, computed again (`attention_bias_lse`, a pass over the scores as
    costly as the forward's); then the gradients; with `dropout` ((p, seed)), their dropout forms
    (`attention_bias_dropout_grad_*`). Where the kernels do not run (f32), eqfuse expands them
    into the decomposition."""
    g, out = L.val(g), L.val(out)
    bias = _bias_of(L, mask)
    kv = k.shape[-3]
    kk, vv = _heads(L, k, q.shape[-3]), _heads(L, v, q.shape[-3])
    causal = L.lit(1 if is_causal else 0).node
    stats = _stats_of_lse(L, lse, q, k.shape[-2], is_causal)
    if stats is None:
        stats = _bias_stats(L, q, k, s, is_causal, bias)
    delta = L.reduce("sum", L.apply("*", L.cast(g, "f32"), L.cast(out, "f32")), [-1], True)
    args = [q.node, kk.node, vv.node, g.node, stats.node, delta.node, bias.node, L.lit(s).node, causal]
    args += _dropout_args(L, dropout)
    op = "attention_bias_dropout_grad_" if dropout else "attention_bias_grad_"
    dq = L.b.op(op + "q", args, q.dtype, q.shape)
    dk = _group_sum(L, L.b.op(op + "k", args, k.dtype, kk.shape), kv)
    dv = _group_sum(L, L.b.op(op + "v", args, v.dtype, vv.shape), kv)
    return dq, dk, dv


FILL_ROW_LSE = -2.0 ** 24
"""A log-sum-exp below this is that of a row of one fill (`_stats_of_lse`)."""


def _lse_rows(L, lse, q):
    """The log-sum-exp a fused SDPA backward is given (`[..., SQ]`, cuDNN's `[..., SQ, 1]`, the
    efficient kernel's rows rounded up to 32, or that padding as the forward's export left it)
    as f32 `[..., SQ, 1]`; None where it is not a tensor of one of those shapes."""
    if isinstance(lse, _Padded):  # (a joint graph: the forward's value before its padding)
        lse = lse.value
    if not isinstance(lse, Value):
        return None
    if lse.shape[:-1] == q.shape[:-2] and lse.shape[-1] > q.shape[-2]:  # (the efficient kernel's padding)
        lse = _slice(L, lse, lse.rank - 1, 0, q.shape[-2], 1)
    if lse.shape not in (q.shape[:-1], q.shape[:-1] + (1,)):
        return None
    return L.reshape(L.cast(lse, "f32"), q.shape[:-1] + (1,))


def _stats_of_lse(L, lse, q, sk, is_causal):
    """`attention_bias_lse`'s statistics (f32 `[..., SQ, 2]`: m, log l) of the masked scores
    whose log-sum-exp the forward returned, by elementwise operations on it; None where `lse` is
    not one (then the caller computes them again from the scores).

    The backward kernels take P = exp(s - m - log l). A row's log-sum-exp gives m = lse, log l =
    0 (PyTorch's own backward: P = exp(s - lse)), except:
    - a row of fills (every key masked by an additive fill or eqfuse's bool fill, -3e38): each
      score rounds to the fill in f32, and so does lse = fill + log(keys), so exp(s - lse) would
      be 1 where softmax gives 1 / keys. Such a row's lse is below FILL_ROW_LSE (-2^24: there one
      unit of the last place of an f32 is at least 2, and a score differs from lse by nothing f32
      resolves: the scores are the fill), so there m = lse (the fill) and log l = log(keys the
      kernels include in the row: every key, or under `is_causal` keys j <= i, PyTorch's
      top-left convention, as eqfuse's kernels and `attention_bias_lse` apply it);
    - a row whose lse is -inf (a forward that saw no finite score there; PyTorch's kernels turn
      a bool mask into -inf): m = the largest f32, so that P = 0 (zero gradients) whatever
      score eqfuse's fill gives the row, not exp(fill + FLT_MAX) = inf.
    Both clamps of the kernels (m >= -FLT_MAX, log l >= 0) then do nothing, so the reference's
    P = exp(s - m - log l) is the kernels'. Elsewhere P is as close as the f32 lse is, as in
    PyTorch's backward (a -1e4 mask's row of fills: lse near -1e4, held to 2^-11, and so its P
    relatively; its scores, rounded alike, are no closer to the exact ones)."""
    lse = _lse_rows(L, lse, q)
    if lse is None:
        return None
    f32 = lambda x: L.cast(L.lit(x), "f32")  # noqa: E731
    top = float(torch.finfo(torch.float32).max)
    fills = L.apply("<", lse, f32(FILL_ROW_LSE), dtype="bool")
    lost = L.apply("<", lse, f32(-top), dtype="bool")
    m = L.apply("where", lost, f32(top), lse, dtype="f32")
    sq = q.shape[-2]
    if is_causal and sq > 1 and sk > 1:
        # Row i includes keys j <= i: min(i + 1, SK) of them.
        keys = L.apply("min", L.apply("+", _iota(L, sq), L.cast(L.lit(1), "i32"), dtype="i32"),
                       L.cast(L.lit(sk), "i32"), dtype="i32")
        log_keys = L.reshape(L.apply("log", L.cast(keys, "f32"), dtype="f32"), (sq, 1))
    else:
        log_keys = f32(math.log(sk))
    log_l = L.apply("where", fills, log_keys, f32(0.0), dtype="f32")
    # Side by side as a selection along the last axis, one elementwise kernel of the statistics
    # (a `concat` of values computed in one kernel would need a second).
    shape = lse.shape[:-1] + (2,)
    first = L.apply("==", _iota(L, 2), L.cast(L.lit(0), "i32"), dtype="bool")
    return L.apply("where", first, L.broadcast(m, shape), L.broadcast(log_l, shape), dtype="f32")


def _sdpa_grads(L, g, q, k, v, out, lse, s, is_causal, dropout=None):
    """(dq, dk, dv) by eqfuse's flash-style backward composites; with `dropout` ((p, seed)),
    their dropout forms (`attention_dropout_grad_*`), the statistics being those of the scores."""
    g, out = L.val(g), L.val(out)
    lse4 = _lse_rows(L, lse, q)
    if lse4 is None:
        raise ExportError(f"a log-sum-exp of shape {list(lse.shape)}" if isinstance(lse, Value)
                          else f"a log-sum-exp that is not a tensor ({lse!r})")
    delta = L.reduce("sum", L.apply("*", L.cast(g, "f32"), L.cast(out, "f32")), [-1], True)
    causal = L.lit(1 if is_causal else 0).node
    kv = k.shape[-3]
    k, v = _heads(L, k, q.shape[-3]), _heads(L, v, q.shape[-3])
    args = [q.node, k.node, v.node, g.node, lse4.node, delta.node, L.lit(s).node, causal] + _dropout_args(L, dropout)
    op = "attention_dropout_grad_" if dropout else "attention_grad_"
    dq = L.b.op(op + "q", args, q.dtype, q.shape)
    dk = _group_sum(L, L.b.op(op + "k", args, k.dtype, k.shape), kv)
    dv = _group_sum(L, L.b.op(op + "v", args, v.dtype, v.shape), kv)
    return dq, dk, dv


def _sdpa_flash_cpu_backward(L, g, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None):
    return _sdpa_backward(L, g, q, k, v, out, lse, attn_mask, dropout_p, is_causal, scale)


def _sdpa_flash_backward(L, g, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal, seed, offset,
                         *, scale=None):
    return _sdpa_backward(L, g, q, k, v, out, lse, None, dropout_p, is_causal, scale, seed)


def _sdpa_efficient_backward(L, g, q, k, v, attn_bias, out, lse, seed, offset, dropout_p, grad_input_mask,
                             is_causal=False, *, scale=None):
    return _sdpa_backward(L, g, q, k, v, out, lse, attn_bias, dropout_p, is_causal, scale, seed) + (None,)


def _sdpa_cudnn_backward(L, g, q, k, v, out, lse, seed, offset, attn_bias, cum_q, cum_k, max_q, max_k, dropout_p,
                         is_causal, *, scale=None):
    return _sdpa_backward(L, g, q, k, v, out, lse, attn_bias, dropout_p, is_causal, scale, seed)


# --- losses with integer targets


def _nll_loss_terms(L, logp, target, weight, ignore_index):
    if weight is not None:
        raise ExportError("nll_loss with class weights")
    x, t = L.val(logp), _index32(L, L.val(target))
    if x.rank not in (1, 2):
        raise ExportError(f"nll_loss of rank {x.rank} (rows of classes expected)")
    x2 = x if x.rank == 2 else L.reshape(x, (1,) + x.shape)
    t1 = t if t.rank == 1 else L.reshape(t, (1,))
    c = x2.shape[-1]
    hot = L.b.op("onehot", [t1.node, L.lit(c).node], "f32", t1.shape + (c,))
    picked = L.reduce("sum", L.apply("*", L.cast(hot, x.dtype), x2), [-1], False)
    valid = L.cast(L.compare("!=", t1, ignore_index), x.dtype)
    return picked, valid, hot


def _nll_loss_forward(L, logp, target, weight, reduction, ignore_index):
    picked, valid, _ = _nll_loss_terms(L, logp, target, weight, ignore_index)
    total = L.reduce("sum", valid, None, False)
    if reduction == 0:
        loss = L.apply("neg", picked)
        if L.val(logp).rank == 1:
            loss = L.reshape(loss, ())
    elif reduction == 1:
        loss = L.apply("neg", L.apply("/", L.reduce("sum", picked, None, False), total))
    else:
        loss = L.apply("neg", L.reduce("sum", picked, None, False))
    return loss, total


def _nll_loss_backward(L, grad, logp, target, weight, reduction, ignore_index, total_weight):
    x = L.val(logp)
    _, valid, hot = _nll_loss_terms(L, logp, target, weight, ignore_index)
    g = L.cast(L.val(grad), x.dtype)
    if reduction == 1:
        g = L.apply("/", g, L.cast(L.val(total_weight), x.dtype))
    if g.rank:  # reduction "none": one gradient a row
        g = L.reshape(g, valid.shape)
    coef = L.reshape(L.apply("*", valid, g), valid.shape + (1,))
    out = L.apply("neg", L.apply("*", L.cast(hot, x.dtype), coef))
    return L.reshape(out, x.shape)


def _rms_norm(L, x, normalized_shape, weight=None, eps=None):
    v = L.val(x)
    if len(normalized_shape) != 1:
        raise ExportError("rms_norm over more than the last axis")
    e = eps if eps is not None else torch.finfo(_torch_dtype(v.dtype)).eps
    ms = L.reduce("mean", L.apply("*", v, v), [-1], True)
    y = L.apply("*", v, L.apply("rsqrt", L.apply("+", ms, L.lit(e))))
    return L.apply("*", y, L.val(weight)) if weight is not None else y


LOWERINGS = {
    "add": lambda L, a, b, alpha=1: L.pointwise("+", a, _scaled(L, b, alpha)),
    "sub": lambda L, a, b, alpha=1: L.pointwise("-", a, _scaled(L, b, alpha)),
    "rsub": lambda L, a, b, alpha=1: L.pointwise("-", b, _scaled(L, a, alpha)),
    "mul": _binary("*"),
    "div": _div,
    "true_divide": _div,
    "floor_divide": lambda L, a, b: _div(L, a, b, "floor"),
    "pow": _binary("pow"),
    "maximum": _binary("max"),
    "minimum": _binary("min"),
    "clamp_min": lambda L, x, m: L.pointwise("max", x, m),
    "clamp_max": lambda L, x, m: L.pointwise("min", x, m),
    "clamp": _clamp,
    "neg": _unary("neg"),
    "exp": _unary("exp"),
    "log": _unary("log"),
    "sqrt": _unary("sqrt"),
    "rsqrt": _unary("rsqrt"),
    "reciprocal": _unary("recip"),
    "abs": _unary("abs"),
    "tanh": _unary("tanh"),
    "sigmoid": _unary("sigmoid"),
    "relu": _unary("relu"),
    "silu": _unary("silu"),
    "erf": _unary("erf"),
    "sin": _unary("sin"),
    "cos": _unary("cos"),
    "square": _unary("square"),
    "gelu": _gelu,
    "log1p": lambda L, x: L.pointwise("log", L.pointwise("+", x, 1)),
    "expm1": lambda L, x: L.pointwise("-", L.pointwise("exp", x), 1),
    "logical_not": lambda L, x: L.apply("not", L.cast(x, "bool"), dtype="bool"),
    # `lerp` (Adam's moments) decomposes to `prims.fma`: a product and a sum, one rounding more.
    "fma": lambda L, a, b, c: L.pointwise("+", L.pointwise("*", a, b), c),
    "sign": _sign,
    "floor": _rounding("floor"),
    "ceil": _rounding("ceil"),
    "round": _rounding("round"),
    "trunc": _rounding("trunc"),
    "fix": _rounding("trunc"),
    "frac": lambda L, x: L.pointwise("-", x, _rounding("trunc")(L, x)),
    "remainder": _remainder(True),
    "fmod": _remainder(False),
    "leaky_relu": _leaky_relu,
    "leaky_relu_backward": _leaky_relu_backward,
    "elu": _elu,
    "celu": lambda L, x, alpha=1.0: _elu(L, x, alpha, 1.0, 1.0 / alpha),
    "selu": lambda L, x: _elu(L, x, 1.6732632423543772, 1.0507009873554805, 1.0),
    "elu_backward": _elu_backward,
    "log2": lambda L, x: L.pointwise("*", L.pointwise("log", x), 1 / math.log(2)),
    "log10": lambda L, x: L.pointwise("*", L.pointwise("log", x), 1 / math.log(10)),
    "exp2": lambda L, x: L.pointwise("exp", L.pointwise("*", x, math.log(2))),
    "sgn": _sign,
    "isnan": _float_class("isnan"),
    "isinf": _float_class("isinf"),
    "isfinite": _float_class("isfinite"),
    "isposinf": _float_class("isposinf"),
    "isneginf": _float_class("isneginf"),
    "empty_strided": _new_empty,
    "eq": _cmp("=="),
    "ne": _cmp("!="),
    "lt": _cmp("<"),
    "le": _cmp("<="),
    "gt": _cmp(">"),
    "ge": _cmp(">="),
    "where": _where,
    "masked_fill": _masked_fill,
    "_to_copy": _cast,
    "_fft_c2c": _fft_c2c,
    "view_as_real": _view_as_real,
    "view_as_complex": _view_as_complex,
    "real": _real,
    "to": _cast,
    "convert_element_type": _cast,
    "type_as": _cast,
    "clone": _identity,
    "contiguous": _identity,
    "alias": _identity,
    "detach": _identity,
    "lift_fresh_copy": _identity,
    "dropout": _dropout,
    "native_dropout": _native_dropout,
    "native_dropout_backward": _native_dropout_backward,
    "sum": _sum,
    "mean": _mean,
    "amax": _amax,
    "amin": _amin,
    "argmax": _arg_extreme("amax"),
    "argmin": _arg_extreme("amin"),
    "max": _max_min_dim("amax"),
    "min": _max_min_dim("amin"),
    "copy": _copy,
    "repeat": _repeat,
    "var_mean": _var_mean,
    "var": _var,
    "softmax": _softmax("softmax"),
    "_softmax": _softmax("softmax"),
    "log_softmax": _softmax("log_softmax"),
    "_log_softmax": _softmax("log_softmax"),
    "layer_norm": _layer_norm,
    "native_layer_norm": _native_layer_norm,
    "linear": _dense,
    "addmm": _addmm,
    "mm": _matmul,
    "bmm": _matmul,
    "matmul": _matmul,
    "t": _t,
    "transpose": _transpose,
    "permute": _permute,
    "view": _view,
    "reshape": _view,
    "_unsafe_view": _view,
    "flatten": _view,
    "expand": _expand,
    "as_strided": _as_strided,
    "unsqueeze": _unsqueeze,
    "squeeze": _squeeze,
    "zeros_like": _like(0.0),
    "new_zeros": _like(0.0),
    "new_ones": _like(1.0),
    "ones_like": _like(1.0),
    "full_like": _like(None),
    "new_empty": _new_empty,
    "new_empty_strided": _new_empty,
    "scaled_dot_product_attention": _sdpa,
    "sdpa_math_mask": _sdpa_math_mask,
    "threshold_backward": _threshold_backward,
    "hardtanh": _hardtanh,
    "hardtanh_backward": _hardtanh_backward,
    "tanh_backward": _tanh_backward,
    "sigmoid_backward": _sigmoid_backward,
    "gelu_backward": _gelu_backward,
    "_softmax_backward_data": _softmax_backward,
    "_log_softmax_backward_data": _log_softmax_backward,
    "getitem": _getitem,
    "slice": _slice,
    "select": _select,
    "narrow": _narrow,
    "cat": _cat,
    "concat": _cat,
    "stack": _stack,
    "chunk": _chunk,
    "unbind": _unbind,
    "embedding": _embedding,
    "index_select": _index_select,
    "embedding_dense_backward": _embedding_dense_backward,
    "index_put": _index_put,
    "index_copy": _index_copy,
    "slice_scatter": _slice_scatter,
    "as_strided_scatter": _as_strided_scatter,
    "select_scatter": _select_scatter,
    "fill": _fill,
    "cumsum": _cumsum,
    "topk": _topk,
    "sort": _sort,
    "histc": _histc,
    "grouped_mm_fallback": _grouped_mm_fallback,
    "grouped_mm_fallback_backward": _grouped_mm_fallback_backward,
    "empty_permuted": _new_empty,
    "empty": _new_empty,
    "flip": _flip,
    "select_backward": _select_backward,
    "slice_backward": _slice_backward,
    "bitwise_and": _logical("and"),
    "logical_and": _logical("and", logical=True),
    "bitwise_or": _logical("or"),
    "logical_or": _logical("or", logical=True),
    "bitwise_not": _bitwise_not,
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa_flash_cpu,
    "_scaled_dot_product_flash_attention": _sdpa_flash,
    "_scaled_dot_product_efficient_attention": _sdpa_efficient,
    "_scaled_dot_product_cudnn_attention": _sdpa_cudnn,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_flash_cpu_backward,
    "_scaled_dot_product_flash_attention_backward": _sdpa_flash_backward,
    "_scaled_dot_product_efficient_attention_backward": _sdpa_efficient_backward,
    "_scaled_dot_product_cudnn_attention_backward": _sdpa_cudnn_backward,
    "nll_loss_forward": _nll_loss_forward,
    "nll_loss_backward": _nll_loss_backward,
    "rms_norm": _rms_norm,
    "gather": _take_along,
    "index": _index,
    "constant_pad_nd": _constant_pad,
    "scatter": _scatter_value,
    "scatter_add": _scatter_add_along,
    "any": _any,
    "convolution": _convolution,
    "convolution_backward": _convolution_backward,
    "max_pool2d_with_indices": _max_pool2d_with_indices,
    "max_pool2d_with_indices_backward": _max_pool2d_with_indices_backward,
    "avg_pool2d": _avg_pool2d,
    "avg_pool2d_backward": _avg_pool2d_backward,
    "_adaptive_avg_pool2d": _adaptive_avg_pool2d,
    "_adaptive_avg_pool2d_backward": _adaptive_avg_pool2d_backward,
    "adaptive_max_pool2d": _adaptive_max_pool2d,
    "adaptive_max_pool2d_backward": _adaptive_max_pool2d_backward,
    "_native_batch_norm_legit_no_training": _batch_norm_no_training,
    "_native_batch_norm_legit_functional": _batch_norm_functional,
    "_native_batch_norm_legit": _batch_norm_legit,
    "native_batch_norm_backward": _batch_norm_backward,
    "native_group_norm": _group_norm,
    "native_group_norm_backward": _group_norm_backward,
    "_weight_norm_interface": _weight_norm,
    "_weight_norm_interface_backward": _weight_norm_backward,
    "_assert_tensor_metadata": _nothing,
    "_assert_async": _nothing,
    "_assert_scalar": _nothing,
}
"""ATen operators (by overload packet name) eqfuse can take, each with its lowering."""
