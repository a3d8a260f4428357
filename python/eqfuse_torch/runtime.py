"""Running an eqfuse plan's generated kernels inside PyTorch, on PyTorch's tensors and stream.

    from eqfuse_torch.runtime import Codegen, GpuPlan

    cg = Codegen.of_graph(graph)            # `eqfuse codegen` into a temporary folder (no GPU)
    cg.unsupported()                        # [] when every kernel has a .cu file, else reasons
    plan = GpuPlan(cg)                      # compiles each .cu with NVRTC through CuPy (lazy import)
    outs = plan({"x": x, "w": w})           # launches in plan order; returns {output name: tensor}

`eqfuse codegen PROG -o DIR` writes one self-contained `.cu` per kernel, `plan.json` and the
launch manifest `launch.json` (`eqfuse.launch/1`): for each kernel in launch order its
`extern "C"` name, file, grid, block, dynamic shared memory, and its arguments (tensor reads,
then writes, then workspaces), each one pointer. `GpuPlan` compiles every file with
`cupy.RawModule(code=..., options=("--gpu-architecture=sm_XY",))` (the options eqfuse's own
runtime passes; kernels whose sources differ only in names, as a model's repeated layers'
do, are compiled once a process: `canonical_source`; distinct ones in threads at once:
`compile_all`, `EQFUSE_COMPILE_THREADS`), allocates every tensor that is not a graph input as a torch tensor on the
inputs' device, allocates the workspaces (one buffer per name, as large as the largest kernel
asks, zeroed once where the manifest says so: those kernels leave them zero), and launches each kernel with `tensor.data_ptr()` arguments on
`torch.cuda.current_stream()`. Kernels that loop over their work (`persistent`) launch at most
one wave of resident blocks when the manifest asks for a wave (`wave`), the grid given
otherwise, as `eqfuse run` does by default.

CUDA graphs (`GraphedLaunch`, on unless `EQFUSE_CUDA_GRAPH=0`): the first call with given input
dtypes and shapes launches kernel by kernel as above; later calls replay `torch.cuda.CUDAGraph`s
of the whole launch sequence over static memory (inputs read in place where their pointers
recur, else copied into static buffers; intermediates in one arena shared by liveness; output
sets of their own): no Python per kernel, no allocation. Outputs still held by the caller are
never overwritten (another output set, or copies); a capture that fails or a first replay that
differs from eager launch turns graphs off for the plan with one line on stderr.

A gemm kernel that codegen plans as one cuBLASLt call (`cublaslt` in the manifest: no file, a
column-major description of the product, its bias and epilogue) is run by `lt_call_torch`:
PyTorch's `addmm` (cuBLASLt with the bias and GELU epilogues), `baddbmm` or `_addmm_activation`
on strided views of the same buffers, written into the output buffer. A call with a bias is
run both ways on its first launch, with the epilogue and as a plain product added to the bias,
and a 16-bit call with a matrix off 16 bytes (a 50257-wide vocabulary) also as the product of
its matrices zero-padded to 16-byte extents; the fastest is kept (`lt_variants`; `EQFUSE_LT_VARIANT=epilogue`,
`separate` or `aligned` fixes one).
With `cublaslt=False`, `Codegen.unsupported()` names such kernels instead and the backend falls
back to eager for the whole graph.

CuPy is imported only by `GpuPlan`; nothing else here needs it or a GPU.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .backend import PLANS, Memo, PlanError, find_eqfuse, plan_key


CODEGENS = Memo(32)
"""`Codegen.of_graph`'s results in this process (a `Codegen`, or the `PlanError` codegen
refused with), by `backend.plan_key`."""


class RuntimeUnavailable(Exception):
    """No way to run kernels here (no CuPy, no GPU): the caller runs eagerly."""


@dataclass
class Codegen:
    """`eqfuse codegen`'s output for one graph: the folder, its manifest and its plan."""

    dir: Path
    manifest: dict
    plan: dict
    _tmp: object = field(default=None, repr=False)

    @classmethod
    def of_graph(cls, graph: dict, *, binary: str | None = None, device: str = "h100", args: tuple[str, ...] = (),
                 timeout: float = 600.0) -> "Codegen":
        """Writes `graph` and runs `eqfuse codegen` on it into a temporary folder (kept as long as
        this object lives). Raises PlanError with eqfuse's message when codegen refuses.

        A graph this process gave codegen already with the same binary and options gets the
        same `Codegen` (or the same refusal) back (`CODEGENS`), and its plan is remembered as
        the graph's (`backend.PLANS`): `plan_graph` then returns the plan these kernels run
        without planning the graph a second time."""
        exe = find_eqfuse(binary)
        text = json.dumps(graph)
        key = plan_key(text, exe, device, args)
        hit = CODEGENS.get(key)
        if isinstance(hit, PlanError):
            raise PlanError(str(hit))
        if hit is not None:
            return hit
        tmp = tempfile.TemporaryDirectory(prefix="eqfuse-")
        d = Path(tmp.name)
        (d / "graph.json").write_text(text)
        cmd = [exe, "codegen", str(d / "graph.json"), "-o", str(d / "kernels"), "--device", device, *args]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PlanError(f"{exe}: {e}") from None
        if r.returncode != 0:
            refused = PlanError(r.stderr.strip() or f"{exe} codegen exited with status {r.returncode}")
            CODEGENS.put(key, refused)
            raise refused
        k = d / "kernels"
        cg = cls(k, json.loads((k / "launch.json").read_text()), json.loads((k / "plan.json").read_text()), tmp)
        CODEGENS.put(key, cg)
        PLANS.put(key, cg.plan)
        return cg

    def unsupported(self, cublaslt: bool = False) -> list[str]:
        """Why the kernels cannot be launched from Python, one reason per kernel (empty when all
        can); `cublaslt`: cuBLASLt calls count as runnable (through `lt_call_torch`)."""
        out = []
        for k in self.manifest["kernels"]:
            if k.get("cublaslt") is not None:
                if not cublaslt:
                    out.append(f"kernel {k['kernel']} ({k['name']}) is a cuBLASLt call, not generated CUDA")
            elif not k.get("file") or not (self.dir / k["file"]).is_file():
                out.append(f"kernel {k['kernel']} ({k['name']}) has no generated source file")
        return out


def lt_call_torch(call: dict, env: dict, variant: str = "epilogue") -> None:
    """Runs a manifest's cuBLASLt call with PyTorch on the tensors of `env` (name -> tensor):
    column-major `d[m, n] = epilogue(alpha op(a) @ op(b) + bias per row of d)` (relu or the
    tanh form of GELU), for each of `batch` matrices and each index of the `outer` loops,
    written into `env[call["d"]]`.

    The column-major `d` is the row-major `[n, m]` matrix `dᵀ = op(b)ᵀ op(a)ᵀ`, so the product is
    computed in that order straight into `d`'s memory (`out=`): no transposing copy. A bias
    (one value per column of dᵀ) and an activation go through `addmm` and `_addmm_activation`,
    which PyTorch runs as cuBLASLt with the bias (and GELU) epilogue, as eqfuse's own runtime
    does; batched products through `baddbmm`.

    `variant="separate"` (a call with a bias, no loops, [`lt_variants`]) runs the bias of one
    matrix as PyTorch runs a broadcast addend: written into `d`, then cuBLAS's plain product
    added to it, then the activation in place. cuBLASLt's heuristics for the bias epilogue pick
    other tiles than cuBLAS's for the plain product: on an H100, f32 [1576, 3072] @ [3072, 768]
    ran 255.6 us with the epilogue and 183.0 us without (PyTorch 2.11).

    `variant="aligned"` pads each matrix (and the bias) with zeros to extents on 16 bytes
    (`_padded`), computes the padded product into a contiguous buffer and copies its part back."""
    import torch

    batch, m, n = int(call["batch"]) or 1, int(call["m"]), int(call["n"])
    alpha = float(call.get("alpha", 1.0))
    epilogue = call["epilogue"]
    if epilogue not in ("default", "bias", "relu", "relu_bias", "gelu", "gelu_bias"):
        raise RuntimeUnavailable(f"cuBLASLt epilogue {epilogue} is not known to the Python runtime")
    act = "relu" if epilogue.startswith("relu") else "gelu" if epilogue.startswith("gelu") else None
    bias = env[call["bias"]].reshape(m) if call.get("bias") else None
    outer = call.get("outer") or []
    counts = [int(lp["count"]) for lp in outer]

    def operand(o: dict, offset: int):
        t = env[o["tensor"]]
        # The stored column-major matrix [rows, cols], leading dimension ld, as a strided view,
        # from the operand's own element offset (a slice read in place) plus the loop's.
        v = t.as_strided((batch, int(o["rows"]), int(o["cols"])), (int(o["batch_stride"]), 1, int(o["ld"])),
                         t.storage_offset() + int(o.get("offset", 0)) + offset)
        return v.transpose(1, 2) if o["transpose"] else v

    out_t = env[call["d"]]
    for index in itertools.product(*(range(c) for c in counts)):
        off = {key: sum(i * int(lp[key]) for i, lp in zip(index, outer)) for key in ("a", "b", "d")}
        a = operand(call["a"], off["a"])  # op(a): [batch, m, k]
        b = operand(call["b"], off["b"])  # op(b): [batch, k, n]
        out = out_t.as_strided((batch, n, m), (m * n, m, 1), out_t.storage_offset() + off["d"])
        x, y = b.transpose(1, 2), a.transpose(1, 2)  # dᵀ = op(b)ᵀ @ op(a)ᵀ: [batch, n, k] @ [batch, k, m]
        if variant == "aligned":
            # Every extent padded with zeros to 16 bytes, into contiguous buffers that PyTorch's
            # products take as they are (an `out=` view with padded rows it would copy to a
            # contiguous temporary, unaligned again): the padding adds zeros to the sums and
            # columns that are dropped.
            xp, yp, pad_bias = _padded(x), _padded(y), None if bias is None else _padded(bias.view(1, 1, -1))[0, 0]
            outp = torch.empty(batch, xp.shape[1], yp.shape[2], dtype=out.dtype, device=out.device)
            _lt_product(xp, yp, outp, pad_bias, act, alpha, "epilogue")
            out.copy_(outp[:, :n, :m])
        else:
            _lt_product(x, y, out, bias, act, alpha, variant)


def _lt_product(x, y, out, bias, act: str | None, alpha: float, variant: str) -> None:
    """`out = act(alpha x @ y + bias)` over `[batch, n, k] @ [batch, k, m]` (`lt_call_torch`)."""
    import torch

    batch, n, m = out.shape
    if batch == 1 and bias is not None and act != "relu":
        if variant == "separate":
            torch.addmm(bias.expand(n, m), x[0], y[0], alpha=alpha, out=out[0])
            if act == "gelu":
                torch._C._nn.gelu_(out[0], approximate="tanh")
        elif act == "gelu" and out.is_cuda:
            # On CUDA the GELU of `_addmm_activation` is the tanh form: cuBLASLt's epilogue,
            # or `gelu_(..., "tanh")` after the product where cuBLASLt is not used.
            torch._addmm_activation(bias, x[0], y[0], alpha=alpha, use_gelu=True, out=out[0])
        elif act == "gelu":
            torch.addmm(bias, x[0], y[0], alpha=alpha, out=out[0])
            torch._C._nn.gelu_(out, approximate="tanh")
        else:
            torch.addmm(bias, x[0], y[0], alpha=alpha, out=out[0])
        return
    if batch == 1 and bias is None and act is None:
        # One matrix (codegen folds a linear layer's batch into its rows): a plain product,
        # as PyTorch runs `mm`, not a batched one of one matrix.
        torch.addmm(out[0], x[0], y[0], beta=0, alpha=alpha, out=out[0])
        return
    if bias is not None:
        torch.baddbmm(bias.expand(batch, n, m), x, y, alpha=alpha, out=out)
    else:
        out.baddbmm_(x, y, beta=0, alpha=alpha)
    if act == "relu":
        out.relu_()
    elif act == "gelu":
        torch._C._nn.gelu_(out, approximate="tanh")


def _padded(v):
    """`v` (`[batch, r, c]`) zero-padded to `[batch, r', c']`, each extent rounded up to 16 bytes
    of elements: contiguous, or the transpose of a contiguous buffer where `v` is a transposed
    view (so that the copy reads and writes along the same axis)."""
    import torch

    step = 16 // v.element_size()
    batch, r, c = v.shape
    rp, cp = -(-r // step) * step, -(-c // step) * step
    if v.stride(1) == 1 and v.stride(2) != 1 and r > 1:
        out = torch.zeros(batch, cp, rp, dtype=v.dtype, device=v.device)
        out[:, :c, :r] = v.transpose(1, 2)
        return out.transpose(1, 2)
    out = torch.zeros(batch, rp, cp, dtype=v.dtype, device=v.device)
    out[:, :r, :c] = v
    return out


LT_VARIANTS = ("epilogue", "separate", "aligned")


def lt_variants(call: dict) -> tuple[str, ...]:
    """The ways `lt_call_torch` can run `call`, which `GpuPlan` times on its first launch where
    there are several: `epilogue` always; `separate` for a call of one matrix with a bias and no
    loops; `aligned` for a 16-bit call whose matrices are not all on 16 bytes (a leading
    dimension of 50257: cuBLAS's kernels for unaligned bf16 ran GPT-2's [8192, 768] @ [768,
    50257] in 6.7 ms on an H100, Inductor, which pads it, in 1.0): the product of matrices
    zero-padded to extents on 16 bytes, its part copied to the output."""
    out = ["epilogue"]
    if call.get("bias") and (int(call["batch"]) or 1) == 1 and not call.get("outer") \
            and not call["epilogue"].startswith("relu"):
        out.append("separate")
    if call.get("dtype") in ("bf16", "f16"):
        lds = [int(call["a"]["ld"]), int(call["b"]["ld"]), int(call["m"])]
        offsets = [int(call["a"].get("offset", 0)), int(call["b"].get("offset", 0))]
        offsets += [int(call[o]["batch_stride"]) for o in ("a", "b")] if (int(call["batch"]) or 1) > 1 else []
        offsets += [int(lp[key]) for lp in call.get("outer") or [] for key in ("a", "b", "d")]
        if any(v % 8 for v in lds + offsets):
            out.append("aligned")
    return tuple(out)


def _lt_graph_us(call: dict, env: dict, variant: str, reps: int = 4) -> float:
    """Microseconds of one `lt_call_torch(call, env, variant)` on the GPU: `reps` calls captured
    in a CUDA graph (after one call outside it: cuBLAS's handle and heuristics), the graph
    replayed once to warm and then timed over two replays with CUDA events."""
    import torch

    lt_call_torch(call, env, variant)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            lt_call_torch(call, env, variant)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    graph.replay()
    end.record()
    end.synchronize()
    return 1000.0 * start.elapsed_time(end) / (2 * reps)


def workspaces(manifest: dict) -> dict[str, tuple[int, bool]]:
    """The workspace buffers a manifest's kernels need: name -> (bytes, zeroed). Kernels name
    their workspaces alike (`eq_ws`, `eq_count`) at sizes of their own, so each name gets one
    buffer as large as the largest kernel asks, zeroed if any kernel needs it zeroed."""
    out: dict[str, tuple[int, bool]] = {}
    for k in manifest["kernels"]:
        for a in k["args"]:
            if a["role"] == "workspace":
                size, zeroed = out.get(a["name"], (0, False))
                out[a["name"]] = (max(size, int(a["bytes"]), 1), zeroed or bool(a.get("zeroed")))
    return out


def _torch_dtype(name: str):
    import torch

    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "i32": torch.int32,
            "bool": torch.bool}[name]


def _parse_type(text: str) -> tuple[str, tuple[int, ...]]:
    """`f32[4,8]` -> ("f32", (4, 8)); `f32[]` -> ("f32", ())."""
    dtype, rest = text.split("[", 1)
    dims = rest.rstrip("]")
    return dtype, tuple(int(d) for d in dims.split(",") if d.strip())


def _cupy():
    try:
        import cupy  # noqa: F401
    except Exception as e:  # ImportError, or a CuPy that finds no CUDA
        raise RuntimeUnavailable(f"CuPy is not available ({type(e).__name__}: {e})") from None
    return cupy


class LaunchPlan:
    """What running a manifest's launch sequence needs, whatever launches the kernels: its inputs,
    tensors, outputs and workspaces, eager launch (`eager`), and CUDA-graph replay (`graphed`, a
    `GraphedLaunch`, None when off). `GpuPlan` launches generated CUDA through CuPy; tests give
    `launch` other kernels. `__call__` replays a graph where one runs, else launches eagerly."""

    def __init__(self, manifest: dict, device):
        self.manifest = manifest
        self.device = device
        self.inputs = {name: _parse_type(t) for name, t in manifest["inputs"]}
        self.outputs = [(out, tensor) for out, tensor in manifest["outputs"]]
        self._output_tensor = dict(self.outputs)
        self.tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.tensor_bytes: dict[str, int] = {}
        for k in manifest["kernels"]:
            for a in k["args"]:
                if a["role"] != "workspace":
                    self.tensors.setdefault(a["name"], (a["dtype"], tuple(a["shape"])))
                    self.tensor_bytes[a["name"]] = max(self.tensor_bytes.get(a["name"], 0), int(a.get("bytes", 0)))
        self.workspace: dict = {}
        self.graphed: GraphedLaunch | None = None
        self.stats = {"eager": 0, "captures": 0, "replays": 0, "cloned": 0, "input_copies": 0}
        """Calls launched eagerly, graphs captured, replays, replays whose outputs were cloned
        (every graph's outputs still held), inputs copied into static buffers; `graph_off` is
        added, with the reason, when graphs are turned off for this plan."""

    def launch(self, env: dict) -> None:
        """Launches every kernel on the tensors of `env` (name -> tensor) on the current stream."""
        raise NotImplementedError

    def prepare(self, name: str, t):
        """Input `name` as the kernels read it: on the device, in the manifest's dtype and shape, contiguous."""
        import torch

        dtype, shape = self.inputs[name]
        if t.device != self.device:
            t = t.to(self.device)
        if t.dtype != _torch_dtype(dtype):
            t = t.to(_torch_dtype(dtype))
        if tuple(t.shape) != shape:
            if t.numel() != _numel(shape):
                raise ValueError(f"input {name}: shape {tuple(t.shape)}, the plan needs {shape}")
            t = t.reshape(shape)
        return t.contiguous() if not t.is_contiguous() else t

    def output_layout(self, out: str):
        """(torch dtype, shape) in which every call returns output `out`, contiguous (eager launch
        allocates it so, graphs' output sets too); None for an output that is an input, which is
        returned as the caller gave it (`prepare`)."""
        tensor = self._output_tensor.get(out)
        if tensor is None or tensor in self.inputs or tensor not in self.tensors:
            return None
        dtype, shape = self.tensors[tensor]
        return _torch_dtype(dtype), tuple(shape)

    def eager(self, inputs: dict) -> dict:
        """One call launched kernel by kernel: every tensor that is not an input allocated now."""
        import torch

        self.stats["eager"] += 1
        env = {name: self.prepare(name, inputs[name]) for name in self.inputs}
        for name, (dtype, shape) in self.tensors.items():
            if name not in env:
                env[name] = torch.empty(shape, dtype=_torch_dtype(dtype), device=self.device)
        self.launch(env)
        return {out: env[tensor] for out, tensor in self.outputs}

    def __call__(self, inputs: dict) -> dict:
        """Runs the plan on `inputs` (graph input name -> tensor, converted to the manifest's
        dtype and made contiguous where needed); returns graph output name -> tensor."""
        import torch

        with torch.no_grad():
            if self.graphed is not None:
                return self.graphed(inputs)
            return self.eager(inputs)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


class GpuPlan(LaunchPlan):
    """A codegen folder compiled and ready to launch on the current CUDA device: kernels through
    CuPy, cuBLASLt calls as torch products (`lt_call_torch`), replayed as CUDA graphs
    (`GraphedLaunch`) when `graphs` is true or, by default, unless `EQFUSE_CUDA_GRAPH=0`."""

    def __init__(self, cg: Codegen, graphs: bool | None = None):
        import torch

        reasons = cg.unsupported(cublaslt=True)
        if reasons:
            raise RuntimeUnavailable("; ".join(reasons))
        if not torch.cuda.is_available():
            raise RuntimeUnavailable("no CUDA device is visible to PyTorch")
        cp = _cupy()
        super().__init__(cg.manifest, torch.device("cuda", torch.cuda.current_device()))
        self.cg = cg
        m = cg.manifest
        major, minor = torch.cuda.get_device_capability(self.device)
        arch = f"sm_{major}{minor}"
        self.kernels = []
        # cuBLASLt calls' variants by kernel index, once timed (`_lt_variant`), and their times.
        self.lt_chosen: dict[int, str] = {}
        self.lt_times: dict[int, dict[str, float]] = {}
        tag = f"_g{next(_RUNNERS)}"
        sources = {k["name"]: (cg.dir / k["file"]).read_text() for k in m["kernels"] if k.get("cublaslt") is None}
        compile_all(cp, sources, arch, self.device.index, tag)
        with cp.cuda.Device(self.device.index):
            sms = cp.cuda.Device(self.device.index).attributes["MultiProcessorCount"]
            for k in m["kernels"]:
                if k.get("cublaslt") is not None:
                    self.kernels.append((k, None, None, None, None, 0))
                    continue
                module, fn = _compiled(cp, sources[k["name"]], k["name"], arch, self.device.index, tag)
                launch = k["launch"]
                smem = int(launch["smem_bytes"])
                # (The default allows 48 KiB less the kernel's static shared memory; a shared
                # function keeps the largest size asked.)
                if smem > fn.max_dynamic_shared_size_bytes:
                    fn.max_dynamic_shared_size_bytes = smem
                grid = list(launch["grid"])
                if launch.get("wave"):
                    threads = launch["block"][0] * launch["block"][1] * launch["block"][2]
                    grid[0] = min(grid[0], self._resident_blocks(cp, fn, threads, smem, sms))
                self.kernels.append((k, module, fn, tuple(grid), tuple(launch["block"]), smem))
        for name, (size, zeroed) in workspaces(m).items():
            alloc = torch.zeros if zeroed else torch.empty
            self.workspace[name] = alloc(size, dtype=torch.uint8, device=self.device)
        why_off = None
        if graphs is None:
            graphs = cuda_graphs_enabled()
            why_off = "EQFUSE_CUDA_GRAPH=0"
        if graphs and any(fn is None or 0 not in grid for _k, _m, fn, grid, _b, _s in self.kernels):
            self.graphed = GraphedLaunch(self, m["kernels"], CudaGraphs(self.device))
        elif not graphs:
            self.stats["graph_off"] = why_off or "GpuPlan(graphs=False)"

    def __call__(self, inputs: dict) -> dict:
        import torch

        with torch.cuda.device(self.device):
            return super().__call__(inputs)

    def _lt_variant(self, i: int, call: dict, env: dict, stream) -> str:
        """The way kernel `i`'s cuBLASLt call runs (`lt_variants`): where it has several, each
        is timed on the tensors of the first launch that is not being captured, as the plan
        runs it, replayed from a CUDA graph (`_lt_graph_us`: GPU time, no Python or launch
        time), and the fastest kept. `EQFUSE_LT_VARIANT` fixes the variant where the call has it.
        The launch then runs the variant kept, so that the output is its result."""
        import torch

        chosen = self.lt_chosen.get(i)
        if chosen is not None:
            return chosen
        variants = lt_variants(call)
        fixed = os.environ.get("EQFUSE_LT_VARIANT", "")
        if fixed in variants or len(variants) == 1:
            self.lt_chosen[i] = fixed if fixed in variants else variants[0]
            return self.lt_chosen[i]
        if torch.cuda.is_current_stream_capturing():
            return variants[0]
        stream.synchronize()
        try:
            times = {v: _lt_graph_us(call, env, v) for v in variants}
        except Exception as e:  # a call that cannot be captured keeps the epilogue
            self.lt_times[i] = {"error": f"{type(e).__name__}: {e}"}
            times = {variants[0]: 0.0}
        else:
            self.lt_times[i] = times
        self.lt_chosen[i] = min(times, key=lambda v: times[v])
        return self.lt_chosen[i]

    @staticmethod
    def _resident_blocks(cp, fn, threads: int, smem: int, sms: int) -> int:
        """One wave: blocks per SM by the driver's occupancy calculator, times the SMs."""
        try:
            per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(getattr(fn, "kernel", fn).ptr, threads, smem)
        except Exception:
            per_sm = 1
        return max(1, int(per_sm)) * sms

    def launch(self, env: dict) -> None:
        import numpy as np
        import torch

        cp = _cupy()
        stream = torch.cuda.current_stream(self.device)
        with cp.cuda.Device(self.device.index), cp.cuda.ExternalStream(stream.cuda_stream, self.device.index):
            for i, (k, _module, fn, grid, block, smem) in enumerate(self.kernels):
                if fn is None:
                    lt_call_torch(k["cublaslt"], env, self._lt_variant(i, k["cublaslt"], env, stream))
                    continue
                if 0 in grid:
                    continue
                ptrs = []
                for a in k["args"]:
                    t = self.workspace[a["name"]] if a["role"] == "workspace" else env[a["name"]]
                    try:
                        ptrs.append(np.uint64(t.data_ptr()))
                    except RuntimeError as e:
                        raise RuntimeUnavailable(f"kernel {k['name']}: {a['name']} ({type(t).__name__}) has no data: {e}") from None
                fn(grid, block, tuple(ptrs), shared_mem=smem)


# --- CUDA-graph replay


def cuda_graphs_enabled(environ=None) -> bool:
    """Whether plans replay CUDA graphs: yes unless `EQFUSE_CUDA_GRAPH` is 0 (or false, off, no)."""
    value = (os.environ if environ is None else environ).get("EQFUSE_CUDA_GRAPH", "1")
    return value.strip().lower() not in ("0", "false", "off", "no")


def lifetimes(kernels: list[dict], names) -> dict[str, tuple[int, int]]:
    """For each tensor of `names`, the first and the last launch (index into the manifest's
    `kernels`) whose arguments name it: it is live over that closed range."""
    names = set(names)
    out: dict[str, tuple[int, int]] = {}
    for i, k in enumerate(kernels):
        for a in k["args"]:
            if a["role"] != "workspace" and a["name"] in names:
                out[a["name"]] = (out.get(a["name"], (i, i))[0], i)
    return out


ARENA_ALIGN = 256
"""Alignment of every tensor in the intermediate arena (bytes): what cudaMalloc gives, enough
for any vector access and for cuBLAS."""


def arena_layout(sizes: dict[str, int], live: dict[str, tuple[int, int]],
                 align: int = ARENA_ALIGN) -> tuple[int, dict[str, int]]:
    """Byte offsets of tensors in one arena: `sizes[name]` bytes, live over launches
    `live[name]` (closed ranges, `lifetimes`). Two tensors whose ranges overlap never overlap in
    memory; one whose last launch comes before another's first may share its bytes. Largest
    first, each at the lowest aligned offset clear of the tensors already placed that are live
    with it. Returns (arena bytes, offsets)."""
    placed: list[tuple[int, int, int, int]] = []  # (start, end, first, last)
    offsets: dict[str, int] = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], live[n][0], n)):
        size = -(-max(int(sizes[name]), 1) // align) * align
        first, last = live[name]
        off = 0
        for start, end in sorted((s, e) for s, e, f, l in placed if f <= last and first <= l):
            if off + size <= start:
                break
            off = max(off, end)
        offsets[name] = off
        placed.append((off, off + size, first, last))
    return max((e for _, e, _, _ in placed), default=0), offsets


class _OutputSet:
    """Static output tensors that graphs write. `free()`: nobody outside holds any of them (no
    tensor or view beyond the one kept here), by each storage's use count against the count
    measured when only this object held it. (A bare `UntypedStorage` object the caller keeps
    without any tensor is not counted; torch's cudagraph trees have the same blind spot.)"""

    def __init__(self, tensors: dict):
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef

        self.tensors = tensors
        self.list = list(tensors.values())
        """The tensors in `out_tensors` order (what a replay hands out)."""
        self.refs = [StorageWeakRef(t.untyped_storage()) for t in self.list]
        # (The weak references keep each storage's address valid; the tensors keep it alive.)
        self.counts = [(ref.cdata, _use_count(ref)) for ref in self.refs]
        self._use_count = torch._C._storage_Use_Count

    def free(self) -> bool:
        use_count = self._use_count
        for cdata, base in self.counts:
            if use_count(cdata) > base:
                return False
        return True


def _use_count(ref) -> int:
    import torch

    return torch._C._storage_Use_Count(ref.cdata)


def _tensor_guard(ts: tuple):
    """A check, in C++, that tensors have the dtypes, devices, shapes and strides (and dispatch
    keys and `requires_grad`) of `ts`: TorchDynamo's `TensorGuards`, `check(*tensors)`. None
    where this PyTorch has no such check (the signature is then compared in Python)."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        guard = TensorGuards(*ts, dynamic_dims_sizes=[list(t.shape) for t in ts],
                             dynamic_dims_strides=[list(t.stride()) for t in ts])
        return guard if guard.check(*ts) else None
    except Exception:  # noqa: BLE001 - an accelerator only
        return None


class _Signature:
    """The graphs of one set of input dtypes, shapes, strides and devices, and what a call with
    it needs worked out once: which inputs may be read in place, the input keys of the pointers
    seen, the copies each key needs."""

    def __init__(self, ts: tuple, in_place: tuple):
        self.in_place = in_place
        """Per input, whether the kernels can read it where the caller keeps it (on the plan's
        device, in the plan's dtype, contiguous): the same for every call of the signature."""
        self.shapes = tuple(t.shape for t in ts)
        self.guard = _tensor_guard(ts)
        """A C++ check that tensors have this signature (`_tensor_guard`), or None."""
        self.seen: list[list[int]] = [[] for _ in ts]
        """The pointers each input had on earlier calls (the last few)."""
        self.known: dict[tuple, tuple] = {}
        """Input pointers -> their input key (`GraphedLaunch._key`), a captured one, for pointers
        that added nothing to `seen` when the key was made: valid as long as `seen` and `keys`
        stay as they are (cleared when either changes)."""
        self.copies: dict[tuple, tuple[list, list[int]]] = {}
        """Input key -> (static buffers viewed as this signature's shapes, the inputs copied into them)."""
        self.keys: list[tuple] = []
        """Input keys graphs were captured for: per input, the pointer the graph reads it at, or
        None where it reads the input's static buffer."""
        self.sets: list[_OutputSet] = []
        """Output sets handed to the caller."""
        self.private: _OutputSet | None = None
        """The output set whose tensors are cloned for the caller (when every other is held)."""
        self.graphs: dict[tuple, object] = {}
        """(input key, output set index, -1 for the private one) -> replay."""


class GraphedLaunch:
    """A plan's launch sequence replayed as CUDA graphs.

    The first call with a given signature (each input's dtype, shape, strides, device) launches
    eagerly (warm-up: modules loaded, cuBLAS initialised). Later calls replay graphs of the whole
    sequence (CuPy kernels, the torch ops of cuBLASLt calls) over static memory: intermediates are
    views of one arena laid out by liveness (`arena_layout`), workspaces are the plan's (zeroed
    ones stay zero: their kernels leave them so), outputs are one of a few output sets.

    Inputs: a graph reads an input where the caller keeps it when the input needs no conversion
    and its pointer was seen on an earlier call (parameters, a buffer the allocator hands out
    again, the forward's outputs a backward reads); other inputs are copied into static buffers
    at each call (`torch._foreach_copy_`: one call for them all). Graphs are keyed by those
    pointers, so an input whose pointer changes (a parameter replaced) is copied, and read in
    place again under a graph captured for its new pointer once that recurs; the caller's old
    tensor is never written. Keys are bounded (`MAX_KEYS`; beyond them a call reads in place
    only pointers a captured key reads in place at its addresses: `_bounded_key`), graphs too
    (`MAX_GRAPHS`; beyond them a new combination launches eagerly).

    Outputs: the caller may keep what a call returned (saved activations until the backward,
    `.grad`, a loss) while calling again, and a replay overwrites its outputs. What torch's own
    cudagraph trees guard against is guarded here by the storages' use counts: an output set is
    replayed into only when nothing outside holds any of its tensors; else another set is used
    (up to `variants`), and when all are held, a set that is never handed out, whose outputs are
    cloned for the caller (one copy of the outputs). The caller gets aliases of the set's tensors
    (`detach()`: counted as held). An output that is an input is returned as eager launch returns
    it (the input itself).

    The per-call work is what changes between calls: the signature is checked in C++ against
    the last one matched (`_tensor_guard`; in Python, a tuple of each input's dtype, shape,
    strides and device, where PyTorch has no such check or it fails), the input pointers are
    looked up in the keys they gave before (`_Signature.known`), and everything a signature or a
    key determines (inputs read in place, static buffers and copies, the order of results) is
    worked out once.

    Each capture first launches eagerly on the capture stream (warm-up of that stream, and the
    reference), and the first replay is compared with that launch (`results_agree`); any
    difference or error turns graphs off for the plan, with one line on stderr (`report`), and
    the eager result is returned."""

    MAX_SIGNATURES = 8
    MAX_KEYS = 4
    MAX_GRAPHS = 16
    MAX_KNOWN = 64
    SEEN = 4

    def __init__(self, plan: LaunchPlan, kernels: list[dict], graphs, variants: int = 2, report=None):
        import operator

        import torch

        self.plan = plan
        self.graphs = graphs
        self.variants = variants
        self.report = report if report is not None else _stderr_line
        self.signatures: dict[tuple, _Signature] = {}
        self.last: _Signature | None = None
        """The signature the last call matched: checked first."""
        self.off: str | None = None
        self.names = list(plan.inputs)
        names = self.names
        getter = operator.itemgetter(*names) if names else None
        self._tensors = ((lambda d: ()) if not names else (lambda d: (getter(d),)) if len(names) == 1 else getter)
        """inputs (name -> tensor) -> the tensors in plan input order."""
        self._data_ptr = torch.Tensor.data_ptr
        self._detach = torch.Tensor.detach
        self._meta = operator.attrgetter("dtype", "shape", "device")
        self._stride = torch.Tensor.stride
        self.out_tensors = [t for t in dict.fromkeys(t for _, t in plan.outputs) if t not in plan.inputs]
        where = {t: i for i, t in enumerate(self.out_tensors)}
        self.results = [(out, where.get(t), t) for out, t in plan.outputs]
        """Per plan output: (output name, index in `out_tensors` or None for an input, tensor name)."""
        middle = [n for n in plan.tensors if n not in plan.inputs and n not in set(self.out_tensors)]
        self.sizes = {n: self._nbytes(n) for n in middle}
        self.arena_bytes, self.offsets = arena_layout(self.sizes, lifetimes(kernels, middle))
        self.arena = None
        self.static_inputs: dict = {}

    def _nbytes(self, name: str) -> int:
        import torch

        dtype, shape = self.plan.tensors[name]
        itemsize = torch.empty((), dtype=_torch_dtype(dtype)).element_size()
        return max(_numel(shape) * itemsize, self.plan.tensor_bytes.get(name, 0))

    def __call__(self, inputs: dict) -> dict:
        if self.off is not None:
            return self.plan.eager(inputs)
        ts = self._tensors(inputs)
        sig = self.last
        if sig is None or sig.guard is None or not sig.guard.check(*ts):
            sig_key = self._signature(ts)
            sig = self.signatures.get(sig_key)
            if sig is None:
                if len(self.signatures) < self.MAX_SIGNATURES:
                    self.signatures[sig_key] = sig = _Signature(ts, self._in_place(ts))
                    self._key(sig, ts, tuple(map(self._data_ptr, ts)))  # the pointers seen
                return self.plan.eager(inputs)
            self.last = sig
        try:
            return self._replay(sig, ts, inputs)
        except _GraphMismatch as e:
            self._turn_off(str(e))
            return e.eager
        except Exception as e:  # a capture that failed: eager launch, never an error or a wrong result
            self._turn_off(f"{type(e).__name__}: {e}")
            try:
                self.graphs.recover()
            except Exception:  # noqa: BLE001 - the eager launch below reports what still fails
                pass
            return self.plan.eager(inputs)

    def _turn_off(self, why: str) -> None:
        self.off = why
        self.signatures.clear()
        self.last = None
        self.arena, self.static_inputs = None, {}
        self.plan.stats["graph_off"] = why
        self.report(f"eqfuse: CUDA graph off for this plan, launching kernel by kernel: {why}")

    def _signature(self, ts: tuple) -> tuple:
        """Each input's (dtype, shape, device) and strides (ValueError where an input's size is
        not the plan's)."""
        key = (tuple(map(self._meta, ts)), tuple(map(self._stride, ts)))
        for name, (_dtype, shape), (_, t_shape, _) in zip(self.names, self.plan.inputs.values(), key[0]):
            if t_shape.numel() != _numel(shape):
                raise ValueError(f"input {name}: shape {tuple(t_shape)}, the plan needs {shape}")
        return key

    def _in_place(self, ts: tuple) -> tuple:
        """Per input, whether the kernels can read it where the caller keeps it."""
        return tuple(t.device == self.plan.device and t.dtype == _torch_dtype(dtype) and t.is_contiguous()
                     for t, (dtype, _shape) in zip(ts, self.plan.inputs.values()))

    def _key(self, sig: _Signature, ts: tuple, ptrs: tuple) -> tuple:
        """Per input, the pointer a graph reads it at (one seen on an earlier call, and no
        conversion needed), or None (copied into its static buffer); records the pointers seen."""
        key = sig.known.get(ptrs)
        if key is not None:
            return key
        new = False
        key = []
        for p, seen, ok in zip(ptrs, sig.seen, sig.in_place):
            if p in seen:
                key.append(p if ok else None)
            else:
                key.append(None)
                seen.append(p)
                del seen[:-self.SEEN]
                new = True
        key = tuple(key)
        if key not in sig.keys and len(sig.keys) >= self.MAX_KEYS:
            key = self._bounded_key(sig, key)
        if new:
            sig.known.clear()  # keys made before now name fewer pointers than they would
        elif key in sig.keys:  # (one not captured yet is made again until it is)
            if len(sig.known) >= self.MAX_KNOWN:
                sig.known.clear()
            sig.known[ptrs] = key
        return key

    def _bounded_key(self, sig: _Signature, key: tuple) -> tuple:
        """The key a call of input key `key` uses once keys are full (pointers that keep
        changing): one that reads in place only where `key` does, at `key`'s pointers, and
        reads most in place among a captured key that agrees so, each captured key less the
        pointers where it and `key` differ, and `key` less the pointers captured keys read at
        other addresses (a parameter stays, an input cycling through buffers is copied; a key
        that reads an input from its static buffer says nothing about it). A captured key wins
        a tie; a new one is taken only while graphs may still be captured."""
        def count(k):
            return sum(q is not None for q in k)

        stable = tuple(p if p is not None and any(k[i] == p for k in sig.keys)
                       and all(k[i] is None or k[i] == p for k in sig.keys) else None for i, p in enumerate(key))
        candidates = [stable] + [tuple(p if q == p else None for q, p in zip(k, key)) for k in sig.keys]
        captured = [k for k in candidates if k in sig.keys]
        best = max(captured, key=count, default=None)
        if len(sig.graphs) < self.MAX_GRAPHS:
            new = max(candidates, key=count)
            if best is None or count(new) > count(best):
                return new
        return best if best is not None else stable

    def _free_set(self, sig: _Signature) -> int | None:
        """The first output set nobody outside holds, else None."""
        for i, o in enumerate(sig.sets):
            if o.free():
                return i
        return None

    def _replay(self, sig: _Signature, ts: tuple, inputs: dict) -> dict:
        key = self._key(sig, ts, tuple(map(self._data_ptr, ts)))
        idx = self._free_set(sig)
        new_set = idx is None and len(sig.sets) < self.variants
        if new_set:
            idx = len(sig.sets)
        clone = idx is None
        if clone:
            idx = -1
        replay = sig.graphs.get((key, idx))
        if replay is None and len(sig.graphs) >= self.MAX_GRAPHS:
            return self.plan.eager(inputs)  # too many combinations of pointers and output sets
        if new_set:
            sig.sets.append(self._output_set())
        if clone and sig.private is None:
            sig.private = self._output_set()
        outputs = sig.private if clone else sig.sets[idx]
        self.graphs.before_replay()
        copies = sig.copies.get(key)
        if copies is None:
            copies = sig.copies[key] = self._copies(sig, key)
        dsts, which = copies
        if which:
            srcs = [ts[i] for i in which]
            if len(dsts) == 1:
                dsts[0].copy_(srcs[0])
            else:
                import torch

                torch._foreach_copy_(dsts, srcs)
            self.plan.stats["input_copies"] += len(which)
        want = None
        if replay is None:
            want = self.graphs.reference(lambda: self.plan.eager(inputs))
            replay = self._capture(key, outputs, ts)
            sig.graphs[(key, idx)] = replay
            if key not in sig.keys:
                sig.keys.append(key)
                sig.known.clear()  # (a key agreed with before may not be the best now)
        replay()
        self.plan.stats["replays"] += 1
        if clone:
            # Every output set handed out is still held by the caller: this one never is, and the
            # caller gets copies (one copy of the outputs).
            self.plan.stats["cloned"] += 1
            outs = [b.clone() for b in outputs.list]
        else:
            outs = list(map(self._detach, outputs.list))  # aliases: counted as held
        result = {out: outs[i] if i is not None else self.plan.prepare(t, inputs[t]) for out, i, t in self.results}
        if want is not None:
            from .backend import results_agree

            why = results_agree(list(result.values()), list(want.values()), half_inputs=True)
            self.graphs.synchronize()
            if why is not None:
                raise _GraphMismatch(f"the first replay differs from eager launch: {why}", want)
        return result

    def _output_set(self) -> _OutputSet:
        tensors = {}
        for name in self.out_tensors:
            dtype, shape = self.plan.tensors[name]
            tensors[name] = _static_empty(shape, _torch_dtype(dtype), self.plan.device)
        return _OutputSet(tensors)

    def _copies(self, sig: _Signature, key: tuple) -> tuple[list, list[int]]:
        """The copies a call of key `key` makes: (destinations, indices of the inputs copied),
        each destination the input's static buffer viewed as the signature's shape."""
        dsts, which = [], []
        for i, (name, p) in enumerate(zip(self.names, key)):
            if p is None:
                buf = self.static_inputs.get(name)
                if buf is None:
                    dtype, shape = self.plan.inputs[name]
                    buf = self.static_inputs[name] = _static_empty(shape, _torch_dtype(dtype), self.plan.device)
                dsts.append(buf.view(sig.shapes[i]))
                which.append(i)
        return dsts, which

    def _capture(self, key: tuple, outputs: _OutputSet, ts: tuple):
        import torch

        if self.arena is None:
            self.arena = _static_empty((max(self.arena_bytes, 1),), torch.uint8, self.plan.device)
        env = {}
        for name, off in self.offsets.items():
            dtype, shape = self.plan.tensors[name]
            dt = _torch_dtype(dtype)
            n = _numel(shape) * torch.empty((), dtype=dt).element_size()
            env[name] = self.arena[off:off + n].view(dt).view(shape)
        for (name, (_dtype, shape)), t, p in zip(self.plan.inputs.items(), ts, key):
            env[name] = t.view(shape) if p is not None else self.static_inputs[name]
        env.update(outputs.tensors)
        replay = self.graphs.capture(env, self.plan.launch)
        self.plan.stats["captures"] += 1
        return replay


class _GraphMismatch(Exception):
    def __init__(self, why: str, eager: dict):
        super().__init__(why)
        self.eager = eager


_MODULES: dict = {}
"""Compiled kernels by canonical source (`canonical_source`), architecture and device: the
kernels of a model's repeated layers differ only in names, so each is compiled once a process."""


def canonical_source(source: str, name: str) -> str:
    """A kernel's source with what names it removed: its whole-line comments dropped, its
    function name `EQK`, its parameters (`p_<tensor>`) numbered in order of first appearance.
    Two kernels with the same canonical source compile to the same function up to renaming, and
    take their pointer arguments in the same order."""
    import re

    lines = [line for line in source.splitlines() if not line.lstrip().startswith("//")]
    text = re.sub(rf"\b{re.escape(name)}\b", "EQK", "\n".join(lines))
    params: dict[str, str] = {}
    return re.sub(r"\bp_[A-Za-z0-9_]+", lambda m: params.setdefault(m.group(0), f"p_{len(params)}"), text)


_RUNNERS = itertools.count()
"""Numbers the runners of a process: `_g<N>` ends a kernel's name under `EQFUSE_KERNEL_NAMES=1`."""


def _module_source(source: str, name: str, tag: str) -> tuple[str, str]:
    """(source compiled, function name) of a kernel: its canonical source and `EQK`, or with
    `EQFUSE_KERNEL_NAMES=1` (profiling) its own source, the function named `<name><tag>` (`tag`
    telling the runner, since two plans number their kernels alike)."""
    if os.environ.get("EQFUSE_KERNEL_NAMES") == "1":
        return re.sub(rf"\b{re.escape(name)}\b", name + tag, source), name + tag
    return canonical_source(source, name), "EQK"


def _compile(cp, canon: str, fn_name: str, arch: str, device: int):
    """(module, function): `canon` compiled by NVRTC through CuPy and loaded on `device`."""
    with cp.cuda.Device(device):
        module = cp.RawModule(code=canon, options=(f"--gpu-architecture={arch}",))
        return module, module.get_function(fn_name)


def _compiled(cp, source: str, name: str, arch: str, device: int, tag: str = ""):
    """(module, function) of a kernel, compiled once per canonical source, arch and device (once
    per kernel with `EQFUSE_KERNEL_NAMES=1`: `_module_source`)."""
    canon, fn_name = _module_source(source, name, tag)
    key = (canon, arch, device)
    hit = _MODULES.get(key)
    if hit is None:
        hit = _MODULES[key] = _compile(cp, canon, fn_name, arch, device)
    return hit


def compile_workers(environ=None) -> int:
    """Threads that compile a plan's kernels: `EQFUSE_COMPILE_THREADS`, else the CPUs this
    process may use (at most 32); 1 compiles one kernel at a time."""
    value = (os.environ if environ is None else environ).get("EQFUSE_COMPILE_THREADS", "")
    if value.strip():
        try:
            return max(1, int(value))
        except ValueError:
            raise ValueError(f"EQFUSE_COMPILE_THREADS={value!r}: not a whole number") from None
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 32))


def compile_all(cp, sources: dict[str, str], arch: str, device: int, tag: str = "", workers: int | None = None) -> int:
    """Compiles the kernels `sources` (name -> generated source) that `_MODULES` lacks, each
    distinct module once, in `workers` threads (`compile_workers()`): NVRTC releases the GIL
    (CuPy calls `nvrtcCompileProgram` without it), so a model's few dozen kernels compile on
    as many cores at once instead of one after another. Returns how many modules it compiled.

    A kernel that fails in a thread is left out: `_compiled`, in kernel order on the caller's
    thread, compiles it again and raises its error there, as a serial compile would."""
    todo: dict[tuple, str] = {}
    for name, source in sources.items():
        canon, fn_name = _module_source(source, name, tag)
        key = (canon, arch, device)
        if key not in _MODULES:
            todo.setdefault(key, fn_name)
    workers = compile_workers() if workers is None else workers
    if len(todo) < 2 or workers < 2:
        return 0
    from concurrent.futures import ThreadPoolExecutor

    def compile_in_thread(canon: str, fn_name: str):
        # A new thread has no current CUDA context until a runtime call binds one: set the
        # device, which makes its primary context (PyTorch's) current here, before CuPy loads
        # the module with the driver API.
        cp.cuda.runtime.setDevice(device)
        return _compile(cp, canon, fn_name, arch, device)

    compiled = 0
    with ThreadPoolExecutor(min(workers, len(todo)), thread_name_prefix="eqfuse-nvrtc") as pool:
        futures = {key: pool.submit(compile_in_thread, key[0], fn_name) for key, fn_name in todo.items()}
        for key, future in futures.items():
            try:
                _MODULES[key] = future.result()
                compiled += 1
            except Exception:  # noqa: BLE001 - reported by the serial compile in `_compiled`
                pass
    return compiled


def _static_empty(shape, dtype, device):
    """A buffer that lives as long as the graphs: a normal tensor even under inference mode
    (an inference tensor could not be written outside it)."""
    import torch

    with torch.inference_mode(False):
        return torch.empty(shape, dtype=dtype, device=device)


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class CudaGraphs:
    """`GraphedLaunch`'s device side: torch.cuda.CUDAGraph capture on a side stream of its own,
    replay on the current stream."""

    def __init__(self, device):
        import torch

        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.pool = torch.cuda.graph_pool_handle()
        self.last = None

    def reference(self, fn):
        """`fn()` on the capture stream, ordered after the current stream's work and before its
        next: the eager launch that warms that stream up and that the first replay is checked against."""
        import torch

        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            out = fn()
        current.wait_stream(self.stream)
        return out

    def capture(self, env: dict, launch):
        """Captures `launch(env)`; returns its replay. What the launch allocates (the products
        and epilogues of cuBLASLt calls) comes from one memory pool that every graph of the plan
        shares: only such temporaries live there (static buffers are allocated outside any
        capture), dead between replays, and the graphs never run concurrently (one stream, or
        `before_replay`'s wait)."""
        import torch

        g = torch.cuda.CUDAGraph()
        # thread_local: what other threads do meanwhile (a data loader pinning memory) does not
        # invalidate the capture; a forbidden call in this thread still does.
        with torch.cuda.graph(g, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            launch(env)
        return g.replay

    def before_replay(self) -> None:
        """Replays on another stream than the last one wait for it: static buffers are shared."""
        import torch

        current = torch.cuda.current_stream(self.device)
        if self.last is not None and self.last != current:
            current.wait_stream(self.last)
        self.last = current

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    def recover(self) -> None:
        """After a failed capture: nothing left pending."""
        self.synchronize()
