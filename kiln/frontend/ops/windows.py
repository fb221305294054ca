"""Sliding-window ops: the frontend of the ``unfold`` and ``fold`` primitives.

``unfold_windows`` gathers every window of an already padded ``(N, C, *S)`` tensor into
``(N, C, *kernel, *out)``; ``fold_windows`` adds such windows back into ``(N, C, *size)``.
Convolution and pooling (``kiln.nn.functional``) are built on these two.
"""

from __future__ import annotations

from ...ir.primitives import P
from ..dispatch import apply
from ..tensor import Tensor

__all__ = ["unfold_windows", "fold_windows"]

_unfold, _fold = P["unfold"], P["fold"]


def _ints(value, d: int, name: str) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * d
    value = tuple(int(v) for v in value)
    if len(value) != d:
        raise ValueError(f"{name} must be an int or have {d} entries (one per spatial dim), got {value}")
    return value


def unfold_windows(input: Tensor, kernel_size, stride=1, dilation=1, *, batch_inner: bool = False) -> Tensor:
    """Windows of ``input`` (N, C, *S): ``out[n, c, *k, *o] = input[n, c, *(o * stride + k * dilation)]``,
    laid out (C, *K, N, *O) instead when ``batch_inner`` (what convolution multiplies by its weight).

    >>> import kiln
    >>> unfold_windows(kiln.arange(5.0).reshape(1, 1, 5), 2).shape
    kiln.Size([1, 1, 2, 4])
    """
    d = input.ndim - 2 if isinstance(kernel_size, int) else len(kernel_size)
    kernel_size = _ints(kernel_size, d, "kernel_size")
    layout = {"batch_inner": True} if batch_inner else {}  # the default stays out of the graph's text
    return apply(_unfold, input, kernel_size=kernel_size, stride=_ints(stride, d, "stride"),
                 dilation=_ints(dilation, d, "dilation"), **layout)  # fmt: skip


def fold_windows(input: Tensor, size, kernel_size, stride=1, dilation=1, *, batch_inner: bool = False) -> Tensor:
    """The adjoint of ``unfold_windows``: windows (N, C, *kernel, *out), or (C, *kernel, N, *out) when
    ``batch_inner``, summed back into (N, C, *size)."""
    size = (size,) if isinstance(size, int) else tuple(int(s) for s in size)
    d = len(size)
    layout = {"batch_inner": True} if batch_inner else {}
    return apply(_fold, input, size=size, kernel_size=_ints(kernel_size, d, "kernel_size"),
                 stride=_ints(stride, d, "stride"), dilation=_ints(dilation, d, "dilation"), **layout)  # fmt: skip
