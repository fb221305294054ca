"""kiln.save / kiln.load: structure, tensors, sharing, map_location, and bad files."""

import io
import json
import math
import os
import pickle
import re
import struct
import subprocess
import sys
import threading
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest

import kiln
from kiln import serialization

ROOT = Path(__file__).resolve().parents[1]


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


def test_shared_tensor_is_one_tensor_again_and_every_place_is_a_safetensors_key(tmp_path):
    import safetensors.numpy

    w = kiln.arange(1000, dtype=kiln.float32)
    out = _roundtrip({"enc": w, "dec": w, "opt": {"state": {0: {"step": kiln.tensor(3.0), "buf": [w]}}}}, tmp_path)
    assert out["enc"] is out["dec"] is out["opt"]["state"][0]["buf"][0]
    plain = safetensors.numpy.load_file(str(tmp_path / "obj.kiln"))  # safetensors has no aliases: one copy a key
    assert sorted(plain) == ["dec", "enc", "opt.state.0.buf.0", "opt.state.0.step"]
    for key in ("enc", "dec", "opt.state.0.buf.0"):
        assert plain[key].tolist() == list(range(1000)), key


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


def test_an_object_that_cannot_be_pickled_is_named(tmp_path):
    with pytest.raises(TypeError, match="kiln.save: bad.1 is a function, which is neither a tensor nor a plain "
                                        "container, and it cannot be pickled either"):  # fmt: skip
        kiln.save({"bad": [1, lambda: 0]}, tmp_path / "x")


def test_truncated_corrupt_and_foreign_files(tmp_path):
    path = tmp_path / "good"
    kiln.save({"w": kiln.ones(100)}, path)
    data = path.read_bytes()
    bad = tmp_path / "bad"
    bad.write_bytes(data[:5])
    with pytest.raises(ValueError, match=r"'.*bad' is 5 bytes long, too short for a safetensors header"):
        kiln.load(bad)
    bad.write_bytes(data[:40])
    with pytest.raises(ValueError, match=r"bad' is truncated or not a safetensors file: it declares a header of \d+ "
                                         r"bytes, but the file has 40 bytes"):  # fmt: skip
        kiln.load(bad)
    bad.write_bytes(data[:-10])
    with pytest.raises(ValueError, match="bad' is truncated or corrupt: its header declares 400 bytes of tensor data, "
                                         "the file holds 390"):  # fmt: skip
        kiln.load(bad)
    bad.write_bytes(b"\x80" * 64)
    with pytest.raises(ValueError, match="truncated or not a safetensors file"):
        kiln.load(bad)
    buffer = io.BytesIO(data[:-10])
    with pytest.raises(ValueError, match="the given BytesIO is truncated or corrupt"):
        kiln.load(buffer)


class _Stream(io.RawIOBase):
    """A pipe-like file object: readable, not seekable, so its size is not known in advance."""

    def __init__(self, data: bytes) -> None:
        self.data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self.data.read(min(len(buffer), 7))  # short reads, as a pipe gives
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_unseekable_streams_are_read_to_the_declared_size(tmp_path):
    buffer = io.BytesIO()
    kiln.save({"w": kiln.arange(10.0), "n": 3}, buffer)
    data = buffer.getvalue()
    out = kiln.load(_Stream(data))
    assert out["n"] == 3 and out["w"].tolist() == list(range(10))
    with pytest.raises(ValueError, match="the given file object is truncated: the data of tensor 'w' ends after"):
        kiln.load(_Stream(data[:-8]))
    with pytest.raises(ValueError, match="goes on after the 40 bytes of tensor data its header declares"):
        kiln.load(_Stream(data + b"more"))


def test_paths_that_are_not_regular_files_are_refused_before_reading(tmp_path):
    zero = tmp_path / "zero.kiln"
    zero.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match=r"zero.kiln' is not a regular file but a character device \(.*'/dev/zero'\)"):
        kiln.load(zero)
    with pytest.raises(ValueError, match="is not a regular file but a directory"):
        kiln.load(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    errors = []
    # Opening a FIFO for reading waits for a writer unless done without blocking: run it where a hang shows.
    reader = threading.Thread(target=lambda: errors.append(_error_of(kiln.load, fifo)), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive(), "kiln.load blocked on a FIFO"
    assert "is not a regular file but a FIFO (named pipe)" in str(errors[0])


def _error_of(fn, *args) -> Exception | None:
    try:
        fn(*args)
    except Exception as error:
        return error
    return None


def _craft(header: dict, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


_META = {"kiln.format": "1", "kiln.structure": '{"tensor": "0", "dtype": "float32", "shape": [2], '
                                               '"requires_grad": false, "device": "cpu"}'}  # fmt: skip


@pytest.mark.parametrize(
    "header, data, message",
    [
        # 1 TB declared in a file of a few hundred bytes: refused before anything is allocated
        ({"0": {"dtype": "F32", "shape": [250_000_000_000], "data_offsets": [0, 10**12]}}, b"",
         "its header declares 1000000000000 bytes of tensor data, the file holds 0"),
        ({"0": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "1": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12),
         "the data of tensor '1' overlaps the one before"),
        ({"0": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12), "leaves a gap of 4 bytes"),
        ({"0": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8),
         r"tensor '0' of dtype F32 and shape \[3\] needs 12 bytes, its data_offsets \[0, 8\] span 8"),
        ({"0": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(8), "expected a list of sizes >= 0"),
        ({"0": {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}}, bytes(16),
         "tensor '0' of dtype 'C64', which kiln cannot read"),
        ({"0": {"dtype": "F32", "shape": [2]}}, b"", "must be described by dtype, shape and data_offsets"),
        ({"__metadata__": [1]}, b"", "its __metadata__ must be a JSON object"),
    ],
)  # fmt: skip
def test_headers_whose_sizes_or_layout_do_not_fit_are_refused(tmp_path, header, data, message):
    path = tmp_path / "crafted.kiln"
    path.write_bytes(_craft({"__metadata__": _META} | header, data))
    with pytest.raises(ValueError, match="crafted.kiln' .*" + message):
        kiln.load(path)


def test_a_version_stored_as_a_number_is_named_as_such(tmp_path):
    path = tmp_path / "v.kiln"
    path.write_bytes(_craft({"__metadata__": _META | {"kiln.format": 1}}))
    with pytest.raises(ValueError, match="v.kiln' is corrupt: its __metadata__ must map names to strings, but "
                                         "'kiln.format' is int 1") as error:  # fmt: skip
        kiln.load(path)
    assert "this kiln reads" not in str(error.value)


_TENSOR = {"tensor": "w", "dtype": "float32", "shape": [2], "requires_grad": False, "device": "cpu"}


@pytest.mark.parametrize(
    "structure, message",
    [
        ('{"dict": [', r"its structure is not JSON \(Expecting value"),
        ('{"float": NaN}', "its structure is not JSON .*NaN is not strict JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        (json.dumps(json.loads("[" * 150 + "]" * 150)), r"at obj(\[0\]){15}.*\.\.\..*(\[0\]){10} is nested more than 100 containers"),
        ({"evil": 1}, r"at obj is \{'evil': 1\}; expected null, a bool, int, string, list or one of the objects"),
        ({"tuple": [], "x": 1}, "at obj is .*; expected null"),
        ({"float": 5}, "at obj has float = 5; expected a str"),
        ({"float": "abc"}, "at obj is a float written as 'abc', which is not a number"),
        ({"tuple": 5}, "at obj has tuple = 5; expected a list"),
        ({"dict": [[1]], "ordered": False}, r"at obj.dict\[0\] is \[1\]; expected a \[key, value\] pair"),
        ({"dict": [[[1, [2]], 1]], "ordered": False}, r"at obj.dict\[0\]\[0\] is a key of type tuple, which a dict"),
        ({"dict": [], "ordered": "yes"}, "has ordered = yes; expected a bool"),
        ({"dict": {"a": 1}, "ordered": True}, "has dict = .*; expected a list"),
        ([_TENSOR | {"tensor": 0}], r"at obj\[0\] has tensor = 0; expected a str"),
        ({k: v for k, v in _TENSOR.items() if k != "shape"}, "at obj is .*; expected null"),
        (_TENSOR | {"shape": [3]}, r"describes tensor 'w' as float32 \[3\], the data holds float32 \[2\]"),
        (_TENSOR | {"dtype": "complex64"}, "describes tensor 'w' as complex64"),
        (_TENSOR | {"tensor": "7"}, "names tensor '7', which is missing from the data"),
        (_TENSOR | {"requires_grad": "yes"}, "has requires_grad = yes; expected a bool"),
        (_TENSOR | {"shape": "2"}, "has shape = 2; expected a list"),
        (_TENSOR | {"device": "tpu:0"}, "places tensor 'w' on 'tpu:0', which is not a device"),
        (_TENSOR | {"parameter": 1}, "has parameter = 1; expected a bool"),
        ({"ndarray": "w", "dtype": "float32", "shape": [2], "scalar": True}, "describes array 'w' as float32 \\[2\\] scalar"),
        ({"dtype": "complex64"}, "names dtype 'complex64'"),
        ({"device": "tpu"}, "is the device 'tpu', which is not a device"),
        ({"size": [2, -1]}, "is a Size of \\[2, -1\\]; expected sizes >= 0"),
        ({"pickle": "@@@"}, "is a pickle whose base64 text is damaged"),
        ({"pickle": "gAQ="}, "is a pickle that cannot be read \\(EOFError"),
    ],
)  # fmt: skip
def test_malformed_structures_name_the_file_and_the_problem(tmp_path, structure, message):
    path = tmp_path / "crafted.kiln"
    kiln.save({"w": kiln.ones(2)}, path)
    text = structure if isinstance(structure, str) else json.dumps(structure)
    path.write_bytes(_rewrite_metadata(path.read_bytes(), **{"kiln.structure": text}))
    with pytest.raises(ValueError, match=r"kiln.load: '.*crafted.kiln' is corrupt: .*" + message):
        kiln.load(path)


def test_an_integer_tensor_that_requires_grad_is_refused(tmp_path):
    path = tmp_path / "int.kiln"
    kiln.save([kiln.arange(2)], path)
    structure = [_TENSOR | {"tensor": "0", "dtype": "int64", "requires_grad": True}]
    path.write_bytes(_rewrite_metadata(path.read_bytes(), **{"kiln.structure": json.dumps(structure)}))
    with pytest.raises(ValueError, match="asks int64 tensor '0' to require grad; only floating point tensors can"):
        kiln.load(path)


def test_nesting_limit_is_the_same_for_save_and_load(tmp_path):
    deepest = leaf = [kiln.ones(1)]
    for _ in range(serialization.MAX_DEPTH - 1):
        deepest = [deepest]
    out = _roundtrip(deepest, tmp_path)
    for _ in range(serialization.MAX_DEPTH - 1):
        out = out[0]
    assert out[0].tolist() == leaf[0].tolist()
    with pytest.raises(ValueError, match="is nested more than 100 containers deep"):
        kiln.save([deepest], tmp_path / "deeper")
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="a container that holds itself"):
        kiln.save(loop, tmp_path / "loop")


_TORCH_LEGACY = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.\x80\x02M\xe9\x03."  # how torch.save's old format starts


def test_pytorch_legacy_pickles_and_other_foreign_files_are_named(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(_TORCH_LEGACY + bytes(100))
    with pytest.raises(ValueError, match=r"model.pt' is a truncated or corrupt pickle \(UnpicklingError"):
        kiln.load(path)
    path.write_bytes(b"\x80\x04\x95" + bytes(100))
    with pytest.raises(ValueError, match=r"model.pt' is a truncated or corrupt pickle"):
        kiln.load(path)
    import numpy as np

    np.save(tmp_path / "a.npy", np.ones(3))
    with pytest.raises(ValueError, match=r"is a numpy .npy file.*numpy.load\(path, allow_pickle=False\)"):
        kiln.load(tmp_path / "a.npy")
    np.savez(tmp_path / "a.npz", a=np.ones(3))
    with pytest.raises(ValueError, match="is a numpy .npz archive, not a checkpoint; read it with numpy.load"):
        kiln.load(tmp_path / "a.npz")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", b"hello")
    with pytest.raises(ValueError, match="model.pt' is a zip archive without exactly one <name>/data.pkl"):
        kiln.load(path)


@pytest.mark.parametrize("zip_format", [True, False])
def test_malicious_pytorch_checkpoints_never_run_code(torch, tmp_path, zip_format):
    path = tmp_path / "model.pt"
    marker = tmp_path / "ran"
    torch.save({"w": torch.ones(2), "payload": _Payload(str(marker))}, path, _use_new_zipfile_serialization=zip_format)
    name = re.escape(f"{io.open.__module__}.open")  # io.open on Python 3.11, _io.open from 3.12 on
    with pytest.raises(pickle.UnpicklingError, match=rf"model.pt' names the global {name}, which is not allowed "
                                                     rf"by default.*add_safe_globals\(\[{name}\]\)"):  # fmt: skip
        kiln.load(path)
    assert not marker.exists()  # unpickling would have run _Payload's reduce


class _Payload:
    """Pickles into a call that creates a file: proof that loading ran (or did not run) code."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_loading_a_large_file_takes_about_its_size_in_memory(tmp_path):
    """Peak resident memory of a fresh process loading a 64 MB checkpoint (reading the whole file and copying
    each tensor out of it took three times the file's size; safetensors' memory map, twice)."""
    path = tmp_path / "big.kiln"
    kiln.save({f"w{i}": kiln.ones(1024, 1024) for i in range(16)}, path)
    size_mib = path.stat().st_size / 2**20
    script = (
        "import sys, kiln\n"
        "def kib(key):\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(key))\n"
        "try:\n"
        "    open('/proc/self/clear_refs', 'w').write('5')\n"  # resets the peak, so imports do not count
        "except OSError:\n"
        "    print('no-reset'); sys.exit()\n"
        "before = kib('VmRSS')\n"
        f"state = kiln.load({str(path)!r})\n"
        "assert all(t.sum().item() == 2**20 for t in state.values())\n"
        "print((kib('VmHWM') - before) / 1024)\n"
    )
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs Linux's /proc/self/status")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    if done.stdout.strip() == "no-reset":
        pytest.skip("this kernel does not let a process reset its peak memory")
    peak_mib = float(done.stdout)
    assert peak_mib < 1.2 * size_mib + 8, (peak_mib, size_mib)


def _rewrite_metadata(data: bytes, **meta) -> bytes:
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header["__metadata__"].update(meta)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    return struct.pack("<Q", len(new)) + new + data[8 + n :]


def test_wrong_version_and_plain_safetensors(tmp_path):
    path = tmp_path / "v"
    kiln.save({"w": kiln.ones(2)}, path)
    data = path.read_bytes()
    path.write_bytes(_rewrite_metadata(data, **{"kiln.format": "99"}))
    with pytest.raises(ValueError, match="format version '99'; this kiln reads versions 1, 2"):
        kiln.load(path)
    path.write_bytes(_rewrite_metadata(data, **{"kiln.structure": '{"evil": 1}'}))
    with pytest.raises(ValueError, match="is corrupt: the structure at obj is"):
        kiln.load(path)
    import numpy as np
    import safetensors.numpy

    safetensors.numpy.save_file({"b": np.ones(2, np.float16), "a": np.arange(3)}, str(path))
    out = kiln.load(path)  # a safetensors file from elsewhere: its tensors by name
    assert sorted(out) == ["a", "b"] and out["a"].tolist() == [0, 1, 2] and out["b"].dtype == kiln.float16
