"""Models and exported programs from strangers: external data without a folder, huge constants, and
composite regions that a file says something else about than its graph."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import kiln  # noqa: E402
import kiln.onnx  # noqa: E402


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _external_model(tmp_path):
    """A model whose weight lives in ``weights.bin`` next to it; returns (model path, weight)."""
    from onnx.external_data_helper import convert_model_to_external_data

    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], [x], [y], [numpy_helper.from_array(w, "w")])
    convert_model_to_external_data(model, location="weights.bin", size_threshold=0)
    onnx.save(model, tmp_path / "m.onnx")
    return tmp_path / "m.onnx", w


def test_external_data_of_a_model_given_as_bytes_is_refused(tmp_path, monkeypatch):
    path, w = _external_model(tmp_path)
    monkeypatch.chdir(tmp_path)  # kiln read weights.bin from the working directory here
    with pytest.raises(ValueError, match=r"tensor 'w' in the external file 'weights.bin'.*give the model's path"):
        kiln.onnx.load(path.read_bytes())
    with pytest.raises(ValueError, match=r"external file 'weights.bin'"):
        kiln.onnx.load(onnx.load(path, load_external_data=False))
    monkeypatch.chdir("/")
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(kiln.onnx.load(path)(x).numpy(), x + w, rtol=1e-6, atol=0)  # by path: its folder
    np.testing.assert_allclose(kiln.onnx.load(onnx.load(path))(x).numpy(), x + w, rtol=1e-6, atol=0)  # data loaded


def test_a_constant_of_a_terabyte_is_a_clear_error():
    shape = numpy_helper.from_array(np.array([1 << 40], np.int64), "shape")
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1 << 40])
    model = _model([helper.make_node("ConstantOfShape", ["shape"], ["y"])], [], [y], [shape])
    program = kiln.onnx.load(model.SerializeToString())
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"ConstantOfShape asks for a tensor of shape \[1099511627776\] "
                                             r"\(4398046511104 bytes\), more than this machine's memory [^\n]*\n\s*"
                                             r"while running ONNX node ConstantOfShape"):  # fmt: skip
            program()
        assert tracemalloc.get_traced_memory()[1] < 64 << 20
    finally:
        tracemalloc.stop()


def test_a_memory_error_inside_a_node_is_a_value_error_naming_it(monkeypatch):
    from kiln.onnx import _load

    def exhausted(a, x):
        np.empty(1 << 62, np.uint8)  # numpy's _ArrayMemoryError, whose constructor takes a shape and a dtype

    monkeypatch.setitem(_load.OPS, "Relu", exhausted)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [x],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])  # fmt: skip
    with pytest.raises(ValueError, match=r"more memory than this machine can give .* while running ONNX node r"):
        kiln.onnx.load(model)(np.ones(2, np.float32))


# ----------------------------------------------------------------------------- regions of exported programs
def _scaled_softmax(x):
    return kiln.softmax(x * 2.0, dim=-1)


def _tamper(path, out, change):
    from kiln.ir.serialize import load_graph_file, save_graph_file

    graph, tensors, meta = load_graph_file(path)
    meta = json.loads(json.dumps(meta))
    change(meta["regions"])
    save_graph_file(out, graph, tensors=tensors, metadata=meta)


def test_a_region_that_disagrees_with_the_graph_is_refused(tmp_path):
    x = kiln.randn(3, 4)
    kiln.export(_scaled_softmax, x).save(tmp_path / "p.kiln")
    loaded = kiln.load_exported(tmp_path / "p.kiln")
    assert [r.name for r in loaded.regions] == ["softmax"]  # an honest region is kept

    def other_dim(regions):
        (region,) = [r for r in regions if r["name"] == "softmax"]
        region["arguments"]["dim"] = 0

    _tamper(tmp_path / "p.kiln", tmp_path / "bad.kiln", other_dim)
    # kiln loaded this, and to_onnx wrote Softmax(axis=0): a model 0.29 away from the program's results
    with pytest.raises(kiln.jit.ExportError, match=r"region 0 \(softmax\) does not match the graph: result 0 "
                                                   r"differs from the graph's by up to"):  # fmt: skip
        kiln.load_exported(tmp_path / "bad.kiln")

    def other_input(regions):
        (region,) = [r for r in regions if r["name"] == "softmax"]
        region["arguments"]["input"] = region["outputs"][0]  # softmax of its own result: not what the graph did

    _tamper(tmp_path / "p.kiln", tmp_path / "bad2.kiln", other_input)
    with pytest.raises(kiln.jit.ExportError, match=r"region 0 \(softmax\) does not match the graph"):
        kiln.load_exported(tmp_path / "bad2.kiln")


def test_a_region_over_dynamic_sizes_is_checked_at_sample_sizes(tmp_path):
    x = kiln.randn(3, 4)
    kiln.export(_scaled_softmax, x, dynamic_shapes=[{0: "batch", 1: "n"}]).save(tmp_path / "p.kiln")
    loaded = kiln.load_exported(tmp_path / "p.kiln")
    assert [r.name for r in loaded.regions] == ["softmax"]  # an honest region over symbolic sizes is kept

    def other_dim(regions):
        (region,) = [r for r in regions if r["name"] == "softmax"]
        region["arguments"]["dim"] = 0

    _tamper(tmp_path / "p.kiln", tmp_path / "bad.kiln", other_dim)
    with pytest.raises(kiln.jit.ExportError, match=r"region 0 \(softmax\) does not match the graph: result 0 "):
        kiln.load_exported(tmp_path / "bad.kiln")
