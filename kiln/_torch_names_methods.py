"""Tensor methods PyTorch has and kiln lacked: ``fill_diagonal_``, ``geometric_``, ``put_``/``put``
(and ``torch.put``), ``map_``, ``apply_`` and the ``name`` attribute (always None: kiln has no
named tensors).

``fill_diagonal_``, ``geometric_`` and ``put_`` are written over kiln's ops and commit their result
in place, so they compile; ``put`` carries the gradient to ``input`` and ``source``. ``map_`` and
``apply_`` call a Python function on every element, as PyTorch's CPU-only methods do: they read
the values, so under ``kiln.compile`` the trace stops there, and they refuse a tensor that
requires grad, as PyTorch does. This module binds the methods at import, as ``_torch_aliases``.
"""

from __future__ import annotations

import math

import numpy as np

from .frontend import ops
from .frontend.autograd.grad_mode import no_grad
from .frontend.jit import state as _jit
from .frontend.ops.checks import check_range
from .frontend.ops.generator import _generator
from .frontend.ops.inplace import commit_inplace
from .frontend.ops.random import _uniform
from .frontend.tensor import Tensor, method
from .ir import dtypes as dt

__all__ = ["put"]


def _diagonal_positions(shape: tuple[int, ...], wrap: bool) -> np.ndarray:
    """Flat (C-order) positions of the main diagonal; for a tall matrix with ``wrap``, the diagonal
    starts again every ``cols + 1`` rows (numpy's ``fill_diagonal``, and PyTorch's)."""
    if len(shape) == 2:
        rows, cols = shape
        step = cols + 1
        end = rows * cols if wrap and rows > cols + 1 else min(rows, cols) * cols
        return np.arange(0, end, step, dtype=np.int64)
    n = shape[0]
    step = sum(n**k for k in range(len(shape)))  # one along every dim at once
    return np.arange(n, dtype=np.int64) * step


@method("fill_diagonal_")
def fill_diagonal_(self: Tensor, fill_value, wrap: bool = False) -> Tensor:
    """Write ``fill_value`` on the main diagonal (every dim's index equal); 2-D or all dims equal.

    >>> import kiln
    >>> kiln.zeros(2, 3).fill_diagonal_(1.0)
    tensor([[1., 0., 0.],
            [0., 1., 0.]])
    """
    shape = tuple(self.shape)
    if len(shape) < 2:
        raise RuntimeError("dimensions must larger than 1")
    if len(shape) > 2 and len(set(shape)) != 1:
        raise RuntimeError("all dimensions of input must be of equal length")
    positions = ops.tensor(_diagonal_positions(shape, wrap), device=self.device)
    flat = ops.reshape(self, (-1,))
    return commit_inplace(self, ops.reshape(ops.index_fill(flat, 0, positions, fill_value), shape),
                          op="fill_diagonal_")  # fmt: skip


@method("geometric_")
def geometric_(self: Tensor, p: float, *, generator=None) -> Tensor:
    """Fill with the number of Bernoulli(``p``) trials up to the first success (1, 2, ...):
    ``ceil(log(u) / log(1 - p))`` for ``u`` uniform on (0, 1]."""
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    work = dt.float64 if self.dtype is dt.float64 else dt.float32
    with no_grad():
        u = ops.sub(1.0, _uniform(tuple(self.shape), work, _generator(generator, self.device)))
        value = ops.clamp(ops.ceil(ops.div(ops.log(u), math.log1p(-p))), min=1.0)
        value = value.to(self.dtype)
    return commit_inplace(self, value, op="geometric_")


def _put(input: Tensor, index: Tensor, source: Tensor, accumulate: bool, op: str) -> Tensor:
    """``input`` (as new values) with its flat (C-order) positions ``index`` set to (or, with
    ``accumulate``, increased by) ``source``'s elements."""
    if index.dtype is not dt.int64:
        raise RuntimeError(f"{op}(): Expected a long tensor for index, but got {index.dtype.name}")
    if source.dtype is not input.dtype:
        raise RuntimeError(f"{op}(): self and source expected to have the same dtype, but got self.dtype = "
                           f"{input.dtype.name} and source.dtype = {source.dtype.name}")  # fmt: skip
    if index.numel() != source.numel():
        raise RuntimeError(f"{op}(): Expected source and index to have the same number of elements, but got "
                           f"source.numel() = {source.numel()}, index.numel() = {index.numel()}")  # fmt: skip
    n = input.numel()
    positions = ops.reshape(index, (-1,))
    check_range(positions, -n, n, IndexError, f"out of range: tried to access an index on a tensor of {n} elements.")
    positions = ops.remainder(positions, max(n, 1))  # negative indices count from the end
    flat = ops.reshape(input, (-1,))
    values = ops.reshape(source, (-1,))
    return ops.reshape(ops.index_put(flat, (positions,), values, accumulate=accumulate), tuple(input.shape))


@method("put_")
def put_(self: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    """Write ``source``'s elements at the flat positions ``index`` of ``self`` (added when ``accumulate``)."""
    return commit_inplace(self, _put(self, index, source, accumulate, "put_"), op="put_")


@method("put")
def put(input: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    """``put_``'s result as a new tensor."""
    return _put(input, index, source, accumulate, "put")


def _elementwise_python(self: Tensor, op: str) -> np.ndarray:
    if self.requires_grad:
        raise RuntimeError(f"Can't call {op}() on Variable that requires grad. Use var.detach().{op}() instead.")
    if self.device.type != "cpu":
        raise TypeError(f"{op}_ is only implemented on CPU tensors")
    if _jit.tracing:
        _jit.unsafe(f"{op}() calls a Python function on every element")
    return self._host()


@method("apply_")
def apply_(self: Tensor, callable) -> Tensor:
    """``self[i] = callable(self[i])`` for every element, with Python numbers (CPU only)."""
    values = _elementwise_python(self, "apply_")
    result = np.array([callable(v) for v in values.reshape(-1).tolist()], dtype=values.dtype)
    return commit_inplace(self, ops.tensor(result.reshape(values.shape), dtype=self.dtype), op="apply_")


@method("map_")
def map_(self: Tensor, tensor: Tensor, callable) -> Tensor:
    """``self[i] = callable(self[i], tensor[i])`` for every element, ``tensor`` broadcast to ``self``."""
    values = _elementwise_python(self, "map_")
    other = np.broadcast_to(tensor.detach()._host(), values.shape)
    pairs = zip(values.reshape(-1).tolist(), other.reshape(-1).tolist(), strict=True)
    result = np.array([callable(a, b) for a, b in pairs], dtype=values.dtype)
    return commit_inplace(self, ops.tensor(result.reshape(values.shape), dtype=self.dtype), op="map_")


Tensor.name = property(lambda self: None, doc="Named tensors' dim names: kiln has none (PyTorch: None).")  # type: ignore[assignment,attr-defined]
