"""One thread's state for running a compiled program: its arena and its kernels' pointer tables.

Two threads calling one compiled function never share a ``Frame``: each has its arena (the memory
plan's intermediates), the arena's views in a template environment, and a pointer table per
kernel with the arena addresses filled in once. ``PointerTables`` also remembers the program's
input arrays of the last call, so a kernel refills its inputs' pointers only when they changed.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..ir.graph import Value

#: The arena's alignment in bytes: a cache line, and an AVX-512 vector.
ALIGNMENT = 64

# A numpy array's data pointer sits right after the object header (PyArrayObject_fields.data);
# reading it there costs 0.1 us where ``array.ctypes.data`` costs 0.9 us. Checked at import.
_DATA_OFFSET = object.__basicsize__
_probe = np.arange(4.0)[1:]
if ctypes.c_void_p.from_address(id(_probe) + _DATA_OFFSET).value != _probe.ctypes.data:  # pragma: no cover

    def data_pointer(array: np.ndarray) -> int | None:
        return array.ctypes.data
else:
    _from_address = ctypes.c_void_p.from_address

    def data_pointer(array: np.ndarray) -> int | None:
        return _from_address(id(array) + _DATA_OFFSET).value


del _probe


class Frame:
    """One thread's arena, its views and the kernels' pointer tables with arena addresses filled in."""

    def __init__(self, plan: Any, slots: Mapping[Value, int], constants: Sequence[tuple[int, np.ndarray]],
                 tables: Sequence[tuple[int, tuple, bool, tuple[int, ...]]]) -> None:  # fmt: skip
        """``plan``: the memory plan (None: no arena); ``slots``: each value's slot in a call's
        environment; ``constants``: (slot, array) pairs; ``tables``: per kernel, its number of
        pointers, the (position, slot) pairs of its arena values, whether a status word follows,
        and the symbolic sizes written after the pointers (before the status word)."""
        template: list[Any] = [None] * len(slots)
        for slot, array in constants:
            template[slot] = array
        self.arena = None
        if plan is not None and plan.offsets:  # also when all are empty: size-0 values get their views
            raw = np.empty(plan.arena_bytes + ALIGNMENT, np.uint8)
            start = (-raw.ctypes.data) % ALIGNMENT
            self.arena = raw[start : start + plan.arena_bytes]
            for value, offset in plan.offsets.items():
                t = value.type
                nbytes = t.dtype.itemsize * int(np.prod(t.shape, dtype=np.int64))
                template[slots[value]] = self.arena[offset : offset + nbytes].view(t.dtype.np).reshape(t.shape)
        self.template = template
        self.tables = PointerTables()
        for size, static, status, sizes in tables:
            table = PointerTable((ctypes.c_void_p * (size + len(sizes) + status))())
            for position, slot in static:
                table.pointers[position] = data_pointer(template[slot])
            for k, n in enumerate(sizes):  # an i64 where a pointer would be (symbolic.symbol_size)
                table.pointers[size + k] = n
            if status:
                table.pointers[size + len(sizes)] = ctypes.addressof(table.status)
            self.tables.append(table)


class PointerTable:
    """A kernel's pointer table in one thread, and the token of the inputs whose pointers it holds
    (``KernelCall.stable``; see ``PointerTables``)."""

    __slots__ = ("pointers", "seen", "status")

    def __init__(self, pointers) -> None:
        self.pointers = pointers
        self.seen: object = None
        self.status = ctypes.c_int64(0)  # the kernel's status word (``Kernel.status``)


class PointerTables(list):
    """One thread's pointer tables, and a token that stands for the program's input arrays: the
    same object while the inputs are the same arrays as at the last call, a new one otherwise.

    ``see(inputs)`` keeps the inputs' ids until one of those arrays dies: while they all live, no
    other object has one of their ids, so the same ids at the next call are the same arrays. One
    comparison of a tuple of ints a call for the whole program (an Adam step over 100 parameters
    reads 500 arrays), where each kernel gathered and compared the ids of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.token: object = object()
        self._ids: tuple | None = None
        self._refs: list = []

    def see(self, inputs: Sequence[Any]) -> None:
        ids = tuple(map(id, inputs))
        if ids == self._ids:
            return
        self.forget()
        try:
            self._refs = [weakref.ref(a, self._died) for a in inputs]
        except TypeError:  # an input without weak references: new pointers every call
            return
        self._ids = ids

    def forget(self) -> None:
        """The inputs' arrays are not those of the last fill: every table refills its pointers."""
        self._ids = None
        self.token = object()

    def _died(self, _ref) -> None:
        self._ids = None
