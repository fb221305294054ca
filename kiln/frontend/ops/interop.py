"""Exchanging tensors with other libraries without copying: the DLPack protocol.

``kiln.from_dlpack(x)`` wraps the memory of any object that exports DLPack (a numpy array, a
PyTorch tensor, a cupy array, another kiln tensor); ``torch.from_dlpack(kiln_tensor)`` and
``numpy.from_dlpack(kiln_tensor)`` go the other way through ``Tensor.__dlpack__``. Either way
the two objects share memory: a write through one is seen through the other.

>>> import numpy as np
>>> a = np.zeros(3, dtype=np.float32)
>>> t = from_dlpack(a); t[1] = 5.0; a.tolist()
[0.0, 5.0, 0.0]
"""

from __future__ import annotations

import numpy as np

from ...ir import dtypes as dt
from ...ir.types import CPU
from ...ir.types import device as parse_device
from ...runtime.devices import array_namespace
from ..tensor import Tensor, make_tensor

__all__ = ["from_dlpack"]

# DLPack's device types (dlpack.h: DLDeviceType).
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST = 1, 2, 3


class _Capsule:
    """A legacy DLPack capsule dressed as a DLPack object, for the ``from_dlpack`` of numpy/cupy."""

    def __init__(self, capsule, device: tuple[int, int]) -> None:
        self.capsule, self.device = capsule, device

    def __dlpack__(self, *args, **kwargs):
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


def from_dlpack(ext_tensor, *, device=None, copy: bool | None = None) -> Tensor:
    """A kiln tensor on the memory of ``ext_tensor`` (anything with ``__dlpack__``, or a DLPack capsule).

    ``copy=True`` copies instead of sharing; ``device`` moves the result (a copy when it differs).
    """
    if hasattr(ext_tensor, "__dlpack__"):
        kind, index = (int(v) for v in ext_tensor.__dlpack_device__())
        source = ext_tensor
    elif type(ext_tensor).__name__ == "PyCapsule":
        # A capsule does not say where its memory is; try the CPU first, then CUDA when present.
        try:
            return _wrap(_Capsule(ext_tensor, (_DL_CPU, 0)), _DL_CPU, 0, device, copy)
        except (BufferError, RuntimeError, TypeError, ValueError):
            kind, index, source = _DL_CUDA, 0, _Capsule(ext_tensor, (_DL_CUDA, 0))
    else:
        raise TypeError(
            f"from_dlpack expected an object with __dlpack__ or a DLPack capsule, got {type(ext_tensor).__name__}"
        )
    return _wrap(source, kind, index, device, copy)


def _wrap(source, kind: int, index: int, device, copy: bool | None) -> Tensor:
    if kind in (_DL_CPU, _DL_CUDA_HOST):
        array, where = np.from_dlpack(source), CPU
    elif kind == _DL_CUDA:
        where = parse_device(f"cuda:{index}")
        array = array_namespace(where).from_dlpack(source)
    else:
        raise RuntimeError(f"from_dlpack: unsupported DLPack device type {kind} (kiln takes CPU and CUDA memory)")
    if copy:
        array = array.copy()
    out = make_tensor(array, where, dt.from_numpy_dtype(array.dtype))
    if device is not None and parse_device(device) is not where:
        out = out.to(device)
    return out
