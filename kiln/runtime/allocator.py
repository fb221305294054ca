"""A caching host allocator: PyTorch's CUDA caching allocator idea applied to host memory.

A large ``np.empty`` is an ``mmap`` of fresh pages, and the first write to each page faults
into the kernel; when the array dies the pages go back (``munmap``). A compiled function that
returns a large tensor on every call would pay those faults every call. ``CachingAllocator``
keeps the storage of dead arrays and hands it out again for the next request of the same size
class, already faulted in.

``empty(shape, dtype)`` returns a C-contiguous, writable, 64-byte-aligned array. Its ``base`` is
a small owner object; numpy makes every view of the array keep that owner alive, and when the
last array or view goes, the owner's finalizer returns the storage to the cache. Finalizers may
run on any thread, inside the allocator itself (a garbage collection triggered while it holds its
lock) or during interpreter shutdown, so they only push the storage on a queue and drain it
when the lock is free; every allocator call drains the queue first.

Sizes are rounded up to classes (8 per power of two, at most 1/8 wasted) so near sizes share
blocks. Cached storage is capped (``max_cached_bytes``, 1 GiB by default): beyond the cap the
least recently freed blocks are really freed.

>>> allocator = CachingAllocator()
>>> a = allocator.empty((1000,), np.float32)
>>> address = a.ctypes.data
>>> del a  # the block returns to the cache...
>>> allocator.empty((1000,), np.float32).ctypes.data == address  # ...and is handed out again
True
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Every block's data pointer is a multiple of this (a cache line; any vector load is aligned).
ALIGNMENT = 64

#: Default cap on the bytes of cached (free) blocks.
DEFAULT_MAX_CACHED_BYTES = 1 << 30

_SMALLEST_CLASS = 512


def size_class(nbytes: int) -> int:
    """The block size serving a request of ``nbytes``: 8 classes per power of two (at most 1/8 wasted).

    >>> size_class(1), size_class(4096), size_class(4097), size_class(64 << 20)
    (512, 4096, 4608, 67108864)
    """
    if nbytes <= _SMALLEST_CLASS:
        return _SMALLEST_CLASS
    step = 1 << ((nbytes - 1).bit_length() - 4)
    return (nbytes + step - 1) & -step


@dataclass(frozen=True)
class AllocatorStats:
    """Counters of one allocator: requests served from the cache (hits) or by new storage
    (misses), bytes of blocks handed out and alive, bytes of free blocks kept for reuse."""

    hits: int
    misses: int
    bytes_in_use: int
    bytes_cached: int
    blocks_cached: int


class _Block:
    """The owner of one block while arrays use it: the base of every array and view of it.

    Its ``__array_interface__`` lets numpy wrap the aligned memory; its finalizer hands the
    storage back to the allocator (an atomic append to a queue, then a drain if the lock is free).
    """

    __slots__ = ("__array_interface__", "storage", "size", "allocator")

    def __init__(self, storage: tuple, size: int, shape: tuple, typestr: str, allocator: CachingAllocator) -> None:
        self.storage = storage  # (raw array, aligned address): keeps the memory alive
        self.size = size
        self.allocator = allocator
        self.__array_interface__ = {"data": (storage[1], False), "shape": shape, "typestr": typestr, "version": 3}

    def __del__(self, _finalizing: Any = sys.is_finalizing) -> None:
        if _finalizing():  # at shutdown the memory simply goes back to the system
            return
        allocator = self.allocator
        allocator._returned.append((self.size, self.storage))  # atomic: safe on any thread
        # Take it back now if nobody holds the lock; if this thread holds it (a collection inside
        # the allocator) or another one does, the next allocator call drains the queue.
        lock = allocator._lock
        if lock.acquire(blocking=False):
            try:
                allocator._drain()
            finally:
                lock.release()


def _new_storage(size: int) -> tuple[np.ndarray, int]:
    """Fresh memory for a block of ``size`` bytes: the raw array and its first aligned address."""
    raw = np.empty(size + ALIGNMENT, np.uint8)
    address = raw.ctypes.data
    return raw, address + (-address) % ALIGNMENT


class CachingAllocator:
    """Host memory for arrays, reusing the storage of dead arrays of the same size class.

    Thread safe. ``max_cached_bytes`` may be changed at any time (lowering it frees blocks).
    """

    def __init__(self, max_cached_bytes: int = DEFAULT_MAX_CACHED_BYTES, min_cached_bytes: int = 0) -> None:
        #: Smaller requests get numpy's own memory (not cached; see ``HOST``).
        self.min_cached_bytes = int(min_cached_bytes)
        self._lock = threading.Lock()
        self._max_cached = int(max_cached_bytes)
        self._free: dict[int, list[tuple]] = {}  # size class -> storages, most recently freed last
        self._order: dict[int, int] = {}  # address -> size class of cached storage, least recent first
        self._returned: collections.deque = collections.deque()  # (size, storage) from finalizers
        self._cached = self._in_use = self._hits = self._misses = 0
        _ALLOCATORS.add(self)

    # ------------------------------------------------------------------ public
    def empty(self, shape: int | tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
        """An uninitialized C-contiguous array of ``shape`` and ``dtype``, 64-byte aligned."""
        dtype = np.dtype(getattr(dtype, "np", dtype))  # also a kiln dtype
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = 1
        for d in shape:
            if d < 0:
                raise ValueError(f"negative dimensions are not allowed, got shape {shape}")
            count *= d
        nbytes = count * dtype.itemsize
        if nbytes < self.min_cached_bytes or nbytes == 0 or dtype.hasobject or dtype.subdtype is not None:
            return np.empty(shape, dtype)  # nothing worth caching (or not plain data): numpy's own
        size = size_class(nbytes)
        storage = None
        with self._lock:
            if self._returned:
                self._drain()
            stack = self._free.get(size)
            if stack:
                storage = stack.pop()
                del self._order[storage[1]]
                self._cached -= size
                self._hits += 1
            else:
                self._misses += 1
            self._in_use += size
        if storage is None:  # outside the lock: a large allocation should not block other threads
            storage = _new_storage(size)
        array = np.asarray(_Block(storage, size, shape, dtype.str, self))
        if dtype.fields is not None:  # a structured dtype's typestr ("|V8") lacks its fields
            array = array.view(dtype)
        return array

    def stats(self) -> AllocatorStats:
        """The counters now (blocks freed by finalizers so far are counted as cached)."""
        with self._lock:
            self._drain()
            blocks = sum(len(stack) for stack in self._free.values())
            return AllocatorStats(self._hits, self._misses, self._in_use, self._cached, blocks)

    def empty_cache(self) -> None:
        """Free every cached block (blocks in use are untouched and come back when freed)."""
        with self._lock:
            self._drain()
            self._free.clear()
            self._order.clear()
            self._cached = 0

    @property
    def max_cached_bytes(self) -> int:
        return self._max_cached

    @max_cached_bytes.setter
    def max_cached_bytes(self, value: int) -> None:
        with self._lock:
            self._max_cached = int(value)
            self._drain()
            self._evict(0)

    # ------------------------------------------------------------------ internals (lock held)
    def _drain(self) -> None:
        """Take back the storage that finalizers returned."""
        returned = self._returned
        while returned:
            size, storage = returned.popleft()
            self._in_use -= size
            if size > self._max_cached:
                continue  # dropped: numpy frees it
            self._evict(size)
            self._free.setdefault(size, []).append(storage)
            self._order[storage[1]] = size
            self._cached += size

    def _evict(self, room: int) -> None:
        """Free least recently cached blocks until ``room`` more bytes fit under the cap."""
        while self._order and self._cached + room > self._max_cached:
            address = next(iter(self._order))
            size = self._order.pop(address)
            stack = self._free[size]
            stack.pop(next(i for i, storage in enumerate(stack) if storage[1] == address))
            self._cached -= size

    def _after_fork(self) -> None:
        # The lock may have been held by a thread that does not exist in the child.
        self._lock = threading.Lock()


_ALLOCATORS: weakref.WeakSet[CachingAllocator] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for allocator in list(_ALLOCATORS):
        allocator._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)

#: The process's host allocator: compiled programs take their outputs from it.
#: The default allocator. Below 1 MiB it hands out numpy's own memory: glibc's heap recycles small
#: blocks without page faults (measured: no gain below 32 MiB), and the cache's bookkeeping (about
#: 2.7 us per allocate-and-free) would cost more than it saves on a compiled call's small outputs.
HOST = CachingAllocator(min_cached_bytes=1 << 20)


def empty(shape: int | tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
    """``HOST.empty(shape, dtype)``: an uninitialized array from the default caching allocator."""
    return HOST.empty(shape, dtype)
