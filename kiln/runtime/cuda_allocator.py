"""The CUDA caching allocator: kiln's accounting over cupy's memory pool.

cupy's ``MemoryPool`` already is the allocator the paper's section 5 describes: a request is
rounded up to 512 bytes, freed blocks are kept on a free list of the stream they were used on
and handed out again at once to the next request of that size on that stream (no cudaFree, no
synchronization), and cudaMalloc is called only when no cached block fits. kiln installs
``CachingAllocator`` as cupy's allocator on top of that pool to keep PyTorch's statistics, which
the pool does not: bytes of live tensors (``memory_allocated``), their peak since the last reset,
the number of allocations, and a ``memory_summary()`` to read.

Every block handed to cupy carries an owner object whose release (when cupy drops the memory)
returns the block to the pool and takes its bytes off the live count.

>>> allocator = CachingAllocator(_FakePool(), lambda block, size: block)
>>> block = allocator.malloc(1000)
>>> allocator.stats()["allocated_bytes"]
1024
>>> del block
>>> allocator.stats()["allocated_bytes"], allocator.stats()["peak_allocated_bytes"]
(0, 1024)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

#: Every allocation is a multiple of this many bytes (cupy's pool unit, the paper's rounding).
ROUND = 512


def round_size(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of ``ROUND`` (at least one unit)."""
    return max(ROUND, -(-nbytes // ROUND) * ROUND)


class _Block:
    """The owner of one allocation: when cupy releases the memory, this object goes, and the pool's
    pointer with it (back on the pool's free list of its stream)."""

    __slots__ = ("allocator", "memory", "size", "__weakref__")

    def __init__(self, allocator: CachingAllocator, memory: Any, size: int) -> None:
        self.allocator, self.memory, self.size = allocator, memory, size

    def __del__(self) -> None:
        self.allocator._released(self.size)


class CachingAllocator:
    """cupy's allocator hook over ``pool`` (see the module docstring); ``wrap(block, size)`` makes
    what cupy receives from a ``_Block`` (``cupy.cuda.MemoryPointer`` over ``UnownedMemory``)."""

    def __init__(self, pool: Any, wrap: Callable[[_Block, int], Any]) -> None:
        self.pool = pool
        self.wrap = wrap
        self._lock = threading.RLock()  # a block may be released by the GC inside malloc
        self.allocated = self.peak = self.count = self.allocations = 0

    def malloc(self, nbytes: int) -> Any:
        memory = self.pool.malloc(nbytes)
        size = round_size(nbytes)
        with self._lock:
            self.allocated += size
            self.count += 1
            self.allocations += 1
            self.peak = max(self.peak, self.allocated)
        return self.wrap(_Block(self, memory, size), nbytes)

    __call__ = malloc

    def _released(self, size: int) -> None:
        with self._lock:
            self.allocated -= size
            self.count -= 1

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.allocated

    def empty_cache(self) -> None:
        """Give the pool's unused cached blocks back to the driver."""
        self.pool.free_all_blocks()

    def stats(self) -> dict[str, int]:
        return {
            "allocated_bytes": self.allocated,
            "peak_allocated_bytes": self.peak,
            "reserved_bytes": int(self.pool.total_bytes()),
            "cached_free_bytes": int(self.pool.free_bytes()),
            "live_blocks": self.count,
            "allocations": self.allocations,
        }

    def summary(self, device: str = "cuda:0") -> str:
        """A readable table of the statistics (``kiln.cuda.memory_summary``)."""
        s = self.stats()
        rows = [
            ("Allocated memory (live tensors)", _bytes(s["allocated_bytes"])),
            ("Peak allocated memory", _bytes(s["peak_allocated_bytes"])),
            ("Reserved memory (the pool's cudaMalloc'd bytes)", _bytes(s["reserved_bytes"])),
            ("Cached, free for reuse", _bytes(s["cached_free_bytes"])),
            ("Live blocks", str(s["live_blocks"])),
            ("Allocations since start", str(s["allocations"])),
        ]
        width = max(len(name) for name, _ in rows)
        title = f"kiln CUDA memory summary, device {device} (blocks rounded to {ROUND} bytes, one pool per stream)"
        rule = "=" * max(len(title), width + 14)
        body = [f"{name:<{width}}  {value:>12}" for name, value in rows]
        return "\n".join([rule, title, rule, *body, rule])


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


class _FakePool:
    """A stand-in for cupy's pool in the doctest (counts only)."""

    def malloc(self, nbytes: int) -> object:
        return object()

    def total_bytes(self) -> int:
        return 0

    def free_bytes(self) -> int:
        return 0

    def free_all_blocks(self) -> None:
        pass


_INSTALLED: CachingAllocator | None = None


def installed() -> CachingAllocator:
    """The allocator cupy uses, installed on first call (a GPU and cupy are required)."""
    global _INSTALLED
    if _INSTALLED is None:
        import cupy  # noqa: PLC0415 - only with a GPU

        def wrap(block: _Block, nbytes: int) -> Any:
            memory = cupy.cuda.UnownedMemory(block.memory.ptr, nbytes, block, block.memory.device_id)
            return cupy.cuda.MemoryPointer(memory, 0)

        _INSTALLED = CachingAllocator(cupy.get_default_memory_pool(), wrap)
        cupy.cuda.set_allocator(_INSTALLED.malloc)
    return _INSTALLED
