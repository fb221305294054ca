"""kiln.save / kiln.load: structure, tensors, sharing, map_location, and bad files."""

import io
import json
import math
import struct
from collections import OrderedDict

import pytest

import kiln


def _roundtrip(obj, tmp_path, **kw):
    path = tmp_path / "obj.kiln"
    kiln.save(obj, path)
    return kiln.load(path, **kw)


def test_nested_structure_roundtrip(tmp_path):
    obj = {
        "ints": {1: "one", -2: [True, False, None]},
        "ordered": OrderedDict([("b", 1), ("a", 2)]),
        "tuple": (1, (2.5, "x"), []),
        "floats": [math.inf, -math.inf, 0.1, 1.0],
        "big": 2**70,
        (1, 2): "tuple key",
    }
    out = _roundtrip(obj, tmp_path)
    nan = _roundtrip(float("nan"), tmp_path)
    assert math.isnan(nan)
    assert out == obj
    assert type(out["ordered"]) is OrderedDict and list(out["ordered"]) == ["b", "a"]
    assert isinstance(out["tuple"], tuple) and isinstance(out["tuple"][1], tuple)
    assert type(out["floats"][3]) is float and type(out["ints"][-2][0]) is bool


def test_tensors_dtype_shape_requires_grad(tmp_path):
    w = kiln.randn(3, 4, requires_grad=True)
    state = {
        "w": w,
        "t": kiln.arange(6).reshape(2, 3).t(),  # non-contiguous
        "b": kiln.tensor([True, False]),
        "s": kiln.tensor(3.5, dtype=kiln.float64),
        "e": kiln.zeros(0, 2, dtype=kiln.int8),
        "h": kiln.tensor([1.5, float("nan")], dtype=kiln.float16),
    }
    out = _roundtrip(state, tmp_path)
    for key, t in state.items():
        assert out[key].dtype == t.dtype and tuple(out[key].shape) == tuple(t.shape), key
        assert out[key].requires_grad == t.requires_grad
    assert out["w"].detach().tolist() == w.detach().tolist()
    assert out["t"].tolist() == [[0, 3], [1, 4], [2, 5]]
    assert math.isnan(out["h"].tolist()[1]) and out["s"].item() == 3.5


def test_shared_tensor_stored_once(tmp_path):
    w = kiln.ones(1000)
    out = _roundtrip({"enc": w, "dec": w, "opt": {"state": {0: {"step": kiln.tensor(3.0), "buf": [w]}}}}, tmp_path)
    assert out["enc"] is out["dec"] is out["opt"]["state"][0]["buf"][0]
    single = tmp_path / "one"
    kiln.save({"a": w}, single)
    assert (tmp_path / "obj.kiln").stat().st_size < single.stat().st_size + 600  # not 2 x 4000 bytes


def test_file_objects_and_map_location(tmp_path):
    buf = io.BytesIO()
    kiln.save({"x": kiln.arange(3)}, buf)
    buf.seek(0)
    assert kiln.load(buf, map_location="cpu")["x"].tolist() == [0, 1, 2]
    path = tmp_path / "m"
    kiln.save([kiln.ones(2)], path)
    assert kiln.load(path, map_location=kiln.device("cpu"))[0].device == kiln.device("cpu")
    assert kiln.load(path, map_location={"cuda:0": "cpu"})[0].tolist() == [1, 1]
    seen = []
    out = kiln.load(path, map_location=lambda t, loc: seen.append(loc) or t * 2)
    assert seen == ["cpu"] and out[0].tolist() == [2, 2]


def test_unsupported_type_rejected(tmp_path):
    with pytest.raises(TypeError, match=r"got object at obj\['bad'\]"):
        kiln.save({"bad": object()}, tmp_path / "x")


def test_truncated_corrupt_and_foreign_files(tmp_path):
    path = tmp_path / "good"
    kiln.save({"w": kiln.ones(100)}, path)
    data = path.read_bytes()
    bad = tmp_path / "bad"
    bad.write_bytes(data[:5])
    with pytest.raises(ValueError, match=r"'.*bad' is not a kiln file: 5 bytes"):
        kiln.load(bad)
    bad.write_bytes(data[:40])
    with pytest.raises(ValueError, match="bad' is truncated"):
        kiln.load(bad)
    bad.write_bytes(data[:-10])
    with pytest.raises(ValueError, match="bad' is corrupt or truncated"):
        kiln.load(bad)
    bad.write_bytes(b"\x80" * 64)
    with pytest.raises(ValueError, match="truncated or not a kiln file"):
        kiln.load(bad)


def _rewrite_metadata(data: bytes, **meta) -> bytes:
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header["__metadata__"].update(meta)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    return struct.pack("<Q", len(new)) + new + data[8 + n :]


def test_wrong_version_and_missing_metadata(tmp_path):
    path = tmp_path / "v"
    kiln.save({"w": kiln.ones(2)}, path)
    data = path.read_bytes()
    path.write_bytes(_rewrite_metadata(data, **{"kiln.format": "99"}))
    with pytest.raises(ValueError, match="format version '99'; this kiln reads version 1"):
        kiln.load(path)
    path.write_bytes(_rewrite_metadata(data, **{"kiln.structure": '{"evil": 1}'}))
    with pytest.raises(ValueError, match="is corrupt: unknown structure node"):
        kiln.load(path)
    import numpy as np
    import safetensors.numpy

    safetensors.numpy.save_file({"a": np.ones(2)}, str(path))
    with pytest.raises(ValueError, match="without kiln structure metadata"):
        kiln.load(path)
