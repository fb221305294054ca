"""Compiled kernels in the on-disk cache, one entry per kernel: a kernel compiles once per machine.

The program cache (``kiln.compiler.program_cache``) stores whole programs; a program that differs
anywhere (a second specialization, another length of an unrolled loop, another model reusing a
block) misses it, though most of its kernels were compiled before. So the LLVM backend also keeps
each kernel's object code under a key of what decides that code -- the kernel's canonical
structure (``kernel_text``: its kind, its bodies' ops, how they connect, dtypes, shapes and
attributes, but not its name nor its values' numbers), the inputs' layouts, the host signature
(LLVM, CPU, features), the optimization level, and a digest of kiln's code generator, IR and
runtime -- and looks there before it generates a kernel.

A kernel's function is named after its key (``symbol``, ``renamed``), so kernels from different
entries load side by side in one program. LLVM compiles several kernels to a module
(``kernel_modules``): the module's object code is an entry of its own, under a digest of its bytes
(``module_key``), and a kernel's entry holds its ``KernelInfo`` and that key. An entry that does not
decode, or whose module's object is missing or not the one named, is a miss: the kernel is compiled
and stored again.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from collections.abc import Sequence

from ...ir.graph import KERNEL, Node, structure_key
from ...ir.types import Sym, parse_dim
from ...runtime.cache import DiskCache, cache_key, default_cache, kernels_of, source_digest
from ..kernel_dag import VIEWS
from . import host
from .kernel_info import KernelInfo

#: Bump when the layout of an entry changes.
ENTRY_FORMAT = 2

_LENGTH = struct.Struct("<Q")
_MODULE_KEY = re.compile(r"[0-9a-f]{64}")  # a module's key in a kernel's entry (``module_key``)


def kernel_cache() -> DiskCache:
    """The cache of compiled kernels: the folder ``kernels`` of the process's cache directory."""
    return kernels_of(default_cache())


def kernel_text(node: Node, layouts: Sequence[tuple[int, ...]]) -> str:
    """What decides the code of kernel (or compiled primitive) ``node`` for inputs with element
    strides ``layouts``, as text: equal for the steps of an unrolled loop, whose values differ."""
    attrs = tuple((k, v) for k, v in node.attr_key() if k not in ("name", "bodies"))
    parts: list = [node.op, attrs, [tuple(s) for s in layouts]]
    parts.append([(v.type.shape, v.type.dtype.name) for v in (*node.inputs, *node.outputs)])
    if node.op == KERNEL:
        for body in node.attrs.get("bodies", ()):
            views = [n.attr_key() for n in body.nodes if n.op in VIEWS]  # structure_key leaves their attributes out
            parts.append((structure_key(body), [v.type.shape for v in body.values()], views))
    return repr(parts)


def kernel_key(text: str) -> str:
    """The cache key of a kernel of ``kernel_text`` ``text`` on this host."""
    from . import engine  # noqa: PLC0415 - the optimization level; LLVM is loaded to compile anyway

    return cache_key(
        "kiln kernel",
        str(ENTRY_FORMAT),
        source_digest("ir", "codegen", "runtime"),
        host.signature(),
        f"O{engine.OPT_LEVEL}, pipeline O{engine.PIPELINE_LEVEL}",
        text,
    )


def symbol(key: str) -> str:
    """The name of the kernel's function: unique per key, so entries load side by side."""
    return f"kiln_k{key[:24]}"


def renamed(ir_text: str, info: KernelInfo, name: str) -> tuple[str, KernelInfo]:
    """The module of one kernel with its function named ``name`` (the generator names a kernel
    after its node, a compiled primitive after its op: the same name in many modules). llvmlite
    writes every reference to a global quoted (``@"kiln_k3"``): those are replaced as they are, without
    a pattern compiled per kernel (DCGAN's 60 kernels: 6.1 -> 1.2 ms of the generator's ~130 ms); a text
    that names it unquoted too is searched with the pattern."""
    quoted = f'@"{info.symbol}"'
    if f"@{info.symbol}" not in ir_text:
        count = ir_text.count(quoted)
        text = ir_text.replace(quoted, f"@{name}")
    else:
        pattern = re.compile(rf'@"?{re.escape(info.symbol)}"?(?![\w.$"])')
        text, count = pattern.subn(f"@{name}", ir_text)
    assert count >= 1, f"the kernel's function {info.symbol} is not in its module"
    return text, dataclasses.replace(info, symbol=name)


def module_key(code: bytes) -> str:
    """The cache key of a module's object code ``code``: a digest of the bytes themselves, so an entry
    read back under it is checked against it (``module_of``)."""
    return cache_key("kiln kernel module", str(ENTRY_FORMAT), code)


def module_of(payload: bytes | None, key: str) -> bytes | None:
    """The object code of the module entry ``payload`` read under ``key`` (None when it is missing or
    holds other bytes)."""
    return payload if payload is not None and module_key(payload) == key else None


def to_entry(info: KernelInfo, module: str) -> bytes:
    """The entry of a kernel: its ``KernelInfo`` (``info_record``) and the key of its module's object code."""
    data = json.dumps(info_record(info)).encode()
    return _LENGTH.pack(len(data)) + data + module.encode()


def info_record(info: KernelInfo) -> list:
    """``info`` as a JSON list: its symbol, extent and work bytes, and for a kernel over symbolic sizes
    the sizes it reads and how its units and work follow them, each size as its text. A program's
    stored code (``LLVMBackend.encode``) holds these records too."""
    record: list = [info.symbol, info.fixed_extent, info.fixed_work_bytes]
    if info.symbols:
        terms = [[[str(d) for d in dims], itemsize] for dims, itemsize in info.work_terms]
        record += [[str(s) for s in info.symbols], info.rows_per_size, info.rows_per_unit, info.bytes_per_size, terms]
    return record


def info_from_record(record: object) -> KernelInfo:
    """The ``KernelInfo`` of ``info_record``'s list (``ValueError`` for one that does not decode)."""
    if not isinstance(record, list) or len(record) not in (3, 8):
        raise ValueError("a kernel's record is not (symbol, extent, work bytes[, its symbolic sizes])")
    symbol_name, extent, work = record[:3]
    if not isinstance(symbol_name, str) or not isinstance(extent, int) or not isinstance(work, int):
        raise ValueError("a kernel's record is not (symbol, extent, work bytes)")
    return KernelInfo(symbol_name, extent, work, *_symbolic_fields(record[3:]))


def from_entry(payload: bytes, key: str | None = None) -> tuple[KernelInfo, str]:
    """The kernel's ``KernelInfo`` and its module's key (``ValueError`` for an entry that does not
    decode, or whose function is not the one named after ``key``)."""
    if len(payload) < _LENGTH.size:
        raise ValueError("truncated kernel entry")
    (size,) = _LENGTH.unpack_from(payload)
    end = _LENGTH.size + size
    info = info_from_record(json.loads(payload[_LENGTH.size : end]))
    module = payload[end:].decode("ascii", errors="replace")
    if not _MODULE_KEY.fullmatch(module):
        raise ValueError("a kernel entry without its module's key")
    if key is not None and info.symbol != symbol(key):
        raise ValueError(f"a kernel entry for {info.symbol}, not {symbol(key)}")
    return info, module


def _symbolic_fields(fields: list) -> tuple:
    """``KernelInfo``'s fields after the first three, from an entry's record (none for a static kernel)."""
    if not fields:
        return ()
    names, per_size, per_unit, bytes_per_size, terms = fields
    try:
        symbols = tuple(parse_dim(name) for name in names)
        work_terms = tuple((tuple(parse_dim(str(d)) for d in dims), int(itemsize)) for dims, itemsize in terms)
    except (TypeError, ValueError) as error:
        raise ValueError(f"a kernel entry's symbolic sizes do not parse: {error}") from error
    if not symbols or not all(isinstance(s, Sym) for s in symbols):
        raise ValueError(f"a kernel entry's symbolic sizes are not symbols: {names!r}")
    if not all(isinstance(n, int) for n in (per_size, per_unit, bytes_per_size)) or per_unit < 1:
        raise ValueError("a kernel entry's units per size are not whole numbers")
    return symbols, per_size, per_unit, bytes_per_size, work_terms
