"""Memory statistics of the CUDA caching allocator (kiln/runtime/cuda_allocator.py), as
``torch.cuda`` names them. Sizes are bytes; blocks are rounded up to 512 bytes; cupy's pool
keeps one free list per stream. Without CUDA every function raises ``CudaUnavailable``."""

from __future__ import annotations

from typing import Any

from ..runtime.cuda_allocator import CachingAllocator, installed
from ..runtime.devices import require_cuda


def _allocator(what: str) -> CachingAllocator:
    require_cuda(f"kiln.cuda.{what}()")
    return installed()


def memory_allocated(device: Any = None) -> int:
    """Bytes held by live tensors (rounded blocks)."""
    return _allocator("memory_allocated").allocated


def max_memory_allocated(device: Any = None) -> int:
    """The most bytes live tensors held at once since the start or ``reset_peak_memory_stats``."""
    return _allocator("max_memory_allocated").peak


def memory_reserved(device: Any = None) -> int:
    """Bytes the pool holds from the driver: live blocks plus cached free ones."""
    return int(_allocator("memory_reserved").pool.total_bytes())


def max_memory_reserved(device: Any = None) -> int:
    """Bytes reserved now (cupy's pool keeps no peak of its own; this is the current value)."""
    return memory_reserved(device)


def empty_cache() -> None:
    """Return the cached free blocks to the driver (live tensors keep theirs)."""
    _allocator("empty_cache").empty_cache()


def reset_peak_memory_stats(device: Any = None) -> None:
    _allocator("reset_peak_memory_stats").reset_peak()


def memory_stats(device: Any = None) -> dict[str, int]:
    return _allocator("memory_stats").stats()


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A readable table of the allocator's statistics."""
    return _allocator("memory_summary").summary(f"cuda:{0 if device is None else device}")
