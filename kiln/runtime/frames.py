"""One thread's state for running a compiled program: its arena and its kernels' pointer tables.

Two threads calling one compiled function never share a ``Frame``: each has its arena (the memory
plan's intermediates), the arena's views in a template environment, and a pointer table per
kernel with the arena addresses filled in once. ``PointerTables`` also remembers the program's
input arrays of the last call, so a call refills the pointers of the inputs that changed alone.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, count
from operator import itemgetter, ne
from typing import Any

import numpy as np

from ..ir.graph import Value

#: The arena's alignment in bytes: a cache line, and an AVX-512 vector.
ALIGNMENT = 64

# A numpy array's data pointer sits right after the object header (PyArrayObject_fields.data);
# reading it there costs 0.1 us where ``array.ctypes.data`` costs 0.9 us. Checked at import.
_DATA_OFFSET = object.__basicsize__
_probe = np.arange(4.0)[1:]
#: ``_DATA_OFFSET`` where the check held, else None: a caller in a hot loop may read the pointer
#: itself (``from_address(id(array) + DATA_OFFSET).value``) without the function call.
DATA_OFFSET: int | None = _DATA_OFFSET
if ctypes.c_void_p.from_address(id(_probe) + _DATA_OFFSET).value != _probe.ctypes.data:  # pragma: no cover
    DATA_OFFSET = None

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
                 tables: Sequence[tuple[int, tuple, bool, tuple[int, ...]]],
                 users: Sequence[tuple[tuple[int, int], ...]] = ()) -> None:  # fmt: skip
        """``plan``: the memory plan (None: no arena); ``slots``: each value's slot in a call's
        environment; ``constants``: (slot, array) pairs; ``tables``: per kernel, its number of
        pointers, the (position, slot) pairs of its arena values, whether a status word follows,
        and the symbolic sizes written after the pointers (before the status word); ``users``: per
        program input, the (table, position) pairs of its pointer (``PointerTables``)."""
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
        self.tables = PointerTables(users)
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
    """A kernel's pointer table in one thread, and its status word (``Kernel.status``)."""

    __slots__ = ("pointers", "status")

    def __init__(self, pointers) -> None:
        self.pointers = pointers
        self.status = ctypes.c_int64(0)


class PointerTables(list):
    """One thread's pointer tables, and the program's input arrays whose pointers they hold.

    ``users[i]``: the ``(table, position)`` pairs that hold input ``i``'s data pointer (the kernels'
    ``KernelCall.stable``). ``see(inputs)`` refills those of the inputs that are other arrays than
    at the last call, and keeps those inputs' ids (of the inputs some table holds) until one of those arrays dies: while they all live,
    no other object has one of their ids, so the same id at the next call is the same array, whose
    data pointer is fixed for its life. A training step whose batch is new every call refills the
    batch's pointers alone, not those of its parameters and optimizer state (an MLP step: 4 of 52)."""

    def __init__(self, users: Sequence[tuple[tuple[int, int], ...]] = ()) -> None:
        super().__init__()
        self.users = users
        # Only the inputs some table holds are compared: a loop body's carried and per-iteration
        # inputs are new arrays at every trip, and its kernels read them from the environment
        # (``CompiledProgram.vary_inputs``); comparing them made every trip refill and re-remember.
        self._watched = tuple(i for i, pairs in enumerate(users) if pairs)
        self._pick = itemgetter(*self._watched) if len(self._watched) > 1 else None
        self._ids: tuple | None = None
        self._refs: list = []

    def see(self, inputs: Sequence[Any]) -> None:
        watched, pick = self._watched, self._pick
        if pick is not None:
            picked = pick(inputs)
        elif watched:
            picked = (inputs[watched[0]],)
        else:
            return
        ids = tuple(map(id, picked))
        last = self._ids
        if ids == last:
            return
        if last is None or len(last) != len(ids):
            changed: Iterable[int] = range(len(ids))
            self._refs = [None] * len(ids)
        else:  # the positions whose id differs, in C loops
            changed = compress(count(), map(ne, ids, last))
        remembered, refs, users = True, self._refs, self.users
        for k in changed:
            i = watched[k]
            pairs = users[i]
            array = inputs[i]
            pointer = data_pointer(array)
            for table, position in pairs:
                self[table].pointers[position] = pointer
            try:
                refs[k] = weakref.ref(array, self._died)
            except TypeError:  # an input without weak references: new pointers every call
                remembered = False
        self._ids = ids if remembered else None

    def _died(self, _ref) -> None:
        self._ids = None
