"""``get_unsafe_globals_in_checkpoint``: which globals a file names that a weights-only load would refuse.

As PyTorch's ``torch.serialization.get_unsafe_globals_in_checkpoint`` (2.5+): the pickle is read
statically (disassembled, never run), and every global it names (``GLOBAL``, or ``STACK_GLOBAL`` on two
strings just pushed) that is not allowed (kiln's defaults, the format's rebuilders, what the user added
with ``add_safe_globals``/``safe_globals``) is listed once as ``"module.name"``, sorted. A global that
the pickle builds at run time is not seen, as in PyTorch. Python 2 names are mapped as the loader maps
them. Besides PyTorch zip files this reads PyTorch's legacy files, plain pickles and kiln's own files
(their pickled parts); a file without any pickle gives ``[]``.

>>> import io, pickle, collections
>>> get_unsafe_globals_in_checkpoint(io.BytesIO(pickle.dumps(collections.OrderedDict(a=1))))
[]
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickletools
import zipfile
from typing import IO, Any

from ..ir.tensor_file import TORCH_LEGACY_MAGIC, TensorFileError, read_tensor_file
from .restricted import allowed_global, python3_name
from .unpickler import BoundedReader, stream_size

__all__ = ["get_unsafe_globals_in_checkpoint", "globals_in_pickle"]

_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING", "SHORT_BINSTRING"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}


def globals_in_pickle(reader: Any) -> set[str]:
    """The ``module.name`` of every global one pickle names, read up to its STOP (``reader``: read/readline)."""
    found: set[str] = set()
    pushed: list[Any] = []  # what each opcode pushed: a string, or None for anything else
    memo: dict[int, Any] = {}
    proto = 0
    arg: Any  # its type depends on the opcode
    for opcode, arg, _ in pickletools.genops(reader):
        name = opcode.name
        if name == "PROTO":
            proto = arg
        elif name == "GLOBAL":
            module, _, attr = arg.partition(" ")
            found.add(".".join(python3_name(module, attr, proto)))
        elif (
            name == "STACK_GLOBAL" and len(pushed) >= 2 and isinstance(pushed[-1], str) and isinstance(pushed[-2], str)
        ):
            found.add(".".join(python3_name(pushed[-2], pushed[-1], proto)))
        if name in _PUTS or name == "MEMOIZE":
            memo[arg if name in _PUTS else len(memo)] = pushed[-1] if pushed else None
        elif name in _GETS:
            pushed.append(memo.get(arg))
        else:
            pushed.append(arg if name in _STRINGS else None)
        del pushed[:-2]
    return found


def get_unsafe_globals_in_checkpoint(f: str | os.PathLike | IO[bytes]) -> list[str]:
    """The globals in a checkpoint that ``kiln.load(f)`` (weights_only=True) would refuse, as
    ``"module.name"`` strings, sorted; ``ValueError`` when ``f`` is no file kiln reads."""
    if isinstance(f, str | os.PathLike):
        with open(os.fspath(f), "rb") as stream:
            return _unsafe(stream, repr(os.fspath(f)))
    return _unsafe(f, "the given file object")


def _unsafe(stream: IO[bytes], source: str) -> list[str]:
    if stream_size(stream) is None:
        stream = io.BytesIO(stream.read())
    start = stream.tell()
    head = stream.read(16)
    stream.seek(start)
    try:
        if head.startswith(b"PK\x03\x04"):
            found, extra = _zip_globals(stream), _torch_names()
        elif head[:1] == b"\x80" and head[4:14] == TORCH_LEGACY_MAGIC:
            reader = BoundedReader(stream, stream_size(stream) or 0)
            found, extra = set().union(*(globals_in_pickle(reader) for _ in range(4))), _torch_names()
        elif head[:1] == b"\x80":
            found, extra = globals_in_pickle(BoundedReader(stream, stream_size(stream) or 0)), {}
        else:
            found, extra = _kiln_globals(stream), {}
    except (ValueError, zipfile.BadZipFile, EOFError) as error:
        if isinstance(error, TensorFileError):
            raise ValueError(f"get_unsafe_globals_in_checkpoint: {source} {error}") from None
        raise ValueError(f"get_unsafe_globals_in_checkpoint: {source} is not a checkpoint kiln can read "
                         f"({type(error).__name__}: {error})") from None  # fmt: skip
    return sorted(name for name in found if allowed_global(name, extra) is None)


def _torch_names() -> dict[str, Any]:
    from .torch_format import _Reader  # noqa: PLC0415 - torch_format imports restricted, as this module does

    return _Reader(lambda *_: None, lambda t, _: t).rebuilders()  # type: ignore[arg-type]  # nothing is read


def _zip_globals(stream: IO[bytes]) -> set[str]:
    from .torch_format import TorchFileError, _ZipBudget  # noqa: PLC0415

    size = stream_size(stream) or 0
    archive = zipfile.ZipFile(stream)
    pickles = [name for name in archive.namelist() if name.endswith("data.pkl") and name.count("/") == 1]
    if len(pickles) != 1:
        raise TorchFileError("is a zip archive without exactly one <name>/data.pkl; not a torch.save checkpoint")
    info = archive.getinfo(pickles[0])
    _ZipBudget(size).charge(info)
    with archive.open(info) as data:
        return globals_in_pickle(BoundedReader(data, info.file_size))


def _kiln_globals(stream: IO[bytes]) -> set[str]:
    meta, _ = read_tensor_file(stream)
    if "kiln.format" not in meta:
        return set()  # a plain safetensors file: no pickle in it
    found: set[str] = set()
    nodes = [json.loads(meta.get("kiln.structure", "null"))]
    while nodes:
        node = nodes.pop()
        if isinstance(node, list):
            nodes += node
        elif isinstance(node, dict):
            if isinstance(node.get("pickle"), str):
                data = base64.b64decode(node["pickle"], validate=True)
                found |= globals_in_pickle(BoundedReader(io.BytesIO(data), len(data)))
            else:
                nodes += node.values()
    return found
