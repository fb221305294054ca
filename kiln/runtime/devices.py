"""Array namespaces per device: numpy on the CPU, cupy on CUDA (imported on first use).

Asking for CUDA where it is not usable (no cupy, no driver, no GPU) raises ``CudaUnavailable``
(a ``RuntimeError``) that says what was asked, why it cannot be done and how to get CUDA.
When cupy is first used, kiln's caching allocator (kiln/runtime/cuda_allocator.py) is
installed over cupy's memory pool.
"""

from __future__ import annotations

import functools
from types import ModuleType

import numpy as np

from ..ir.types import Device

INSTALL_HINT = (
    "install kiln's CUDA extra and the cupy wheel of your CUDA major version on a machine with an NVIDIA GPU "
    "(pip install 'kiln[cuda]' cupy-cuda13x, or cupy-cuda12x for CUDA 12); kiln.cuda.is_available() tells "
    "whether CUDA is usable"
)


class CudaUnavailable(RuntimeError):
    """CUDA was asked for where it is not usable."""


@functools.cache
def _probe() -> tuple[ModuleType | None, str]:
    """(cupy, "") when CUDA is usable, else (None, why not)."""
    try:
        import cupy  # noqa: PLC0415 - optional and heavy: imported only when CUDA is asked for
    except Exception as error:  # noqa: BLE001 - any failure to import means "no CUDA"
        return None, f"cupy is not installed ({type(error).__name__}: {error})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # noqa: BLE001 - no driver or no GPU
        return None, f"no CUDA driver or GPU was found ({type(error).__name__}: {error})"
    if count <= 0:
        return None, "no NVIDIA GPU was found"
    from .cuda_allocator import installed  # noqa: PLC0415

    installed()
    return cupy, ""


def _cupy() -> ModuleType | None:
    return _probe()[0]


def cuda_available() -> bool:
    return _cupy() is not None


def cuda_device_count() -> int:
    cp = _cupy()
    return 0 if cp is None else int(cp.cuda.runtime.getDeviceCount())


def require_cuda(what: str) -> ModuleType:
    """cupy, or ``CudaUnavailable`` naming ``what`` was asked for."""
    cp, why = _probe()
    if cp is None:
        raise CudaUnavailable(f"{what} needs CUDA, but CUDA is not available: {why}. To use a GPU, {INSTALL_HINT}.")
    return cp


def array_namespace(device: Device) -> ModuleType:
    """The module whose functions run kernels on ``device``."""
    if device.type == "cpu":
        return np
    return require_cuda(f"device {device}")


def to_device(array, device: Device):
    """Copy ``array`` (numpy or cupy) onto ``device``."""
    if device.type == "cpu":
        return array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else array
    cp = array_namespace(device)
    with cp.cuda.Device(device.index or 0):
        return cp.asarray(array)
