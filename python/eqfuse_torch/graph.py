"""Writing eqfuse JSON graphs (`eqfuse.graph/1`, docs/graph-schema.md) from Python.

`GraphBuilder` appends nodes in order and tracks each value's dtype and shape, so that the code
lowering another framework's operators can decide where reshapes and casts are needed. It needs
no PyTorch. Invariant: every node's `args` index earlier nodes, equal nodes are written once
(the Rust reader hash-conses too), and names are identifiers unique within the graph.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

SCHEMA = "eqfuse.graph/1"
DTYPES = ("f32", "f16", "bf16", "i32", "bool")

# Operator spellings of eqfuse's op table (src/ir/lang.rs `OPS`). An input may not use one as its name.
OPS = frozenset(
    "neg exp log sqrt rsqrt recip abs tanh sigmoid relu gelu gelu_tanh silu erf sin cos square not "
    "floor ceil round trunc "
    "+ - * / pow max min < <= > >= == != sum mean amax amin where cast transpose reshape broadcast @ "
    "iota onehot dropout softmax log_softmax layernorm rmsnorm cross_entropy attention grad "
    "attention_lse attention_grad_q attention_grad_k attention_grad_v gather scatter_add slice concat "
    "attention_bias attention_bias_lse attention_bias_grad_q attention_bias_grad_k attention_bias_grad_v".split()
    + "attention_dropout attention_bias_dropout attention_dropout_grad_q attention_dropout_grad_k".split()
    + "attention_dropout_grad_v attention_bias_dropout_grad_q attention_bias_dropout_grad_k".split()
    + ["attention_bias_dropout_grad_v"]
)

POINTWISE = frozenset(
    "neg exp log sqrt rsqrt recip abs tanh sigmoid relu gelu gelu_tanh silu erf sin cos square not "
    "floor ceil round trunc + - * / pow max min < <= > >= == != where cast".split()
)
"""Operators applied element by element, their operands broadcast (`cast`'s second argument is
its dtype): each element of the result depends only on the elements at its index."""


class ExportError(Exception):
    """A graph eqfuse cannot take; the message names the operators and nodes involved."""


@dataclass(frozen=True)
class Value:
    """A node of the graph being built: its index, dtype (None for a weak literal, which takes
    the dtype of the tensor it meets) and shape."""

    node: int
    dtype: str | None
    shape: tuple[int, ...]

    @property
    def weak(self) -> bool:
        return self.dtype is None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy broadcasting; raises ExportError for shapes that do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        sizes = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise ExportError(f"shapes {list(shapes)} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _aligned(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """`shape` with leading axes of size 1 up to `rank` (as broadcasting aligns it)."""
    return (1,) * (rank - len(shape)) + tuple(shape)


def _unit_axes_only(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether a reshape from `a` to `b` only adds or removes axes of size 1."""
    return [d for d in a if d != 1] == [d for d in b if d != 1]


def _moved(base: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The base shape `base` of a value of shape `a`, carried through a reshape to `b` that only
    adds or removes axes of size 1: the axes longer than 1 keep their sizes in order."""
    kept = iter(s for s, d in zip(base, a) if d != 1)
    return tuple(next(kept) if d != 1 else 1 for d in b)


def identifier(text: str) -> str:
    """An identifier from any text: other characters become `_`, and a `v_` prefix is added
    when the text does not start with a letter or `_`."""
    out = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return out if re.match(r"[A-Za-z_]", out) else "v_" + out


class GraphBuilder:
    """Builds one `eqfuse.graph/1` graph."""

    def __init__(self) -> None:
        self.nodes: list[dict] = []
        self.inputs: list[dict] = []
        self.outputs: list[dict] = []
        self._memo: dict[str, int] = {}
        self._names: set[str] = set()
        self.types: dict[int, tuple[str | None, tuple[int, ...]]] = {}
        """Each value node's dtype (None for a weak literal) and shape."""
        self._bases: dict[int, tuple[int, ...]] = {}  # (`base_shape`, by node)

    def unique_name(self, text: str, input: bool = False) -> str:
        """A fresh identifier for `text`; input names also avoid dtypes and operator spellings."""
        base = identifier(text)
        name, k = base, 0
        while name in self._names or (input and (name in OPS or name in DTYPES)):
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    def _add(self, entry: dict, name: str | None = None) -> int:
        key = json.dumps(entry, sort_keys=True)
        index = self._memo.get(key)
        if index is None:
            index = len(self.nodes)
            self.nodes.append(dict(entry))
            self._memo[key] = index
        if name is not None and "name" not in self.nodes[index] and entry["op"] not in ("input", "const"):
            self.nodes[index]["name"] = self.unique_name(name)
        return index

    def input(self, name: str, dtype: str, shape: tuple[int, ...]) -> Value:
        """Declares an input under a fresh identifier made from `name`; returns its value."""
        if dtype not in DTYPES:
            raise ExportError(f"input {name}: dtype {dtype} is not one of {DTYPES}")
        if any(d < 1 for d in shape):
            raise ExportError(f"input {name}: shape {list(shape)} has an empty axis")
        ident = self.unique_name(name, input=True)
        self.inputs.append({"name": ident, "dtype": dtype, "shape": list(shape)})
        return self._typed(self._add({"op": "input", "value": ident}), dtype, tuple(shape))

    def _typed(self, index: int, dtype: str | None, shape: tuple[int, ...]) -> Value:
        self.types.setdefault(index, (dtype, tuple(shape)))
        return Value(index, dtype, tuple(shape))

    def input_name(self, v: Value) -> str:
        """The name of an input value."""
        return self.nodes[v.node]["value"]

    def const(self, x: float) -> Value:
        """A weak scalar literal."""
        x = float(x)
        if not math.isfinite(x):
            raise ExportError(f"the literal {x} is not finite")
        value = int(x) if x.is_integer() and abs(x) < 9e15 else x
        return self._typed(self._add({"op": "const", "value": value}), None, ())

    def dims(self, shape: tuple[int, ...]) -> int:
        return self._add({"op": "dims", "value": [int(d) for d in shape]})

    def dtype(self, dtype: str) -> int:
        return self._add({"op": "dtype", "value": dtype})

    def op(self, op: str, args: list[int], dtype: str | None, shape: tuple[int, ...], name: str | None = None) -> Value:
        """Applies an operator to earlier nodes (values and attribute nodes, in table order)."""
        if op not in OPS:
            raise ExportError(f"`{op}` is not an eqfuse operator")
        return self._typed(self._add({"op": op, "args": list(args)}, name), dtype, tuple(shape))

    # --- values that are broadcasts of smaller ones

    def base_shape(self, v: Value) -> tuple[int, ...]:
        """The smallest shape `s` (of `v`'s rank, each size 1 or `v`'s) such that `v` is a
        broadcast of a value of shape `s` this graph can compute: `broadcast` gives its operand,
        an element-by-element operator the broadcast of its operands' base shapes, a reshape
        that only adds or removes axes of size 1 its operand's base shape on the axes it keeps;
        any other node is its own base. A padding mask `where(broadcast(m, [B, 1, S, S]), 0,
        fill)` has base shape `[B, 1, 1, S]`: what `base` computes, and a caller writes instead
        of `B * S * S` elements (or reads, as a view of the smaller tensor)."""
        # Post-order with an explicit stack (a long chain of operators must not exhaust
        # Python's recursion); nodes never change once added, so their base shapes are kept.
        stack = [v.node]
        while stack:
            i = stack[-1]
            if i in self._bases:
                stack.pop()
                continue
            todo = [d for d in self._base_deps(i) if d not in self._bases]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            self._bases[i] = self._base_shape_of(i)
        return self._bases[v.node]

    def _base_deps(self, index: int) -> list[int]:
        """The nodes whose base shapes give node `index`'s."""
        node = self.nodes[index]
        op = node["op"]
        if op == "broadcast":
            return [node["args"][0]]
        if op in POINTWISE:
            args = node["args"][:1] if op == "cast" else node["args"]  # (not cast's dtype)
            return [a for a in args if self.types[a][1]]  # (scalars broadcast anyway)
        if op == "reshape" and _unit_axes_only(self.types[node["args"][0]][1], self.types[index][1]):
            return [node["args"][0]]
        return []

    def _base_shape_of(self, index: int) -> tuple[int, ...]:
        _, shape = self.types[index]
        node = self.nodes[index]
        deps = self._base_deps(index)
        if not deps:
            return shape
        if node["op"] == "reshape":
            out = _moved(self._bases[deps[0]], self.types[deps[0]][1], shape)
        else:  # a broadcast, or an element-by-element operator: its operands' broadcast
            out = _aligned(broadcast_shapes(*(_aligned(self._bases[d], len(shape)) for d in deps)), len(shape))
        return out if math.prod(out) < math.prod(shape) else shape

    def base(self, v: Value, shape: tuple[int, ...] | None = None) -> Value:
        """`v` computed at its base shape (`base_shape`), or at `shape`, which must lie between
        the two (each size the base shape's or `v`'s; the base is then broadcast to it):
        `broadcast(base(v), v.shape)` is `v`. Nodes are added only where a value is smaller."""
        least = self.base_shape(v)
        want = tuple(shape) if shape is not None else least
        if len(want) != v.rank or any(w not in (b, n) for w, b, n in zip(want, least, v.shape)):
            raise ExportError(f"{list(want)} does not lie between {list(least)} and {list(v.shape)}")
        if want == v.shape:
            return v
        built: dict[int, Value] = {}
        stack = [v.node]
        while stack:
            i = stack[-1]
            if i in built:
                stack.pop()
                continue
            dtype, full = self.types[i]
            if self._bases[i] == full:
                built[i] = Value(i, dtype, full)
                stack.pop()
                continue
            todo = [d for d in self._base_deps(i) if d not in built]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            built[i] = self._rebuilt(i, built)
        small = built[v.node]
        return small if small.shape == want else self.op("broadcast", [small.node, self.dims(want)], v.dtype, want)

    def _rebuilt(self, index: int, built: dict[int, Value]) -> Value:
        """Node `index` at its base shape, from its operands at theirs (`built`)."""
        dtype, _ = self.types[index]
        node = self.nodes[index]
        want = self._bases[index]
        if node["op"] in POINTWISE:
            args = [built[a].node if a in built else a for a in node["args"]]
            small = self.op(node["op"], args, dtype, broadcast_shapes(*(built[d].shape for d in self._base_deps(index))))
        else:  # a broadcast, or a reshape that adds or removes axes of size 1: its operand's base
            small = built[node["args"][0]]
        return small if small.shape == want else self.op("reshape", [small.node, self.dims(want)], dtype, want)

    def output(self, name: str, v: Value) -> str:
        """Declares a result; returns the identifier it was given."""
        if v.weak:
            raise ExportError(f"output {name} is a constant, not computed from inputs")
        ident = self.unique_name(name)
        self.outputs.append({"name": ident, "node": v.node})
        return ident

    def to_json(self) -> dict:
        if not self.outputs:
            raise ExportError("the graph has no outputs")
        return {"schema": SCHEMA, "inputs": self.inputs, "nodes": self.nodes, "outputs": self.outputs}
