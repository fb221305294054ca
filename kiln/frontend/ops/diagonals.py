"""Diagonal matrices: ``diag``, ``diag_embed``, ``diagflat`` and ``trace``, as ``torch`` has them.

Building a diagonal is the pad primitive: the values, ``m + 1`` apart in a flat ``m * m`` plane with
zeros around and between them, then reshaped -- so the gradient (a strided slice) and compiling come
with the primitives. Reading one is ``diagonal`` (a view; ``diag`` copies it, as PyTorch does).
"""

from __future__ import annotations

from ..tensor import Tensor, method
from .creation import clone, zeros
from .reductions import sum
from .shape import diagonal as _diagonal
from .shape import flatten, movedim, reshape, strided_pad

__all__ = ["diag", "diag_embed", "diagflat", "trace"]


@method("diag_embed")
def diag_embed(input: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """Each vector along the last dim on the ``offset`` diagonal of a new (dim1, dim2) plane of zeros.

    >>> import kiln
    >>> diag_embed(kiln.tensor([1, 2])).tolist()
    [[1, 0], [0, 2]]
    """
    *lead, n = input.shape
    m = n + abs(offset)
    ndim = len(lead) + 2
    first, second = (d % ndim for d in (dim1, dim2))
    if first == second:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    if n == 0:
        plane = zeros(*lead, m, m, dtype=input.dtype, device=input.device)
    else:
        start = offset if offset >= 0 else -offset * m
        end = m * m - start - (n - 1) * (m + 1) - 1
        zero = (0,) * len(lead)
        flat = strided_pad(input, zero + (start,), zero + (end,), zero + (m,))
        plane = reshape(flat, (*lead, m, m))
    return movedim(plane, (-2, -1), (first, second))


@method("diagflat")
def diagflat(input: Tensor, offset: int = 0) -> Tensor:
    """A matrix with the flattened ``input`` on its ``offset`` diagonal."""
    return diag_embed(flatten(input), offset)


@method("diag")
def diag(input: Tensor, diagonal: int = 0) -> Tensor:
    """A vector's diagonal matrix, or a matrix's diagonal as a new vector (``torch.diag``).

    >>> import kiln
    >>> diag(kiln.tensor([[1, 2], [3, 4]])).tolist(), diag(kiln.tensor([5, 6]), 1).shape
    ([1, 4], kiln.Size([3, 3]))
    """
    if input.ndim == 1:
        return diag_embed(input, diagonal)
    if input.ndim == 2:
        return clone(_diagonal(input, diagonal))
    raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {input.ndim}D")


@method("trace")
def trace(input: Tensor) -> Tensor:
    """The sum of a matrix's diagonal (integers sum to int64, as PyTorch)."""
    if input.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {input.ndim}")
    return sum(_diagonal(input))
