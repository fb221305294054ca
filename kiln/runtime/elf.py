"""Relocatable ELF objects for x86-64 Linux, loaded into executable memory without LLVM.

A program loaded from the disk cache needs its machine code and nothing else of LLVM, yet
loading an object through llvmlite's MCJIT first loads the 180 MB ``libllvmlite`` and its Python
bindings: 25 to 50 ms of a fresh process, a third of a warm-cache compile. The objects kiln emits
are small and plain (position-independent code, constant pools, at most a few calls into the C
library such as ``memset``), so this module loads them itself:

- the allocated sections of every object are laid out in fresh pages, executable ones first,
  then read-only ones, then writable ones, each group page-aligned and each section at its
  alignment;
- symbols resolve to their section's address; an undefined one to a global of another of the
  objects, else to the process's symbol of that name (``dlsym``), reached through a stub
  (``jmp *slot(%rip)``) and a GOT slot in the same pages, so a 32-bit displacement always reaches;
- the relocations x86-64 position-independent code uses are applied (64-bit absolute, 32- and
  64-bit PC-relative, PLT32 and the GOT-relative ones); the pages are then made read+execute and
  read-only where they are not data.

Anything else -- another machine or byte order, a relocation type not listed, a thread-local or
common symbol, a symbol the process does not have, a displacement that does not fit -- raises
``Unsupported`` before any code is mapped executable, and the caller loads through LLVM instead.

>>> supported() in (True, False)
True
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import struct
import sys
import weakref
from typing import NamedTuple

__all__ = ["LoadedObjects", "Unsupported", "supported"]


class Unsupported(Exception):
    """The objects use something this loader does not do; load them through LLVM instead."""


def supported() -> bool:
    """Whether this process can use the loader at all (x86-64 Linux)."""
    return sys.platform.startswith("linux") and os.uname().machine.lower() in ("x86_64", "amd64")


_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")
_U64, _I32, _I64 = struct.Struct("<Q"), struct.Struct("<i"), struct.Struct("<q")

_ET_REL, _EM_X86_64 = 1, 62
_SHT_SYMTAB, _SHT_RELA, _SHT_NOBITS, _SHT_REL = 2, 4, 8, 9
_SHF_WRITE, _SHF_ALLOC, _SHF_EXECINSTR, _SHF_TLS = 0x1, 0x2, 0x4, 0x400
_SHN_UNDEF, _SHN_LORESERVE, _SHN_ABS = 0, 0xFF00, 0xFFF1
_STB_GLOBAL, _STB_WEAK = 1, 2
_STT_TLS = 6

# x86-64 relocation types (System V ABI, AMD64 supplement)
_R_NONE, _R_64, _R_PC32, _R_PLT32, _R_GOTPCREL, _R_PC64, _R_GOTPCRELX, _R_REX_GOTPCRELX = 0, 1, 2, 4, 9, 24, 41, 42
_GOT_RELATIVE = (_R_GOTPCREL, _R_GOTPCRELX, _R_REX_GOTPCRELX)
_STUB = bytes.fromhex("ff2500000000")  # jmp *0(%rip): the 8-byte target follows the instruction
_STUB_BYTES = 16  # the jump, its 8-byte target, 2 bytes of padding

_EXECUTE, _READ, _WRITE = 0, 1, 2  # page groups, in layout order
_PAGE = mmap.PAGESIZE


class _Section:
    """An allocated section: its group, its bytes (None: zero-filled, .bss), and its offset once laid out."""

    __slots__ = ("align", "data", "kind", "name", "offset", "size")

    def __init__(self, name: str, kind: int, data: bytes | None, size: int, align: int) -> None:
        self.name, self.kind, self.data, self.size, self.align, self.offset = name, kind, data, size, align, 0


class _Symbol(NamedTuple):
    name: str
    bind: int
    section: int  # its section index in the object (or _SHN_UNDEF, _SHN_ABS)
    value: int


class _Object(NamedTuple):
    sections: dict[int, _Section]  # the allocated ones, by section index
    symbols: list[_Symbol]
    relocations: list[tuple[int, list[tuple[int, int, int, int]]]]  # (section, [(offset, type, symbol, addend)])


def _parse(data: bytes, which: int) -> _Object:
    try:
        return _parse_headers(data, which)
    except (struct.error, IndexError, ValueError, ZeroDivisionError) as error:  # offsets past the end
        raise Unsupported(f"object {which} is malformed ({type(error).__name__}: {error})") from None


def _parse_headers(data: bytes, which: int) -> _Object:
    if len(data) < _EHDR.size or data[:4] != b"\x7fELF":
        raise Unsupported(f"object {which} is not ELF")
    ident, e_type, machine, _, _, _, shoff, _, _, _, _, shentsize, shnum, shstrndx = _EHDR.unpack_from(data)
    if ident[4] != 2 or ident[5] != 1 or e_type != _ET_REL or machine != _EM_X86_64:
        raise Unsupported(f"object {which} is not a little-endian 64-bit x86-64 relocatable object")
    if shentsize != _SHDR.size or shoff + shnum * shentsize > len(data):
        raise Unsupported(f"object {which} has malformed section headers")
    headers = [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx]

    def string(table: tuple, offset: int) -> str:
        start = table[4] + offset
        return data[start : data.index(b"\0", start)].decode()

    sections: dict[int, _Section] = {}
    symbols: list[_Symbol] = []
    relocations = []
    for index, (name, kind, flags, _, offset, size, link, info, align, entsize) in enumerate(headers):
        if kind == _SHT_REL:
            raise Unsupported("REL relocations (x86-64 objects use RELA)")
        if flags & _SHF_ALLOC and size:
            if flags & _SHF_TLS:
                raise Unsupported(f"thread-local section {string(names, name)}")
            group = _EXECUTE if flags & _SHF_EXECINSTR else _WRITE if flags & _SHF_WRITE else _READ
            if kind != _SHT_NOBITS and offset + size > len(data):
                raise Unsupported(f"object {which}: section {string(names, name)} runs past the end")
            content = None if kind == _SHT_NOBITS else data[offset : offset + size]
            sections[index] = _Section(string(names, name), group, content, size, max(align, 1))
        elif kind == _SHT_SYMTAB:
            strings = headers[link]
            for i in range(size // entsize):
                st_name, st_info, _, shndx, value, _ = _SYM.unpack_from(data, offset + i * entsize)
                if st_info & 0xF == _STT_TLS:
                    raise Unsupported("a thread-local symbol")
                symbols.append(_Symbol(string(strings, st_name), st_info >> 4, shndx, value))
        elif kind == _SHT_RELA:
            entries = [_RELA.unpack_from(data, offset + i * entsize) for i in range(size // entsize)]
            relocations.append((info, [(off, inf & 0xFFFFFFFF, inf >> 32, addend) for off, inf, addend in entries]))
    return _Object(sections, symbols, relocations)


class LoadedObjects:
    """The objects' code in executable memory; ``address(name)`` gives a global function's entry.

    The pages are unmapped when this object is collected: whoever calls a function pointer taken
    from it keeps a reference to it.
    """

    def __init__(self, objects: list[bytes]) -> None:
        if not supported():
            raise Unsupported(
                f"kiln loads ELF objects itself on x86-64 Linux only, not {sys.platform} {os.uname().machine}"
            )
        self._objects = [_parse(data, i) for i, data in enumerate(objects)]
        self._defined = {
            s.name: (k, s)
            for k, obj in enumerate(self._objects)
            for s in obj.symbols
            if s.bind in (_STB_GLOBAL, _STB_WEAK) and s.section != _SHN_UNDEF and s.name
        }
        self._externals: dict[str, int] = {}  # name -> its address in the process, in stub order
        self._slots: dict[object, int] = {}  # GOT slot of each symbol reached through the GOT
        for k, obj in enumerate(self._objects):
            for _, entries in obj.relocations:
                for _, kind, index, _ in entries:
                    symbol = obj.symbols[index]
                    if self._is_external(symbol) and symbol.name not in self._externals:
                        self._externals[symbol.name] = _process_symbol(symbol.name)
                    if kind in _GOT_RELATIVE:
                        self._slots.setdefault(self._slot_key(k, index), len(self._slots))
        size, self._starts = self._lay_out()
        self._base = _map(size)
        # The C function itself, not a module function that looks it up: a library collected while the
        # interpreter shuts down finds this module's globals already None ('NoneType' object is not
        # callable, printed at the exit of a real program whose background compile was still loading).
        self._finalizer = weakref.finalize(self, _libc().munmap, self._base, size)
        image = self._image(size)
        self._symbols = {name: self._address(k, s) for name, (k, s) in self._defined.items()}
        ctypes.memmove(self._base, bytes(image), size)
        execute, read, write = (self._base + start for start in self._starts)
        _protect(execute, read - execute, mmap.PROT_READ | mmap.PROT_EXEC)
        _protect(read, write - read, mmap.PROT_READ)

    def address(self, name: str) -> int:
        try:
            return self._symbols[name]
        except KeyError:
            raise KeyError(f"the compiled library has no function {name!r}") from None

    # ------------------------------------------------------------------------- building the image
    def _is_external(self, symbol: _Symbol) -> bool:
        return symbol.section == _SHN_UNDEF and symbol.name not in self._defined

    def _slot_key(self, k: int, index: int) -> object:
        symbol = self._objects[k].symbols[index]
        return symbol.name if symbol.bind in (_STB_GLOBAL, _STB_WEAK) else (k, index)

    def _lay_out(self) -> tuple[int, list[int]]:
        """Give every section its offset: groups in order, each page-aligned; the stubs lead the
        executable group and the GOT slots the read-only one. The image's size and each group's start."""
        starts, end = [], 0
        reserved = {_EXECUTE: len(self._externals) * _STUB_BYTES, _READ: len(self._slots) * 8, _WRITE: 0}
        for group in (_EXECUTE, _READ, _WRITE):
            end = _round_up(end, _PAGE)
            starts.append(end)
            end += reserved[group]
            for obj in self._objects:
                for section in obj.sections.values():
                    if section.kind == group:
                        section.offset = _round_up(end, section.align)
                        end = section.offset + section.size
        return max(_round_up(end, _PAGE), _PAGE), starts

    def _image(self, size: int) -> bytearray:
        """The pages' bytes: stubs, GOT slots and sections, relocated for this mapping."""
        image = bytearray(size)
        for i, target in enumerate(self._externals.values()):
            stub = self._starts[_EXECUTE] + i * _STUB_BYTES
            image[stub : stub + len(_STUB)] = _STUB
            _U64.pack_into(image, stub + len(_STUB), target)
        for k, obj in enumerate(self._objects):
            for index, symbol in enumerate(obj.symbols):
                slot = self._slots.get(self._slot_key(k, index))
                if slot is not None:
                    _U64.pack_into(image, self._starts[_READ] + 8 * slot, self._address(k, symbol, data=True))
            for section in obj.sections.values():
                if section.data is not None:
                    image[section.offset : section.offset + section.size] = section.data
            for target, entries in obj.relocations:
                relocated = obj.sections.get(target)
                if relocated is not None:  # else a section that is not loaded (debug information)
                    for offset, kind, index, addend in entries:
                        self._relocate(image, relocated.offset + offset, kind, k, index, addend)
        return image

    def _relocate(self, image: bytearray, at: int, kind: int, k: int, index: int, addend: int) -> None:
        symbol = self._objects[k].symbols[index]
        place = self._base + at
        if kind == _R_NONE:
            return
        if kind == _R_64:
            _U64.pack_into(image, at, (self._address(k, symbol, data=True) + addend) % 2**64)
        elif kind == _R_PC32:
            _pack_i32(image, at, self._address(k, symbol, data=True) + addend - place, symbol.name)
        elif kind == _R_PLT32:
            _pack_i32(image, at, self._address(k, symbol) + addend - place, symbol.name)
        elif kind == _R_PC64:
            _I64.pack_into(image, at, self._address(k, symbol, data=True) + addend - place)
        elif kind in _GOT_RELATIVE:
            slot = self._base + self._starts[_READ] + 8 * self._slots[self._slot_key(k, index)]
            _pack_i32(image, at, slot + addend - place, symbol.name)
        else:
            raise Unsupported(f"x86-64 relocation type {kind} (against {symbol.name!r})")

    def _address(self, k: int, symbol: _Symbol, data: bool = False) -> int:
        """Where ``symbol`` (of object ``k``) is; a function of the process is reached through its
        stub unless ``data`` asks for the symbol's own address."""
        if symbol.section == _SHN_UNDEF:
            if symbol.name in self._defined:
                return self._address(*self._defined[symbol.name], data=data)
            if data:
                return self._externals[symbol.name]
            stub = list(self._externals).index(symbol.name)
            return self._base + self._starts[_EXECUTE] + stub * _STUB_BYTES
        if symbol.section == _SHN_ABS:
            return symbol.value
        section = self._objects[k].sections.get(symbol.section)
        if symbol.section >= _SHN_LORESERVE or section is None:
            raise Unsupported(f"symbol {symbol.name!r} is in section {symbol.section:#x}, which is not loaded")
        return self._base + section.offset + symbol.value


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pack_i32(image: bytearray, at: int, value: int, name: str) -> None:
    if not -(2**31) <= value < 2**31:
        raise Unsupported(f"a 32-bit displacement to {name!r} does not fit ({value:#x})")
    _I32.pack_into(image, at, value)


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)  # the process: the C library and whatever it loaded
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc


_MAP_FAILED = ctypes.c_void_p(-1).value


def _process_symbol(name: str) -> int:
    try:
        function = getattr(_libc(), name)
    except AttributeError:
        raise Unsupported(f"the process has no symbol {name!r}") from None
    address = ctypes.cast(function, ctypes.c_void_p).value
    if not address:
        raise Unsupported(f"the process's symbol {name!r} has no address")
    return address


def _map(size: int) -> int:
    address = _libc().mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if address in (None, _MAP_FAILED):
        raise Unsupported(f"mmap of {size} bytes failed (errno {ctypes.get_errno()})")
    return address


def _protect(address: int, size: int, protection: int) -> None:
    if size and _libc().mprotect(address, size, protection) != 0:
        raise Unsupported(f"mprotect failed (errno {ctypes.get_errno()}): executable pages refused?")
