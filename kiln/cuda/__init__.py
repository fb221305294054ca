"""``kiln.cuda``: the GPU, as ``torch.cuda`` names it.

CUDA is optional: without cupy or an NVIDIA GPU, ``is_available()`` is False, ``device_count()``
0, the seeding functions do nothing (as in PyTorch, so a program may call them everywhere), and
anything that needs a device raises a ``RuntimeError`` saying what was asked and how to install
CUDA support (``pip install 'kiln[cuda]' cupy-cuda13x``, or ``cupy-cuda12x`` for CUDA 12).

>>> import kiln
>>> kiln.cuda.is_available() in (True, False)
True
>>> kiln.cuda.manual_seed(0)  # never fails, GPU or not
"""

from __future__ import annotations

from typing import Any

from ..runtime.devices import CudaUnavailable, cuda_available, cuda_device_count, require_cuda
from ..runtime.streams import Event, Stream, current_stream, default_stream, stream
from .memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_peak_memory_stats,
)

__all__ = [
    "CudaUnavailable", "Event", "Stream", "current_device", "current_stream", "default_stream", "device_count",
    "empty_cache", "get_device_capability", "get_device_name", "is_available", "manual_seed", "manual_seed_all",
    "max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_stats",
    "memory_summary", "reset_peak_memory_stats", "set_device", "stream", "synchronize",
]  # fmt: skip


def is_available() -> bool:
    """Whether CUDA is usable: cupy imports and at least one NVIDIA GPU answers."""
    return cuda_available()


def device_count() -> int:
    return cuda_device_count()


def current_device() -> int:
    return int(require_cuda("kiln.cuda.current_device()").cuda.runtime.getDevice())


def set_device(device: Any) -> None:
    from ..runtime.streams import _index  # noqa: PLC0415

    require_cuda("kiln.cuda.set_device()").cuda.runtime.setDevice(_index(device))


def get_device_name(device: Any = None) -> str:
    """The GPU's name, such as ``'NVIDIA H100 80GB HBM3'``."""
    from ..runtime.streams import _index  # noqa: PLC0415

    cp = require_cuda("kiln.cuda.get_device_name()")
    name = cp.cuda.runtime.getDeviceProperties(_index(device))["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def get_device_capability(device: Any = None) -> tuple[int, int]:
    from ..runtime.streams import _index  # noqa: PLC0415

    cp = require_cuda("kiln.cuda.get_device_capability()")
    props = cp.cuda.runtime.getDeviceProperties(_index(device))
    return int(props["major"]), int(props["minor"])


def synchronize(device: Any = None) -> None:
    """Wait until every stream of the device has run what was queued on it."""
    from ..runtime.streams import _index  # noqa: PLC0415

    cp = require_cuda("kiln.cuda.synchronize()")
    with cp.cuda.Device(_index(device)):
        cp.cuda.runtime.deviceSynchronize()


def manual_seed(seed: int) -> None:
    """Seed the current GPU's default generator (Philox, the CPU's numbers for the same seed and
    offset); does nothing without CUDA."""
    if not is_available():
        return
    _seed_devices(seed, [current_device()])


def manual_seed_all(seed: int) -> None:
    """Seed every GPU's default generator; does nothing without CUDA."""
    if not is_available():
        return
    _seed_devices(seed, range(device_count()))


def _seed_devices(seed: int, indices) -> None:
    from ..frontend.ops.generator import _generator  # noqa: PLC0415 - the per-device default generators
    from ..ir.types import device  # noqa: PLC0415

    for index in indices:
        _generator(None, device(f"cuda:{index}")).manual_seed(seed)


def __getattr__(name: str):
    if name == "amp":  # kiln.cuda.amp needs kiln.amp, which needs the rest of kiln: imported when asked for
        import importlib  # noqa: PLC0415

        return importlib.import_module(".amp", __name__)
    raise AttributeError(f"module 'kiln.cuda' has no attribute {name!r}")
