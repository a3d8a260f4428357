"""A `torch.compile` backend that plans the captured graphs with eqfuse.

    import torch
    from eqfuse_torch import eqfuse_backend

    compiled = torch.compile(model, backend=eqfuse_backend)
    y = compiled(x)                # runs, and plans what it captured
    for p in eqfuse_backend.plans:  # one record per captured graph
        print(p.kind, p.plan["total"] if p.plan else p.error)

What it does: TorchDynamo captures the model; AOTAutograd traces it to ATen with PyTorch's core
decompositions, giving a forward graph and, when gradients are needed, the joint
forward-backward graph and the partitioned backward graph. Each is exported to eqfuse's JSON
graph (`export.py`) and planned by the `eqfuse` binary (`eqfuse optimize --format json`); the
plan is kept in `EqfuseBackend.plans` and summarised through `report` (stderr by default).

What it does NOT do yet: run eqfuse's kernels. The graphs run eagerly (the AOTAutograd ATen
graphs, unfused), so results are PyTorch's and so is the speed; the plan is a report. Running the
planned kernels needs the GPU runtime to be callable from Python, which it is not yet. A graph
eqfuse cannot take (an operator without a lowering, a dynamic shape, the binary missing) is run
eagerly as well, with a warning naming why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from .graph import ExportError


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


def plan_graph(graph: dict, *, binary: str | None = None, device: str = "h100", args: tuple[str, ...] = (),
               timeout: float = 600.0) -> dict:
    """Plans an `eqfuse.graph/1` graph with `eqfuse optimize --format json`; returns the plan
    (`eqfuse.plan/1`, docs/plan-schema.md). Raises PlanError with eqfuse's message on failure."""
    exe = find_eqfuse(binary)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.json"
        path.write_text(json.dumps(graph))
        cmd = [exe, "optimize", str(path), "--format", "json", "--device", device, *args]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PlanError(f"{exe}: {e}") from None
    if r.returncode != 0:
        raise PlanError(r.stderr.strip() or f"{exe} exited with status {r.returncode}")
    return json.loads(r.stdout)


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


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


class EqfuseBackend:
    """The backend; call the instance as `torch.compile(model, backend=instance)`.

    `binary`, `device` and `args` go to `eqfuse optimize`; `report` receives one line per
    captured graph (None to stay quiet); `joint` also plans the joint forward-backward graph.
    """

    def __init__(self, binary: str | None = None, device: str = "h100", args: tuple[str, ...] = (),
                 report=_stderr, joint: bool = True):
        self.binary, self.device, self.args, self.report, self.joint = binary, device, args, report, joint
        self.plans: list[CapturedPlan] = []

    def __call__(self, gm, example_inputs):
        from functorch.compile import default_partition, make_boxed_func
        from torch._decomp import core_aten_decompositions
        from torch._dynamo.backends.common import aot_autograd

        def compiler(kind):
            def compile_graph(aten_gm, inputs):
                self.capture(kind, aten_gm)
                return make_boxed_func(aten_gm.forward)

            return compile_graph

        def partition(joint_gm, joint_inputs, **kwargs):
            if self.joint:
                self.capture("joint", joint_gm)
            return default_partition(joint_gm, joint_inputs, **kwargs)

        backend = aot_autograd(
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            partition_fn=partition,
            decompositions=core_aten_decompositions(),
        )
        return backend(gm, example_inputs)

    def capture(self, kind: str, aten_gm) -> CapturedPlan:
        """Exports and plans one ATen graph; never raises (a failure is recorded and warned)."""
        from .export import export_graph_module

        graph = None
        try:
            graph = export_graph_module(aten_gm).graph
            record = CapturedPlan(kind, graph, plan_graph(graph, binary=self.binary, device=self.device, args=self.args))
        except (ExportError, PlanError) as e:
            record = CapturedPlan(kind, graph, None, str(e))
            warnings.warn(f"eqfuse: the {kind} graph runs eagerly without a plan: {e}", stacklevel=2)
        except Exception as e:  # an exporter bug must not stop the user's model from running
            record = CapturedPlan(kind, graph, None, f"{type(e).__name__}: {e}")
            warnings.warn(f"eqfuse: the {kind} graph runs eagerly without a plan: {e}", stacklevel=2)
        self.plans.append(record)
        if self.report and record.plan:
            t, u = record.plan["total"], record.plan["unfused"]
            self.report(
                f"eqfuse: {kind} graph: {t['kernels']} kernels, {t['bytes']} bytes, {t['predicted_us']} us predicted "
                f"(unfused {u['kernels']} kernels, {u['bytes']} bytes, {u['predicted_us']} us); running it eagerly"
            )
        return record


eqfuse_backend = EqfuseBackend()
"""A ready instance: `torch.compile(model, backend=eqfuse_backend)`."""
