"""``torch.*`` names over kiln's other namespaces, for ported programs: ``asarray``,
``cosine_similarity`` (``nn.functional``'s), ``vmap`` (``func``'s), ``is_nonzero``, ``narrow_copy``,
and the float32 matmul precision switch.

This module sits on the public side, over ``kiln.nn`` and ``kiln.func``, as ``_torch_aliases`` does
over ``kiln.linalg`` and ``kiln.special``.
"""

from __future__ import annotations

import numpy as np

from . import func
from .frontend import ops
from .frontend.tensor import Tensor
from .nn import functional

__all__ = ["asarray", "cosine_similarity", "vmap", "is_nonzero", "narrow_copy", "set_float32_matmul_precision",
           "get_float32_matmul_precision"]  # fmt: skip

cosine_similarity = functional.cosine_similarity
vmap = func.vmap


def asarray(obj, *, dtype=None, device=None, copy: bool | None = None, requires_grad: bool = False) -> Tensor:
    """``torch.asarray``: ``obj`` as a tensor, sharing its memory where it can (a tensor, a numpy array)
    unless ``copy=True``; ``copy=False`` raises where a copy would be needed."""
    out = ops.tensor(obj, dtype=dtype, device=device) if copy else ops.as_tensor(obj, dtype=dtype, device=device)
    if copy is False and not _shares(obj, out):
        raise ValueError("can't alias the given object: a copy is needed (its type, dtype or device differs)")
    return out.requires_grad_() if requires_grad else out


def _shares(obj, out: Tensor) -> bool:
    if isinstance(obj, Tensor):
        return out is obj  # (``as_tensor`` returns the tensor itself where nothing must change)
    return isinstance(obj, np.ndarray) and isinstance(out._data, np.ndarray) and np.shares_memory(obj, out._data)


def is_nonzero(input: Tensor) -> bool:
    """``torch.is_nonzero``: whether a one-element tensor's value is not zero."""
    n = input.numel()
    if n != 1:
        raise RuntimeError(f"Boolean value of Tensor with {'no values' if n == 0 else 'more than one value'} "
                           "is ambiguous")  # fmt: skip
    return bool(input)


def narrow_copy(input: Tensor, dim: int, start: int, length: int) -> Tensor:
    """``torch.narrow_copy``: ``narrow``'s slice as new memory."""
    return ops.narrow(input, dim, start, length).clone()


_PRECISIONS = ("highest", "high", "medium")
_precision = ["highest"]


def set_float32_matmul_precision(precision: str) -> None:
    """``torch.set_float32_matmul_precision``: kept for ``get_float32_matmul_precision``. kiln's CPU
    products compute float32 in float32 whatever it says (PyTorch's CPU too, but for oneDNN's bf16
    paths under "medium")."""
    if precision not in _PRECISIONS:
        raise RuntimeError(f"Invalid precision {precision!r}: expected one of {', '.join(_PRECISIONS)}")
    _precision[0] = precision


def get_float32_matmul_precision() -> str:
    return _precision[0]
