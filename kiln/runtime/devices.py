"""Array namespaces per device: numpy on the CPU, cupy on CUDA (imported on first use)."""

from __future__ import annotations

import functools
from types import ModuleType

import numpy as np

from ..ir.types import Device


@functools.cache
def _cupy() -> ModuleType | None:
    try:
        import cupy  # noqa: PLC0415 - optional and heavy: imported only when CUDA is asked for

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:  # noqa: BLE001 - no cupy, no driver or no GPU all mean "no CUDA"
        return None
    return None


def cuda_available() -> bool:
    return _cupy() is not None


def cuda_device_count() -> int:
    cp = _cupy()
    return 0 if cp is None else int(cp.cuda.runtime.getDeviceCount())


def array_namespace(device: Device) -> ModuleType:
    """The module whose functions run kernels on ``device``."""
    if device.type == "cpu":
        return np
    cp = _cupy()
    if cp is None:
        raise RuntimeError(
            f"device {device} was asked for, but CUDA is not available "
            "(install kiln[cuda] on a machine with an NVIDIA GPU; kiln.cuda.is_available() tells)"
        )
    return cp


def to_device(array, device: Device):
    """Copy ``array`` (numpy or cupy) onto ``device``."""
    if device.type == "cpu":
        return array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else array
    cp = array_namespace(device)
    with cp.cuda.Device(device.index or 0):
        return cp.asarray(array)
