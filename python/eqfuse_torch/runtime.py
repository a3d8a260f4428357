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
runtime passes), allocates every tensor that is not a graph input as a torch tensor on the
inputs' device, allocates the workspaces (one buffer per name, as large as the largest kernel
asks, zeroed once where the manifest says so: those kernels leave them zero), and launches each kernel with `tensor.data_ptr()` arguments on
`torch.cuda.current_stream()`. Kernels that loop over their work (`persistent`) launch at most
one wave of resident blocks when the manifest asks for a wave (`wave`), the grid given
otherwise, as `eqfuse run` does by default.

A gemm kernel that codegen plans as one cuBLASLt call (`cublaslt` in the manifest: no file, a
column-major description of the product, its bias and epilogue) is run by `lt_call_torch`:
`torch.matmul` on strided views of the same buffers (PyTorch calls cuBLAS), then the bias and the
activation as PyTorch ops, written into the output buffer. That is the same product, not
eqfuse's fused kernel: the epilogue costs extra passes (bf16 rounds the product before the
bias). With `cublaslt=False`, `Codegen.unsupported()` names such kernels instead and the backend
falls back to eager for the whole graph.

CuPy is imported only by `GpuPlan`; nothing else here needs it or a GPU.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .backend import PlanError, find_eqfuse


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
        this object lives). Raises PlanError with eqfuse's message when codegen refuses."""
        tmp = tempfile.TemporaryDirectory(prefix="eqfuse-")
        d = Path(tmp.name)
        (d / "graph.json").write_text(json.dumps(graph))
        exe = find_eqfuse(binary)
        cmd = [exe, "codegen", str(d / "graph.json"), "-o", str(d / "kernels"), "--device", device, *args]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PlanError(f"{exe}: {e}") from None
        if r.returncode != 0:
            raise PlanError(r.stderr.strip() or f"{exe} codegen exited with status {r.returncode}")
        k = d / "kernels"
        return cls(k, json.loads((k / "launch.json").read_text()), json.loads((k / "plan.json").read_text()), tmp)

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


def lt_call_torch(call: dict, env: dict) -> None:
    """Runs a manifest's cuBLASLt call with PyTorch on the tensors of `env` (name -> tensor):
    column-major `d[m, n] = op(a) @ op(b)` (+ bias per row of d, then relu or tanh-form GELU),
    for each of `batch` matrices, written into `env[call["d"]]`."""
    import torch

    batch, m, n = int(call["batch"]) or 1, int(call["m"]), int(call["n"])

    def operand(o: dict):
        t = env[o["tensor"]]
        # The stored column-major matrix [rows, cols], leading dimension ld, as a strided view.
        v = t.as_strided((batch, int(o["rows"]), int(o["cols"])), (int(o["batch_stride"]), 1, int(o["ld"])))
        return v.transpose(1, 2) if o["transpose"] else v

    d = torch.matmul(operand(call["a"]), operand(call["b"]))
    epilogue = call["epilogue"]
    if call.get("bias"):
        d = d + env[call["bias"]].reshape(1, m, 1)
    if epilogue in ("relu", "relu_bias"):
        d = torch.relu(d)
    elif epilogue in ("gelu", "gelu_bias"):
        d = torch.nn.functional.gelu(d, approximate="tanh")
    elif epilogue not in ("default", "bias"):
        raise RuntimeUnavailable(f"cuBLASLt epilogue {epilogue} is not known to the Python runtime")
    env[call["d"]].as_strided((batch, m, n), (m * n, 1, m)).copy_(d)


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


class GpuPlan:
    """A codegen folder compiled and ready to launch on the current CUDA device."""

    def __init__(self, cg: Codegen):
        import torch

        reasons = cg.unsupported(cublaslt=True)
        if reasons:
            raise RuntimeUnavailable("; ".join(reasons))
        if not torch.cuda.is_available():
            raise RuntimeUnavailable("no CUDA device is visible to PyTorch")
        cp = _cupy()
        self.cg = cg
        self.device = torch.device("cuda", torch.cuda.current_device())
        m = cg.manifest
        major, minor = torch.cuda.get_device_capability(self.device)
        arch = f"sm_{major}{minor}"
        self.inputs = {name: _parse_type(t) for name, t in m["inputs"]}
        self.outputs = [(out, tensor) for out, tensor in m["outputs"]]
        self.tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.kernels = []
        self.workspace: dict[str, torch.Tensor] = {}
        with cp.cuda.Device(self.device.index):
            sms = cp.cuda.Device(self.device.index).attributes["MultiProcessorCount"]
            for k in m["kernels"]:
                if k.get("cublaslt") is not None:
                    for a in k["args"]:
                        self.tensors.setdefault(a["name"], (a["dtype"], tuple(a["shape"])))
                    self.kernels.append((k, None, None, None, None, 0))
                    continue
                source = (cg.dir / k["file"]).read_text()
                module = cp.RawModule(code=source, options=(f"--gpu-architecture={arch}",))
                fn = module.get_function(k["name"])
                launch = k["launch"]
                smem = int(launch["smem_bytes"])
                if smem > 48 * 1024:
                    fn.max_dynamic_shared_size_bytes = smem
                grid = list(launch["grid"])
                if launch.get("wave"):
                    threads = launch["block"][0] * launch["block"][1] * launch["block"][2]
                    grid[0] = min(grid[0], self._resident_blocks(cp, fn, threads, smem, sms))
                for a in k["args"]:
                    if a["role"] != "workspace":
                        self.tensors.setdefault(a["name"], (a["dtype"], tuple(a["shape"])))
                self.kernels.append((k, module, fn, tuple(grid), tuple(launch["block"]), smem))
        for name, (size, zeroed) in workspaces(m).items():
            alloc = torch.zeros if zeroed else torch.empty
            self.workspace[name] = alloc(size, dtype=torch.uint8, device=self.device)

    @staticmethod
    def _resident_blocks(cp, fn, threads: int, smem: int, sms: int) -> int:
        """One wave: blocks per SM by the driver's occupancy calculator, times the SMs."""
        try:
            per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(getattr(fn, "kernel", fn).ptr, threads, smem)
        except Exception:
            per_sm = 1
        return max(1, int(per_sm)) * sms

    def __call__(self, inputs: dict) -> dict:
        """Runs the plan on `inputs` (graph input name -> tensor, converted to the manifest's
        dtype and made contiguous where needed); returns graph output name -> tensor."""
        import numpy as np
        import torch

        cp = _cupy()
        env: dict[str, torch.Tensor] = {}
        for name, (dtype, shape) in self.inputs.items():
            t = inputs[name]
            if t.device != self.device:
                t = t.to(self.device)
            if t.dtype != _torch_dtype(dtype):
                t = t.to(_torch_dtype(dtype))
            if tuple(t.shape) != shape:
                if t.numel() != int(np.prod(shape, dtype=np.int64)):
                    raise ValueError(f"input {name}: shape {tuple(t.shape)}, the plan needs {shape}")
                t = t.reshape(shape)
            env[name] = t.contiguous()
        for name, (dtype, shape) in self.tensors.items():
            if name not in env:
                env[name] = torch.empty(shape, dtype=_torch_dtype(dtype), device=self.device)
        stream = torch.cuda.current_stream(self.device)
        with cp.cuda.Device(self.device.index), cp.cuda.ExternalStream(stream.cuda_stream, self.device.index):
            for k, _module, fn, grid, block, smem in self.kernels:
                if fn is None:
                    lt_call_torch(k["cublaslt"], env)
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
        return {out: env[tensor] for out, tensor in self.outputs}
