"""Reading safetensors files that may come from strangers: bounded, checked, and never running code.

``read_tensor_file(f)`` returns a file's text metadata and its tensors as numpy arrays; ``f`` is a
path or a binary file object. Before any tensor data is read it checks that a path names a
regular file (not a directory, a FIFO, or a device such as ``/dev/zero`` behind a symlink), that
the header's declared length fits the file, and that every tensor's dtype, shape and byte range
agree and tile the data section exactly, as the safetensors format requires. Only then is each
tensor read, straight into an array of its own: loading costs about the file's size in memory. A
stream whose size cannot be known (a pipe) is read in chunks, so a header that declares a terabyte
costs only the bytes that really arrive before the truncation is found.
(safetensors' memory-mapped reader, which copies each tensor out of the mapping, peaked at twice
the file's size: 382 MB of resident memory for a 191 MB checkpoint, against 191 MB here.)

Files of other formats that people try to load (PyTorch checkpoints, pickles, numpy files, zip
archives, HDF5) are recognized by their first bytes and named, with what to do instead; nothing
is ever unpickled.

>>> import io, numpy as np, safetensors.numpy
>>> data = safetensors.numpy.save({"w": np.arange(3, dtype=np.float32)}, metadata={"note": "hi"})
>>> metadata, arrays = read_tensor_file(io.BytesIO(data))
>>> metadata, arrays["w"].tolist()
({'note': 'hi'}, [0.0, 1.0, 2.0])
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
import struct
from typing import IO, Any

import numpy as np

__all__ = ["MAX_HEADER", "TORCH_LEGACY_MAGIC", "TensorFileError", "read_tensor_file"]

MAX_HEADER = 100_000_000  # bytes of JSON header; safetensors' own limit
SNIFF_BYTES = 4096  # enough to name a zip archive's first member
#: A stream whose size cannot be known ahead (a pipe) is read this many bytes at a time: a header that
#: declares more data than the stream holds then costs what arrived, never what it declared.
STREAM_CHUNK = 16 << 20

# safetensors' dtype names that kiln has a dtype for, as little-endian numpy dtypes
_DTYPES = {
    "BOOL": np.dtype("bool"),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
}
TORCH_LEGACY_MAGIC = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")  # pickled first by torch.save's old format
_CONVERT = (
    "kiln never unpickles a file (unpickling can run code). Convert it once where torch is installed: "
    "state = torch.load(path, weights_only=True); "
    "kiln.save({k: kiln.from_numpy(v.numpy()) for k, v in state.items()}, new_path)"
)


class TensorFileError(ValueError):
    """A file that is not a well-formed safetensors file; the message says what is wrong (not where)."""


def read_tensor_file(f: str | os.PathLike | IO[bytes]) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """``(metadata, arrays)`` of a safetensors file; ``TensorFileError`` says what is wrong with a bad one."""
    if isinstance(f, str | os.PathLike):
        with _open_regular(os.fspath(f)) as stream:
            return _read(stream, os.fstat(stream.fileno()).st_size)
    return _read(f, _remaining(f))


def _open_regular(path: str) -> IO[bytes]:
    # O_NONBLOCK: opening a FIFO must not wait for a writer before fstat can refuse it
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        real = os.path.realpath(path)
        where = "" if real == os.path.abspath(path) else f" ({path!r} leads to {real!r})"
        raise TensorFileError(f"is not a regular file but {_file_kind(mode)}{where}; give the path of a saved file")
    os.set_blocking(fd, True)
    return open(fd, "rb", buffering=0)


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _remaining(stream: IO[bytes]) -> int | None:
    """Bytes left in a seekable file object; None for a stream whose size cannot be known ahead."""
    try:
        if not stream.seekable():
            return None
        here = stream.tell()
        end = stream.seek(0, io.SEEK_END)
        stream.seek(here)
        return end - here
    except (AttributeError, OSError):
        return None


def _read(stream: IO[bytes], size: int | None) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    first = _read_up_to(stream, 8)
    if len(first) < 8:
        _refuse_foreign(first, stream)
        raise TensorFileError(f"is {len(first)} bytes long, too short for a safetensors header (truncated?)")
    (header_size,) = struct.unpack("<Q", first)
    fits = size is None or 8 + header_size <= size
    if header_size > MAX_HEADER or not fits or header_size < 2:
        _refuse_foreign(first, stream)
        file_size = "" if size is None else f", but the file has {size} bytes"
        raise TensorFileError(f"is truncated or not a safetensors file: it declares a header of {header_size} bytes"
                              f"{file_size}")  # fmt: skip
    text = _read_up_to(stream, header_size)
    if len(text) < header_size:
        raise TensorFileError(f"is truncated: its header of {header_size} bytes ends after {len(text)}")
    metadata, entries = _parse_header(text)
    data_size = _check_layout(entries)
    if size is not None and 8 + header_size + data_size != size:
        raise TensorFileError(f"is truncated or corrupt: its header declares {data_size} bytes of tensor data, "
                              f"the file holds {size - 8 - header_size}")  # fmt: skip
    arrays = {}
    for name, (dtype, shape, _) in sorted(entries.items(), key=lambda item: item[1][2]):
        if size is None:  # a pipe: what the header declares is unchecked, so allocate only what arrives
            array = _read_chunked(stream, dtype, shape, name)
        else:
            array = np.empty(shape, dtype)
            _read_into(stream, array, name)
        arrays[name] = array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))
    if size is None and _read_up_to(stream, 1):
        raise TensorFileError(f"is corrupt: it goes on after the {data_size} bytes of tensor data its header declares")
    return metadata, arrays


def _parse_header(text: bytes) -> tuple[dict[str, str], dict[str, tuple[np.dtype, tuple[int, ...], tuple[int, int]]]]:
    try:
        header = json.loads(text, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise TensorFileError(f"is corrupt or not a safetensors file: its header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise TensorFileError(f"is corrupt: its header must be a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict):
        raise TensorFileError(f"is corrupt: its __metadata__ must be a JSON object, got {str(metadata):.100}")
    for key, value in metadata.items():
        if not isinstance(value, str):  # the format stores text only: a number here was not written by safetensors
            raise TensorFileError(f"is corrupt: its __metadata__ must map names to strings, but {key[:100]!r} is "
                                  f"{type(value).__name__} {str(value):.100}")  # fmt: skip
    return metadata, {name: _entry(name, entry) for name, entry in header.items()}


def _entry(name: str, entry: Any) -> tuple[np.dtype, tuple[int, ...], tuple[int, int]]:
    where = f"tensor {name[:100]!r}"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise TensorFileError(f"is corrupt: {where} must be described by dtype, shape and data_offsets, "
                              f"got {str(entry):.100}")  # fmt: skip
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype == "BF16":
        from .dtypes import bfloat16_dtype  # noqa: PLC0415 - bfloat16 needs ml_dtypes, imported when met

        _DTYPES["BF16"] = bfloat16_dtype().np
    if dtype not in _DTYPES:
        raise TensorFileError(f"has {where} of dtype {str(dtype)[:20]!r}, which kiln cannot read "
                              f"(it reads {', '.join(_DTYPES)})")  # fmt: skip
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise TensorFileError(f"is corrupt: {where} has shape {str(shape):.100}; expected a list of sizes >= 0")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise TensorFileError(f"is corrupt: {where} has data_offsets {str(offsets):.100}; expected [begin, end]")
    nbytes = math.prod(shape) * _DTYPES[dtype].itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise TensorFileError(f"is corrupt: {where} of dtype {dtype} and shape {shape} needs {nbytes} bytes, "
                              f"its data_offsets {offsets} span {offsets[1] - offsets[0]}")  # fmt: skip
    return _DTYPES[dtype], tuple(shape), (offsets[0], offsets[1])


def _check_layout(entries: dict) -> int:
    """The data section's size: the tensors' byte ranges must follow one another from 0 without gap or overlap."""
    end = 0
    for name, (_, _, (begin, stop)) in sorted(entries.items(), key=lambda item: item[1][2]):
        if begin != end:
            problem = "overlaps the one before" if begin < end else f"leaves a gap of {begin - end} bytes before it"
            raise TensorFileError(f"is corrupt: the data of tensor {name[:100]!r} {problem}")
        end = stop
    return end


def _is_count(x: Any) -> bool:
    return type(x) is int and x >= 0


def _read_up_to(stream: IO[bytes], n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_into(stream: IO[bytes], array: np.ndarray, name: str) -> None:
    view = array.reshape(-1).view(np.uint8).data  # the fresh array's own bytes: reshape makes no copy
    got = 0
    while got < len(view):
        if hasattr(stream, "readinto"):
            n = stream.readinto(view[got:])
        else:
            chunk = stream.read(len(view) - got)
            view[got : got + len(chunk)] = chunk
            n = len(chunk)
        if not n:
            raise TensorFileError(f"is truncated: the data of tensor {name[:100]!r} ends after {got} of "
                                  f"{len(view)} bytes")  # fmt: skip
        got += n


def _read_chunked(stream: IO[bytes], dtype: np.dtype, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A tensor read from a stream of unknown size, ``STREAM_CHUNK`` bytes at a time."""
    nbytes = math.prod(shape) * dtype.itemsize
    data = bytearray()
    while len(data) < nbytes:
        chunk = stream.read(min(STREAM_CHUNK, nbytes - len(data)))
        if not chunk:
            raise TensorFileError(f"is truncated: the data of tensor {name[:100]!r} ends after {len(data)} of "
                                  f"{nbytes} bytes")  # fmt: skip
        data += chunk
    return np.frombuffer(data, dtype).reshape(shape)  # writable: the bytearray is the array's own memory


def _refuse_foreign(first: bytes, stream: IO[bytes]) -> None:
    """Raise naming the file's real format when its first bytes give it away; otherwise return."""
    if first.startswith(b"PK\x03\x04"):
        head = first + _read_up_to(stream, SNIFF_BYTES)
        (name_length,) = struct.unpack("<H", head[26:28]) if len(head) >= 28 else (0,)
        member = head[30 : 30 + name_length]
        if member.endswith((b"data.pkl", b"/version", b"/byteorder", b"/.format_version")):
            raise TensorFileError(
                f"is a PyTorch checkpoint (torch.save's zip format), not a safetensors file; {_CONVERT}"
            )
        kind = "a numpy .npz archive" if member.endswith(b".npy") else "a zip archive"
        raise TensorFileError(f"is {kind}, not a safetensors file; read it with the tool that wrote it")
    if first[:1] == b"\x80" and first[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        head = first + _read_up_to(stream, 16)
        what = "a PyTorch checkpoint (torch.save's legacy pickle format)" if head[4:14] == TORCH_LEGACY_MAGIC \
            else "a Python pickle"  # fmt: skip
        raise TensorFileError(f"is {what}, not a safetensors file; {_CONVERT}")
    if first.startswith(b"\x93NUMPY"):
        raise TensorFileError("is a numpy .npy file, not a safetensors file; read it with "
                              "numpy.load(path, allow_pickle=False) and wrap it with kiln.from_numpy")  # fmt: skip
    if first.startswith(b"\x89HDF\r\n\x1a\n"):
        raise TensorFileError("is an HDF5 file (Keras .h5?), not a safetensors file")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")
