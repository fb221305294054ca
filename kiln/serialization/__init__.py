"""``kiln.save`` / ``kiln.load``: checkpoints as PyTorch 2.6+ has them, safe by default.

``kiln.save(obj, f)`` writes a safetensors file (``kiln_format.py`` describes it). Tensors, numpy
arrays, dicts/OrderedDicts/lists/tuples, str/int/float/bool/None, kiln dtypes, devices and ``Size``
are stored without pickle; any other object (a whole ``nn.Module``, a user's class) is pickled into
the file, its tensors still stored as tensors. A tensor's stored name is its place in ``obj``, so a
saved state_dict is also a plain safetensors file with the state_dict's keys, which
``safetensors.torch.load_file`` (or any safetensors reader) opens as is.

``kiln.load(f, map_location=None, *, weights_only=True)`` recognizes what it is given:

- a kiln file; pickled parts are refused under ``weights_only=True`` unless their globals are allowed
  (``add_safe_globals``, ``safe_globals``), with ``pickle.UnpicklingError`` naming the global;
- a plain safetensors file: a dict of its tensors by name;
- a PyTorch checkpoint (``torch.save``'s zip format, ``.pt``/``.pth``, or its pre-1.6 legacy format):
  read without torch through a restricted unpickler that admits only tensor rebuilds, storages and
  plain containers (``torch_format.py``), giving kiln tensors;
- a plain pickle: through the same weights-only unpickler, or ``pickle`` itself with
  ``weights_only=False``.

With ``weights_only=True`` nothing in a file can run code, and what a file makes kiln allocate is
bounded by the file's size: a pickle's calls by ``unpickler.MAX_EXPANSION``, a zip member's inflation
by ``torch_format.MAX_INFLATION``; beyond them the load is refused with a ``ValueError`` naming the file.
``get_unsafe_globals_in_checkpoint(f)`` lists the globals a file names that would be refused, without
unpickling it. ``weights_only=False`` unpickles anything, so use it only for files you trust.

>>> import io, kiln
>>> buffer = io.BytesIO()
>>> kiln.save({"w": kiln.ones(2), "step": 3}, buffer)
>>> _ = buffer.seek(0)
>>> kiln.load(buffer)
{'w': tensor([1., 1.]), 'step': 3}
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections.abc import Callable
from typing import IO, Any

from ..frontend.ops.creation import from_numpy
from ..ir.tensor_file import TORCH_LEGACY_MAGIC, TensorFileError, read_tensor_file
from . import kiln_format
from .kiln_format import MAX_DEPTH, place
from .restricted import (
    WeightsOnlyRefusal,
    WeightsOnlyUnpickler,
    add_safe_globals,
    clear_safe_globals,
    get_safe_globals,
    safe_globals,
)
from .scan import get_unsafe_globals_in_checkpoint
from .torch_format import TorchFileError, load_torch_legacy, load_torch_zip
from .unpickler import PickleLimitError, stream_size

__all__ = ["MAX_DEPTH", "add_safe_globals", "clear_safe_globals", "get_safe_globals", "get_unsafe_globals_in_checkpoint",
           "load", "safe_globals", "save"]  # fmt: skip


def save(obj: Any, f: str | os.PathLike | IO[bytes], pickle_module: Any = None, pickle_protocol: int = 2,
         _use_new_zipfile_serialization: bool = True) -> None:  # fmt: skip
    """Write ``obj`` to a path or a binary file object (``torch.save``'s arguments after ``f`` are accepted
    and have no effect: kiln always writes its safetensors-based format).

    Tensors, numpy arrays, plain containers and primitives are stored without pickle; any other object
    is pickled (so loading it needs ``weights_only=False`` or ``add_safe_globals``)."""
    kiln_format.encode_to(obj, f)


def load(f: str | os.PathLike | IO[bytes], map_location: str | Callable | dict | Any = None, pickle_module: Any = None,
         *, weights_only: bool | None = None, mmap: bool | None = None, **pickle_load_args: Any) -> Any:  # fmt: skip
    """Read a kiln file, a plain safetensors file, a PyTorch checkpoint or a pickle (see the module's docs).

    ``map_location``: a device (or its name), a dict mapping stored device names to new ones, or a callable
    ``(tensor, location) -> tensor or None``, as in PyTorch. ``weights_only`` (default True) refuses any
    pickled global outside the allow-list. ``mmap`` is accepted for PyTorch's signature; kiln reads the
    data into memory either way. A file of another kind, truncated or corrupt, raises ``ValueError``
    naming the file and the problem."""
    weights_only = True if weights_only is None else bool(weights_only)
    source = _source(f)
    if isinstance(f, str | os.PathLike):
        head = b""
        if _is_regular(f):  # a FIFO or a device is refused by read_tensor_file, without opening it blocking
            with open(os.fspath(f), "rb") as probe:  # only to tell the format; read_tensor_file reopens it
                head = probe.read(16)
        stream: Any = f
    else:
        head, stream = _peek(f, 16)
    try:
        if head.startswith(b"PK\x03\x04"):
            return _load_zip(stream, map_location, weights_only, source)
        if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
            return _load_pickle(stream, head, map_location, weights_only, source)
        meta, arrays = read_tensor_file(stream)
    except (TensorFileError, TorchFileError) as error:
        raise ValueError(f"kiln.load: {source} {error}") from None
    if "kiln.format" in meta:
        return kiln_format.decode(meta, arrays, map_location, source, weights_only)
    return {name: place(from_numpy(array), "cpu", map_location) for name, array in arrays.items()}


def _is_regular(path) -> bool:
    import stat  # noqa: PLC0415

    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _source(f) -> str:
    if isinstance(f, str | os.PathLike):
        return repr(os.fspath(f))
    return "the given BytesIO" if isinstance(f, io.BytesIO) else "the given file object"


def _peek(f: IO[bytes], n: int) -> tuple[bytes, IO[bytes] | _Prefixed]:
    """The first ``n`` bytes of ``f`` and a stream that still yields them (``f`` itself when seekable)."""
    try:
        if f.seekable():
            here = f.tell()
            head = f.read(n)
            f.seek(here)
            return head, f
    except (AttributeError, OSError):
        pass
    head = f.read(n)
    return head, _Prefixed(head, f)


class _Prefixed(io.RawIOBase):
    """An unseekable stream with bytes already read from it put back in front."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self.head, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        chunk = self.rest.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def _load_zip(stream, map_location, weights_only: bool, source: str):
    if not isinstance(stream, str | os.PathLike) and not stream.seekable():
        stream = io.BytesIO(stream.read())  # a zip's directory is at its end
    try:
        return load_torch_zip(stream, weights_only=weights_only, source=source,
                              place=lambda t, location: place(t, location, map_location))  # fmt: skip
    except zipfile.BadZipFile as error:
        raise TorchFileError(f"is a damaged zip archive ({error})") from None
    except (WeightsOnlyRefusal, PickleLimitError):
        raise
    except (pickle.UnpicklingError, EOFError, IndexError, KeyError, TypeError, AttributeError, ValueError) as error:
        if isinstance(error, TorchFileError):
            raise
        raise TorchFileError(f"is a corrupt PyTorch checkpoint ({type(error).__name__}: {error})") from None


def _load_pickle(stream, head: bytes, map_location, weights_only: bool, source: str):
    opened = open(os.fspath(stream), "rb") if isinstance(stream, str | os.PathLike) else None
    try:
        file = opened or stream
        size = stream_size(file)
        if size is None:  # a pipe: its size bounds what the pickle may build, so read it first
            file = io.BytesIO(file.read())
            size = stream_size(file)
            assert size is not None  # a BytesIO knows its size
        if head[4:14] == TORCH_LEGACY_MAGIC:
            return load_torch_legacy(file, file.tell() + size, weights_only=weights_only,
                                     source=source, place=lambda t, location: place(t, location, map_location))  # fmt: skip

        def refuse(pid):
            raise pickle.UnpicklingError(
                f"{source} names a persistent object {str(pid)[:80]}, which kiln cannot rebuild"
            )

        if weights_only:
            return WeightsOnlyUnpickler(file, extra={}, persistent_load=refuse, source=source, size=size).load()
        return pickle.load(file)
    except (WeightsOnlyRefusal, PickleLimitError):
        raise
    except TorchFileError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, IndexError, KeyError, TypeError, AttributeError) as error:
        raise TorchFileError(f"is a truncated or corrupt pickle ({type(error).__name__}: {error})") from None
    finally:
        if opened is not None:
            opened.close()
