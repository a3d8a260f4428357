"""A `torch.compile` backend that plans the captured graphs with eqfuse and runs eqfuse's kernels.

    import torch
    from eqfuse_torch import eqfuse_backend

    compiled = torch.compile(model, backend=eqfuse_backend)
    y = compiled(x)                # runs eqfuse's kernels where it can, eagerly where not
    for p in eqfuse_backend.plans:  # one record per captured graph
        print(p.kind, p.runs, p.plan["total"] if p.plan else p.error)

What it does: TorchDynamo captures the model; AOTAutograd traces it to ATen with PyTorch's core
decompositions less attention's (`decompositions()`), giving a forward graph and, when gradients are needed, the joint
forward-backward graph and the partitioned backward graph. Each is exported to eqfuse's JSON
graph (`export.py`) and planned by the `eqfuse` binary (`eqfuse optimize --format json`); the
plan is kept in `EqfuseBackend.plans` and summarised through `report` (stderr by default).

Running (`execute=True`, the default): a forward or backward graph whose inputs are CUDA tensors
is given to `eqfuse codegen`, each generated `.cu` is compiled with NVRTC through CuPy, and the
kernels are launched in plan order on PyTorch's current stream, on PyTorch's tensors
(`runtime.py`): from the second call on, as CUDA graphs replayed (`EQFUSE_CUDA_GRAPH=0` launches
kernel by kernel; `CapturedPlan.launches` counts which ran; `EQFUSE_KERNEL_NAMES=1` compiles each
kernel under its plan name, for profiles, instead of once per canonical source). The graph runs eagerly instead (the
AOTAutograd ATen graph, unfused), with a warning saying why, when: the exporter or the planner
refuses it (an operator without a lowering, no binary), the inputs are not on a
CUDA device, CuPy is missing, or codegen refuses a kernel. A gemm planned as a cuBLASLt call
runs as a torch product (`runtime.py`). The joint graph is only planned, on a thread beside the
other graphs' compiles (its record is in `plans` at once, its plan once `EqfuseBackend.wait`).

Dynamic shapes: a graph Dynamo captures with symbolic shapes (called again at another size, or
`torch.compile(..., dynamic=True)`) is lowered through AOTAutograd again at each shape it is
called with, at that shape's first call, and planned for it (`_PerShape`); past `shapes` shapes
(a key/value cache growing a token a call), further shapes run the captured graph eagerly, warned.

Compile time: a graph that runs is planned once, by `eqfuse codegen`, whose plan is the one
recorded (`plan_graph` remembers plans by graph, binary and options: a graph planned before in
the process is not planned again); its kernels' distinct sources compile in threads at once
(`runtime.compile_all`).

Saved tensors: the forward returns the tensors it saves for the backward in the layout its
kernels wrote (the backward's kernels read any layout; an eager run lays them out as traced),
and one that its graph computes as a broadcast of a smaller tensor (a padding mask expanded to
the scores' `[B, 1, S, S]`) as an expanded view of that tensor; the backward's graph then reads
the smaller tensor (`Exported.broadcast_outputs`, `export_graph_module(broadcasts=...)`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from .graph import ExportError
from .rng import has_dropout, relayout


class PlanError(Exception):
    """The eqfuse binary refused a graph or could not be run; the message is its error."""


def find_eqfuse(binary: str | None = None) -> str:
    """The eqfuse binary: `binary`, else `$EQFUSE`, else `eqfuse` on the PATH, else the
    repository's `target/release` or `target/debug` build."""
    if binary:
        return binary
    if os.environ.get("EQFUSE"):
        return os.environ["EQFUSE"]
    found = shutil.which("eqfuse")
    if found:
        return found
    root = Path(__file__).resolve().parents[2]
    for build in ("release", "debug"):
        candidate = root / "target" / build / "eqfuse"
        if candidate.is_file():
            return str(candidate)
    raise PlanError("no eqfuse binary: set $EQFUSE, put eqfuse on the PATH, or `cargo build --release`")


def device_profile(name: str | None = None) -> str:
    """The built-in profile for a GPU named `name` (default: the current CUDA device's, where
    PyTorch has one): `h200` for an H200, `h100` for an H100 and for anything else (a GPU without
    a profile of its own is planned as an H100; `eqfuse calibrate` writes one for it)."""
    if name is None:
        try:
            import torch

            name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
        except Exception:  # no CUDA build, no driver: nothing to plan for but the default
            name = ""
    return "h200" if "H200" in name.upper() else "h100"


def plan_graph(graph: dict, *, binary: str | None = None, device: str = "h100", args: tuple[str, ...] = (),
               timeout: float = 600.0) -> dict:
    """Plans an `eqfuse.graph/1` graph with `eqfuse optimize --format json`; returns the plan
    (`eqfuse.plan/1`, docs/plan-schema.md). Raises PlanError with eqfuse's message on failure.

    A graph this process has planned already with the same binary and options (the same JSON
    text: a graph captured again, or one `eqfuse codegen` planned for running, `runtime.Codegen`)
    is not planned again: its plan is `PLANS`'s. The plan of a graph is then the plan its kernels
    run, even where a planning deadline cut the search (which makes plans depend on timing)."""
    exe = find_eqfuse(binary)
    text = json.dumps(graph)
    key = plan_key(text, exe, device, args)
    plan = PLANS.get(key)
    if plan is not None:
        return plan
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.json"
        path.write_text(text)
        cmd = [exe, "optimize", str(path), "--format", "json", "--device", device, *args]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PlanError(f"{exe}: {e}") from None
    if r.returncode != 0:
        raise PlanError(r.stderr.strip() or f"{exe} exited with status {r.returncode}")
    plan = json.loads(r.stdout)
    PLANS.put(key, plan)
    return plan


def plan_key(text: str, exe: str, device: str, args) -> tuple:
    """What a plan of graph JSON `text` depends on: the text (by digest), the binary (its path,
    size and modification time: a rebuilt binary plans afresh), the device and the options."""
    try:
        st = os.stat(exe)
        build = (st.st_size, st.st_mtime_ns)
    except OSError:
        build = None
    return hashlib.sha256(text.encode()).hexdigest(), exe, build, device, tuple(args)


class Memo:
    """The last `size` values by key (least recently used first out)."""

    def __init__(self, size: int):
        self.size = size
        self.items: OrderedDict = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            value = self.items.get(key)
            if value is not None:
                self.items.move_to_end(key)
            return value

    def clear(self) -> None:
        with self.lock:
            self.items.clear()

    def put(self, key, value) -> None:
        with self.lock:
            self.items[key] = value
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)


PLANS = Memo(64)
"""Plans made in this process (`eqfuse optimize`'s, and `eqfuse codegen`'s `plan.json`), by
`plan_key`."""


@dataclass
class CapturedPlan:
    """One captured graph and what eqfuse made of it."""

    kind: str
    """`forward`, `backward` or `joint` (the forward-backward graph before partitioning)."""
    graph: dict | None
    """Its `eqfuse.graph/1` export, or None when the export failed."""
    plan: dict | None
    """Its `eqfuse.plan/1` plan, or None when the export or the planning failed."""
    error: str | None = None
    """Why there is no plan."""
    runs: str = "eager"
    """`eqfuse` when eqfuse's kernels run the graph, `eager` when PyTorch runs it."""
    why_eager: str | None = None
    """Why the graph runs eagerly (None when eqfuse runs it, or for the joint graph)."""
    launches: dict | None = None
    """How eqfuse's kernels ran, counted as they run (`runtime.LaunchPlan.stats`): calls
    launched kernel by kernel (`eager`), CUDA graphs captured and replayed, replays whose
    outputs were cloned, inputs copied into static buffers, and `graph_off` with the reason
    when graphs were turned off. None when eqfuse does not run the graph."""


def decompositions() -> dict:
    """The decompositions AOTAutograd applies before the graphs reach eqfuse
    (`export.decompositions`: core ATen less attention's)."""
    from .export import decompositions as table

    return table()


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


class EqfuseBackend:
    """The backend; call the instance as `torch.compile(model, backend=instance)`.

    `binary`, `device` and `args` go to `eqfuse optimize` / `eqfuse codegen` (`device`, by
    default `auto`: the built-in profile of the current CUDA device, `device_profile()`);
    `report` receives one line per captured graph (None to stay quiet); `joint` also plans the
    joint forward-backward graph; `execute` runs eqfuse's kernels where it can (else every graph runs
    eagerly and the plans are a report); `verify` checks the first call of every graph eqfuse
    runs against the ATen graph run eagerly on the same arguments, and if any output differs
    beyond rounding (`results_agree`) runs that graph eagerly from then on, warned and recorded
    in its plan's `why_eager`. `partition` splits a training graph into forward and backward:
    `min_cut` (the default; PyTorch's min-cut rematerialization, as Inductor: the forward saves
    few tensors and the backward recomputes cheap elementwise ones, which eqfuse fuses into
    its kernels) or `default` (the forward saves every value the backward reads). `attention`
    rewrites attention written out (`softmax(q @ k^T * scale + mask) @ v`, eager attention in
    `transformers`) in each captured graph into `scaled_dot_product_attention` before
    AOTAutograd traces it (`attention.rewrite_attention`), so training plans it as flash
    attention forward and backward. `shapes`: how many shapes of a graph captured with symbolic
    shapes are lowered and planned (`_PerShape`); further shapes run it eagerly.
    """

    def __init__(self, binary: str | None = None, device: str = "auto", args: tuple[str, ...] = (),
                 report=_stderr, joint: bool = True, execute: bool = True, verify: bool = True,
                 partition: str = "min_cut", attention: bool = True, shapes: int = 8):
        if partition not in ("min_cut", "default"):
            raise ValueError(f"partition must be `min_cut` or `default`, not {partition!r}")
        device = device_profile() if device == "auto" else device
        self.binary, self.device, self.args, self.report, self.joint = binary, device, args, report, joint
        self.execute, self.verify, self.partition, self.attention = execute, verify, partition, attention
        self.shapes = shapes
        self._plans: list[CapturedPlan] = []
        self._pending: list[tuple[CapturedPlan, threading.Thread]] = []

    @property
    def plans(self) -> list[CapturedPlan]:
        """One record per captured graph, in capture order (the joint graph's planned, `wait`)."""
        self.wait()
        return self._plans

    def wait(self, block: bool = True) -> None:
        """Reports the graphs planned on threads of their own (the joint graph's: `capture`'s
        `later`) once planned; with `block`, waits for them all."""
        while self._pending and (block or not self._pending[0][1].is_alive()):
            record, thread = self._pending.pop(0)
            thread.join()
            self._reported(record, False)

    def __call__(self, gm, example_inputs):
        if self.attention:
            # Before AOTAutograd partitions it: written-out attention as SDPA, whose backward
            # is eqfuse's flash backward (`attention.py`), not the probabilities saved.
            from .attention import rewrite_attention, route_math_sdpa

            rewrite_attention(gm)
            # SDPA calls PyTorch may run as math (f32 heads; a float mask its 16-bit fused
            # kernels cannot take): kept one attention node for eqfuse's kernel.
            route_math_sdpa(gm)
        if _symbolic(example_inputs):
            # Dynamo captured the graph with symbolic shapes (a second call at another size, or
            # `dynamic=True`); eqfuse's plans are of static shapes: the graph is lowered again
            # for each shape it is called with, at that shape's first call.
            scalars = _scalar_reads(gm)
            return _PerShape(gm, lambda inputs: self._lowered(_with_scalars(gm, scalars, inputs), inputs),
                             self.shapes, scalars)
        return self._lowered(gm, example_inputs)

    def _lowered(self, gm, example_inputs):
        """The captured graph `gm` through AOTAutograd at `example_inputs`' shapes: its forward
        (and backward) graphs compiled by `compile`."""
        from functorch.compile import default_partition, make_boxed_func, min_cut_rematerialization_partition
        from torch._dynamo.backends.common import aot_autograd

        # The forward's constant outputs by node name, which its backward folds: one dict per
        # lowered graph, shared by its forward and backward only.
        constants: dict = {}

        def compiler(kind):
            def compile_graph(aten_gm, inputs):
                return make_boxed_func(self.compile(kind, aten_gm, inputs, constants))

            return compile_graph

        def partition(joint_gm, joint_inputs, **kwargs):
            if self.joint:
                # Planned beside the forward's and the backward's compiles: nothing waits for
                # the joint graph's plan, a report, until the backward is compiled.
                self.capture("joint", joint_gm, later=True)
            # The forward's outputs past the user's are saved for the backward alone: eqfuse's
            # kernels read any layout, so they are returned as the kernels wrote them (an eager
            # run of the backward lays them out as traced: `_traced_args`).
            if "num_fwd_outputs" in kwargs:
                constants[_SAVED_FROM] = kwargs["num_fwd_outputs"]
            if self.partition == "min_cut":
                return min_cut_rematerialization_partition(joint_gm, joint_inputs, compiler="inductor", **kwargs)
            return default_partition(joint_gm, joint_inputs, **kwargs)

        backend = aot_autograd(
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            partition_fn=partition,
            decompositions=decompositions(),
        )
        return backend(gm, example_inputs)

    def compile(self, kind: str, aten_gm, example_inputs, constants: dict | None = None):
        """The callable that runs one forward or backward graph: eqfuse's kernels, or the ATen
        graph eagerly when they cannot run (warned, and recorded in the plan's `why_eager`)."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        # AOTAutograd compiles a training graph's forward under its fake-tensor mode: the
        # constants, workspaces and kernels made here must be real tensors.
        with unset_fake_temporarily():
            record, exported, runner = self.capture(kind, aten_gm, example_inputs=example_inputs, build=self.execute,
                                                    constants=constants)
            # With dropout where eqfuse runs graphs (on CUDA, or wherever a plan was built),
            # PyTorch's dropout is replaced by eqfuse's in every graph, eager ones included.
            seeded = self.execute and (runner is not None or _on_cuda(example_inputs)) and has_dropout(aten_gm)
            if runner is None:
                # With dropout, eager means eqfuse's dropout too: a forward that runs eagerly
                # and a backward on eqfuse's kernels (or the reverse) must draw the same masks.
                return _SeededEager(aten_gm) if seeded else _Eager(aten_gm)
            saved_from = (constants or {}).get(_SAVED_FROM) if kind == "forward" else None
            try:
                return _Runner(aten_gm, exported, runner, record if self.verify else None, seeded, saved_from)
            except Exception as e:  # an exporter bug must not stop the user's model from running
                record.runs, record.why_eager = "eager", f"{type(e).__name__}: {e}"
                warnings.warn(f"eqfuse: the {kind} graph runs eagerly: {record.why_eager}", stacklevel=2)
                return _SeededEager(aten_gm) if seeded else _Eager(aten_gm)

    def capture(self, kind: str, aten_gm, example_inputs=None, build: bool = False, constants: dict | None = None,
                later: bool = False):
        """Exports and plans one ATen graph, and with `build` compiles its kernels for running;
        never raises (a failure is recorded and warned). Returns (record, export, GpuPlan or None).
        `constants`: the forward's constant outputs by node name, shared by the forward and the
        backward of one captured graph (the forward fills it, the backward folds them). With
        `later` (a graph only reported, never run), `eqfuse optimize` runs on a thread of its own:
        the record is in `plans` at once, its plan there once `wait` returns."""
        import torch

        from .export import export_graph_module

        graph = exported = runner = None
        try:
            # A backward graph reads the forward's saved tensors by the names of the forward's
            # nodes; those the forward returns as constants are constants here too (a causal
            # mask the export folded: the backward then sees it is causal).
            constants = constants if constants is not None else {}
            statics = {} if kind != "backward" else {
                n.name: constants[n.name] for n in aten_gm.graph.nodes
                if n.op == "placeholder" and n.name in constants}
            # A saved tensor the forward returns as a broadcast of a smaller one (a padding mask
            # [B, 1, 1, S] expanded to the scores' [B, 1, S, S]) is that smaller one in the
            # backward's graph too: its kernels read the mask by key.
            broadcasts = constants.get(_BROADCASTS, {}) if kind == "backward" else {}
            # A saved tensor the forward returns as a view of another (a transposed activation,
            # q, k and v as slices of the projection) is that other in the backward's graph,
            # viewed there: its kernels read it in place.
            views = constants.get(_VIEWS, {}) if kind == "backward" else {}
            saved_from = constants.get(_SAVED_FROM) if kind == "forward" else None
            exported = export_graph_module(aten_gm, statics=statics, free_layout_from=saved_from,
                                           broadcasts=broadcasts, views=views, reshaped_outputs=True,
                                           allow_empty=True)
            if kind == "forward":
                out_node = next(n for n in aten_gm.graph.nodes if n.op == "output")
                results = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
                for i, t in exported.constants.items():
                    # (A random-number state carrying a seed changes every call: not a constant.)
                    if isinstance(results[i], torch.fx.Node) and i not in exported.seed_outputs:
                        constants[results[i].name] = t
                for i, small in exported.broadcast_outputs.items():
                    if saved_from is not None and i >= saved_from and isinstance(results[i], torch.fx.Node):
                        constants.setdefault(_BROADCASTS, {})[results[i].name] = small
                for i, view in exported.view_outputs.items():
                    constants.setdefault(_VIEWS, {})[results[i].name] = view
            graph = exported.graph
            if graph is None:
                # Nothing to compute: every output is a constant the export folded (a mask
                # built from `arange` alone, in a graph of its own) or a view of an argument.
                record = CapturedPlan(kind, None, _empty_plan())
            elif later and not build:
                record = CapturedPlan(kind, graph, None)
                self._later(record)
                return record, exported, None
            else:
                if build and _on_cuda(example_inputs):
                    self._codegen(graph)
                plan = plan_graph(graph, binary=self.binary, device=self.device, args=self.args)
                record = CapturedPlan(kind, graph, plan)
        except (ExportError, PlanError) as e:
            record = CapturedPlan(kind, graph, None, str(e))
        except Exception as e:  # an exporter bug must not stop the user's model from running
            record = CapturedPlan(kind, graph, None, f"{type(e).__name__}: {e}")
        if record.plan is None:
            record.why_eager = f"no plan: {record.error}"
        elif build:
            try:
                runner = _NoKernels(aten_gm) if graph is None else self._build(graph, example_inputs)
                record.runs = "eqfuse"
                record.launches = getattr(runner, "stats", None)
            except Exception as e:  # RuntimeUnavailable, PlanError, a CuPy compile error
                record.why_eager = f"{type(e).__name__}: {e}" if not isinstance(e, _Quiet) else str(e)
        self._plans.append(record)
        self._reported(record, build)
        # The joint graph's plan, made meanwhile, is reported once planned: by the backward's
        # compile, the last of a captured graph's, at the latest.
        self.wait(block=kind == "backward")
        return record, exported, runner

    def _later(self, record: CapturedPlan) -> None:
        """Plans `record`'s graph on a thread (the subprocess holds no GIL): the record is in
        `plans` now, its plan or error filled in before `wait` reports it."""
        def plan():
            try:
                record.plan = plan_graph(record.graph, binary=self.binary, device=self.device, args=self.args)
            except PlanError as e:
                record.error = str(e)
            except Exception as e:  # noqa: BLE001 - recorded, as `capture` records it
                record.error = f"{type(e).__name__}: {e}"

        thread = threading.Thread(target=plan, name=f"eqfuse-plan-{record.kind}", daemon=True)
        self._plans.append(record)
        self._pending.append((record, thread))
        thread.start()

    def _reported(self, record: CapturedPlan, build: bool) -> None:
        """Warns where a graph runs eagerly, and gives `report` the plan's line."""
        if record.plan is None and record.why_eager is None:
            record.why_eager = f"no plan: {record.error}"
        if record.why_eager and (build or record.plan is None):
            warnings.warn(f"eqfuse: the {record.kind} graph runs eagerly: {record.why_eager}", stacklevel=3)
        if self.report and record.plan:
            t, u = record.plan["total"], record.plan["unfused"]
            how = "running eqfuse's kernels" if record.runs == "eqfuse" else "running it eagerly"
            self.report(
                f"eqfuse: {record.kind} graph: {t['kernels']} kernels, {t['bytes']} bytes, {t['predicted_us']} us "
                f"predicted (unfused {u['kernels']} kernels, {u['bytes']} bytes, {u['predicted_us']} us); {how}"
            )

    def _codegen(self, graph: dict) -> None:
        """`eqfuse codegen` of a graph whose kernels are to run, before `plan_graph`: one
        planning gives both the kernels and (remembered, `runtime.Codegen.of_graph`) the plan
        that `plan_graph` then returns. A refusal is `_build`'s to report; the graph is then
        planned by `eqfuse optimize` for its record, as any graph is."""
        from .runtime import Codegen

        try:
            Codegen.of_graph(graph, binary=self.binary, device=self.device, args=self.args)
        except PlanError:
            pass

    def _build(self, graph: dict, example_inputs):
        import torch

        from .runtime import Codegen, GpuPlan

        tensors = [t for t in (example_inputs or []) if isinstance(t, torch.Tensor)]
        if not _on_cuda(example_inputs):
            raise _Quiet("its inputs are not all CUDA tensors (eqfuse's kernels run on the GPU only)")
        with torch.cuda.device(tensors[0].device):
            cg = Codegen.of_graph(graph, binary=self.binary, device=self.device, args=self.args)
            return GpuPlan(cg)


def _empty_plan() -> dict:
    """The plan of a graph with nothing to compute: no kernels."""
    zero = {"kernels": 0, "bytes": 0, "flops": 0, "predicted_us": 0.0}
    return {"schema": "eqfuse.plan/1", "kernels": [], "total": zero, "unfused": dict(zero)}


class _NoKernels:
    """The runner of a graph with nothing to compute (`_empty_plan`): its outputs are constants
    or views of its arguments, which `_Runner` makes; no kernel runs."""

    def __init__(self, aten_gm):
        import torch

        out = next(n for n in aten_gm.graph.nodes if n.op == "output")
        results = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
        vals = [getattr(r, "meta", {}).get("val") for r in results]
        self.device = next((v.device for v in vals if isinstance(v, torch.Tensor)), torch.device("cpu"))

    def __call__(self, inputs: dict) -> dict:
        return {}


_SAVED_FROM = "__eqfuse_saved_from__"
"""Key of `constants` (one captured graph's): the forward output index from which outputs are
saved for the backward alone."""

_VIEWS = "__eqfuse_views__"
"""Key of `constants`: the forward's saved outputs it returns as views of other tensors
(`Exported.view_outputs`), node name -> `export.ViewOf`, whose base the backward's graph reads
(`export_graph_module(views=...)`)."""

_BROADCASTS = "__eqfuse_broadcasts__"
"""Key of `constants`: the forward's saved outputs it returns as broadcasts of smaller tensors
(`Exported.broadcast_outputs`), node name -> the smaller tensor's shape, which the backward's
graph reads (`export_graph_module(broadcasts=...)`)."""


def _traced_args(gm, args):
    """`args` with the strides the graph was traced with (a saved tensor eqfuse's forward
    returned in its own layout), for an eager run of the ATen graph, whose views assume them."""
    from .rng import _as_traced

    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    if len(vals) != len(args):
        return list(args)
    return [_as_traced(a, v) if hasattr(a, "stride") else a for a, v in zip(args, vals)]


class _Eager:
    """Runs an ATen graph eagerly, its arguments laid out as traced."""

    def __init__(self, aten_gm):
        self.aten_gm = aten_gm

    def __call__(self, *args):
        if not _real(args):
            return self.aten_gm.forward(*args)
        return self.aten_gm.forward(*_traced_args(self.aten_gm, args))


def _on_cuda(example_inputs) -> bool:
    """Whether a graph's tensors are on CUDA, but for one-element CPU tensors (scalars, which
    PyTorch mixes with CUDA tensors: a float Dynamo passes as a tensor with dynamic shapes, a
    cache's position counter): `_Runner` copies those to the GPU when the plan reads them, and
    returns an output eager returns on the CPU there."""
    import torch

    tensors = [t for t in (example_inputs or []) if isinstance(t, torch.Tensor)]
    cuda = [t for t in tensors if t.device.type == "cuda"]
    return bool(cuda) and all(t.device.type == "cuda" or (t.device.type == "cpu" and t.numel() <= 1)
                              for t in tensors)


def _symbolic(example_inputs) -> bool:
    """Whether Dynamo captured a graph with symbolic shapes: a size or scalar input, or a tensor
    whose shape or strides are symbols."""
    import torch

    def sym(v):
        return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))

    for x in example_inputs:
        if sym(x) or (isinstance(x, torch.Tensor) and any(sym(d) for d in (*x.shape, *x.stride()))):
            return True
    return False


def _shape_key(args, scalars=()) -> tuple:
    """What a graph lowered at static shapes was lowered for, from a call's arguments: each
    tensor's shape, strides, dtype, device and whether it requires grad; each other argument
    (a size, a scalar) by value, as the one-element tensors at positions `scalars` are."""
    import torch

    return tuple(
        (tuple(a.shape), a.stride(), a.dtype, a.device, a.requires_grad) + ((a.item(),) if i in scalars else ())
        if isinstance(a, torch.Tensor) else (type(a), a)
        for i, a in enumerate(args))


def _scalar_reads(gm) -> frozenset:
    """Positions of `gm`'s placeholders that are one-element tensors read only by `.item()`:
    with symbolic shapes Dynamo passes a Python float (a module's `norm_type`, a scale) as such
    a tensor, whose value no static trace can see (`_with_scalars` makes it a constant)."""
    found = set()
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        if node.users and all(u.op == "call_method" and u.target == "item" for u in node.users):
            found.add(i)
    return frozenset(found)


def _with_scalars(gm, scalars: frozenset, args):
    """`gm`, or with `scalars` (`_scalar_reads`) a copy of it whose `.item()` of those
    placeholders are the values `args` holds there (the lowering is keyed by them: `_shape_key`)."""
    import copy

    import torch

    if not scalars:
        return gm
    graph = copy.deepcopy(gm.graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for i in scalars:
        for item in list(placeholders[i].users):
            value = args[i].item()
            for user in list(item.users):
                user.replace_input_with(item, value)
            graph.erase_node(item)
    return torch.fx.GraphModule(gm, graph)


class _PerShape:
    """A graph Dynamo captured with symbolic shapes, run as the graph lowered at the shapes of
    each call (`lower(args)`, at the first call of those shapes; the sizes Dynamo passes as
    arguments, and the scalars it passes as tensors, `_scalar_reads`, are constants of that
    lowering). At most `limit` shapes are lowered, each planned and compiled once: a graph
    called at ever new shapes (a key/value cache that grows a token a call) would plan at each,
    so past the limit new shapes run the captured graph `gm` eagerly, with one warning (as
    Dynamo's own recompile limit does). `torch.compile(..., dynamic=False)` recompiles per shape
    in Dynamo instead; padding inputs to a few sizes keeps every call on eqfuse's kernels."""

    def __init__(self, gm, lower, limit: int, scalars: frozenset = frozenset()):
        self.gm, self.lower, self.limit, self.scalars = gm, lower, max(0, limit), scalars
        self.lowered: dict = {}
        self.eager_calls = 0

    def __call__(self, *args):
        key = _shape_key(args, self.scalars)
        run = self.lowered.get(key)
        if run is None:
            if len(self.lowered) >= self.limit:
                if self.eager_calls == 0:
                    warnings.warn(f"eqfuse: a graph with dynamic shapes was called at more than {self.limit} shapes; "
                                  "further shapes run eagerly (pad inputs to fewer sizes, or raise "
                                  "EqfuseBackend(shapes=...))", stacklevel=2)
                self.eager_calls += 1
                return self.gm(*args)
            run = self.lowered[key] = self.lower(list(args))
        return run(*args)


class _SeededEager:
    """Runs an ATen graph with dropout eagerly, but with eqfuse's dropout (`rng.py`): fresh seeds
    on every call, drawn from PyTorch's generator."""

    def __init__(self, aten_gm):
        from .rng import dropout_sites

        self.aten_gm = aten_gm
        self.sites = dropout_sites(aten_gm)

    def __call__(self, *args):
        if not _real(args):
            return self.aten_gm.forward(*args)
        return self.run(args, None)

    def run(self, args, seeds, upcast: bool = False):
        """The graph's outputs with `seeds` (site index -> seed; fresh when None)."""
        import torch

        from .rng import Seeds, SeededInterpreter

        if seeds is None:
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
            seeds = Seeds.draw(len(self.sites), device).tolist() if self.sites else []
        by_node = {name: int(seeds[k]) for name, k in self.sites.items()}
        with torch.no_grad():
            out = SeededInterpreter(self.aten_gm, by_node, upcast=upcast).run(*_traced_args(self.aten_gm, args))
        return list(out) if isinstance(out, (list, tuple)) else [out]


class _Quiet(Exception):
    """A reason to run eagerly that needs no exception type in its message."""


def results_agree(got, want, half_inputs: bool = False, skip=(), exact=None, slack: float = 1.0) -> str | None:
    """None when eqfuse's outputs `got` equal eager's `want` up to rounding, else what differs.

    Same structure, dtypes and shapes; integers and booleans exactly; floating point within
    |got - want| <= rtol * (|want| + max|want|), rtol 1e-4 for f32/f64 and 2e-2 for f16/bf16 (one
    rounding of a 16-bit result, plus the order of a sum), and NaN where eager has NaN. With
    `half_inputs` (the graph reads or computes f16/bf16 tensors: 16-bit arguments, or products
    under `torch.autocast`) every output is held to 2e-2: an f32 result computed from 16-bit data
    (a layer norm's statistics) differs by where eager rounds to 16 bits and a fused kernel does
    not. Every element may also be off by rtol * 1e-2 of the graph's
    largest float output (1e-6 of it in f32, about 8 units in the last place): a value that is
    zero in exact arithmetic (the gradient of a bias that softmax ignores) is rounding noise on
    both sides, not a value to match. Positions in `skip` are not compared (an SDPA op's
    random-number state without dropout, `Exported.dont_care`: PyTorch leaves it unset).

    With `exact` (the graph's outputs computed in f32 from the same inputs, `exact_outputs`), an
    element outside that bound still agrees when eqfuse is no further from the f32 result than
    eager is (`slack` times as far: 2 for an f32 graph measured against its f64 run, where both
    are rounding noise around a value that is zero in exact arithmetic), give or take the same
    tolerance: after many 16-bit layers eager's own rounding
    errors reach that bound (Inductor's differ from eager's as much), and eqfuse, which keeps
    more intermediates in f32, must not be held to eager's errors. So does an integer or boolean
    element that differs from eager's where it is the f32 graph's, and a whole integer or
    boolean output that differs from the f32 graph's in at most twice as many elements as
    eager's does (a comparison's mask flips where a value sits within its 16-bit rounding of
    the threshold, eager's as well as eqfuse's)."""
    import torch

    if len(got) != len(want):
        return f"{len(got)} outputs, eager gives {len(want)}"
    floats = [w.detach().double() for i, w in enumerate(want)
              if i not in skip and isinstance(w, torch.Tensor) and w.is_floating_point()]
    graph_scale = max((w[torch.isfinite(w)].abs().max().item() for w in floats if torch.isfinite(w).any()),
                      default=0.0)
    for i, (g, w) in enumerate(zip(got, want)):
        if i in skip:
            continue
        if g is None or w is None or not isinstance(w, torch.Tensor):
            if (g is None) != (w is None):
                return f"output {i}: {g!r} where eager gives {w!r}"
            continue
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"output {i}: {g.dtype}{list(g.shape)} where eager gives {w.dtype}{list(w.shape)}"
        if not w.is_floating_point():
            bad = g != w
            if bad.any() and exact is not None and isinstance(exact[i], torch.Tensor) and exact[i].shape == w.shape:
                # A mask of a comparison (T5's ReLU mask, `h <= 0`, saved for the backward)
                # flips where a 16-bit value sits within its rounding of the threshold, in eager
                # as in eqfuse: it agrees where each element that differs from eager's is the
                # f32 graph's, or where eqfuse's mask differs from the f32 graph's in at most
                # twice as many elements as eager's does (a T5 block, bf16: eager's ReLU mask
                # off the f32 one at 149 of 131072 elements, eqfuse's at 160, 81 between them).
                e = exact[i].to(g.dtype)
                bad &= g != e
                if bad.any() and int((g != e).sum()) <= 2 * int((w != e).sum()):
                    bad &= False
            if bad.any():
                return f"output {i}: {int(bad.sum())} of {w.numel()} elements differ"
            continue
        rtol = 2e-2 if half_inputs or w.dtype in (torch.float16, torch.bfloat16) else 1e-4
        g64, w64 = g.detach().double(), w.detach().double()
        finite = torch.isfinite(w64)
        scale = w64[finite].abs().max().item() if finite.any() else 0.0
        bad = ~((g64 - w64).abs() <= rtol * (w64.abs() + scale) + rtol * 1e-2 * graph_scale)
        bad &= ~(g64.isnan() & w64.isnan()) & ~((g64 == w64) & ~finite)
        if bad.any() and exact is not None and isinstance(exact[i], torch.Tensor) and exact[i].shape == w.shape:
            e64 = exact[i].detach().double()
            closer = (g64 - e64).abs() <= slack * (w64 - e64).abs() + rtol * (e64.abs() + scale) + rtol * 1e-2 * graph_scale
            bad &= ~closer
        if bad.any():
            err = (g64 - w64).abs()[bad].max().item()
            return f"output {i}: {int(bad.sum())} of {w.numel()} elements differ (largest difference {err:.3g}, largest eager value {scale:.3g})"
    return None


def _real(args) -> bool:
    """Whether every tensor argument has data: AOTAutograd may call a compiled graph with fake
    tensors while tracing, and those run as the ATen graph (no kernel can read them)."""
    import torch

    # (Tracing makes every argument fake, parameters too: the first and last tensors tell, and a
    # graph of hundreds of arguments is not walked on every call. A plain tensor is told real in
    # C++; anything else, a subclass or a wrapper, by `is_fake`.)
    plain, fake, functional, wrapped = _real_checks()
    for a in (args[:4] + args[-4:] if len(args) > 8 else args):
        if type(a) in plain:
            if not (fake(a) or functional(a) or wrapped(a)):
                continue
        elif not isinstance(a, torch.Tensor):
            continue
        from torch._subclasses.fake_tensor import is_fake

        if is_fake(a) or functional(a):
            return False
    return True


def _real_checks() -> tuple:
    """(plain tensor types, C++ checks of a fake, a functional and a functorch-wrapped tensor)."""
    global _REAL_CHECKS
    if _REAL_CHECKS is None:
        import torch

        # (`torch._C._is_fake_tensor` is newer than PyTorch 2.11, whose fake tensors are all of
        # the FakeTensor subclass: never a plain type, so told by `is_fake` below.)
        fake = getattr(torch._C, "_is_fake_tensor", None) or (lambda t: False)
        _REAL_CHECKS = ((torch.Tensor, torch.nn.Parameter), fake, torch._is_functional_tensor,
                        torch._C._functorch.is_functorch_wrapped_tensor)
    return _REAL_CHECKS


_REAL_CHECKS = None


def exact_outputs(gm, args, to=None):
    """The outputs of an ATen graph run with every 16-bit float (arguments, results and dtypes
    asked for) in f32 (with `to=torch.float64`, every float in f64): the reference
    `results_agree` measures eager's and eqfuse's rounding against. None when the graph cannot
    run so (an op without an f32 or f64 form)."""
    import torch
    from torch.utils._pytree import tree_map

    half = (torch.float16, torch.bfloat16) if to is None else (torch.float16, torch.bfloat16, torch.float32)
    to = torch.float32 if to is None else to

    def up(x):
        if isinstance(x, torch.Tensor) and x.dtype in half:
            return x.to(to)
        if isinstance(x, torch.dtype) and x in half:
            return to
        return x

    class F32(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            return super().call_function(target, tree_map(up, args), tree_map(up, kwargs))

    try:
        with torch.no_grad():
            out = F32(gm).run(*tree_map(up, list(args)))
    except Exception:
        return None
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _computes_in_half(gm) -> bool:
    """Whether an ATen graph holds a 16-bit float value anywhere (under `torch.autocast` an f32
    graph's products run in bf16 or f16): its f32 outputs then carry 16-bit rounding, and the
    first-call check holds them to `results_agree`'s 16-bit tolerance."""
    import torch

    half = (torch.float16, torch.bfloat16)
    for node in gm.graph.nodes:
        vals = node.meta.get("val")
        for v in vals if isinstance(vals, (list, tuple)) else (vals,):
            if isinstance(v, torch.Tensor) and v.dtype in half:
                return True
    return False


class _Runner:
    """Calls a GpuPlan with an AOTAutograd graph's positional arguments; returns its outputs in
    the graph's order, with the graph's dtypes and shapes (None where the graph returns None).

    With a `record`, the first call also runs the ATen graph eagerly and compares (`results_agree`);
    on a difference, or if eqfuse's kernels raise, that call and every later one return eager's
    results, and the record says why (`runs` becomes `eager`).

    A call does only what depends on its arguments: which arguments pass as they are and which
    are mapped (broadcasts, views read through their base), and each output's steps (cast, pad,
    reshape or expand, layout, a view made of another) are worked out at construction; a step
    that finds its result already as the graph wants it (dtype, shape, strides) makes nothing."""

    def __init__(self, aten_gm, exported, plan, record=None, seeded: bool = False, saved_from: int | None = None):
        import torch

        from .export import ViewOf

        self.aten_gm, self.record = aten_gm, record
        self.eager = False
        # Dropout: the export's sites must be the ones the reference draws (same node names).
        self.seeded = _SeededEager(aten_gm) if seeded else None
        if self.seeded is not None and self.seeded.sites != exported.seeds:
            raise RuntimeError(f"dropout sites {sorted(exported.seeds)} where the graph has {sorted(self.seeded.sites)}")
        self.seed_input, self.seed_outputs = exported.seed_input, dict(exported.seed_outputs)
        self.pads = dict(exported.pads)
        self.n_seeds = len(exported.seeds)
        self.last_seeds = None
        self.plan = plan
        self.input_names = exported.input_names
        self.exported = exported
        self.dont_care = set(exported.dont_care)
        if saved_from is not None:
            # Saved for the backward alone, and dependent on how an unstable `sort` or `topk`
            # orders equal values (a mixture of experts' token order): eqfuse's order, which its
            # backward reads consistently, need not be eager's.
            self.dont_care |= {i for i in exported.unordered if i >= saved_from}
        self.half = _computes_in_half(aten_gm)
        self.values = {}
        device = plan.device
        for name, t in exported.values.items():
            self.values[name] = t.detach().to(device)
        out_node = next(n for n in aten_gm.graph.nodes if n.op == "output")
        results = out_node.args[0]
        results = results if isinstance(results, (list, tuple)) else [results]
        self.outputs = []
        self.on_cpu = set()
        for i, r in enumerate(results):
            if r is None:
                self.outputs.append(None)
            elif i in exported.constants:  # known at export time: returned as it is
                self.outputs.append(exported.constants[i].detach().to(device))
            elif i in exported.view_outputs:  # a view of another tensor: made after the others
                self.outputs.append(exported.view_outputs[i])
            else:
                val = r.meta["val"]
                try:
                    stride = tuple(val.stride())
                except Exception:  # noqa: BLE001 - a layout without strides: returned as eqfuse gives it
                    stride = None
                if saved_from is not None and i >= saved_from:
                    stride = None  # saved for the backward alone: read in any layout
                base = exported.broadcast_outputs.get(i)  # computed as a smaller tensor: expanded
                self.outputs.append((exported.output_names[i], val.dtype, tuple(val.shape), stride, base))
                if device.type != "cpu" and getattr(val, "device", device).type == "cpu":  # (a scalar eager keeps there)
                    self.on_cpu.add(i)
        self.torch = torch
        self.cpu_args = device.type != "cpu" and any(
            n.op == "placeholder" and getattr(getattr(n.meta.get("val"), "device", None), "type", None) == "cpu"
            for n in aten_gm.graph.nodes)
        # What every call does, worked out once: the arguments passed as they are (by position)
        # and those mapped (`Exported.argument`: broadcasts and views read through their base),
        # and per output one step from the plan's results to the graph's output.
        self.n_args = len(self.input_names)
        direct = [(name, i) for i, name in enumerate(self.input_names)
                  if name is not None and name not in exported.broadcast_inputs and name not in exported.view_inputs]
        self.direct_names = [name for name, _ in direct]
        self.direct_args = _getter([i for _, i in direct])
        self.mapped = [(name, i) for i, name in enumerate(self.input_names)
                       if name is not None and (name in exported.broadcast_inputs or name in exported.view_inputs)]
        # (name, None): the plan's result `name` as it is; (None, step): `step(got, seeds)`.
        self.steps = [self._output_step(i, o) for i, o in enumerate(self.outputs)]
        self.views = [(i, o) for i, o in enumerate(self.outputs) if isinstance(o, ViewOf)]

    def _output_step(self, i: int, o) -> tuple:
        """Output `i` from the plan's results and the call's seeds: (None, `step(got, seeds)`),
        or (name, None) where the plan's result `name` is always the graph's output as it is (a
        plan that says so, `LaunchPlan.output_layout`, in the graph's dtype, shape and strides)."""
        from .export import ViewOf

        torch = self.torch
        if i in self.seed_outputs:
            from .rng import rng_state

            site, dtype, shape, device = self.seed_outputs[i], o.dtype, tuple(o.shape), o.device
            return None, lambda got, seeds: rng_state(seeds[site], dtype, shape, device)
        if o is None or isinstance(o, (torch.Tensor, ViewOf)):
            return None, lambda got, seeds: o  # (a view is made once the others are: `views`)
        name, dtype, shape, stride, base = o
        pad = self.pads.get(i)
        size = torch.Size(shape)
        layout = getattr(self.plan, "output_layout", None)
        cpu = i in self.on_cpu
        if layout is not None and pad is None and base is None and not cpu and layout(name) == (dtype, shape):
            dense = tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))
            if stride is None or all(n <= 1 or a == b for n, a, b in zip(shape, dense, stride)):
                return name, None

        def step(got, seeds):
            t = got[name]
            if t.dtype != dtype:
                t = t.to(dtype)
            if pad is not None:  # padded by PyTorch's kernel along the last axis
                length, fill = pad
                t = t.reshape(shape[:-1] + (-1,))
                t = torch.nn.functional.pad(t, (0, length - t.shape[-1]), value=fill)
            if base is not None:
                t = t.reshape(base).expand(shape)
            elif t.shape != size:
                t = t.reshape(shape)
            if stride is not None and t.stride() != stride:
                # The graphs after this one were traced with PyTorch's strides for this output
                # (a transposed attention result the backward views as it was): give them those.
                t = relayout(t, stride)
            return t.cpu() if cpu else t

        return None, step

    def __call__(self, *args):
        if not _real(args):
            return self.aten_gm.forward(*args)
        if self.eager:
            return self.seeded.run(args, None) if self.seeded is not None else self._eager(args)
        if self.record is None:
            return self._run(args)
        import torch

        record, self.record = self.record, None
        want = self._eager(args) if self.seeded is None else None
        try:
            got = self._run(args)
            seeds = self.last_seeds.tolist() if self.last_seeds is not None else []
            if self.seeded is not None:
                # PyTorch's dropout draws other masks: the reference is the graph with eqfuse's.
                want = self.seeded.run(args, seeds)
            half = (torch.float16, torch.bfloat16)
            half_inputs = self.half or any(isinstance(a, torch.Tensor) and a.dtype in half for a in args)
            why = results_agree(got, want, half_inputs, skip=self.dont_care)
            if why is not None and half_inputs:
                exact = (exact_outputs(self.aten_gm, _traced_args(self.aten_gm, args)) if self.seeded is None
                         else self.seeded.run(args, seeds, True))
                if exact is not None:
                    why = results_agree(got, want, half_inputs, skip=self.dont_care, exact=exact)
            elif why is not None and self.seeded is None:
                # An f32 graph: a value zero in exact arithmetic (a gradient that sums to zero)
                # is rounding noise in eager as in eqfuse, which no bound relative to the
                # outputs can tell from an error: measured against the graph in f64 instead.
                exact = exact_outputs(self.aten_gm, _traced_args(self.aten_gm, args), torch.float64)
                if exact is not None:
                    why = results_agree(got, want, half_inputs, skip=self.dont_care, exact=exact, slack=2.0)
        except Exception as e:  # a kernel that cannot run these arguments: eager, never an error
            why = f"{type(e).__name__}: {e}"
            if want is None:
                want = self.seeded.run(args, None)
        if why is not None:
            self.eager = True
            record.runs = "eager"
            record.why_eager = f"eqfuse's result differed from eager on the first call: {why}"
            warnings.warn(f"eqfuse: the {record.kind} graph runs eagerly: {record.why_eager}", stacklevel=2)
            return want
        return got

    def _eager(self, args):
        return self.aten_gm.forward(*_traced_args(self.aten_gm, args))

    def _run(self, args):
        inputs = dict(self.values)
        if len(args) == self.n_args:
            inputs.update(zip(self.direct_names, self.direct_args(args)))
        else:  # (as zip would: the arguments there are)
            inputs.update((name, args[i]) for name, i in zip(self.direct_names, self.direct_args.positions)
                          if i < len(args))
        argument = self.exported.argument
        for name, i in self.mapped:
            if i >= len(args):
                continue
            # An expanded argument, or a view a forward made: the graph reads the tensor it
            # is a broadcast or a view of, in place.
            try:
                inputs[name] = argument(name, args[i])
            except ValueError:
                # (A forward run eagerly lays its saved tensors out as PyTorch does.)
                return self.seeded.run(args, None) if self.seeded is not None else self._eager(args)
        if self.cpu_args:
            # One-element CPU tensors (`_on_cuda`): copied to the plan's device.
            device = self.plan.device
            for k, v in inputs.items():
                if isinstance(v, self.torch.Tensor) and v.device.type == "cpu":
                    inputs[k] = v.to(device)
        seeds = None
        if self.seed_input is not None:
            from .rng import Seeds

            seeds = self.last_seeds = Seeds.draw(self.n_seeds, self.plan.device)
            inputs[self.seed_input] = seeds
        got = self.plan(inputs)
        out = [got[name] if step is None else step(got, seeds) for name, step in self.steps]
        for i, o in self.views:  # saved for the backward: the view of its base, no copy
            where, at = o.base
            base = args[at] if where == "arg" else out[at] if where == "result" else got[at]
            out[i] = o.of(base)
        return out


def _getter(positions: list[int]):
    """`get(args)`: the items of `args` at `positions`, a tuple (`get.positions`)."""
    import operator

    if not positions:
        get = lambda args: ()  # noqa: E731
    elif len(positions) == 1:
        at = positions[0]
        get = lambda args: (args[at],)  # noqa: E731
    else:
        item = operator.itemgetter(*positions)
        get = lambda args: item(args)  # noqa: E731
    get.positions = positions
    return get


eqfuse_backend = EqfuseBackend()
"""A ready instance: `torch.compile(model, backend=eqfuse_backend)`."""
