"""The lean path of the eager view ops (reshape, permute, slice, expand) on CPU arrays.

``dispatch.apply`` serves every primitive: it looks up the device's namespace and the op's kernel,
calls the kernel with keyword attributes and checks its result, which is most of a view op's ~1.3 us
where the numpy view itself takes 0.1 us. A view op on a plain CPU tensor makes its array here and
wraps it as ``apply`` would (sharing the input's base and version counter) and records the same
``PrimBackward`` -- the same values and the same autograd graph. A trace and a profile take ``apply``
(they record the primitive), as does any other device; a view the array library refuses goes to
``apply`` too, which raises the shape rule's error.
"""

from __future__ import annotations

import numpy as np

from ...ir.primitives import Primitive
from ...ir.types import CPU
from .. import dispatch
from ..autograd import grad_mode
from ..autograd import graph as _graph
from ..jit import state as _jit
from ..tensor import Tensor, make_tensor

_ndarray = np.ndarray
_grad_state = grad_mode.state


def lean(x: Tensor) -> bool:
    """Whether a view of ``x`` may be made here: an eager CPU array, outside traces and profiles."""
    return (
        not ((_jit.tracing and _jit.current.get() is not None) or dispatch.profiling_ops)
        and x._device is CPU
        and x._data.__class__ is _ndarray
    )


def wrap_view(x: Tensor, array: np.ndarray, prim: Primitive, attrs: dict) -> Tensor:
    """``array`` (a view of ``x``'s array made by ``prim`` with ``attrs``) as ``apply(prim, x, **attrs)``
    would return it: a tensor viewing ``x``'s base, sharing its version counter, with ``prim``'s node."""
    result = make_tensor(array, CPU, x._dtype)  # (outside traces: nothing to stamp)
    result._version = x._version
    result._base = x._base if x._base is not None else x
    if x._requires_grad and (not grad_mode.threads_without_grad or _grad_state.grad_enabled):
        _graph.record(prim, (x,), attrs, result)
    return result


def broadcast_view(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``np.broadcast_to(array, shape)`` (read-only, sharing memory), made as one ndarray over a
    contiguous array's buffer: broadcast_to's own checks take ~2 us, this ~1. A ValueError where the
    shapes do not broadcast."""
    lead = len(shape) - array.ndim
    if lead < 0 or not array.flags.c_contiguous or not array.size:
        return np.broadcast_to(array, shape)
    strides = [0] * lead
    for n, m, stride in zip(array.shape, shape[lead:], array.strides, strict=True):
        if n == m:
            strides.append(stride)
        elif n == 1:
            strides.append(0)
        else:
            return np.broadcast_to(array, shape)  # (raises numpy's error)
    out = np.ndarray(shape, array.dtype, array, 0, tuple(strides))
    out.flags.writeable = False  # as broadcast_to's: a write would land on every repeat
    return out
