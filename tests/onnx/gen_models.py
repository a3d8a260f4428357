"""Writes the ONNX test models of tests/onnx.rs with the `onnx` package, and their expected
outputs: each model gets a folder `NAME/` holding `model.onnx`, `inputs/*.npy` and
`expected/*.npy`.

Expected outputs come from computations independent of eqfuse: plain NumPy for the two models
the issue names (a decomposed layernorm; Gemm + Relu + MatMul + Softmax), and onnx's own
reference evaluator (`onnx.reference`) for the operator-coverage models, checked against NumPy
where that is short. Run from the repository root:

    pip install onnx numpy
    python3 tests/onnx/gen_models.py

The outputs are deterministic (fixed seeds), so re-running rewrites identical files.
"""

import os
import shutil

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = TensorProto.FLOAT


def const_i64(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def const_f32(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.float32), name)


def with_output_shapes(model):
    """Fills in the shapes of outputs declared without one, from onnx's shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    known = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for out in model.graph.output:
        if not out.type.tensor_type.HasField("shape") and out.name in known:
            out.type.CopyFrom(known[out.name].type)
    return model


def save(name, model, feeds, expected, rtol=1e-5):
    model = with_output_shapes(model)
    onnx.checker.check_model(model, full_check=True)
    folder = os.path.join(HERE, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.join(folder, "inputs"))
    os.makedirs(os.path.join(folder, "expected"))
    onnx.save(model, os.path.join(folder, "model.onnx"))
    for k, v in feeds.items():
        np.save(os.path.join(folder, "inputs", k + ".npy"), v)
    # Every expected output is also computed by onnx's reference evaluator, as a cross-check
    # of the independent computation (or as the computation itself).
    ref = ReferenceEvaluator(model).run(None, feeds)
    names = [o.name for o in model.graph.output]
    for k, r in zip(names, ref):
        e = expected.get(k, r)
        np.testing.assert_allclose(e, r, rtol=rtol, atol=rtol, err_msg=f"{name}/{k}")
        np.save(os.path.join(folder, "expected", k + ".npy"), np.asarray(e))


def layernorm():
    """The decomposed layernorm PyTorch's exporter writes: mean, sub, pow, mean, add, sqrt, div,
    mul, add. The batch size is symbolic, with a default in the model's metadata."""
    c = 64
    rng = np.random.default_rng(1)
    gamma = rng.standard_normal(c).astype(np.float32)
    beta = rng.standard_normal(c).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mu"], name="/ln/ReduceMean", keepdims=1),
        helper.make_node("Sub", ["x", "mu"], ["xc"], name="/ln/Sub"),
        helper.make_node("Pow", ["xc", "two"], ["sq"], name="/ln/Pow"),
        helper.make_node("ReduceMean", ["sq", "axes"], ["var"], name="/ln/ReduceMean_1", keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="/ln/Add"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="/ln/Sqrt"),
        helper.make_node("Div", ["xc", "sd"], ["nrm"], name="/ln/Div"),
        helper.make_node("Mul", ["nrm", "gamma"], ["scaled"], name="/ln/Mul"),
        helper.make_node("Add", ["scaled", "beta"], ["y"], name="/ln/Add_1"),
    ]
    graph = helper.make_graph(
        nodes,
        "layernorm",
        [helper.make_tensor_value_info("x", F32, ["batch", c])],
        [helper.make_tensor_value_info("y", F32, ["batch", c])],
        initializer=[
            const_i64("axes", [-1]),
            const_f32("two", 2.0),
            const_f32("eps", 1e-5),
            const_f32("gamma", gamma),
            const_f32("beta", beta),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="gen_models.py")
    helper.set_model_props(model, {"eqfuse.dim.batch": "16"})
    x = rng.standard_normal((16, c)).astype(np.float32)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + np.float32(1e-5)) * gamma + beta
    save("layernorm", model, {"x": x}, {"y": y.astype(np.float32)})


def mlp_softmax():
    """Gemm (transB, bias) + Relu + MatMul + Softmax, at opset 13."""
    b, d, h, k = 8, 32, 64, 16
    rng = np.random.default_rng(2)
    w1 = (rng.standard_normal((h, d)) / np.sqrt(d)).astype(np.float32)
    b1 = rng.standard_normal(h).astype(np.float32)
    w2 = (rng.standard_normal((h, k)) / np.sqrt(h)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["z"], name="fc2"),
        helper.make_node("Softmax", ["z"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp_softmax",
        [helper.make_tensor_value_info("x", F32, [b, d])],
        [helper.make_tensor_value_info("y", F32, [b, k])],
        initializer=[const_f32("w1", w1), const_f32("b1", b1), const_f32("w2", w2)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="gen_models.py")
    x = rng.standard_normal((b, d)).astype(np.float32)
    z = np.maximum(x @ w1.T + b1, 0) @ w2
    e = np.exp(z - z.max(-1, keepdims=True))
    y = e / e.sum(-1, keepdims=True)
    save("mlp_softmax", model, {"x": x}, {"y": y.astype(np.float32)})


def ops_shapes():
    """Layout and reduction operators at opset 17: general Transpose, Reshape with 0 and -1,
    Unsqueeze, Squeeze, Expand, reductions over several axes with keepdims=0, LogSoftmax,
    LayerNormalization over two axes, MatMul with 1-D operands, Gemm with transA, alpha, beta."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    v5 = rng.standard_normal(5).astype(np.float32)
    v4 = rng.standard_normal(4).astype(np.float32)
    scale = rng.standard_normal((4, 5)).astype(np.float32)
    bias = rng.standard_normal((4, 5)).astype(np.float32)
    a = rng.standard_normal((5, 4)).astype(np.float32)
    bm = rng.standard_normal((5, 6)).astype(np.float32)
    cm = rng.standard_normal((1, 6)).astype(np.float32)
    n = helper.make_node
    nodes = [
        n("Transpose", ["x"], ["t"], perm=[2, 0, 3, 1]),
        n("Reshape", ["t", "shape_0m1"], ["flat"]),
        n("Unsqueeze", ["flat", "axes_0_m1"], ["u"]),
        n("Squeeze", ["u", "axes_0"], ["sq1"]),
        n("Squeeze", ["sq1"], ["sq"]),
        n("ReduceMax", ["sq"], ["rmax"], axes=[1], keepdims=1),
        n("Expand", ["rmax", "shape_2_4_30"], ["expanded"]),
        n("Identity", ["expanded"], ["ex"]),
        n("ReduceSum", ["x", "axes_1_3"], ["rsum"], keepdims=0),
        n("LogSoftmax", ["x"], ["lsm"], axis=1),
        n("LayerNormalization", ["x", "scale", "bias"], ["ln"], axis=-2, epsilon=1e-3),
        n("MatMul", ["x", "v5"], ["mv"]),
        n("MatMul", ["v4", "x"], ["vm"]),
        n("Gemm", ["a", "bm", "cm"], ["gemm"], transA=1, alpha=0.5, beta=2.0),
        n("Transpose", ["x"], ["tdefault"]),
        n("ReduceMean", ["x"], ["rall"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "ops_shapes",
        [helper.make_tensor_value_info("x", F32, list(x.shape))],
        [
            helper.make_tensor_value_info(name, F32, None)
            for name in ["t", "sq", "ex", "rsum", "lsm", "ln", "mv", "vm", "gemm", "tdefault", "rall"]
        ],
        initializer=[
            const_i64("shape_0m1", [0, -1]),
            const_i64("axes_0_m1", [0, -1]),
            const_i64("axes_0", [0]),
            const_i64("shape_2_4_30", [2, 1, 1]),
            const_i64("axes_1_3", [1, 3]),
            const_f32("v5", v5),
            const_f32("v4", v4),
            const_f32("scale", scale),
            const_f32("bias", bias),
            const_f32("a", a),
            const_f32("bm", bm),
            const_f32("cm", cm),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="gen_models.py")
    expected = {
        "t": x.transpose(2, 0, 3, 1),
        "rsum": x.sum(axis=(1, 3)),
        "mv": x @ v5,
        "vm": v4 @ x,
        "gemm": 0.5 * (a.T @ bm) + 2.0 * cm,
        "tdefault": x.transpose(3, 2, 1, 0),
        "rall": np.float32(x.mean()),
    }
    save("ops_shapes", model, {"x": x}, expected)


def ops_indexing():
    """Indexing operators at opset 18 (issue 20): Gather of embedding rows by int32 token ids
    (one negative) and by a constant scalar index, Slice with starts/ends/axes/steps as
    constant inputs (an end of INT64_MAX, a negative start, a step of 2), Concat of three
    inputs, Split by sizes and into equal parts (num_outputs)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    wte = rng.standard_normal((10, 4)).astype(np.float32)
    tokens = np.array([[1, 4, 9, 0, 4], [7, -1, 2, 2, 5]], dtype=np.int32)
    n = helper.make_node
    big = np.iinfo(np.int64).max
    nodes = [
        n("Gather", ["wte", "tokens"], ["emb"], axis=0),
        n("Gather", ["x", "two"], ["col2"], axis=1),
        n("Slice", ["x", "s_starts", "s_ends", "s_axes", "s_steps"], ["odd"]),
        n("Slice", ["x", "t_starts", "t_ends", "t_axes"], ["corner"]),
        n("Concat", ["x", "odd", "x"], ["cat"], axis=-1),
        n("Split", ["x", "sizes"], ["left", "right"], axis=1),
        n("Split", ["x"], ["h0", "h1"], axis=1, num_outputs=2),
        n("Mul", ["h0", "h1"], ["halves"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ops_indexing",
        [
            helper.make_tensor_value_info("x", F32, list(x.shape)),
            helper.make_tensor_value_info("tokens", TensorProto.INT32, list(tokens.shape)),
        ],
        [
            helper.make_tensor_value_info(name, F32, None)
            for name in ["emb", "col2", "odd", "corner", "cat", "left", "right", "halves"]
        ],
        initializer=[
            const_f32("wte", wte),
            const_i64("two", 2),
            const_i64("s_starts", [1]),
            const_i64("s_ends", [big]),
            const_i64("s_axes", [1]),
            const_i64("s_steps", [2]),
            const_i64("t_starts", [0, -3]),
            const_i64("t_ends", [2, 100]),
            const_i64("t_axes", [0, 1]),
            const_i64("sizes", [3, 5]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="gen_models.py")
    expected = {
        "emb": wte[tokens],
        "col2": x[:, 2],
        "odd": x[:, 1::2],
        "corner": x[0:2, -3:],
        "cat": np.concatenate([x, x[:, 1::2], x], axis=1),
        "left": x[:, :3],
        "right": x[:, 3:],
        "halves": x[:, :4] * x[:, 4:],
    }
    save("ops_indexing", model, {"x": x, "tokens": tokens}, expected)


def ops_gather():
    """GatherElements (torch.gather) along each axis with negative indices, on data of rank 3,
    and on constants as PyTorch's BERT export writes it (a [1, 32] table, [1, 16] indices:
    onnx.reference fails on BERT's 64 columns, more than np.choose takes);
    GatherND with batch_dims 0: whole-element tuples (the form BERT's export writes for its
    mask, on bool data) and partial tuples selecting rows (opset 18)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    i0 = rng.integers(-3, 3, size=(2, 4, 5)).astype(np.int64)
    i1 = rng.integers(-4, 4, size=(3, 6, 5)).astype(np.int64)
    i2 = rng.integers(-5, 5, size=(3, 4, 5)).astype(np.int32)
    table = np.arange(100, 132, dtype=np.int64).reshape(1, 32)
    pos = np.arange(3, 19, dtype=np.int64).reshape(1, 16)
    m = rng.standard_normal((2, 6)) > 0
    nd_full = np.stack(np.meshgrid(np.arange(2), np.arange(6), indexing="ij"), -1)[:, ::-1].reshape(2, 1, 6, 2)
    nd_full = np.ascontiguousarray(nd_full).astype(np.int64)
    nd_rows = np.array([[[2], [0]], [[-1], [1]]], dtype=np.int64)
    n = helper.make_node
    nodes = [
        n("GatherElements", ["x", "i0"], ["ge0"], axis=0),
        n("GatherElements", ["x", "i1"], ["ge1"], axis=1),
        n("GatherElements", ["x", "i2"], ["ge2"], axis=-1),
        n("GatherElements", ["table", "pos"], ["ge_const"], axis=1),
        n("Cast", ["ge_const"], ["ge_const_f"], to=F32),
        n("GatherND", ["m", "nd_full"], ["nd_mask"]),
        n("GatherND", ["x", "nd_rows"], ["nd_rows_out"]),
    ]
    outs = [("ge0", F32), ("ge1", F32), ("ge2", F32), ("ge_const_f", F32), ("nd_mask", TensorProto.BOOL),
            ("nd_rows_out", F32)]
    graph = helper.make_graph(
        nodes,
        "ops_gather",
        [
            helper.make_tensor_value_info("x", F32, list(x.shape)),
            helper.make_tensor_value_info("i2", TensorProto.INT32, list(i2.shape)),
            helper.make_tensor_value_info("m", TensorProto.BOOL, list(m.shape)),
        ],
        [helper.make_tensor_value_info(o, t, None) for o, t in outs],
        initializer=[
            numpy_helper.from_array(i0, "i0"),
            numpy_helper.from_array(i1, "i1"),
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(pos, "pos"),
            numpy_helper.from_array(nd_full, "nd_full"),
            numpy_helper.from_array(nd_rows, "nd_rows"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="gen_models.py")
    expected = {
        "ge0": np.take_along_axis(x, np.where(i0 < 0, i0 + 3, i0), 0),
        "ge1": np.take_along_axis(x, np.where(i1 < 0, i1 + 4, i1), 1),
        "ge2": np.take_along_axis(x, np.where(i2 < 0, i2 + 5, i2), 2),
        "ge_const_f": table[:, 3:19].astype(np.float32),
        "nd_mask": m[nd_full[..., 0], nd_full[..., 1]],
        "nd_rows_out": x[nd_rows[..., 0]],
    }
    save("ops_gather", model, {"x": x, "i2": i2, "m": m}, expected)


def ops_shape_arith():
    """Shape arithmetic as PyTorch's TorchScript exporter writes it (T5's encoder): Shape (with
    start/end), ConstantOfShape (int64 and bool values), Gather of a shape, Mul, Equal, Where
    and Concat of constants feeding a Reshape's and an Expand's shape, which must stay constants
    the importer reads; Flatten (opset 18)."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    n = helper.make_node
    bool_one = numpy_helper.from_array(np.array([True]), "v")
    i64_one = numpy_helper.from_array(np.array([1], dtype=np.int64), "v")
    nodes = [
        n("Shape", ["x"], ["shape"]),
        n("Shape", ["x"], ["tail"], start=-2),
        n("Gather", ["shape", "one"], ["dim1"], axis=0),
        n("Mul", ["dim1", "two"], ["dim1x2"]),
        n("Concat", ["first", "dim1x2", "minus_one"], ["spec"], axis=0),
        n("Reshape", ["x", "spec"], ["r"]),
        n("ConstantOfShape", ["four"], ["ones"], value=i64_one),
        n("Mul", ["ones", "minus_one_s"], ["neg"]),
        n("Equal", ["target", "neg"], ["is_neg"]),
        n("Where", ["is_neg", "ones", "target"], ["expand_to"]),
        n("Expand", ["x", "expand_to"], ["e"]),
        n("ConstantOfShape", ["tail"], ["mask"], value=bool_one),
        n("Where", ["mask", "x", "zero"], ["masked"]),
        n("Flatten", ["x"], ["flat"], axis=2),
        n("Flatten", ["x"], ["flat0"], axis=0),
        n("Cast", ["shape"], ["shape_f"], to=F32),
        n("ReduceSum", ["x", "last"], ["s"], keepdims=1),
        n("Mul", ["s", "shape_f_last"], ["scaled"]),
    ]
    outs = ["r", "e", "masked", "flat", "flat0", "scaled"]
    graph = helper.make_graph(
        nodes,
        "ops_shape_arith",
        [helper.make_tensor_value_info("x", F32, list(x.shape))],
        [helper.make_tensor_value_info(o, F32, None) for o in outs],
        initializer=[
            const_i64("one", [1]),
            const_i64("two", 2),
            const_i64("first", [1]),
            const_i64("minus_one", [-1]),
            const_i64("minus_one_s", -1),
            const_i64("four", [4]),
            const_i64("target", [5, -1, -1, 4]),
            const_f32("zero", 0.0),
            const_i64("last", [-1]),
            const_f32("shape_f_last", 0.5),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="gen_models.py")
    expected = {
        "r": x.reshape(1, 6, -1),
        "e": np.broadcast_to(x, (5, 2, 3, 4)),
        "masked": x,
        "flat": x.reshape(6, 4),
        "flat0": x.reshape(1, 24),
        "scaled": x.sum(-1, keepdims=True) * 0.5,
    }
    save("ops_shape_arith", model, {"x": x}, expected)


def conv_patches():
    """Conv as a patch embedding (ViT): 2-D, strides equal to the 4x4 kernel, with a bias, on a
    14x12 image whose last rows and columns fit no whole patch (opset 18)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 14, 12)).astype(np.float32)
    w = rng.standard_normal((5, 3, 4, 4)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="/patch/Conv", kernel_shape=[4, 4], strides=[4, 4],
                            pads=[0, 0, 0, 0], dilations=[1, 1], group=1)
    graph = helper.make_graph(
        [node],
        "conv_patches",
        [helper.make_tensor_value_info("x", F32, list(x.shape))],
        [helper.make_tensor_value_info("y", F32, [2, 5, 3, 3])],
        initializer=[const_f32("w", w), const_f32("b", b)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="gen_models.py")
    patches = x[:, :, :12, :12].reshape(2, 3, 3, 4, 3, 4).transpose(0, 2, 4, 1, 3, 5).reshape(2, 9, 48)
    y = (patches @ w.reshape(5, 48).T + b).transpose(0, 2, 1).reshape(2, 5, 3, 3)
    save("conv_patches", model, {"x": x}, {"y": y.astype(np.float32)}, rtol=1e-4)
    # Convolutions of other forms, each refused naming why.
    bad = {"stride": dict(strides=[2, 2]), "pads": dict(strides=[4, 4], pads=[1, 1, 1, 1]),
           "group": dict(strides=[4, 4], group=3)}
    for k, attrs in bad.items():
        wk = const_f32("w", w if k != "group" else w[:, :1])
        node = helper.make_node("Conv", ["x", "w"], ["y"], name=f"/bad_{k}/Conv", **attrs)
        graph = helper.make_graph([node], "conv_" + k, [helper.make_tensor_value_info("x", F32, list(x.shape))],
                                  [helper.make_tensor_value_info("y", F32, None)], initializer=[wk])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="gen_models.py")
        onnx.save(model, os.path.join(HERE, f"conv_{k}.onnx"))


def external_data():
    """The mlp_softmax model with its weights saved as external data (the `model.onnx.data`
    beside it, as PyTorch writes), and a copy whose location leaves the model's folder."""
    b, d, h = 4, 8, 16
    rng = np.random.default_rng(9)
    w1 = rng.standard_normal((d, h)).astype(np.float32)
    b1 = rng.standard_normal(h).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["z"], name="fc"),
        helper.make_node("Add", ["z", "b1"], ["zb"], name="bias"),
        helper.make_node("Relu", ["zb"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "external_data",
        [helper.make_tensor_value_info("x", F32, [b, d])],
        [helper.make_tensor_value_info("y", F32, [b, h])],
        initializer=[const_f32("w1", w1), const_f32("b1", b1)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="gen_models.py")
    x = rng.standard_normal((b, d)).astype(np.float32)
    y = np.maximum(x @ w1 + b1, 0).astype(np.float32)
    save("external_data", model, {"x": x}, {"y": y})
    folder = os.path.join(HERE, "external_data")
    onnx.save_model(model, os.path.join(folder, "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    loaded = onnx.load(os.path.join(folder, "model.onnx"))
    np.testing.assert_allclose(ReferenceEvaluator(loaded).run(None, {"x": x})[0], y, rtol=1e-5, atol=1e-5)
    # The same model pointing at `../model.onnx.data`: refused, whatever is there.
    escape = onnx.load(os.path.join(folder, "model.onnx"), load_external_data=False)
    for t in escape.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../external_data/model.onnx.data"
    os.makedirs(os.path.join(HERE, "external_escape"), exist_ok=True)
    onnx.save(escape, os.path.join(HERE, "external_escape", "model.onnx"))


def ops_pointwise():
    """Pointwise operators at opset 21: Gelu both ways, Where on a bool input, Cast through
    int64, variadic Max and Min, Pow by an int64 exponent, constants of every attribute kind,
    reductions with axes as an input (opset 18 on) and noop_with_empty_axes."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    y = rng.standard_normal((3, 8)).astype(np.float32)
    m = rng.standard_normal((3, 8)) > 0
    n = helper.make_node
    nodes = [
        n("Gelu", ["x"], ["gelu"]),
        n("Gelu", ["x"], ["gelu_tanh"], approximate="tanh"),
        n("Erf", ["x"], ["erf"]),
        n("Tanh", ["x"], ["tanh"]),
        n("Sigmoid", ["x"], ["sigmoid"]),
        n("Abs", ["x"], ["ax"]),
        n("Constant", [], ["one"], value_float=1.0),
        n("Add", ["ax", "one"], ["ax1"]),
        n("Log", ["ax1"], ["log"]),
        n("Sqrt", ["ax1"], ["sqrt"]),
        n("Reciprocal", ["ax1"], ["recip"]),
        n("Exp", ["x"], ["exp"]),
        n("Neg", ["x"], ["neg"]),
        n("Where", ["m", "x", "y"], ["where"]),
        n("Constant", [], ["three"], value=numpy_helper.from_array(np.array(3.0, dtype=np.float32))),
        n("Mul", ["x", "three"], ["x3"]),
        n("Cast", ["x3"], ["xi"], to=TensorProto.INT64),
        n("Cast", ["xi"], ["trunc"], to=TensorProto.FLOAT),
        n("Max", ["x", "y", "neg"], ["max3"]),
        n("Min", ["x", "one"], ["min2"]),
        n("Constant", [], ["p3"], value_int=3),
        n("Pow", ["x", "p3"], ["cube"]),
        n("Sub", ["x", "y"], ["sub"]),
        n("Div", ["x", "ax1"], ["div"]),
        n("Relu", ["x"], ["relu"]),
        n("Constant", [], ["axes_last"], value_ints=[-1]),
        n("ReduceMean", ["x", "axes_last"], ["rmean"], keepdims=0),
        n("ReduceMax", ["x", "axes_last"], ["rmax"]),
        n("ReduceSum", ["x"], ["noop"], noop_with_empty_axes=1),
        n("Softmax", ["x"], ["sm0"], axis=0),
        n("LayerNormalization", ["x", "gamma"], ["ln"]),
    ]
    outs = [
        "gelu", "gelu_tanh", "erf", "tanh", "sigmoid", "log", "sqrt", "recip", "exp", "where",
        "trunc", "max3", "min2", "cube", "sub", "div", "relu", "rmean", "rmax", "noop", "sm0", "ln",
    ]
    graph = helper.make_graph(
        nodes,
        "ops_pointwise",
        [
            helper.make_tensor_value_info("x", F32, [3, 8]),
            helper.make_tensor_value_info("y", F32, [3, 8]),
            helper.make_tensor_value_info("m", TensorProto.BOOL, [3, 8]),
        ],
        [helper.make_tensor_value_info(o, F32, None) for o in outs],
        initializer=[const_f32("gamma", rng.standard_normal(8).astype(np.float32))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], producer_name="gen_models.py")
    expected = {"where": np.where(m, x, y), "trunc": np.trunc(x * 3), "cube": x**3, "relu": np.maximum(x, 0)}
    save("ops_pointwise", model, {"x": x, "y": y, "m": m}, expected)


def ops_logic():
    """Comparisons, boolean logic, IsNaN, Clip with and without bounds, and a causal mask of
    -inf built from comparisons and fed to Where before a Softmax (opset 13)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 4)).astype(np.float32)
    y = rng.standard_normal((4, 4)).astype(np.float32)
    z = x.copy()
    z[1, 2] = np.nan
    n = helper.make_node
    nodes = [
        n("Less", ["x", "y"], ["lt"]),
        n("LessOrEqual", ["x", "y"], ["le"]),
        n("Greater", ["x", "zero"], ["gt"]),
        n("GreaterOrEqual", ["x", "y"], ["ge"]),
        n("Equal", ["lt", "le"], ["eq"]),
        n("Not", ["lt"], ["nlt"]),
        n("And", ["gt", "le"], ["and"]),
        n("Or", ["lt", "gt"], ["or"]),
        n("IsNaN", ["z"], ["isnan"]),
        n("Clip", ["x", "lo", "hi"], ["clip"]),
        n("Clip", ["x", "", "hi"], ["clip_hi"]),
        n("Clip", ["x"], ["clip_none"]),
        n("Less", ["cols", "rows_plus"], ["keep"]),
        n("Where", ["keep", "x", "neginf"], ["masked"]),
        n("Softmax", ["masked"], ["causal"], axis=-1),
    ]
    bools = ["lt", "le", "gt", "ge", "eq", "nlt", "and", "or", "isnan"]
    floats = ["clip", "clip_hi", "clip_none", "causal"]
    graph = helper.make_graph(
        nodes,
        "ops_logic",
        [
            helper.make_tensor_value_info("x", F32, [4, 4]),
            helper.make_tensor_value_info("y", F32, [4, 4]),
            helper.make_tensor_value_info("z", F32, [4, 4]),
        ],
        [helper.make_tensor_value_info(o, TensorProto.BOOL, None) for o in bools]
        + [helper.make_tensor_value_info(o, F32, None) for o in floats],
        initializer=[
            const_f32("zero", 0.0),
            const_f32("lo", -0.5),
            const_f32("hi", 0.75),
            const_f32("neginf", -np.inf),
            const_f32("cols", np.arange(4, dtype=np.float32).reshape(1, 4)),
            const_f32("rows_plus", np.arange(1, 5, dtype=np.float32).reshape(4, 1)),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="gen_models.py")
    keep = np.arange(4)[None, :] < np.arange(1, 5)[:, None]
    masked = np.where(keep, x, -np.inf)
    e = np.exp(masked - masked.max(-1, keepdims=True))
    expected = {
        "lt": x < y, "le": x <= y, "gt": x > 0, "ge": x >= y, "eq": (x < y) == (x <= y), "nlt": ~(x < y),
        "and": (x > 0) & (x <= y), "or": (x < y) | (x > 0), "isnan": np.isnan(z),
        "clip": np.clip(x, -0.5, 0.75), "clip_hi": np.minimum(x, 0.75), "clip_none": x,
        "causal": (e / e.sum(-1, keepdims=True)).astype(np.float32),
    }
    save("ops_logic", model, {"x": x, "y": y, "z": z}, expected)


def half():
    """float16 throughout: a layer norm without bias, literals that must take the tensor's dtype
    (Where of two scalar constants), and a graph output cast to float."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 8)).astype(np.float16)
    m = rng.standard_normal((4, 8)) > 0
    n = helper.make_node
    h16 = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.float16), name)
    nodes = [
        n("LayerNormalization", ["x", "scale"], ["ln"], epsilon=1e-2),
        n("Where", ["m", "zero", "one"], ["w"]),
        n("Add", ["ln", "w"], ["y"]),
        n("Mul", ["y", "half"], ["yh"]),
        n("Cast", ["yh"], ["y32"], to=F32),
    ]
    graph = helper.make_graph(
        nodes,
        "half",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 8]),
            helper.make_tensor_value_info("m", TensorProto.BOOL, [4, 8]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 8]), helper.make_tensor_value_info("y32", F32, [4, 8])],
        initializer=[
            h16("scale", rng.standard_normal(8)),
            h16("zero", 0.0),
            h16("one", 1.0),
            h16("half", 0.5),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="gen_models.py")
    save("half", model, {"x": x, "m": m}, {}, rtol=1e-2)


def unsupported():
    """A model with two operators the importer does not read (Sign, MaxPool): both are named."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="first"),
        helper.make_node("Sign", ["r"], ["s"], name="/sign"),
        helper.make_node("MaxPool", ["s"], ["y"], name="/pool/MaxPool", kernel_shape=[3, 3]),
    ]
    graph = helper.make_graph(
        nodes,
        "unsupported",
        [helper.make_tensor_value_info("x", F32, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", F32, [1, 1, 2, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="gen_models.py")
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(HERE, "unsupported.onnx"))


def symbolic():
    """A model with a symbolic size and no default for it."""
    node = helper.make_node("Exp", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "symbolic",
        [helper.make_tensor_value_info("x", F32, ["n", 4])],
        [helper.make_tensor_value_info("y", F32, ["n", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="gen_models.py")
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(HERE, "symbolic.onnx"))


if __name__ == "__main__":
    layernorm()
    mlp_softmax()
    ops_shapes()
    ops_pointwise()
    ops_indexing()
    ops_logic()
    ops_gather()
    ops_shape_arith()
    conv_patches()
    external_data()
    half()
    unsupported()
    symbolic()
    print("wrote the models under", HERE)
