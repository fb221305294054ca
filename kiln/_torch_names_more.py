"""Small ``torch.*`` names ported programs meet beyond kiln's other namespaces: the constants
``pi``, ``e``, ``inf``, ``nan`` and ``newaxis``; ``adjoint``, ``fix``, ``get_device``, ``is_conj``,
``is_neg``, ``is_inference`` (the Tensor methods, at the top level); ``can_cast``; the deprecated
``nuclear_norm`` and ``frobenius_norm``; ``max_pool1d_with_indices``; ``orgqr``
(``linalg.householder_product``); and the process switches ``set_anomaly_enabled``,
``set_warn_always`` and ``set_num_interop_threads`` with their getters.

kiln has no complex dtype, so the complex names (``complex``, ``polar``, ``real``, ``imag``,
``view_as_complex``) stay out: ``is_conj`` and ``is_neg`` are always False. This module sits on the
public side, over ``kiln.linalg`` and ``kiln.nn``.
"""

from __future__ import annotations

import math

from . import linalg
from .frontend.autograd import anomaly
from .frontend.tensor import Tensor, method
from .ir import dtypes as dt
from .nn import functional as F

__all__ = [
    "pi", "e", "inf", "nan", "newaxis", "adjoint", "fix", "get_device", "is_conj", "is_neg", "is_inference",
    "can_cast", "nuclear_norm", "frobenius_norm", "max_pool1d_with_indices", "orgqr", "is_anomaly_enabled",
    "is_anomaly_check_nan_enabled", "set_anomaly_enabled", "set_warn_always", "is_warn_always_enabled",
    "get_num_interop_threads", "set_num_interop_threads",
]  # fmt: skip

pi, e, inf, nan = math.pi, math.e, math.inf, math.nan
newaxis = None

# (the methods are bound at import by the frontend's ``@method``: getattr, which mypy cannot see through)
adjoint, fix, get_device, is_conj, is_neg, is_inference = (
    getattr(Tensor, name) for name in ("adjoint", "fix", "get_device", "is_conj", "is_neg", "is_inference")
)


def can_cast(from_: dt.DType, to: dt.DType) -> bool:
    """Whether PyTorch's casting rules allow ``from_`` into ``to`` in place: never to a lower
    category (float to integer, integer or float to bool); any size within one."""
    return from_.category <= to.category


def nuclear_norm(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """The sum of singular values over ``dim`` (a pair; a 2-D input's two by default). Deprecated
    in PyTorch for ``linalg.matrix_norm(A, "nuc")``; ``nuclear_norm(A, True)`` is its keepdim."""
    if isinstance(dim, bool):
        dim, keepdim = None, dim
    if dim is None:
        if input.ndim != 2:
            raise RuntimeError(f"Expected a tensor with 2 dimensions, but got a tensor with {input.ndim} dimensions "
                               "instead.")  # fmt: skip
        dim = (0, 1)
    return linalg.matrix_norm(input, "nuc", tuple(dim), keepdim)


def frobenius_norm(input: Tensor, dim, keepdim: bool = False) -> Tensor:
    """The square root of the sum of squares over ``dim`` (one or two dims). Deprecated in PyTorch
    for ``linalg.vector_norm(A, 2, dim)``."""
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if len(dims) > 2:
        raise RuntimeError(f"Expected at most 2 dimensions, but got {len(dims)} dimensions instead.")
    return linalg.vector_norm(input, 2, dims, keepdim)


def max_pool1d_with_indices(input: Tensor, kernel_size, stride=(), padding=0, dilation=1, ceil_mode: bool = False):
    """``max_pool1d``'s values and the indices of the maxima along the last dim."""
    return tuple(F.max_pool1d(input, kernel_size, stride or None, padding, dilation, ceil_mode, return_indices=True))


def orgqr(input: Tensor, tau: Tensor) -> Tensor:
    """``linalg.householder_product`` (LAPACK's name)."""
    return linalg.householder_product(input, tau)


method("orgqr")(orgqr)

is_anomaly_enabled = anomaly.is_anomaly_enabled
_switches = {"warn_always": False, "interop_threads": 1}


def is_anomaly_check_nan_enabled() -> bool:
    """Whether anomaly mode checks backward outputs for nan: kiln's does whenever it is on."""
    return anomaly.is_anomaly_enabled()


def set_anomaly_enabled(enabled: bool, check_nan: bool = True) -> None:
    """Anomaly mode on or off for the process (``autograd.set_detect_anomaly`` without a block).
    kiln's anomaly mode always checks for nan: ``check_nan=False`` is refused rather than ignored."""
    if enabled and not check_nan:
        raise NotImplementedError("set_anomaly_enabled: kiln's anomaly mode always checks backward outputs for nan")
    anomaly.set_detect_anomaly(enabled)


def set_warn_always(b: bool) -> None:
    """Kept for ``is_warn_always_enabled``: kiln's warnings go through Python's ``warnings`` filters,
    which decide how often each one shows."""
    _switches["warn_always"] = bool(b)


def is_warn_always_enabled() -> bool:
    return bool(_switches["warn_always"])


def set_num_interop_threads(num: int) -> None:
    """Kept for ``get_num_interop_threads``: kiln runs independent ops one after another, so there is
    no inter-op pool to size (``set_num_threads`` sizes the pool its kernels use)."""
    if num < 1:
        raise RuntimeError("Expected positive number of threads")
    _switches["interop_threads"] = int(num)


def get_num_interop_threads() -> int:
    return int(_switches["interop_threads"])
