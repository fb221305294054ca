"""Graph JSON and graph files: exact round trips, strict validation, and clear errors for bad files."""

from __future__ import annotations

import copy
import json
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from safetensors import safe_open
from safetensors.numpy import save_file

from kiln.ir.dtypes import float16, float32, int64
from kiln.ir.graph import Graph, GraphBuilder, SourceLocation
from kiln.ir.serialize import (
    FORMAT_VERSION,
    FormatError,
    graph_from_json,
    graph_to_json,
    load_graph_file,
    save_graph_file,
)
from kiln.ir.types import TensorType, device
from kiln.ir.verifier import VerificationError
from tests.ir.test_printer_parser import assert_same_graph, random_graphs


def sample_graph() -> Graph:
    b = GraphBuilder()
    x = b.input(TensorType((2, 3), float32))
    i = b.input(TensorType((4,), int64, device("cuda:1")))
    c = b.constant(np.arange(6, dtype=np.float32).reshape(2, 3), TensorType((2, 3), float32))
    y = b.node("add", [x, c], loc=SourceLocation('dir with space/m\u00e9 "q".py', 7, "<lambda>"))
    s = b.node("reduce_sum", [y], {"axes": (1,), "keepdim": False}, loc=SourceLocation("m.py", 8, "f"))
    p = b.node("pad", [s], {"low": (1,), "high": (0,), "interior": (0,), "value": -math.inf})
    q = b.node("pad", [p], {"low": (0,), "high": (1,), "interior": (1,), "value": math.nan})
    h = b.node("cast", [q], {"dtype": float16})
    z = b.node("neg", [i])
    b.constant(np.array(-0.0, np.float32), TensorType((), float32))
    return b.build([h, z, y])


def test_json_round_trip_is_exact_and_strict_json():
    graph = sample_graph()
    obj = graph_to_json(graph)
    text = json.dumps(obj, allow_nan=False)  # nan/inf attrs are tagged, so strict JSON works
    back = graph_from_json(json.loads(text), graph.constants)
    assert_same_graph(graph, back)
    assert str(back) == str(graph)
    attrs = obj["nodes"][3]["attrs"]
    assert attrs["value"] == {"float": "-inf"} and attrs["low"] == {"tuple": [1]}
    assert obj["nodes"][5]["attrs"] == {"dtype": {"dtype": "f16"}}
    assert obj["inputs"][1]["type"] == {"shape": [4], "dtype": "i64", "device": "cuda:1"}


def test_json_keeps_ints_floats_and_tuples_apart():
    b = GraphBuilder()
    x = b.input(TensorType((2,), float32))
    attrs = {"i": 1, "f": 1.0, "z": -0.0, "t": (), "n": None, "b": True, "s": "x", "nest": ((1.5, "a"), ())}
    b.node("op", [x], attrs, type=TensorType((2,), float32))
    graph = b.build([])
    back = json.loads(json.dumps(graph_to_json(graph), allow_nan=False))
    node = back["nodes"][0]["attrs"]
    assert node["i"] == 1 and type(node["i"]) is int and type(node["f"]) is float
    with pytest.raises(VerificationError, match="unknown op 'op'"):  # decoding succeeded; verify runs last
        graph_from_json(back, {})


def corrupt(obj: dict, path: tuple, value) -> dict:
    obj = copy.deepcopy(obj)
    target = obj
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return obj


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (("nodes",), KeyError, r"graph: expected the keys .*missing \['nodes'\]"),
        (("nodes",), {}, "nodes: expected a list, got an object"),
        (("inputs", 0, "id"), "0", "inputs\\[0\\].id: expected an integer >= 0, got '0'"),
        (("inputs", 0, "id"), True, "expected an integer"),
        (("inputs", 0, "type", "shape"), [2, -3], "shape\\[1\\]: expected an integer >= 0"),
        (("inputs", 0, "type", "dtype"), "float128", "expected a dtype .*got 'float128'"),
        (("inputs", 0, "type", "device"), "tpu", "expected a device such as"),
        (("inputs", 0, "type", "extra"), 1, "unexpected \\['extra'\\]"),
        (("nodes", 1, "inputs", 0), 99, "nodes\\[1\\].inputs\\[0\\]: %99 is not defined before it is used"),
        (("nodes", 1, "inputs"), None, "nodes\\[1\\].inputs: expected a list, got null"),
        (("nodes", 2, "attrs", "axes"), {"tuple": [1], "x": 2}, "nodes\\[2\\].attrs.axes: expected an int"),
        (("nodes", 2, "attrs", "axes"), [1], "nodes\\[2\\].attrs.axes: expected an int"),
        (("nodes", 2, "attrs", "axes"), {"float": "1.5"}, "expected an int"),
        (("nodes", 2, "attrs", "axes"), {"dtype": "f99"}, "axes.dtype: expected a dtype"),
        (("nodes", 2, "loc", "line"), "8", "nodes\\[2\\].loc.line: expected an integer"),
        (("nodes", 2, "loc"), [], "nodes\\[2\\].loc: expected an object"),
        (("nodes", 2, "op"), 3, "nodes\\[2\\].op: expected a string"),
        (("nodes", 2, "outputs", 0, "id"), 0, "nodes\\[2\\].outputs\\[0\\].id: %0 is defined twice"),
        (("outputs", 0), 42, "outputs\\[0\\]: %42 is not defined"),
    ],
)
def test_graph_from_json_rejects_malformed_structure(path, value, match):
    graph = sample_graph()
    with pytest.raises(FormatError, match=match):
        graph_from_json(corrupt(graph_to_json(graph), path, value), graph.constants)


def test_graph_from_json_rejects_non_objects_and_deep_nesting():
    with pytest.raises(FormatError, match="graph: expected an object, got a list"):
        graph_from_json([], {})
    deep: object = 1
    for _ in range(100_000):
        deep = {"tuple": [deep]}
    obj = graph_to_json(sample_graph())
    obj["nodes"][2]["attrs"]["axes"] = deep
    with pytest.raises(FormatError, match="nested too deeply"):
        graph_from_json(obj, sample_graph().constants)


def test_graph_from_json_verifies():
    graph = sample_graph()
    obj = corrupt(graph_to_json(graph), ("nodes", 1, "outputs", 0, "type", "shape"), [3, 2])
    with pytest.raises(VerificationError, match=r"node 1 \(%3 = add, at .*\): output type f32\[3,2\]"):
        graph_from_json(obj, graph.constants)
    # check=False (a signed compile-cache entry) skips the verifier only: the structure is still read
    # strictly, and a well-formed graph comes back equal to the one written.
    assert graph_from_json(obj, graph.constants, check=False).nodes[1].outputs[0].type.shape == (3, 2)
    with pytest.raises(FormatError):
        graph_from_json(corrupt(obj, ("nodes", 1, "inputs", 0), 999), graph.constants, check=False)
    assert_same_graph(graph_from_json(graph_to_json(graph), graph.constants, check=False), graph)


# -- files ----------------------------------------------------------------------------------


def test_file_round_trip(tmp_path):
    graph = sample_graph()
    weights = {"layer.weight": np.arange(12, dtype=np.float64).reshape(3, 4).T, "flag": np.array([True, False])}
    metadata = {"epoch": 3, "name": "m\u00e9", "nested": {"lr": 0.1}}
    path = tmp_path / "model.kiln"
    save_graph_file(path, graph, tensors=weights, metadata=metadata)
    loaded, tensors, meta = load_graph_file(path)
    assert_same_graph(graph, loaded)
    assert meta == metadata
    assert sorted(tensors) == sorted(weights)
    for name, array in weights.items():  # the transposed (non-contiguous) weight survives intact
        assert tensors[name].dtype == array.dtype and np.array_equal(tensors[name], array)
    assert sorted(loaded.constants) == ["c0", "c1"]
    for name, array in graph.constants.items():
        assert loaded.constants[name].dtype == array.dtype and np.array_equal(loaded.constants[name], array)
    assert math.copysign(1, float(loaded.constants["c1"])) == -1
    assert os.listdir(tmp_path) == ["model.kiln"]  # no temporary file left behind
    assert str(loaded) == str(graph)


def test_defaults_and_empty_graph(tmp_path):
    path = str(tmp_path / "empty.kiln")
    save_graph_file(path, GraphBuilder().build([]))
    graph, tensors, meta = load_graph_file(path)
    assert (graph.inputs, graph.nodes, graph.outputs, tensors, meta) == ((), (), (), {}, {})


def test_save_refuses_bad_input_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "g.kiln"
    save_graph_file(path, sample_graph())
    before = path.read_bytes()
    with pytest.raises(TypeError, match="metadata must be JSON-serializable"):
        save_graph_file(path, sample_graph(), metadata={"x": object()})
    with pytest.raises(TypeError, match="tensor 'w' must be a numpy array"):
        save_graph_file(path, sample_graph(), tensors={"w": [1.0]})
    bad = sample_graph()
    with pytest.raises(VerificationError, match="constant 'c0' is missing"):
        save_graph_file(path, Graph(bad.inputs, bad.nodes, bad.outputs, {}))
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["g.kiln"]


def rewrite_header(src, dst, **changes) -> None:
    """Copy a graph file with some metadata entries replaced (None deletes one)."""
    with safe_open(str(src), framework="numpy") as f:
        header = dict(f.metadata())
        arrays = {k: f.get_tensor(k) for k in f.keys()}
    for key, value in changes.items():
        if value is None:
            header.pop(key, None)
        else:
            header[key] = value
    save_file(arrays, str(dst), metadata=header)


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "good.kiln"
    save_graph_file(path, sample_graph(), tensors={"w": np.ones(3, np.float32)})
    return path


def test_newer_format_version(saved, tmp_path):
    bad = tmp_path / "newer.kiln"
    rewrite_header(saved, bad, format_version=str(FORMAT_VERSION + 1))
    with pytest.raises(FormatError, match=f"newer.kiln: written in graph format version {FORMAT_VERSION + 1}, newer"):
        load_graph_file(bad)
    rewrite_header(saved, bad, format_version="1.5")
    with pytest.raises(FormatError, match="newer.kiln: expected an integer format_version, got '1.5'"):
        load_graph_file(bad)


def test_truncated_file(saved, tmp_path):
    data = saved.read_bytes()
    for size in (len(data) - 1, len(data) // 2, 7, 0):
        bad = tmp_path / "truncated.kiln"
        bad.write_bytes(data[:size])
        with pytest.raises(FormatError, match="truncated.kiln: not a readable safetensors file"):
            load_graph_file(bad)


def test_not_a_safetensors_file(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("graph(%0: f32[2]) {\n  return (%0)\n}\n")
    with pytest.raises(FormatError, match="notes.txt: not a readable safetensors file"):
        load_graph_file(bad)


def test_plain_safetensors_file_is_not_a_graph_file(tmp_path):
    bad = tmp_path / "weights.safetensors"
    save_file({"w": np.ones(2, np.float32)}, str(bad))
    with pytest.raises(FormatError, match="weights.safetensors: not a kiln graph file"):
        load_graph_file(bad)


def tampered_graph(saved, tmp_path, edit) -> str:
    with safe_open(str(saved), framework="numpy") as f:
        obj = json.loads(f.metadata()["graph"])
    edit(obj)
    bad = tmp_path / "tampered.kiln"
    rewrite_header(saved, bad, graph=json.dumps(obj))
    return bad


def test_tampered_type(saved, tmp_path):
    bad = tampered_graph(saved, tmp_path, lambda g: g["nodes"][2]["outputs"][0]["type"].update(shape=[5]))
    with pytest.raises(VerificationError, match=r"tampered.kiln: node 2 \(%4 = reduce_sum, at m.py:8 in f\): output"):
        load_graph_file(bad)


def test_tampered_op(saved, tmp_path):
    bad = tampered_graph(saved, tmp_path, lambda g: g["nodes"][1].update(op="os.system"))
    with pytest.raises(VerificationError, match="tampered.kiln: .*unknown op 'os.system'"):
        load_graph_file(bad)


def test_tampered_structure_and_json(saved, tmp_path):
    bad = tampered_graph(saved, tmp_path, lambda g: g["nodes"][1].pop("attrs"))
    with pytest.raises(FormatError, match=r"tampered.kiln: graph JSON: nodes\[1\]: expected the keys"):
        load_graph_file(bad)
    rewrite_header(saved, bad, graph='{"inputs": [NaN]}')
    with pytest.raises(FormatError, match="tampered.kiln: the graph or metadata entry is not valid JSON"):
        load_graph_file(bad)
    rewrite_header(saved, bad, metadata="[1]")
    with pytest.raises(FormatError, match="tampered.kiln: the metadata entry must be a JSON object"):
        load_graph_file(bad)
    rewrite_header(saved, bad, graph=None)
    with pytest.raises(FormatError, match=r"tampered.kiln: the file's metadata lacks \['graph'\]"):
        load_graph_file(bad)


def test_tampered_constant(saved, tmp_path):
    with safe_open(str(saved), framework="numpy") as f:
        header = dict(f.metadata())
        arrays = {k: f.get_tensor(k) for k in f.keys()}
    bad = tmp_path / "tampered.kiln"
    save_file({**arrays, "constants/c0": np.zeros((3, 2), np.float32)}, str(bad), metadata=header)
    with pytest.raises(VerificationError, match="tampered.kiln: .*constant 'c0' is an array of shape \\(3, 2\\)"):
        load_graph_file(bad)
    save_file({**arrays, "evil": np.zeros(1, np.float32)}, str(bad), metadata=header)
    with pytest.raises(FormatError, match="tampered.kiln: unexpected tensor 'evil'"):
        load_graph_file(bad)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_random_graphs_json_round_trip(graph):
    text = json.dumps(graph_to_json(graph), allow_nan=False)
    assert_same_graph(graph, graph_from_json(json.loads(text), graph.constants))


# -- kernel nodes ---------------------------------------------------------------------------
def test_kernel_graphs_round_trip_through_json_and_files(tmp_path):
    from kiln.ir.graph import qualified_constants
    from kiln.ir.printer import print_graph
    from tests.ir.test_printer_parser import kernel_graph

    graph = kernel_graph()
    text = json.dumps(graph_to_json(graph), allow_nan=False)
    assert '"bodies": {"graphs": [' in text
    back = graph_from_json(json.loads(text), qualified_constants(graph))
    assert print_graph(back) == print_graph(graph)
    assert back.constants == {} and back.nodes[0].bodies[0].constants["c0"] == 2.0
    path = tmp_path / "g.kiln"
    save_graph_file(path, graph)
    with safe_open(path, framework="numpy") as f:
        assert sorted(f.keys()) == ["constants/k0/0/c0", "constants/k1/0/c0", "constants/k1/1/c0"]
    loaded, _, _ = load_graph_file(path)
    assert print_graph(loaded) == print_graph(graph)
    assert float(loaded.nodes[2].bodies[1].constants["c0"]) == 0.5


def test_kernel_json_errors():
    from kiln.ir.graph import qualified_constants
    from tests.ir.test_printer_parser import kernel_graph

    graph = kernel_graph()
    obj = graph_to_json(graph)
    bad = copy.deepcopy(obj)
    bad["nodes"][0]["attrs"]["bodies"] = {"graph": []}
    with pytest.raises(FormatError, match="nodes\\[0\\].attrs.bodies: expected the keys \\['graphs'\\]"):
        graph_from_json(bad, qualified_constants(graph))
    bad = copy.deepcopy(obj)
    bad["nodes"][0]["attrs"]["bodies"]["graphs"][0]["nodes"][0]["inputs"] = [7]
    with pytest.raises(FormatError, match="bodies.graphs\\[0\\].nodes\\[0\\].inputs\\[0\\]: %7 is not defined"):
        graph_from_json(bad, qualified_constants(graph))
    bad = copy.deepcopy(obj)
    del bad["nodes"][0]["attrs"]["bodies"]
    with pytest.raises(VerificationError, match="a kernel's attrs are name, kind and bodies"):
        graph_from_json(bad, qualified_constants(graph))
    with pytest.raises(VerificationError, match="constant 'c0' is missing"):
        graph_from_json(obj, graph.constants)
