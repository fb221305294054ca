"""Reading PyTorch's own checkpoints (``torch.save``'s zip format) into kiln tensors, without torch.

A ``.pt``/``.pth`` file is a zip archive: ``<name>/data.pkl`` (a pickle of the saved object, whose
tensors are calls of ``torch._utils._rebuild_tensor_v2`` on storages named by persistent ids),
``<name>/data/<key>`` (each storage's raw bytes), ``<name>/byteorder`` and ``<name>/version``.
The pickle is read by the weights-only unpickler (``restricted.py``) with torch's rebuild functions,
storage types, dtypes, ``Size`` and ``device`` mapped to kiln's own; no other torch name resolves, and
torch is never imported. Tensors keep their strides and offsets, and tensors that shared a storage in
torch share memory (and a version counter) in kiln. Every size, stride and offset is checked against
its storage before a view is made, so a crafted file cannot reach memory outside it.

The legacy format (``_use_new_zipfile_serialization=False``, PyTorch before 1.6) is read too: the same
pickle followed by the storages' bytes (``load_torch_legacy``).
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

from ..frontend.tensor import Size, Tensor, make_tensor
from ..ir import dtypes as dt
from ..ir.types import CPU
from ..ir.types import device as parse_device
from .restricted import WeightsOnlyUnpickler, allowed_global, python3_name
from .unpickler import stream_size

__all__ = ["TorchFileError", "load_torch_legacy", "load_torch_zip"]

_STORAGE_DTYPES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool",
}  # fmt: skip
_TORCH_DTYPES = {
    "float32": "float32", "float": "float32", "float64": "float64", "double": "float64", "float16": "float16",
    "half": "float16", "bfloat16": "bfloat16", "int64": "int64", "long": "int64", "int32": "int32", "int": "int32",
    "int16": "int16", "short": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
}  # fmt: skip


class TorchFileError(ValueError):
    """A PyTorch checkpoint kiln cannot read; the message says what (the caller adds which file)."""


class _StorageType:
    def __init__(self, name: str) -> None:
        self.name = name


class _Storage:
    def __init__(self, array: np.ndarray, location: str) -> None:
        self.array = array
        self.location = location
        self.base: Tensor | None = None  # the tensor whose version counter every view of this storage shares


def _dtype(name: str) -> dt.DType:
    if name == "bfloat16":
        from ..ir.dtypes import bfloat16_dtype  # noqa: PLC0415 - needs ml_dtypes

        return bfloat16_dtype()
    return dt.BY_NAME[name]


class _Reader:
    """Rebuilds tensors on storages; ``fetch(key, dtype, numel)`` gives each storage's array (read or to be read)."""

    def __init__(self, fetch: Callable[[str, dt.DType, int], np.ndarray], place: Callable[[Tensor, str], Tensor]):
        self.fetch = fetch
        self.place = place
        self.storages: dict[str, _Storage] = {}

    def rebuilders(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "torch._utils._rebuild_tensor_v2": self.rebuild_tensor,
            "torch._utils._rebuild_tensor": self.rebuild_tensor,
            "torch._utils._rebuild_parameter": _rebuild_parameter,
            "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
            "torch._tensor._rebuild_from_type_v2": _rebuild_from_type,
            "torch.Tensor": _TENSOR_TYPE,
            "torch.Size": Size,
            "torch.device": _torch_device,
        }
        found |= {f"torch.{name}": _StorageType(name) for name in _STORAGE_DTYPES}
        found |= {f"torch.{name}": _LazyDType(kiln_name) for name, kiln_name in _TORCH_DTYPES.items()}
        return found

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise TorchFileError(f"names a persistent object {str(pid)[:100]} that is not a storage")
        storage_type, key, location, numel = pid[1:5]
        if not isinstance(storage_type, _StorageType) or not isinstance(key, str) or type(numel) is not int:
            raise TorchFileError(f"describes a storage as {str(pid)[:100]}; expected (type, key, location, numel)")
        if key not in self.storages:
            if len(pid) > 5 and pid[5] is not None:
                raise TorchFileError("holds a storage view (torch.save before 1.0), which kiln does not read")
            if numel < 0:
                raise TorchFileError(f"is corrupt: storage {key[:40]!r} has {numel} elements")
            self.storages[key] = _Storage(self.fetch(key, _dtype(_STORAGE_DTYPES[storage_type.name]), numel),
                                          str(location))  # fmt: skip
        return self.storages[key]

    def rebuild_tensor(self, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None) -> Tensor:
        if not isinstance(storage, _Storage):
            raise TorchFileError(f"rebuilds a tensor from {type(storage).__name__}, not a storage")
        size, stride = _ints(size, "size"), _ints(stride, "stride")
        if type(offset) is not int or offset < 0 or len(size) != len(stride) or any(s < 0 for s in size + stride):
            raise TorchFileError(f"is corrupt: a tensor has offset {offset}, size {size} and stride {stride}")
        if hooks:
            raise TorchFileError("holds a tensor with backward hooks, which a checkpoint cannot carry")
        array = storage.array
        extent = 0 if 0 in size else offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) + 1
        if extent > array.size:
            raise TorchFileError(f"is corrupt: a tensor of size {size}, stride {stride} and offset {offset} reaches "
                                 f"element {extent - 1} of a storage of {array.size}")  # fmt: skip
        view = np.lib.stride_tricks.as_strided(array[offset:] if array.size else array, shape=size,
                                               strides=[s * array.itemsize for s in stride])  # fmt: skip
        t = make_tensor(view, CPU, _dtype_of(array))
        whole = offset == 0 and view.size == array.size and view.flags.c_contiguous
        if storage.base is None and whole:
            storage.base = t
        else:
            if storage.base is None:
                storage.base = make_tensor(array, CPU, _dtype_of(array))
            t._base, t._version = storage.base, storage.base._version
        return self.place(t.requires_grad_(True) if requires_grad else t, storage.location)


def _dtype_of(array: np.ndarray) -> dt.DType:
    return dt.from_numpy_dtype(array.dtype)


def _ints(value: Any, what: str) -> list[int]:
    if not isinstance(value, tuple | list) or not all(type(v) is int for v in value):
        raise TorchFileError(f"is corrupt: a tensor's {what} is {str(value)[:80]}, not a tuple of ints")
    return list(value)


def _rebuild_parameter(data, requires_grad, hooks, state=None):
    from ..nn import Parameter  # noqa: PLC0415 - serialization sits above nn in kiln's layers

    if hooks:
        raise TorchFileError("holds a Parameter with hooks, which kiln cannot rebuild")
    return _with_attributes(Parameter(data, bool(requires_grad)), state)


#: ``torch.Tensor`` as a pickle names it: the type ``_rebuild_from_type_v2`` makes a tensor of.
_TENSOR_TYPE = object()


def _rebuild_from_type(func, new_type, args, state):
    """``torch._tensor._rebuild_from_type_v2``: how torch.save writes a tensor with Python attributes."""
    if new_type is not _TENSOR_TYPE or not callable(func) or not isinstance(args, tuple):
        raise TorchFileError(f"rebuilds a tensor of type {str(new_type)[:60]}, which kiln cannot make")
    return _with_attributes(func(*args), state)


def _with_attributes(t, state):
    """``t`` with the Python attributes a torch file saved with it (``p._no_weight_decay = True``): a dict
    of names, or PyTorch's ``(dict, slots)`` pair."""
    if isinstance(state, tuple) and len(state) == 2 and not state[1]:
        state = state[0]
    if state is None or state == {}:
        return t
    if not isinstance(t, Tensor) or not isinstance(state, dict) or not all(type(k) is str for k in state):
        raise TorchFileError(f"gives a tensor the state {str(state)[:80]}, not a dict of attribute names")
    t.__dict__.update(state)
    return t


def _torch_device(spec, index=None):
    if isinstance(spec, str) and index is not None:
        spec = f"{spec}:{index}"
    return parse_device(spec)


class _LazyDType:
    """``torch.bfloat16`` resolves to kiln's only when a pickle names it (it needs ml_dtypes)."""

    def __init__(self, name: str) -> None:
        self.name = name


def _resolve_dtypes(obj: Any) -> Any:
    return _dtype(obj.name) if isinstance(obj, _LazyDType) else obj


class _TorchUnpickler(WeightsOnlyUnpickler):
    def __init__(self, file, *, weights_only: bool, **kwargs) -> None:
        super().__init__(file, restricted=weights_only, **kwargs)
        self.weights_only = weights_only

    def find_class(self, module: str, name: str) -> Any:
        module3, name3 = python3_name(module, name, self.proto)  # type: ignore[attr-defined]  # typeshed omits proto
        full = f"{module3}.{name3}"
        if full in self.extra:
            return _resolve_dtypes(self.extra[full])
        if self.weights_only:
            return super().find_class(module, name)
        if module3 == "torch" or module3.startswith("torch."):
            found = allowed_global(full, {})
            if found is None:
                raise TorchFileError(f"names {full}, a PyTorch object that kiln cannot rebuild (kiln reads "
                                     "tensors, parameters and plain containers from PyTorch files)")  # fmt: skip
            return found
        return pickle._Unpickler.find_class(self, module, name)  # type: ignore[attr-defined]  # trusted: any global


#: The members of a PyTorch zip that kiln reads may hold at most this many bytes per byte of the archive
#: (torch.save stores its members uncompressed; a deflated storage of zeros inflates 1000-fold)...
MAX_INFLATION = 16
#: ...plus this many bytes, so that a small deflated archive is never refused for its small members.
INFLATION_SLACK = 1 << 20


class _ZipBudget:
    """What the members read so far may still inflate to: ``MAX_INFLATION`` times the archive plus the slack."""

    def __init__(self, archive_size: int) -> None:
        self.left = MAX_INFLATION * archive_size + INFLATION_SLACK

    def charge(self, info: zipfile.ZipInfo) -> None:
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise TorchFileError(f"is corrupt: member {info.filename[:80]!r} is stored uncompressed but its sizes "
                                 f"differ ({info.compress_size} and {info.file_size} bytes)")  # fmt: skip
        self.left -= info.file_size
        if self.left < 0:
            raise TorchFileError(f"is a zip bomb or corrupt: member {info.filename[:80]!r} inflates "
                                 f"{info.compress_size} bytes to {info.file_size}, more than kiln reads from an "
                                 f"archive of its size (at most {MAX_INFLATION} bytes per byte of the archive "
                                 "plus 1 MiB: kiln.serialization.torch_format.MAX_INFLATION)")  # fmt: skip


class _ZipStorages:
    def __init__(self, archive: zipfile.ZipFile, prefix: str, budget: _ZipBudget) -> None:
        self.archive, self.prefix, self.budget = archive, prefix, budget
        self.big = False
        if prefix + "byteorder" in archive.namelist():
            info = archive.getinfo(prefix + "byteorder")
            if info.file_size > 16:
                raise TorchFileError(f"is corrupt: its byteorder member holds {info.file_size} bytes")
            budget.charge(info)
            self.big = archive.read(info).strip() == b"big"

    def __call__(self, key: str, dtype: dt.DType, numel: int) -> np.ndarray:
        member = f"{self.prefix}data/{key}"
        try:
            info = self.archive.getinfo(member)
        except KeyError:
            raise TorchFileError(f"is missing the data of storage {key[:40]!r} ({member[:80]})") from None
        if info.file_size != numel * dtype.itemsize:
            raise TorchFileError(f"is corrupt: storage {key[:40]!r} should hold {numel} {dtype.name} values "
                                 f"({numel * dtype.itemsize} bytes), its data has {info.file_size} bytes")  # fmt: skip
        self.budget.charge(info)
        array = np.empty(numel, dtype.np)
        with self.archive.open(info) as stream:
            _read_into(stream, array, key)
        return array.byteswap(inplace=True) if self.big else array


def _read_into(stream, array: np.ndarray, key: str) -> None:
    view, got = array.view(np.uint8).data, 0
    while got < len(view):
        n = stream.readinto(view[got:])
        if not n:
            raise TorchFileError(f"is truncated: storage {key[:40]!r} ends after {got} of {len(view)} bytes")
        got += n


def load_torch_zip(stream, *, weights_only: bool, source: str, place: Callable[[Tensor, str], Tensor]) -> Any:
    """The object a ``torch.save`` zip file holds, with kiln tensors; ``place(tensor, location)`` moves each.
    What kiln reads from the archive is bounded by its size (``MAX_INFLATION``)."""
    size = os.path.getsize(stream) if isinstance(stream, str | os.PathLike) else stream_size(stream)
    archive = zipfile.ZipFile(stream)
    pickles = [name for name in archive.namelist() if name.endswith("data.pkl") and name.count("/") == 1]
    if len(pickles) != 1 and archive.namelist() and all(n.endswith(".npy") for n in archive.namelist()):
        raise TorchFileError("is a numpy .npz archive, not a checkpoint; read it with numpy.load(path)")
    if len(pickles) != 1:
        raise TorchFileError("is a zip archive without exactly one <name>/data.pkl; not a torch.save checkpoint")
    prefix = pickles[0][: -len("data.pkl")]
    budget = _ZipBudget(size or 0)
    info = archive.getinfo(pickles[0])
    budget.charge(info)
    reader = _Reader(_ZipStorages(archive, prefix, budget), place)
    with archive.open(info) as member:  # read whole (its size is charged): a zip member is slow to read by opcode
        data = io.BytesIO(member.read())  # at most its declared size: zipfile stops there
    unpickler = _TorchUnpickler(data, weights_only=weights_only, extra=reader.rebuilders(),
                                persistent_load=reader.persistent_load, source=source)  # fmt: skip
    return unpickler.load()


class _LegacyStorages:
    """The legacy format's storages come after the pickle: allocate them (bounded by the bytes left), fill later."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.arrays: dict[str, np.ndarray] = {}

    def __call__(self, key: str, dtype: dt.DType, numel: int) -> np.ndarray:
        nbytes = numel * dtype.itemsize
        if nbytes > self.budget:
            raise TorchFileError(f"is truncated or corrupt: storage {key[:40]!r} declares {nbytes} bytes, more "
                                 "than the file has left")  # fmt: skip
        self.budget -= nbytes
        self.arrays[key] = np.empty(numel, dtype.np)
        return self.arrays[key]


LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001


def load_torch_legacy(stream, size: int, *, weights_only: bool, source: str, place: Callable[[Tensor, str], Tensor]):
    """The object of a ``torch.save(..., _use_new_zipfile_serialization=False)`` file: a magic number, the
    protocol, the writer's sys_info, the object's pickle, the list of storage keys, then each storage as
    an int64 count and its raw bytes. ``size``: the bytes in ``stream`` (each storage is checked against it)."""

    def plain():  # the header pickles hold numbers and dicts only
        return WeightsOnlyUnpickler(stream, extra={}, persistent_load=_no_persistent, source=source).load()

    if plain() != LEGACY_MAGIC or plain() != LEGACY_PROTOCOL:
        raise TorchFileError("is not a legacy torch.save file: its magic number or protocol is wrong")
    info = plain()
    big = isinstance(info, dict) and info.get("little_endian") is False
    storages = _LegacyStorages(size - stream.tell())
    reader = _Reader(storages, place)
    result = _TorchUnpickler(stream, weights_only=weights_only, extra=reader.rebuilders(),
                             persistent_load=reader.persistent_load, source=source).load()  # fmt: skip
    keys = plain()
    if not isinstance(keys, list) or sorted(keys) != sorted(storages.arrays):
        raise TorchFileError("is corrupt: its list of storages does not match the storages its tensors use")
    for key in keys:
        array = storages.arrays[key]
        count = stream.read(8)
        if len(count) < 8 or int.from_bytes(count, "big" if big else "little", signed=True) != array.size:
            raise TorchFileError(f"is corrupt or truncated: storage {key[:40]!r} should start with its count "
                                 f"{array.size}")  # fmt: skip
        _read_into(stream, array, key)
        if big:
            array.byteswap(inplace=True)
    return result


def _no_persistent(pid):
    raise TorchFileError(f"names a persistent object {str(pid)[:80]} where none belongs")
