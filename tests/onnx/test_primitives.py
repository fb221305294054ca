"""Every primitive of the registry through ONNX: written by its rule, run by onnxruntime and by
``kiln.onnx.load``, compared with the primitive's eager kernel on the registry's own samples."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from kiln.frontend.jit.export import ExportedProgram  # noqa: E402
from kiln.frontend.jit.signature import Argument, Result, Signature  # noqa: E402
from kiln.ir import dtypes as dt  # noqa: E402
from kiln.ir.graph import GraphBuilder  # noqa: E402
from kiln.ir.primitives import PRIMITIVES  # noqa: E402
from kiln.ir.types import TensorType  # noqa: E402
from kiln.onnx import DROPPED, RULES, UNMAPPABLE  # noqa: E402
from kiln.onnx._export import build_model  # noqa: E402
from kiln.onnx._primitives import PARTIAL  # noqa: E402


def test_every_primitive_maps_or_says_why():
    for name in PRIMITIVES:
        assert (name in RULES) != (name in UNMAPPABLE), f"{name}: needs an ONNX rule or an UNMAPPABLE reason"
        assert name not in UNMAPPABLE or len(UNMAPPABLE[name]) > 40, f"{name}: say why it cannot be mapped"
    assert set(RULES) | set(UNMAPPABLE) <= set(PRIMITIVES)
    assert DROPPED <= set(RULES) and set(PARTIAL) <= set(RULES)


def _as_float32(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float32) if array.dtype == np.float64 else array


def _program(name: str, arrays: list[np.ndarray], attrs: dict) -> tuple[ExportedProgram, np.ndarray]:
    """A one-node program applying ``name``, and the eager kernel's result."""
    prim = PRIMITIVES[name]
    b = GraphBuilder()
    inputs = [b.input(TensorType(a.shape, dt.from_numpy_dtype(a.dtype))) for a in arrays]
    out = b.node(name, inputs, attrs)
    graph = b.build([out])
    signature = Signature([Argument(i) for i in range(len(arrays))], [Result(0)], devices=(out.type.device,))
    specs = [("tensor", a.shape, dt.from_numpy_dtype(a.dtype).short) for a in arrays]
    program = ExportedProgram(graph, {}, None, specs, signature, None)
    return program, np.asarray(prim.eager(np, *arrays, **attrs))


def _cases():
    rng = np.random.default_rng(0)
    for name, prim in PRIMITIVES.items():
        if name in UNMAPPABLE or name in DROPPED or name in PARTIAL:
            continue  # PARTIAL: a whole result cannot be written (tests/onnx/test_dynamic_programs.py writes its parts)
        for k, sample in enumerate(prim.samples(rng)):
            yield pytest.param(name, sample, id=f"{name}-{k}")


def _compare(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{what}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    )
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize(("name", "sample"), list(_cases()))
def test_primitive_through_onnx(name, sample, tmp_path):
    arrays = [_as_float32(np.asarray(a)) for a in sample.args]
    program, want = _program(name, arrays, sample.attrs)
    names = {i: f"x{i}" for i in range(len(arrays))}
    model = build_model(program, opset=17, arg_names=names, output_names=None, dim_names={})
    onnx.checker.check_model(model, full_check=True)
    import kiln.onnx

    loaded = kiln.onnx.load(model)(*arrays)
    _compare(loaded.numpy(), want, f"{name} through kiln.onnx.load")
    try:
        import onnxruntime as ort
    except ImportError:
        return  # the round trip through kiln.onnx.load above needs no onnxruntime
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {f"x{i}": a for i, a in enumerate(arrays)})
    _compare(np.asarray(got), want, f"{name} through onnxruntime")
