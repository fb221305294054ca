"""Sliding-window ops: the frontend of the ``unfold`` and ``fold`` primitives.

``unfold_windows`` gathers every window of an already padded ``(N, C, *S)`` tensor into
``(N, C, *kernel, *out)``; ``fold_windows`` adds such windows back into ``(N, C, *size)``.
Convolution and pooling (``kiln.nn.functional``) are built on these two; ``tile_transform`` and
``untile_transform`` are the tile transforms of its Winograd path (``kiln/ir/primitives/tiles.py``).
"""

from __future__ import annotations

from ...ir.primitives import P
from ..dispatch import apply
from ..tensor import Tensor

__all__ = ["unfold_windows", "fold_windows", "tile_transform", "untile_transform"]

_unfold, _fold, _conv = P["unfold"], P["fold"], P["conv"]
_tile, _untile = P["tile_transform"], P["untile_transform"]


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


def convolve(input: Tensor, weight: Tensor, stride, dilation) -> Tensor:
    """The ``conv`` primitive: ``input`` (N, C, *S), already padded, by ``weight`` (O, C, *K) ->
    (N, O, *out); ``kiln.nn.functional.conv2d`` calls it for small filters (no checks of its own)."""
    return apply(_conv, input, weight, stride=tuple(stride), dilation=tuple(dilation))


def _matrix(matrix) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in row) for row in matrix)


def tile_transform(input: Tensor, matrix, stride: int = 1) -> Tensor:
    """Each ``t x t`` tile at ``stride`` of the last two dims of ``input`` (*B, H, W) mapped through the
    ``alpha x t`` ``matrix`` L on both sides, ``L x L^T``: (alpha**2, *B, th, tw), element
    ``i*alpha + j`` first. Winograd's convolution transforms are three of these.

    >>> import kiln
    >>> tile_transform(kiln.ones(1, 4, 4), [[1, 1]], stride=2).tolist()  # 2x2 tile sums
    [[[[4.0, 4.0], [4.0, 4.0]]]]
    """
    return apply(_tile, input, matrix=_matrix(matrix), stride=int(stride))


def untile_transform(input: Tensor, size, matrix, stride: int = 1) -> Tensor:
    """The adjoint of ``tile_transform``: each tile of (alpha**2, *B, th, tw) mapped back, ``L^T v L``,
    and added into planes (*B, *size) at ``stride``."""
    size = tuple(int(s) for s in size)
    return apply(_untile, input, size=size, matrix=_matrix(matrix), stride=int(stride))
