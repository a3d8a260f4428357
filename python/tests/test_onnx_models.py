"""The seven architectures of test_models.py through ONNX (issue 20): each model is exported by
PyTorch's own ONNX exporter (`torch.onnx.export(..., dynamo=True, opset_version=18)`, weights
written as external data beside the model), then

- `eqfuse run --cpu MODEL` evaluates the imported program on the CPU reference, and every
  output is within 1e-4 relative (largest difference over largest value) of PyTorch's;
- `eqfuse optimize MODEL` plans it with fewer kernels than the unfused plan.

Where the dynamo exporter itself fails on a model (T5's encoder: "Failed to decompose the FX
graph"), PyTorch's TorchScript exporter (`dynamo=False`) is used instead; a model neither
exporter writes is skipped, with the exporters' errors as the reason.

Needs torch, transformers, onnx and onnxscript (the dynamo exporter's dependency); run from the
repository root: `python3 -m pytest python/tests/test_onnx_models.py`.
"""

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
np = pytest.importorskip("numpy")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eqfuse_torch.backend import find_eqfuse  # noqa: E402
from test_models import MODELS, make, tensors  # noqa: E402

RTOL = 1e-4


def export_onnx(model, kw, path):
    """The model as ONNX at `path`: the dynamo exporter, else the TorchScript one. Returns
    how it was exported, or skips the test with both exporters' errors."""
    errors = []
    for dynamo in (True, False):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(model, (), str(path), kwargs=kw, dynamo=dynamo, opset_version=18)
            return "dynamo" if dynamo else "torchscript"
        except Exception as e:  # noqa: BLE001 - the exporter's failure is the skip's reason
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            errors.append(f"{'dynamo' if dynamo else 'TorchScript'} exporter: {type(e).__name__}: {first}")
    pytest.skip("torch.onnx.export fails: " + "; ".join(errors))


def identifier(onnx_name):
    """The name eqfuse gives an ONNX value (its files' names): other characters than letters,
    digits and `_` become `_`, and a `v_` prefix where it does not start with a letter or `_`
    (TorchScript's `input.1` is `input_1`)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", onnx_name)
    return name if re.match(r"[A-Za-z_]", name) else "v_" + name


def relative(got, want):
    """Largest difference over the largest value of PyTorch's output."""
    scale = max(float(np.abs(want).max()), 1e-30)
    return float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()) / scale


def eqfuse(*args):
    r = subprocess.run([find_eqfuse(), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"eqfuse {' '.join(map(str, args))}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.mark.parametrize("name", sorted(MODELS))
def test_onnx_export_runs_on_eqfuse(name, tmp_path):
    model, kw = make(name)
    model.eval()
    with torch.no_grad():
        want = [t.numpy() for t in tensors(model(**kw))]
    path = tmp_path / "model.onnx"
    how = export_onnx(model, kw, path)
    graph = onnx.load(str(path), load_external_data=False).graph
    initialized = {t.name for t in graph.initializer}
    names = [i.name for i in graph.input if i.name not in initialized]
    feeds = [v for v in kw.values() if isinstance(v, torch.Tensor)]
    assert len(names) == len(feeds), (names, list(kw))
    inputs = tmp_path / "in"
    inputs.mkdir()
    # Integer token ids and masks go in as the int64 PyTorch holds them; bool masks as bool.
    for n, t in zip(names, feeds):
        np.save(inputs / f"{identifier(n)}.npy", t.numpy())

    out = tmp_path / "out"
    ran = eqfuse("run", "--cpu", path, "--inputs", inputs, "--outputs", out)
    # Every input is the one given, none generated.
    assert ran.count("loaded from") == len(names), ran
    got = [np.load(out / f"{identifier(o.name)}.npy") for o in graph.output]
    assert len(got) == len(want), ([o.name for o in graph.output], [w.shape for w in want])
    for o, g, w in zip(graph.output, got, want):
        assert g.shape == w.shape, (o.name, g.shape, w.shape)
        err = relative(g, w)
        print(f"{name} ({how} export) output {o.name}: largest relative difference {err:.3g}")
        assert err <= RTOL, (name, o.name, err)

    plan = json.loads(eqfuse("optimize", path, "--format", "json"))
    assert plan["total"]["kernels"] < plan["unfused"]["kernels"], (plan["total"], plan["unfused"])
