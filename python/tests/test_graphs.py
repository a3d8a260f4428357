"""CUDA-graph replay of a plan's launch sequence (`runtime.GraphedLaunch`).

Without a GPU, the logic is checked on the CPU: a plan whose "kernels" are torch ops
(`TorchKernels`, a `LaunchPlan`) replayed by `PointerGraphs`, a stand-in for `torch.cuda.CUDAGraph`
that, like a CUDA graph, records nothing but the pointers it was captured with and on replay reads
and writes exactly that memory (tensors rebuilt from raw addresses). So a replay that overwrote
memory the caller still holds, read a stale input, or shared intermediates wrongly, shows here as
wrong numbers. With CUDA and CuPy the same checks run on eqfuse's generated kernels
(`test_gpu_*`).

Run from the repository root: `python3 -m pytest python/tests/test_graphs.py`.
"""

import ctypes
import random
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eqfuse_torch.runtime import (  # noqa: E402
    ARENA_ALIGN, GraphedLaunch, LaunchPlan, arena_layout, cuda_graphs_enabled, lifetimes)

F = torch.nn.functional


# --- the arena


def _overlap(a, b):
    return a[0] < b[1] and b[0] < a[1]


def assert_layout_sound(sizes, live, total, offsets):
    assert offsets.keys() == sizes.keys()
    for n, off in offsets.items():
        assert off % ARENA_ALIGN == 0 and off + sizes[n] <= total
    names = sorted(sizes)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if live[a][0] <= live[b][1] and live[b][0] <= live[a][1]:  # live together
                assert not _overlap((offsets[a], offsets[a] + sizes[a]), (offsets[b], offsets[b] + sizes[b])), (a, b)


def test_arena_layout_never_overlaps_tensors_live_together():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 14)
        sizes, live = {}, {}
        for i in range(n):
            first = rng.randint(0, 10)
            sizes[f"t{i}"] = rng.choice([1, 4, 255, 256, 257, 1000, 4096, rng.randint(1, 10000)])
            live[f"t{i}"] = (first, first + rng.randint(0, 5))
        total, offsets = arena_layout(sizes, live)
        assert_layout_sound(sizes, live, total, offsets)
        assert total <= sum(-(-s // ARENA_ALIGN) * ARENA_ALIGN for s in sizes.values())


def test_arena_layout_shares_memory_between_tensors_that_do_not_meet():
    total, offsets = arena_layout({"a": 1024, "b": 1024, "c": 1024}, {"a": (0, 1), "b": (2, 3), "c": (1, 2)})
    assert offsets["a"] == offsets["b"] and offsets["c"] != offsets["a"] and total == 2048


def test_lifetimes_span_first_and_last_launch_naming_a_tensor():
    kernels = MANIFEST["kernels"]
    live = lifetimes(kernels, ["a", "b", "c", "y", "nothing"])
    assert live == {"a": (0, 3), "b": (1, 2), "c": (3, 4), "y": (2, 4)}


# --- a plan of torch ops, replayed by a pointer-level stand-in for CUDA graphs


def _arg(name, role, dtype="f32", shape=(4, 8)):
    return {"name": name, "role": role, "dtype": dtype, "shape": list(shape),
            "bytes": 4 * int(torch.Size(shape).numel())}


MANIFEST = {
    "schema": "eqfuse.launch/1",
    "inputs": [["x", "f32[4,8]"], ["w", "f32[8]"], ["ids", "i32[4]"]],
    "outputs": [["y", "y"], ["z", "z"], ["x_again", "x"], ["y_again", "y"]],
    "kernels": [
        {"name": "k0", "args": [_arg("x", "read"), _arg("w", "read", shape=(8,)), _arg("a", "write")]},
        {"name": "k1", "args": [_arg("a", "read"), _arg("b", "write")]},
        {"name": "k2", "args": [_arg("b", "read"), _arg("x", "read"), _arg("ids", "read", "i32", (4,)),
                                _arg("y", "write")]},
        {"name": "k3", "args": [_arg("a", "read"), _arg("c", "write"),
                                {"name": "eq_ws", "role": "workspace", "bytes": 16, "zeroed": True}]},
        {"name": "k4", "args": [_arg("c", "read"), _arg("y", "read"), _arg("z", "write")]},
    ],
}
"""a = x*w; b = a+1; y = b*x + ids; c = a-1 (a workspace left zero); z = c+y; outputs y, z,
x itself and y again. b and c are never live together: they share the arena."""


def reference(x, w, ids):
    a = x * w
    y = (a + 1) * x + ids.float()[:, None]
    return {"y": y, "z": (a - 1) + y, "x_again": x, "y_again": y}


class TorchKernels(LaunchPlan):
    """A LaunchPlan whose kernels are torch ops writing into the tensors they are given."""

    def __init__(self, manifest=MANIFEST):
        super().__init__(manifest, torch.device("cpu"))
        self.workspace = {"eq_ws": torch.zeros(16, dtype=torch.uint8)}
        self.launches = 0

    def launch(self, env):
        self.launches += 1
        assert int(self.workspace["eq_ws"].sum()) == 0, "a zeroed workspace was not left zero"
        env["a"].copy_(env["x"] * env["w"])
        env["b"].copy_(env["a"] + 1)
        env["y"].copy_(env["b"] * env["x"] + env["ids"].float()[:, None])
        self.workspace["eq_ws"].fill_(7)  # a kernel's scratch, then left zero
        env["c"].copy_(env["a"] - 1)
        self.workspace["eq_ws"].zero_()
        env["z"].copy_(env["c"] + env["y"])


def _at(ptr, dtype, shape):
    """A tensor over the memory at `ptr` that does not own it (a CUDA graph's baked pointer)."""
    n = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer((ctypes.c_uint8 * n).from_address(ptr), dtype=torch.uint8).view(dtype).view(shape)


class PointerGraphs:
    """The device side of GraphedLaunch (`runtime.CudaGraphs`) on the CPU: a capture runs nothing
    and keeps only the pointers of the tensors captured; a replay runs the launch sequence on
    exactly that memory, as a CUDA graph does."""

    def __init__(self, fail=None, corrupt=False):
        self.captures = 0
        self.fail, self.corrupt = fail, corrupt

    def reference(self, fn):
        return fn()

    def capture(self, env, launch):
        self.captures += 1
        if self.fail:
            raise RuntimeError(self.fail)
        baked = {n: (t.data_ptr(), t.dtype, tuple(t.shape)) for n, t in env.items()}

        def replay():
            tensors = {n: _at(*b) for n, b in baked.items()}
            launch(tensors)
            if self.corrupt:
                tensors["z"].add_(1.0)

        return replay

    def before_replay(self):
        pass

    def synchronize(self):
        pass

    def recover(self):
        pass


def graphed(variants=2, **kw):
    plan = TorchKernels()
    lines = []
    plan.graphed = GraphedLaunch(plan, plan.manifest["kernels"], PointerGraphs(**kw), variants=variants,
                                 report=lines.append)
    return plan, lines


def inputs(seed, w=None):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(4, 8, generator=g), "w": w if w is not None else torch.randn(8, generator=g),
            "ids": torch.randint(0, 5, (4,), generator=g)}  # int64: converted, so copied in


def check(got, args):
    want = reference(**args)
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-5, msg=k)


def test_intermediates_that_never_meet_share_the_arena():
    plan, _ = graphed()
    g = plan.graphed
    assert set(g.offsets) == {"a", "b", "c"} and g.out_tensors == ["y", "z"]
    assert g.offsets["b"] == g.offsets["c"] != g.offsets["a"]


def test_replay_matches_eager_over_calls_with_changing_inputs():
    plan, lines = graphed()
    w = torch.randn(8)
    alive = []  # every x at a new address: copied in, never read in place
    for i in range(6):
        args = inputs(i, w)
        alive.append(args)
        check(plan(args), args)
    assert plan.stats["eager"] == 2  # the first call, and the capture call's reference
    assert plan.stats["captures"] == 1 and plan.stats["replays"] == 5 and lines == []


def test_outputs_the_caller_holds_are_never_overwritten():
    """Outputs of every call kept: the first two graphs' outputs stay held, so later calls
    replay a third graph whose outputs are cloned; every result kept stays right."""
    plan, _ = graphed()
    w = torch.randn(8)
    kept = []
    for i in range(6):
        args = inputs(i, w)
        kept.append((plan(args), args))
    for got, args in kept:
        check(got, args)
    assert plan.stats["captures"] == 3 and plan.stats["cloned"] == 3


def test_released_outputs_are_replayed_into_again():
    """`y = f(x)` in a loop: the previous result is still held during the call (it is rebound
    after), so two graphs alternate and nothing is cloned."""
    plan, _ = graphed()
    w = torch.randn(8)
    out = None
    ptrs = []
    alive = []
    for i in range(8):
        args = inputs(i, w)
        alive.append(args)
        out = plan(args)
        check(out, args)
        ptrs.append(out["y"].data_ptr())
    assert plan.stats["captures"] == 2 and plan.stats["cloned"] == 0
    # After the eager first call, the two graphs' output sets alternate. (The first call's
    # output, freed when rebound, may be where a caching allocator puts the second set.)
    assert ptrs[1] != ptrs[2]
    assert all(ptrs[i] == ptrs[i - 2] for i in range(3, len(ptrs))), ptrs


def test_views_of_outputs_count_as_held():
    plan, _ = graphed()
    w = torch.randn(8)
    plan(inputs(0, w))
    a1 = inputs(1, w)
    y1 = plan(a1)["y"][1:3]  # only a view of one output kept
    for i in range(2, 5):
        plan(inputs(i, w))
    torch.testing.assert_close(y1, reference(**a1)["y"][1:3], rtol=0, atol=1e-5)


@pytest.mark.parametrize("direct", [False, True])
def test_outputs_fed_back_as_inputs(direct):
    """x = f(x): an input that is one of the graph's own outputs (directly: read in place once
    its pointer recurs, while the replay writes the other output set)."""
    manifest = {**MANIFEST, "outputs": [["y", "y"], ["z", "z"]]}
    plan = TorchKernels(manifest)
    plan.graphed = GraphedLaunch(plan, manifest["kernels"], PointerGraphs())
    w, ids = torch.randn(8) * 0.1, torch.zeros(4, dtype=torch.int32)
    x = torch.randn(4, 8) * 0.1
    x_ref = x.clone()
    for _ in range(10):
        x = plan({"x": x, "w": w, "ids": ids})["y"]
        x_ref = reference(x_ref, w, ids)["y"]
        if not direct:
            x, x_ref = x * 0.5, x_ref * 0.5
        torch.testing.assert_close(x, x_ref, rtol=1e-5, atol=1e-6)
    if direct:
        assert any(k[0] is not None for k in _sig(plan).keys), _sig(plan).keys
        assert plan.stats["cloned"] == 0


def _sig(plan):
    (sig,) = plan.graphed.signatures.values()
    return sig


def test_parameters_are_read_in_place_and_a_replaced_one_is_picked_up():
    plan, _ = graphed()
    w = torch.randn(8)
    alive = [inputs(i, w) for i in range(8)]
    plan(alive[0])
    plan(alive[1])  # captured: w had one pointer on both calls, x and ids (int64, converted) did not
    assert _sig(plan).keys == [(None, w.data_ptr(), None)]
    copies = plan.stats["input_copies"]
    with torch.no_grad():
        w.mul_(3.0)  # an optimizer step: same storage, new values
    check(plan(alive[2]), alive[2])
    assert plan.stats["input_copies"] - copies == 2 and plan.stats["captures"] == 1  # x and ids only
    old = w.clone()
    w_new = torch.randn(8)  # the parameter's storage replaced (`p.data = ...`, a reload)
    for i in (3, 4, 5):
        alive[i]["w"] = w_new
        check(plan(alive[i]), alive[i])
    torch.testing.assert_close(w, old, rtol=0, atol=0)  # the old tensor is never written
    # copied into a static buffer the first time, read in place once its pointer recurred
    assert _sig(plan).keys[1:] == [(None, None, None), (None, w_new.data_ptr(), None)]
    assert plan.stats["captures"] == 3


def test_inputs_needing_conversion_are_copied_not_read_in_place():
    plan, _ = graphed()
    args = inputs(0)
    plan(args)
    plan(args)  # every pointer the same, but ids is int64 and the plan reads i32
    assert _sig(plan).keys == [(args["x"].data_ptr(), args["w"].data_ptr(), None)]


def test_an_input_refilled_in_place_is_read_where_it_is():
    """A caller that writes each batch into one buffer: no copy after the graph is captured."""
    plan, _ = graphed()
    args = inputs(0)
    args["ids"] = args["ids"].int()
    for i in range(5):
        with torch.no_grad():
            args["x"].copy_(torch.randn(4, 8))
            args["ids"].random_(0, 5)
        check(plan(args), args)
    assert plan.stats["input_copies"] == 0 and plan.stats["captures"] == 1


def test_pointers_that_keep_changing_are_bounded():
    """Inputs cycling through many recurring addresses: keys and graphs stay bounded, and the
    parameter, at one address throughout, stays read in place under every graph."""
    plan, _ = graphed()
    w = torch.randn(8)
    xs = [torch.randn(4, 8) for _ in range(3)]
    idss = [torch.randint(0, 5, (4,), dtype=torch.int32) for _ in range(3)]
    for i in range(60):
        args = {"x": xs[i % 3], "w": w, "ids": idss[(i // 3) % 3]}
        with torch.no_grad():
            args["x"].normal_()
        check(plan(args), args)
    g = plan.graphed
    sig = _sig(plan)
    assert plan.stats["captures"] > g.MAX_KEYS  # keys beyond the bound were tried
    assert len(sig.graphs) <= g.MAX_GRAPHS and plan.stats["captures"] <= g.MAX_GRAPHS
    assert all(k[1] == w.data_ptr() for k in sig.keys), sig.keys


def test_a_key_agreeing_with_the_pointers_is_replayed_once_keys_are_full():
    """Keys full, the first of them reading nothing in place: a call whose pointers agree with
    a captured key replays it, copying only what that key does not read in place (not every
    input, as keeping only the pointers common to every key would)."""
    plan, _ = graphed()
    x1, w1, ids1 = torch.randn(4, 8), torch.randn(8), torch.randint(0, 5, (4,), dtype=torch.int32)
    x2, w2, ids2 = torch.randn(4, 8), torch.randn(8), torch.randint(0, 5, (4,), dtype=torch.int32)
    x3, w3 = torch.randn(4, 8), torch.randn(8)
    for x, w, ids in [(x1, w1, ids1), (x2, w2, ids2), (x2, w2, ids2), (x3, w2, ids2), (x3, w3, ids2)]:
        args = {"x": x, "w": w, "ids": ids}
        check(plan(args), args)
    sig = _sig(plan)
    p = torch.Tensor.data_ptr
    assert sig.keys == [(None, None, None), (p(x2), p(w2), p(ids2)), (None, p(w2), p(ids2)), (p(x3), None, p(ids2))]
    for _ in range(3):
        copies = plan.stats["input_copies"]
        args = {"x": x3, "w": w3, "ids": ids2}
        check(plan(args), args)
        assert plan.stats["input_copies"] - copies == 1  # w3 alone
    assert len(sig.keys) == plan.graphed.MAX_KEYS


def test_a_changed_layout_at_the_same_pointer_is_a_new_signature():
    """Once a signature's checks and its pointers' key are cached, an input at the same address
    with other strides, another dtype or another shape (a new tensor, or the same tensor
    changed in place) is still told apart: never read as the old layout."""
    plan, _ = graphed()
    w, ids = torch.randn(8), torch.randint(0, 5, (4,), dtype=torch.int32)
    storage = torch.randn(32)
    x = storage.view(4, 8)
    for _ in range(4):
        args = {"x": x, "w": w, "ids": ids}
        check(plan(args), args)
    assert plan.stats["captures"] == 1 and plan.stats["input_copies"] == 0
    variants = [
        storage.view(8, 4).t(),  # transposed: same address, same shape
        storage.view(torch.int32).view(4, 8),  # the same bytes as i32
        storage.view(2, 16),  # another shape of the same size
    ]
    for v in variants:
        assert v.data_ptr() == x.data_ptr()
        for _ in range(3):
            got = plan({"x": v, "w": w, "ids": ids})
            check(got, {"x": v.reshape(4, 8).float(), "w": w, "ids": ids})
    # The very tensor the graphs read in place, given other strides in place.
    for _ in range(3):
        args = {"x": x, "w": w, "ids": ids}
        check(plan(args), args)
    with torch.no_grad():
        x.set_(storage.untyped_storage(), 0, (4, 8), (1, 4))
    for _ in range(3):
        got = plan({"x": x, "w": w, "ids": ids})
        check(got, {"x": x.contiguous(), "w": w, "ids": ids})
    assert len(plan.graphed.signatures) == 4  # (the last, transposed in place, is the first variant's)


def test_outputs_held_across_many_replays_are_never_overwritten():
    """Every other result kept, the rest dropped, over many calls with the inputs' pointers
    recurring (the key cached): what is kept stays right."""
    plan, _ = graphed()
    w = torch.randn(8)
    xs = [torch.randn(4, 8) for _ in range(2)]
    ids = torch.randint(0, 5, (4,), dtype=torch.int32)
    kept = []
    for i in range(24):
        x = xs[i % 2]
        with torch.no_grad():
            x.normal_()
        args = {"x": x, "w": w, "ids": ids}
        got = plan(args)
        want = reference(**args)
        check(got, args)
        if i % 2:
            kept.append((got["z"], want["z"].clone()))
    for got, want in kept:
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert plan.stats["cloned"] > 0 and plan.stats["captures"] <= plan.graphed.MAX_GRAPHS


def test_non_contiguous_inputs_get_their_own_signature():
    plan, _ = graphed()
    w = torch.randn(8)
    for i in range(3):
        args = inputs(i, w)
        args["x"] = torch.randn(8, 4).t()
        check(plan(args), args)
        args = inputs(10 + i, w)
        check(plan(args), args)
    assert len(plan.graphed.signatures) == 2


def test_a_failed_capture_launches_eagerly_with_one_line():
    plan, lines = graphed(fail="operation not permitted when stream is capturing")
    w = torch.randn(8)
    for i in range(4):
        args = inputs(i, w)
        check(plan(args), args)
    assert len(lines) == 1 and "not permitted" in lines[0] and "CUDA graph off" in lines[0]
    assert "not permitted" in plan.stats["graph_off"] and plan.stats["replays"] == 0


def test_a_replay_that_differs_from_eager_is_never_returned():
    plan, lines = graphed(corrupt=True)
    w = torch.randn(8)
    for i in range(4):
        args = inputs(i, w)
        check(plan(args), args)
    assert len(lines) == 1 and "differs from eager" in lines[0]
    assert plan.stats["captures"] == 1


def test_wrong_input_size_is_an_error():
    plan, _ = graphed()
    args = inputs(0)
    args["x"] = torch.randn(5, 8)
    with pytest.raises(ValueError, match="the plan needs"):
        plan(args)


def test_the_environment_variable_turns_graphs_off(monkeypatch):
    for value, on in [(None, True), ("1", True), ("0", False), ("off", False), ("false", False), ("", True)]:
        if value is None:
            monkeypatch.delenv("EQFUSE_CUDA_GRAPH", raising=False)
        else:
            monkeypatch.setenv("EQFUSE_CUDA_GRAPH", value)
        assert cuda_graphs_enabled() is on, value
    assert cuda_graphs_enabled({"EQFUSE_CUDA_GRAPH": "0"}) is False


def test_without_graphs_every_call_launches():
    plan = TorchKernels()
    w = torch.randn(8)
    for i in range(3):
        args = inputs(i, w)
        check(plan(args), args)
    assert plan.launches == 3 and plan.stats["eager"] == 3


def test_inference_mode_inputs():
    plan, _ = graphed()
    w = torch.randn(8)
    with torch.inference_mode():
        for i in range(3):
            args = inputs(i, w)
            check(plan(args), args)
    for i in range(3, 5):  # static buffers made under inference mode are written outside it
        args = inputs(i, w)
        check(plan(args), args)


# --- on the GPU: eqfuse's generated kernels


def _gpu_ready():
    if not torch.cuda.is_available():
        return False
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


gpu = pytest.mark.skipif(not _gpu_ready(), reason="needs a CUDA device and CuPy")


def _gpu_plans(fn, *args, **kw):
    """The graph of `fn` compiled twice: replayed as CUDA graphs, and launched kernel by kernel."""
    from test_runtime import graph_of

    from eqfuse_torch.runtime import Codegen, GpuPlan

    exported = graph_of(fn, *[a.cpu() for a in args])
    cg = Codegen.of_graph(exported.graph, **kw)
    names = [n for n in exported.input_names if n]
    values = {k: v.cuda() for k, v in exported.values.items()}
    return GpuPlan(cg, graphs=True), GpuPlan(cg, graphs=False), lambda *a: {**values, **dict(zip(names, a))}


def _ln_gelu_residual(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)) + x


def _mlp(x, w1, b1, w2):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2).softmax(-1)


@gpu
@pytest.mark.parametrize("fn,shapes", [(_ln_gelu_residual, [(512, 1024), (1024,), (1024,)]),
                                       (_mlp, [(256, 128), (512, 128), (512,), (64, 512)])])
def test_gpu_replay_matches_eager_launch(fn, shapes):
    """Over several calls with new inputs: equal to kernel-by-kernel launch, earlier outputs kept
    intact, a parameter updated in place and one whose storage is replaced both picked up."""
    torch.manual_seed(0)
    params = [torch.randn(*s, device="cuda") * 0.1 for s in shapes[1:]]
    graphs, eager, arguments = _gpu_plans(fn, torch.randn(*shapes[0], device="cuda"), *params)
    kept = []
    for i in range(8):
        x = torch.randn(*shapes[0], device="cuda")
        if i == 4:
            with torch.no_grad():
                params[0].mul_(1.5)  # in place: the graph reads it where it is
        if i == 6:
            params[0] = torch.randn_like(params[0]) * 0.1  # replaced: a new pointer
        args = arguments(x, *params)
        got = graphs(args)
        want = eager(args)
        torch.cuda.synchronize()
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got[k].float(), fn(x, *params).float(), rtol=2e-3, atol=2e-3)
        kept.append(({k: v for k, v in got.items()}, {k: v.clone() for k, v in want.items()}))
    for got, want in kept:  # nothing returned earlier was overwritten by a later replay
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5)
    s = graphs.stats
    assert s["replays"] >= 6 and s["captures"] >= 2 and "graph_off" not in s, s
    assert eager.stats["replays"] == 0


@gpu
def test_gpu_backend_replays_graphs():
    torch.manual_seed(0)
    x = torch.randn(256, 512, device="cuda")
    w, b = torch.randn(512, device="cuda"), torch.randn(512, device="cuda")
    from eqfuse_torch.backend import EqfuseBackend

    backend = EqfuseBackend(report=None)
    torch._dynamo.reset()
    compiled = torch.compile(_ln_gelu_residual, backend=backend, dynamic=False)
    with torch.no_grad():
        outs = []
        for i in range(5):
            xi = x + i
            outs.append((compiled(xi, w, b), _ln_gelu_residual(xi, w, b)))
    for got, want in outs:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    (p,) = backend.plans
    assert p.runs == "eqfuse" and p.launches["replays"] >= 3, p.launches


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_training_steps_with_graphs_match_eager(dtype):
    """Several SGD steps of an MLP through the backend (forward and backward graphs replayed,
    parameters updated in place between steps) against the same steps run eagerly."""
    from test_training import Mlp

    from eqfuse_torch.backend import EqfuseBackend

    torch.manual_seed(0)
    torch._dynamo.reset()
    m0 = Mlp().cuda().to(dtype)
    m1 = Mlp().cuda().to(dtype)
    m1.load_state_dict(m0.state_dict())
    backend = EqfuseBackend(report=None)
    compiled = torch.compile(m1, backend=backend, dynamic=False)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (m0, m1)]
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    for step in range(5):
        x = torch.randn(256, 32, device="cuda", dtype=dtype)
        y = torch.randn(256, 8, device="cuda", dtype=dtype)
        losses = []
        for run, opt in ((m0, opts[0]), (compiled, opts[1])):
            opt.zero_grad(set_to_none=step % 2 == 0)  # .grad kept (and accumulated into) on odd steps
            loss = run(x, y)
            loss.backward()
            opt.step()
            losses.append(loss.detach().float())
        assert abs(losses[1] - losses[0]) <= tol * abs(losses[0]) + 1e-6, (step, losses)
    for (n, p0), p1 in zip(m0.named_parameters(), m1.parameters()):
        err = ((p1.float() - p0.float()).abs().max() / p0.float().abs().max()).item()
        assert err <= tol, (n, err)
    runs = {p.kind: p for p in backend.plans if p.kind != "joint"}
    assert runs["forward"].runs == "eqfuse" and runs["backward"].runs == "eqfuse"
    for p in runs.values():
        assert p.launches["replays"] >= 3 and "graph_off" not in p.launches, (p.kind, p.launches)
