"""Tests of the runtime that launches eqfuse's generated kernels from PyTorch (`runtime.py`) and
of the backend's choice between running them and running eagerly.

On a machine without a GPU or CuPy (CI), the plumbing is tested with a stand-in for `GpuPlan`
that evaluates the same plan with `eqfuse run --cpu`; the GPU tests run only where CUDA and CuPy
are present (the device machine): a layernorm + GELU + residual graph through
`torch.compile(backend=EqfuseBackend())` must run eqfuse's kernels and match eager.

Run from the repository root: `python3 -m pytest python/tests`.
"""

import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from eqfuse_torch import export_program  # noqa: E402
from eqfuse_torch.backend import EqfuseBackend, PlanError, _Runner, find_eqfuse  # noqa: E402
from eqfuse_torch.runtime import (LT_VARIANTS, Codegen, GpuPlan, RuntimeUnavailable, _parse_type,  # noqa: E402
                                  lt_call_torch, lt_variants, workspaces)

F = torch.nn.functional


def ln_gelu_residual(x, w, b):
    """The small graph of the GPU check: layernorm, GELU, a residual."""
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)) + x


def graph_of(fn, *args):
    class M(torch.nn.Module):
        def forward(self, *a):
            return fn(*a)

    return export_program(torch.export.export(M(), args))


def test_codegen_writes_every_kernel_and_its_manifest():
    x, w, b = torch.randn(64, 256), torch.randn(256), torch.randn(256)
    cg = Codegen.of_graph(graph_of(ln_gelu_residual, x, w, b).graph)
    m = cg.manifest
    assert m["schema"] == "eqfuse.launch/1"
    assert [k["name"] for k in m["kernels"]] and cg.unsupported() == []
    assert len(m["kernels"]) == cg.plan["total"]["kernels"] == 1
    for k in m["kernels"]:
        source = (cg.dir / k["file"]).read_text()
        assert f'extern "C"' in source and k["name"] in source
        assert [a["role"] for a in k["args"]][:3] == ["read", "read", "read"]
    assert [_parse_type(t) for _, t in m["inputs"]] == [("f32", (64, 256)), ("f32", (256,)), ("f32", (256,))]


def test_unsupported_names_cublaslt_kernels_and_missing_files(tmp_path):
    (tmp_path / "k0.cu").write_text("// a kernel")
    manifest = {"kernels": [
        {"kernel": 0, "name": "elementwise_f32_k0", "file": "k0.cu"},
        {"kernel": 1, "name": "gemm_f32_k1", "file": "", "cublaslt": {"m": 8}},
        {"kernel": 2, "name": "rowreduce_f32_k2", "file": "k2.cu"},
    ]}
    reasons = Codegen(tmp_path, manifest, {}).unsupported()
    assert reasons == ["kernel 1 (gemm_f32_k1) is a cuBLASLt call, not generated CUDA",
                       "kernel 2 (rowreduce_f32_k2) has no generated source file"]


def test_workspaces_shared_by_name_are_as_large_as_the_largest_kernel_asks():
    """Column reductions of different widths name their workspaces alike: one buffer sized by
    the first would be overrun by the next (the MLP's backward graph wrote garbage gradients on
    the GPU that way)."""
    torch.manual_seed(0)
    x, y = torch.randn(256, 64), torch.randn(256, 8)
    cg = Codegen.of_graph(graph_of(lambda x, y: (x.sum(0), (y * y).sum(0)), x, y).graph)
    asked = {}
    for k in cg.manifest["kernels"]:
        for a in k["args"]:
            if a["role"] == "workspace":
                asked.setdefault(a["name"], set()).add((int(a["bytes"]), bool(a.get("zeroed"))))
    ws = workspaces(cg.manifest)
    assert ws.keys() == asked.keys() and any(len(sizes) > 1 for sizes in asked.values()), asked
    for name, sizes in asked.items():
        assert ws[name] == (max(max(b for b, _ in sizes), 1), any(z for _, z in sizes))
    manifest = {"kernels": [{"args": [{"name": "eq_ws", "role": "workspace", "bytes": 32}]},
                            {"args": [{"name": "eq_ws", "role": "workspace", "bytes": 1024},
                                      {"name": "eq_count", "role": "workspace", "bytes": 4, "zeroed": True}]}]}
    assert workspaces(manifest) == {"eq_ws": (1024, False), "eq_count": (4, True)}


def test_codegen_refusal_is_a_plan_error():
    bad = {"schema": "eqfuse.graph/1", "inputs": [], "nodes": [], "outputs": [{"name": "y", "node": 3}]}
    with pytest.raises(PlanError):
        Codegen.of_graph(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_gpu_plan_refuses_without_a_gpu():
    x, w, b = torch.randn(8, 32), torch.randn(32), torch.randn(32)
    cg = Codegen.of_graph(graph_of(ln_gelu_residual, x, w, b).graph)
    with pytest.raises(RuntimeUnavailable, match="no CUDA device"):
        GpuPlan(cg)


def _lt_operand(name, t, transposed_view):
    """The manifest's description of a row-major operand (codegen/gemm.rs `lt_operand`): a
    contiguous [R, C] is column-major [C, R] with ld C, op N; a transposed view of a contiguous
    [C, R] is column-major [R, C] with ld R, op T."""
    r, c = t.shape[-2:]
    bs = r * c if t.dim() == 3 else 0
    if transposed_view:
        return {"tensor": name, "transpose": True, "rows": r, "cols": c, "ld": r, "batch_stride": bs}
    return {"tensor": name, "transpose": False, "rows": c, "cols": r, "ld": c, "batch_stride": bs}


@pytest.mark.parametrize("variant", ["epilogue", "separate"])
@pytest.mark.parametrize("epilogue", ["default", "bias", "relu_bias", "gelu_bias"])
@pytest.mark.parametrize("batched,wt", [(False, False), (False, True), (True, False)])
def test_cublaslt_calls_run_as_torch_products(epilogue, batched, wt, variant):
    """Row-major D = act(A @ B + bias) is the column-major call d = op(B) op(A), m = N, n = M,
    in either variant (`separate`: the bias written first, a plain product added to it)."""
    torch.manual_seed(0)
    M, K, N, batch = 5, 7, 3, (2 if batched else 1)
    a = torch.randn(batch, M, K) if batched else torch.randn(M, K)
    w_stored = torch.randn(N, K) if wt else torch.randn(K, N)   # B = w_stored.T when wt
    b_logical = w_stored.t() if wt else w_stored
    bias = torch.randn(N)
    env = {"a": a, "w": w_stored, "bias": bias, "d": torch.full((batch, M, N) if batched else (M, N), float("nan"))}
    call = {"dtype": "f32", "m": N, "n": M, "k": K, "batch": batch, "a": _lt_operand("w", b_logical, wt),
            "b": _lt_operand("a", a, False), "d": "d", "epilogue": epilogue}
    if "bias" in epilogue:
        call["bias"] = "bias"
    assert lt_variants(call) == (("epilogue", "separate") if epilogue in ("bias", "gelu_bias") and not batched
                                 else ("epilogue",))
    lt_call_torch(call, env, variant)
    want = a @ b_logical + (bias if "bias" in epilogue else 0)
    if epilogue.startswith("relu"):
        want = torch.relu(want)
    if epilogue.startswith("gelu"):
        want = F.gelu(want, approximate="tanh")
    torch.testing.assert_close(env["d"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("epilogue", ["default", "bias", "gelu_bias"])
@pytest.mark.parametrize("batched", [False, True])
def test_unaligned_16_bit_calls_have_an_aligned_variant(epilogue, batched):
    """A bf16 call whose output rows are 13 wide (26 bytes, as GPT-2's 50257-wide logits are off
    16 bytes) has the `aligned` variant: the product of its matrices zero-padded to 16 bytes,
    its part copied to the output, the same values as the call run in place; an aligned bf16
    call has no such variant."""
    torch.manual_seed(0)
    M, K, N, batch = 6, 16, 13, (2 if batched else 1)
    a = torch.randn(batch, M, K, dtype=torch.bfloat16) if batched else torch.randn(M, K, dtype=torch.bfloat16)
    w = torch.randn(N, K, dtype=torch.bfloat16)
    bias = torch.randn(N, dtype=torch.bfloat16)
    call = {"dtype": "bf16", "m": N, "n": M, "k": K, "batch": batch, "a": _lt_operand("w", w.t(), True),
            "b": _lt_operand("a", a, False), "d": "d", "epilogue": epilogue}
    if "bias" in epilogue:
        call["bias"] = "bias"
    assert "aligned" in lt_variants(call)
    assert "aligned" not in lt_variants({**call, "m": 16, "a": {**call["a"], "rows": 16}})
    runs = {}
    for variant in ("epilogue", "aligned"):
        env = {"a": a, "w": w, "bias": bias, "d": torch.full((batch, M, N) if batched else (M, N), float("nan"),
                                                             dtype=torch.bfloat16)}
        lt_call_torch(call, env, variant)
        runs[variant] = env["d"]
    torch.testing.assert_close(runs["aligned"], runs["epilogue"], rtol=0, atol=0)
    want = a.float() @ w.float().t() + (bias.float() if "bias" in epilogue else 0)
    want = F.gelu(want, approximate="tanh") if epilogue.startswith("gelu") else want
    torch.testing.assert_close(runs["aligned"].float(), want, rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("epilogue", ["default", "gelu_bias"])
def test_cublaslt_calls_scale_and_loop(epilogue):
    """`alpha` scales the product; `outer` loops run the call once per index, each operand moved
    by its stride (here the activation's and the output's leading axis, the weight shared)."""
    torch.manual_seed(0)
    M, K, N = 4, 6, 3
    a = torch.randn(2, M, K)
    w = torch.randn(K, N)
    bias = torch.randn(N)
    env = {"a": a, "w": w, "bias": bias, "d": torch.full((2, M, N), float("nan"))}
    call = {"dtype": "f32", "m": N, "n": M, "k": K, "batch": 1, "a": _lt_operand("w", w, False),
            "b": {**_lt_operand("a", a[0], False)}, "d": "d", "epilogue": epilogue, "alpha": 0.5,
            "outer": [{"count": 2, "a": 0, "b": M * K, "d": M * N}]}
    if "bias" in epilogue:
        call["bias"] = "bias"
    lt_call_torch(call, env)
    want = 0.5 * (a @ w) + (bias if "bias" in epilogue else 0)
    if epilogue.startswith("gelu"):
        want = F.gelu(want, approximate="tanh")
    torch.testing.assert_close(env["d"], want, rtol=1e-5, atol=1e-5)


def test_cublaslt_operands_start_at_their_offset():
    """An operand's `offset` (a slice read in place) moves its first element: here A is the
    second half of each row of `x` [M, 2K] (ld 2K, from element K), looped over a leading axis
    whose own offsets add to it."""
    torch.manual_seed(0)
    M, K, N = 4, 6, 3
    x = torch.randn(2, M, 2 * K)
    w = torch.randn(K, N)
    env = {"x": x, "w": w, "d": torch.full((2, M, N), float("nan"))}
    b = {"tensor": "x", "transpose": False, "rows": K, "cols": M, "ld": 2 * K, "batch_stride": 0, "offset": K}
    call = {"dtype": "f32", "m": N, "n": M, "k": K, "batch": 1, "a": _lt_operand("w", w, False), "b": b,
            "d": "d", "epilogue": "default", "outer": [{"count": 2, "a": 0, "b": M * 2 * K, "d": M * N}]}
    lt_call_torch(call, env)
    torch.testing.assert_close(env["d"], x[..., K:] @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,act", [((1024, 512), True), ((4, 300, 512), True), ((8, 197, 512), False)])
def test_codegen_cublaslt_calls_compute_the_graph(shape, act):
    """When this binary plans a dense layer as a cuBLASLt call, running the manifest's call with
    `lt_call_torch` on the graph's inputs gives the graph's output; over [batch, rows, features]
    activations the call is one product of batch x rows rows (codegen folds the batch)."""
    torch.manual_seed(0)
    x, w, b = torch.randn(*shape), torch.randn(384, 512) * 0.05, torch.randn(384)
    f = (lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh")) if act else (lambda x, w, b: x @ w.t())
    exported = graph_of(f, x, w, b)
    try:
        cg = Codegen.of_graph(exported.graph)
    except PlanError as e:
        pytest.skip(f"this eqfuse binary has no gemm code generation: {e}")
    calls = [k for k in cg.manifest["kernels"] if k.get("cublaslt")]
    if len(calls) != 1:
        pytest.skip("the plan has no single cuBLASLt call")
    # (Over 3-d activations the plan also copies the call's [batch x rows, n] result into the
    # graph's [batch, rows, n] output: an output that is a reshape gets a kernel of its own.)
    names = [n for n in exported.input_names if n]
    env = dict(zip(names, (x, w, b)))
    call = calls[0]["cublaslt"]
    shape = tuple(calls[0]["args"][-1]["shape"])
    env[call["d"]] = torch.empty(shape)
    assert (call["batch"], call["n"], call.get("outer", [])) == (1, x.numel() // 512, [])
    lt_call_torch(call, env)
    want = x.reshape(-1, 512) @ w.t() + (b if "bias" in call["epilogue"] else 0)
    want = F.gelu(want, approximate="tanh") if call["epilogue"].startswith("gelu") else want
    if call["epilogue"] == "gelu_bias":  # the whole layer in the call
        torch.testing.assert_close(want, f(x, w, b).reshape(want.shape), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(env[call["d"]], want.reshape(shape), rtol=1e-4, atol=1e-3)


class CpuReferencePlan:
    """A stand-in for GpuPlan: the same codegen plan, evaluated by `eqfuse run --cpu`."""

    device = torch.device("cpu")

    def __init__(self, graph):
        self.graph = graph
        self.calls = 0

    def __call__(self, inputs):
        import json

        self.calls += 1
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            (d / "g.json").write_text(json.dumps(self.graph))
            (d / "in").mkdir()
            for name, t in inputs.items():
                np.save(d / "in" / f"{name}.npy", t.detach().float().numpy() if t.dtype == torch.bfloat16 else t.detach().numpy())
            r = subprocess.run([find_eqfuse(), "run", "--cpu", str(d / "g.json"), "--inputs", str(d / "in"), "--outputs",
                                str(d / "out")], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            return {o["name"]: torch.from_numpy(np.load(d / "out" / f"{o['name']}.npy")) for o in self.graph["outputs"]}


def test_backend_runner_maps_arguments_values_and_outputs(monkeypatch):
    """The backend's path to a plan, with the plan evaluated on the CPU reference: arguments by
    placeholder, folded constants as values, outputs in the graph's order, dtype and shape."""
    made = []

    def fake_build(self, graph, example_inputs):
        made.append(CpuReferencePlan(graph))
        return made[-1]

    monkeypatch.setattr(EqfuseBackend, "_build", fake_build)

    def f(x, w, b, i):
        y = ln_gelu_residual(x, w, b)
        return y.reshape(4, 2, 16), (x.sum(-1) > 0).long() + i, y.mean()

    args = (torch.randn(8, 16), torch.randn(16), torch.randn(16), torch.arange(8))
    backend = EqfuseBackend(report=None)
    with torch.no_grad():
        got = torch.compile(f, backend=backend)(*args)
    want = f(*args)
    assert made and made[0].calls == 1, [(p.kind, p.error, p.why_eager) for p in backend.plans]
    assert [p.runs for p in backend.plans] == ["eqfuse"]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_an_output_that_reshapes_a_product_is_returned_as_a_view(monkeypatch):
    """A linear layer over [B, S, E] activations returns `view(mm, [B, S, N])` (a classifier's or
    a language model's logits): the graph writes the product and the backend returns the view of
    it, with eager's shape and strides, and no kernel copies it. In a training step the
    gradients equal eager's too."""
    made = []
    monkeypatch.setattr(EqfuseBackend, "_build", lambda self, graph, ex: made.append(ShapeRecordingPlan(graph)) or made[-1])
    torch.manual_seed(0)
    head = torch.nn.Linear(64, 96, bias=False)
    x = torch.randn(4, 50, 64)

    def f(x):
        return head(torch.tanh(x)).unsqueeze(1)

    backend = EqfuseBackend(report=None)
    with torch.no_grad():
        got = torch.compile(f, backend=backend, dynamic=False)(x)
        want = f(x)
    assert [p.runs for p in backend.plans] == ["eqfuse"], [p.why_eager for p in backend.plans]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.shape == want.shape and got.stride() == want.stride()
    kernels = backend.plans[0].plan["kernels"]
    assert all(set(k["ops"]) - {"reshape", "transpose"} for k in kernels), [k["ops"] for k in kernels]  # no copy
    assert [o["name"] for o in made[0].graph["outputs"]] == [n for n in made[0].results], made[0].results
    assert not any(name.startswith("out") for name in made[0].results), made[0].results

    torch._dynamo.reset()
    xg = x.clone().requires_grad_(True)
    compiled = torch.compile(f, backend=EqfuseBackend(report=None), dynamic=False)
    compiled(xg).square().mean().backward()
    xe = x.clone().requires_grad_(True)
    f(xe).square().mean().backward()
    torch.testing.assert_close(xg.grad, xe.grad, rtol=1e-5, atol=1e-6)


def test_a_graph_with_nothing_to_compute_runs_no_kernel(monkeypatch):
    """A graph whose every output is a constant the export folds (a causal mask built from
    `arange` alone, which `transformers` 5.17 computes in a graph of its own for XGLM and
    wav2vec2) has nothing to launch: the backend returns the constants, eqfuse's empty plan,
    not an eager fallback."""
    made = []
    monkeypatch.setattr(EqfuseBackend, "_build", lambda self, graph, ex: made.append(CpuReferencePlan(graph)) or made[-1])

    def mask():
        i = torch.arange(16)
        return torch.where(i[None, :] <= i[:, None], 0.0, torch.finfo(torch.float32).min).expand(2, 1, 16, 16)

    backend = EqfuseBackend(report=None)
    torch._dynamo.reset()
    got = torch.compile(mask, backend=backend, dynamic=False)()
    assert [(p.runs, p.plan["kernels"]) for p in backend.plans] == [("eqfuse", [])], \
        [(p.runs, p.why_eager) for p in backend.plans]
    assert not made
    torch.testing.assert_close(got, mask(), rtol=0, atol=0)


class ShapeRecordingPlan(CpuReferencePlan):
    """The CPU stand-in, keeping the inputs it was given and the outputs it gave (name -> tensor)."""

    def __call__(self, inputs):
        self.seen = dict(inputs)
        self.results = super().__call__(inputs)
        return self.results


def test_backend_returns_a_broadcast_output_as_a_view(monkeypatch):
    """An output that PyTorch returns expanded (stride 0 along an axis) and that the graph
    computes as a broadcast is written at its smaller shape and returned as an expanded view of
    it; a broadcast PyTorch returns as a dense tensor is written whole, as it was traced."""
    made = []
    monkeypatch.setattr(EqfuseBackend, "_build", lambda self, graph, ex: made.append(ShapeRecordingPlan(graph)) or made[-1])

    def f(x, m):
        bias = torch.where(m[:, None, :], 0.0, -1e4)  # [B, 1, S]: a padding mask by key
        return torch.softmax(x + bias, -1), bias.expand(2, 8, 8), torch.where(m[:, None, :].expand(2, 8, 8), 1.0, 2.0)

    x, m = torch.randn(2, 8, 8), torch.rand(2, 8) > 0.3
    m[:, 0] = True
    backend = EqfuseBackend(report=None)
    with torch.no_grad():
        got = torch.compile(f, backend=backend, dynamic=False)(x, m)
    want = f(x, m)
    assert [p.runs for p in backend.plans] == ["eqfuse"], [p.why_eager for p in backend.plans]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    assert got[1].stride() == want[1].stride() == (8, 0, 1)
    assert got[1].untyped_storage().nbytes() == 2 * 8 * 4  # [2, 1, 8] f32, no more
    assert got[2].is_contiguous()
    # What the graph computes: the expanded output at its smaller shape, the dense one whole.
    assert [tuple(t.shape) for t in made[0].results.values()] == [(2, 8, 8), (2, 1, 8), (2, 8, 8)]


def test_backend_reads_an_expanded_input_in_place(monkeypatch):
    """An argument expanded from a smaller tensor is a graph input of the smaller shape,
    broadcast in the graph: the plan is given a view of the argument's storage, no copy. A
    transposed argument is passed as it is (the runtime lays it out) and computes the same."""
    made = []
    monkeypatch.setattr(EqfuseBackend, "_build", lambda self, graph, ex: made.append(ShapeRecordingPlan(graph)) or made[-1])

    def f(x, bias, v):
        return torch.softmax(x + bias, -1) @ v

    x, small, v = torch.randn(2, 8, 8), torch.randn(2, 1, 8), torch.randn(2, 4, 8).transpose(1, 2)
    backend = EqfuseBackend(report=None)
    with torch.no_grad():
        got = torch.compile(f, backend=backend, dynamic=False)(x, small.expand(2, 8, 8), v)
    torch.testing.assert_close(got, f(x, small.expand(2, 8, 8), v), rtol=1e-5, atol=1e-5)
    assert [p.runs for p in backend.plans] == ["eqfuse"], [p.why_eager for p in backend.plans]
    graph = backend.plans[0].graph
    assert [i["shape"] for i in graph["inputs"]] == [[2, 8, 8], [2, 1, 8], [2, 8, 4]]
    name = graph["inputs"][1]["name"]
    seen = made[0].seen[name]
    assert tuple(seen.shape) == (2, 1, 8) and seen.data_ptr() == small.data_ptr()
    assert made[0].seen[graph["inputs"][2]["name"]].stride() == v.stride()


def test_backend_runs_cpu_inputs_eagerly_with_a_warning():
    x, w, b = torch.randn(8, 32), torch.randn(32), torch.randn(32)
    backend = EqfuseBackend(report=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = torch.compile(ln_gelu_residual, backend=backend)(x, w, b)
    torch.testing.assert_close(got, ln_gelu_residual(x, w, b))
    (p,) = backend.plans
    assert p.runs == "eager" and p.plan is not None
    assert "not all CUDA tensors" in p.why_eager
    assert any("runs eagerly" in str(c.message) and "CUDA" in str(c.message) for c in caught)


def _gpu_ready():
    if not torch.cuda.is_available():
        return False
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


gpu = pytest.mark.skipif(not _gpu_ready(), reason="needs a CUDA device and CuPy")


@gpu
@pytest.mark.parametrize("shape", [(64, 256), (4096, 1024)])
def test_gpu_backend_runs_eqfuse_kernels_and_matches_eager(shape):
    torch.manual_seed(0)
    x = torch.randn(*shape, device="cuda")
    w = torch.randn(shape[-1], device="cuda")
    b = torch.randn(shape[-1], device="cuda")
    backend = EqfuseBackend(report=None)
    torch._dynamo.reset()  # earlier tests compiled this function: no recompilation with dynamic sizes
    with torch.no_grad():
        compiled = torch.compile(ln_gelu_residual, backend=backend, dynamic=False)
        got = compiled(x, w, b)
        torch.cuda.synchronize()
    (p,) = backend.plans
    assert p.runs == "eqfuse", p.why_eager
    torch.testing.assert_close(got, ln_gelu_residual(x, w, b), rtol=1e-5, atol=1e-5)
    # a second call with other values reuses the compiled kernels
    x2 = torch.randn_like(x)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x2, w, b), ln_gelu_residual(x2, w, b), rtol=1e-5, atol=1e-5)
    assert len(backend.plans) == 1


def test_repeated_layers_compile_once():
    """The kernels of repeated layers differ in names only: their canonical sources are equal
    (compiled once), while kernels of other shapes or bodies stay apart."""
    from eqfuse_torch.runtime import canonical_source

    def block(x, m, w1, b1, w2, b2):
        for _ in range(3):
            x = ln_gelu_residual(x @ m, w1, b1)
            x = ln_gelu_residual(x @ m, w2, b2)
        return torch.softmax(x @ m, -1)

    args = (torch.randn(64, 64), torch.randn(64, 64), torch.randn(64), torch.randn(64), torch.randn(64), torch.randn(64))
    cg = Codegen.of_graph(graph_of(block, *args).graph)
    kernels = [k for k in cg.manifest["kernels"] if k.get("file")]
    canon = [canonical_source((cg.dir / k["file"]).read_text(), k["name"]) for k in kernels]
    assert len(kernels) >= 4
    assert len(set(canon)) < len(canon), "the repeated layers' kernels did not coincide"
    assert len(set(canon)) >= 2, "the softmax kernel coincided with a layer's"
    for c, k in zip(canon, kernels):
        assert k["name"] not in c and "EQK" in c


class FakeCupy:
    """Stands in for CuPy's compile: `RawModule(code=...).get_function(name)` takes `delay`
    seconds (as NVRTC would, without the GIL), counts compiles by source and the most that ran
    at once, and fails for a source containing `BROKEN`."""

    def __init__(self, delay=0.2):
        import threading

        fake = self
        self.delay, self.lock = delay, threading.Lock()
        self.compiles, self.active, self.most = {}, 0, 0

        class Device:
            def __init__(self, index):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        class RawModule:
            def __init__(self, code, options):
                self.code = code

            def get_function(self, name):
                import time

                with fake.lock:
                    fake.compiles[self.code] = fake.compiles.get(self.code, 0) + 1
                    fake.active += 1
                    fake.most = max(fake.most, fake.active)
                time.sleep(fake.delay)
                with fake.lock:
                    fake.active -= 1
                if "BROKEN" in self.code:
                    raise RuntimeError("nvrtc: error: BROKEN is undefined")
                return (self.code, name)

        runtime = type("runtime", (), {"setDevice": staticmethod(lambda index: None)})
        self.cuda = type("cuda", (), {"Device": Device, "runtime": runtime})
        self.RawModule = RawModule


def test_kernels_compile_in_threads_once_each(monkeypatch):
    """`compile_all` compiles a plan's distinct modules at once in threads, each once (kernels
    that differ in names only share one), and `_compiled` then finds them all compiled; a module
    that fails in a thread fails again, with its error, where `_compiled` compiles it."""
    from eqfuse_torch import runtime

    monkeypatch.setattr(runtime, "_MODULES", {})
    monkeypatch.delenv("EQFUSE_KERNEL_NAMES", raising=False)
    cp = FakeCupy()

    def kernel(name, body):
        return f'extern "C" __global__ void {name}(float* p_x) {{ {body} }}'

    sources = {f"k{i}": kernel(f"k{i}", f"p_x[0] = {i % 4};") for i in range(8)}  # 4 distinct bodies
    assert runtime.compile_all(cp, sources, "sm_90", 0, workers=4) == 4
    assert sorted(cp.compiles.values()) == [1, 1, 1, 1] and cp.most >= 2, (cp.compiles, cp.most)
    for name, source in sources.items():
        module, fn = runtime._compiled(cp, source, name, "sm_90", 0)
        assert fn[1] == "EQK" and fn[0] == runtime.canonical_source(source, name)
    assert sum(cp.compiles.values()) == 4
    assert runtime.compile_all(cp, sources, "sm_90", 0, workers=4) == 0  # all compiled already

    broken = {"b0": kernel("b0", "BROKEN;"), "b1": kernel("b1", "p_x[0] = 9;")}
    assert runtime.compile_all(cp, broken, "sm_90", 0, workers=4) == 1
    with pytest.raises(RuntimeError, match="BROKEN is undefined"):
        runtime._compiled(cp, broken["b0"], "b0", "sm_90", 0)
    assert runtime.compile_workers({"EQFUSE_COMPILE_THREADS": "1"}) == 1
    assert runtime.compile_all(cp, {"c": kernel("c", "p_x[0] = 7;"), "d": kernel("d", "p_x[0] = 8;")}, "sm_90", 0,
                               workers=1) == 0  # one thread: `_compiled` compiles them in turn
    with pytest.raises(ValueError, match="EQFUSE_COMPILE_THREADS"):
        runtime.compile_workers({"EQFUSE_COMPILE_THREADS": "many"})


def recorded_commands(monkeypatch) -> list:
    """The eqfuse subcommands (`optimize`, `codegen`) run from now on, in order."""
    commands = []
    real_run = subprocess.run

    def run(cmd, *a, **k):
        commands.append(cmd[1])
        return real_run(cmd, *a, **k)

    monkeypatch.setattr(subprocess, "run", run)
    return commands


def test_codegen_plans_once_for_the_plan_and_the_kernels(monkeypatch):
    """A graph given to `eqfuse codegen` is not planned again by `plan_graph`: its plan is the
    plan the kernels run. The same graph given to codegen twice is planned once, and a refusal
    is remembered as such."""
    import eqfuse_torch.backend as backend
    from eqfuse_torch import runtime
    from eqfuse_torch.backend import plan_graph

    backend.PLANS.clear()  # what earlier tests planned
    runtime.CODEGENS.clear()
    commands = recorded_commands(monkeypatch)
    x, w, b = torch.randn(16, 64), torch.randn(64), torch.randn(64)
    graph = graph_of(ln_gelu_residual, x, w, b).graph
    cg = Codegen.of_graph(graph)
    assert plan_graph(graph) is cg.plan
    assert Codegen.of_graph(graph) is cg
    assert commands == ["codegen"]
    assert plan_graph(graph, args=("--no-fusion",))["total"]["kernels"] >= cg.plan["total"]["kernels"]
    assert commands == ["codegen", "optimize"]  # other options: planned afresh
    bad = {"schema": "eqfuse.graph/1", "inputs": [], "nodes": [], "outputs": [{"name": "y", "node": 3}]}
    for _ in range(2):
        with pytest.raises(PlanError):
            Codegen.of_graph(bad)
    assert commands == ["codegen", "optimize", "codegen"]
    assert backend.PLANS.get(backend.plan_key("{}", "nowhere", "h100", ())) is None


def test_backend_plans_a_graph_it_runs_once(monkeypatch):
    """On CUDA inputs the backend gives a graph to `eqfuse codegen` before recording its plan:
    one planning (codegen's) for both, no `eqfuse optimize`."""
    import eqfuse_torch.backend as backend

    commands = recorded_commands(monkeypatch)
    monkeypatch.setattr(backend, "_on_cuda", lambda example_inputs: True)
    built = []
    monkeypatch.setattr(EqfuseBackend, "_build",
                        lambda self, graph, ex: built.append(Codegen.of_graph(graph)) or CpuReferencePlan(graph))
    x, w, b = torch.randn(8, 48), torch.randn(48), torch.randn(48)
    eqfuse = EqfuseBackend(report=None)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(ln_gelu_residual, backend=eqfuse, dynamic=False)(x, w, b)
    torch.testing.assert_close(got, ln_gelu_residual(x, w, b), rtol=1e-5, atol=1e-5)
    (p,) = eqfuse.plans
    assert p.runs == "eqfuse" and p.plan is built[0].plan, p.why_eager
    assert [c for c in commands if c in ("optimize", "codegen")] == ["codegen"], commands


@gpu
def test_gpu_kernels_compile_in_threads_and_run(monkeypatch):
    """On the GPU, a plan's distinct kernels compile in threads through CuPy (each thread loads
    its module into PyTorch's context) and run: the backend's result matches eager."""
    from eqfuse_torch import runtime

    monkeypatch.setattr(runtime, "_MODULES", {})
    counts = []
    real = runtime.compile_all
    monkeypatch.setattr(runtime, "compile_all", lambda *a, **k: counts.append(real(*a, **k)) or counts[-1])

    def block(x, m, w, b):
        y = ln_gelu_residual(x @ m, w, b)
        return torch.softmax(y * 2, -1), y.sum(0), (y * x).mean(-1)

    torch.manual_seed(0)
    args = (torch.randn(256, 128, device="cuda"), torch.randn(128, 128, device="cuda") / 16,
            torch.randn(128, device="cuda"), torch.randn(128, device="cuda"))
    backend = EqfuseBackend(report=None)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(block, backend=backend, dynamic=False)(*args)
        torch.cuda.synchronize()
    (p,) = backend.plans
    assert p.runs == "eqfuse", p.why_eager
    assert counts and counts[0] >= 2, counts  # several distinct modules, compiled by the threads
    for g, w in zip(got, block(*args)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_fake_and_functional_arguments_are_told_from_real_ones():
    """`_real`, which sends a call with tracing's tensors to the ATen graph, on plain tensors,
    parameters, fake tensors and functional tensors, among few arguments or first or last of many."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from eqfuse_torch.backend import _real

    real = [torch.randn(3), torch.nn.Parameter(torch.randn(2)), 4, None]
    assert _real(tuple(real)) and _real(tuple(real * 10))
    with FakeTensorMode():
        fake = torch.randn(3)
    functional = torch._to_functional_tensor(torch.randn(3))
    for odd in (fake, functional):
        for args in ((odd,), (odd, *real * 5), (*real * 5, odd), (*real[:2], odd, *real)):
            assert not _real(args), (type(odd), len(args))
