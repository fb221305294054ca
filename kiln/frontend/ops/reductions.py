"""Reductions: sum, mean, prod, max/min, var/std, logsumexp, softmax, cumsum, norm..."""

from __future__ import annotations

from ...ir import dtypes as dt
from ...ir.primitives import P
from ...ir.shapes import normalize_axes
from ..dispatch import apply
from ..tensor import Tensor, method
from ._util import cast

__all__ = ["sum"]


@method("sum")
def sum(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Sum over ``dim`` (all dims when None); bool and integer inputs sum in int64, as in PyTorch."""
    if dtype is not None:
        input = cast(input, dt.as_dtype(dtype))
    elif not input._dtype.is_floating_point:
        input = cast(input, dt.int64)
    axes = normalize_axes(dim, input.ndim)
    return apply(P["reduce_sum"], input, axes=axes, keepdim=keepdim)
