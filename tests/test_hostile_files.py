"""Files from strangers: what ``kiln.load`` (weights_only=True) does with hostile pickles in each container.

Every hostile file is built here, at run time, from pickle opcodes or from objects whose ``__reduce__``
says what to write; none is committed. Each load is measured (tracemalloc, which sees Python's objects
and numpy's arrays) and must stay under ``LIMIT`` bytes above the file's own size.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import subprocess
import sys
import textwrap
import tracemalloc
import zipfile
from collections import OrderedDict
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln import serialization

LIMIT = 64 << 20  # what a hostile load may take above the file's size
_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's _reconstruct, as numpy names it when pickling


class _Call:
    """Pickles as ``func(*args)``, then ``BUILD`` with ``state`` when given: a pickle saying exactly this."""

    def __init__(self, func, args, state=None) -> None:
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)


def _structured_array(fields: dict, flags: int, data: bytes) -> _Call:
    """A numpy array of one 8-byte item whose dtype's state gives it ``fields`` (name -> (dtype, offset))."""
    state = (3, "|", None, tuple(fields), fields, 8, 8, flags)
    return _Call(
        _RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (1,), _Call(np.dtype, ("V8", False, True), state), False, data)
    )


def _far_field() -> _Call:
    return _structured_array({"a": (np.dtype("<f8"), 1000)}, 16, bytes(8))  # reads 1000 bytes past its item


def _object_over_int() -> _Call:
    # flags 0: numpy then takes the item for plain bytes, and reads the int's bytes as the object's pointer
    return _structured_array({"i": (np.dtype("<i8"), 0), "o": (np.dtype("O"), 0)}, 0, b"A" * 8)


# ----------------------------------------------------------------------------- containers
def _plain(obj, tmp_path: Path) -> Path:
    path = tmp_path / "plain.pkl"
    path.write_bytes(pickle.dumps(obj, protocol=4))
    return path


def _torch_zip(data_pkl: bytes, tmp_path: Path, members: dict | None = None, compress=zipfile.ZIP_STORED) -> Path:
    path = tmp_path / "model.pt"
    with zipfile.ZipFile(path, "w", compress) as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        archive.writestr("archive/version", b"3\n")
        for name, data in (members or {}).items():
            archive.writestr(name, data)
    return path


def _zip(obj, tmp_path: Path) -> Path:
    return _torch_zip(pickle.dumps(obj, protocol=4), tmp_path)


def _legacy(obj, tmp_path: Path) -> Path:
    path = tmp_path / "legacy.pt"
    info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
    parts = [0x1950A86A20F9469CFC6C, 1001, info, obj, []]
    path.write_bytes(b"".join(pickle.dumps(part, protocol=4 if part is obj else 2) for part in parts))
    return path


def _kiln(obj, tmp_path: Path) -> Path:
    path = tmp_path / "file.kiln"
    kiln.save({"x": obj}, path)  # not a tensor nor a container: kiln pickles it into the file
    return path


CONTAINERS = {"plain pickle": _plain, "torch zip": _zip, "torch legacy": _legacy, "kiln file": _kiln}


def _measured_load(path: Path):
    """``(result or the exception raised, peak bytes above the file's size)`` of ``kiln.load(path)``."""
    tracemalloc.start()
    try:
        try:
            outcome = kiln.load(path)
        except Exception as error:  # noqa: BLE001 - the outcome is what the test looks at
            outcome = error
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return outcome, peak - path.stat().st_size


def _refused(path: Path, pattern: str, kind: type = ValueError) -> str:
    outcome, peak = _measured_load(path)
    assert isinstance(outcome, kind), f"{path.name} gave {outcome!r:.300}"
    message = str(outcome)
    assert str(path) in message and __import__("re").search(pattern, message), message
    assert peak < LIMIT, f"loading {path.name} took {peak >> 20} MB"
    return message


# ----------------------------------------------------------------------------- memory safety
@pytest.mark.parametrize("container", CONTAINERS)
def test_a_dtype_with_a_field_outside_its_item_is_refused(tmp_path, container):
    path = CONTAINERS[container](_far_field(), tmp_path)
    _refused(path, r"numpy dtype 'V8'.*only plain")  # kiln read 1000 bytes past the array (heap bytes came back)


def test_an_object_field_over_an_int_field_is_refused_in_every_container(tmp_path):
    # kiln crashed here (SIGSEGV: the int's bytes were read as a pointer), so the loads run in a child process
    paths = [CONTAINERS[name](_object_over_int(), tmp_path / name.replace(" ", "_")) for name in CONTAINERS
             if (tmp_path / name.replace(" ", "_")).mkdir() is None]  # fmt: skip
    script = textwrap.dedent(f"""
        import sys, kiln
        for path in {[str(p) for p in paths]!r}:
            try:
                print(repr(kiln.load(path))[:200])
            except ValueError as error:
                print("refused:", str(error).replace(chr(10), " "))
            sys.stdout.flush()
    """)
    here = str(Path(kiln.__file__).resolve().parents[1])  # the kiln this test imported
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=here, timeout=300,
                          env={"PYTHONPATH": here, "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, f"the loads crashed the process (exit {done.returncode}): {done.stderr[-500:]}"
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and all(line.startswith("refused:") and "numpy dtype 'V8'" in line for line in lines), lines


def test_numpy_data_of_plain_dtypes_still_loads(tmp_path):
    obj = {"a": np.arange(6, dtype=">i4").reshape(2, 3).T, "s": np.float32(2.5), "d": np.dtype("<f2"),
           "b": np.array([True, False]), "c": np.array([1 + 2j]), "u": np.array(["ab", "c"])}  # fmt: skip
    for protocol in (2, 4):
        data = pickle.dumps(obj, protocol=protocol)
        out, want = kiln.load(io.BytesIO(data)), pickle.loads(data)  # numpy's own reading is the reference
        for key, value in want.items():
            assert type(out[key]) is type(value) and np.array_equal(out[key], value), (protocol, key)
            assert getattr(out[key], "dtype", None) == getattr(value, "dtype", None), (protocol, key)


# ----------------------------------------------------------------------------- bounded memory
_NEWOBJ_TUPLE = b"\x80\x02cbuiltins\ntuple\n" + pickle.dumps((range(1 << 22),), 2)[2:-1] + b"\x81."  # NEWOBJ
_BOMBS = {
    "list(range(n))": (
        pickle.dumps(_Call(list, (range(1 << 22),)), 4),
        r"list\(\) of range would take 268435456 bytes",
    ),
    "bytearray(n)": (pickle.dumps(_Call(bytearray, (1 << 27,)), 4), r"bytearray\(\) of int would take 134217728 bytes"),
    "ndarray((n,), object)": (pickle.dumps(_Call(np.ndarray, ((1 << 24,), "O")), 4), r"calls numpy.ndarray directly"),
    "tuple.__new__(tuple, range(n))": (_NEWOBJ_TUPLE, r"tuple\(\) of range would take"),
}


@pytest.mark.parametrize("bomb", _BOMBS)
def test_a_small_pickle_cannot_ask_for_much_memory(tmp_path, bomb):
    data, pattern = _BOMBS[bomb]
    path = tmp_path / "bomb.pkl"
    path.write_bytes(data)
    assert path.stat().st_size < 80
    _refused(path, pattern)


def test_a_large_memo_index_costs_one_entry(tmp_path):
    path = tmp_path / "memo.pkl"
    path.write_bytes(b"\x80\x02N" + b"r" + struct.pack("<I", 1 << 24) + b".")  # LONG_BINPUT 2**24 (the C unpickler
    outcome, peak = _measured_load(path)  # grew its memo table to twice that: 256 MB)
    assert outcome is None and peak < LIMIT


def test_a_declared_length_beyond_the_pickle_is_refused_before_reading(tmp_path):
    path = tmp_path / "long.pkl"
    path.write_bytes(b"\x80\x04\x8e" + struct.pack("<Q", 1 << 40) + b"abc")  # BINBYTES8 of a terabyte
    _refused(path, r"truncated or corrupt.*asks for 1099511627776 bytes")


def _deflated_zip(tmp_path: Path, name: str, head: bytes, zeros: int, tail: bytes, data_pkl: bytes = b"") -> Path:
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        if data_pkl:
            archive.writestr("archive/data.pkl", data_pkl)
        with archive.open(name, "w", force_zip64=True) as member:
            member.write(head)
            chunk = bytes(1 << 20)
            for _ in range(zeros >> 20):
                member.write(chunk)
            member.write(tail)
    return path


def _tensor_pickle(numel: int) -> bytes:
    """protocol 2 opcodes of ``_rebuild_tensor_v2(storage "0" of numel floats, 0, (numel,), (1,))``."""
    storage = b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuJ"
    storage += struct.pack("<i", numel) + b"tQ"
    size = b"J" + struct.pack("<i", numel) + b"\x85K\x01\x85"
    return b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(" + storage + b"K\x00" + size + b"\x89Ntq\x00R."


def test_a_deflated_storage_cannot_inflate_past_the_archives_bound(tmp_path):
    numel = 1 << 25  # 128 MiB of float32 zeros, deflated to about 130 KB
    path = _deflated_zip(tmp_path, "archive/data/0", b"", numel * 4, b"", data_pkl=_tensor_pickle(numel))
    assert path.stat().st_size < 300_000
    _refused(path, r"zip bomb or corrupt: member 'archive/data/0' inflates \d+ bytes to 134217728")
    small = _torch_zip(_tensor_pickle(3), tmp_path, {"archive/data/0": struct.pack("<3f", 1, 2, 3)})
    assert kiln.load(small).tolist() == [1.0, 2.0, 3.0]  # the same pickle, of a storage that fits


def test_a_deflated_data_pkl_cannot_inflate_past_the_archives_bound(tmp_path):
    n = 1 << 27  # BINBYTES8 of 128 MiB of zeros
    path = _deflated_zip(tmp_path, "archive/data.pkl", b"\x80\x04\x8e" + struct.pack("<Q", n), n, b".")
    _refused(path, r"zip bomb or corrupt: member 'archive/data.pkl' inflates")


def test_an_ext_opcode_in_a_torch_zip_names_the_file(tmp_path):
    path = _torch_zip(b"\x80\x02\x82\x01.", tmp_path)  # EXT1 1: a global from the extension registry
    _refused(path, r"extension registry \(an EXT opcode, code 1\)")


# ----------------------------------------------------------------------------- protocol 2 checkpoints
_PY2 = {"s": {1, 2}, "f": frozenset({3}), "c": 1 + 2j, "b": b"\x00\xffab", "ba": bytearray(b"xy"), "r": range(3)}


def test_protocol_2_names_and_bytes_load_as_python_reads_them():
    data = pickle.dumps(_PY2, protocol=2)
    assert b"__builtin__" in data and b"_codecs" in data  # what PyTorch's default protocol writes
    assert kiln.load(io.BytesIO(data)) == _PY2
    with pytest.raises(ValueError, match=r"BytesIO calls _codecs.encode\(str, 'rot13'\)"):  # latin-1 text only
        kiln.load(io.BytesIO(pickle.dumps(_Call(__import__("_codecs").encode, ("x", "rot13")), protocol=2)))


def test_pytorch_checkpoints_with_sets_complex_and_bytes(torch, tmp_path):
    obj = {**_PY2, "w": torch.arange(3.0)}
    del obj["r"], obj["f"]  # PyTorch refuses range and frozenset
    torch.save(obj, tmp_path / "t.pt")
    want = torch.load(tmp_path / "t.pt", weights_only=True)
    got = kiln.load(tmp_path / "t.pt")
    assert got.pop("w").tolist() == want.pop("w").tolist() and got == want


# ----------------------------------------------------------------------------- MemoryError
class _Pipe(io.RawIOBase):
    def __init__(self, data: bytes) -> None:
        self.data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self.data.readinto(buffer)


def test_a_stream_declaring_a_terabyte_is_refused_by_what_arrives():
    header = json.dumps({"w": {"dtype": "U8", "shape": [1 << 40], "data_offsets": [0, 1 << 40]}}).encode()
    stream = _Pipe(struct.pack("<Q", len(header)) + header + bytes(1000))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"given file object is truncated: the data of tensor 'w' ends after "
                                             r"1000 of 1099511627776 bytes"):  # fmt: skip
            kiln.load(stream)
        assert tracemalloc.get_traced_memory()[1] < LIMIT
    finally:
        tracemalloc.stop()


# ----------------------------------------------------------------------------- get_unsafe_globals_in_checkpoint
def test_unsafe_globals_are_listed_without_running_the_pickle(tmp_path):
    obj = {"o": OrderedDict(a=1), "f": Fraction(1, 3), "n": np.arange(2), "bomb": _Call(bytearray, (1 << 40,))}
    path = _plain(obj, tmp_path)
    assert serialization.get_unsafe_globals_in_checkpoint(path) == ["fractions.Fraction"]
    for container in (_zip, _legacy):
        assert kiln.serialization.get_unsafe_globals_in_checkpoint(container(obj, tmp_path)) == ["fractions.Fraction"]
    with serialization.safe_globals([Fraction]):
        assert serialization.get_unsafe_globals_in_checkpoint(path) == []
    module = kiln.nn.Linear(2, 2)
    kiln.save({"m": module, "w": kiln.ones(1)}, tmp_path / "m.kiln")
    unsafe = serialization.get_unsafe_globals_in_checkpoint(tmp_path / "m.kiln")
    assert f"{type(module).__module__}.{type(module).__qualname__}" in unsafe, unsafe
    kiln.save({"w": kiln.ones(1)}, tmp_path / "w.kiln")
    assert serialization.get_unsafe_globals_in_checkpoint(tmp_path / "w.kiln") == []


def test_unsafe_globals_as_pytorch_lists_them(torch, tmp_path):
    torch.save({"w": torch.ones(2), "f": Fraction(1, 3), "o": OrderedDict(a=1)}, tmp_path / "t.pt")
    want = torch.serialization.get_unsafe_globals_in_checkpoint(tmp_path / "t.pt")
    assert serialization.get_unsafe_globals_in_checkpoint(tmp_path / "t.pt") == sorted(want) == ["fractions.Fraction"]


def test_a_pickle_cannot_give_a_global_a_state(tmp_path):
    # BUILD on kiln.float32 (an allowed global) rewrote the process's own dtype: float32 became 8 bytes wide
    f8 = b"\x8c\x05numpy\x8c\x05dtype\x93\x8c\x02f8\x89\x88\x87R"  # numpy.dtype("f8", False, True)
    data = b"\x80\x04\x8c\x0ekiln.ir.dtypes\x8c\x07float32\x93}\x8c\x02np" + f8 + b"sb."
    path = tmp_path / "state.pkl"
    path.write_bytes(data)
    _refused(path, r"gives the global kiln.float32 a state")
    assert kiln.float32.itemsize == 4
