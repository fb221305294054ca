"""COO sparse tensors, with what graph networks use: ``sparse_coo_tensor``, ``Tensor.to_sparse``,
``coalesce``, ``to_dense`` and the product of a sparse matrix and a dense one (``spmm``, ``mm``,
``matmul``, ``@``), differentiable in the dense side and in the values, eagerly and compiled.

A ``SparseTensor`` is not a ``Tensor``: it holds an int64 ``indices`` tensor (sparse dims x nnz), a
``values`` tensor (nnz, *dense dims) and a size. Its product with a dense matrix is ordinary kiln
ops over those tensors -- the dense rows its columns name (``index_select``), scaled by the values,
added into the rows its rows name (``index_add``) -- so its gradients, index checks and compiling
come from theirs; captured by a compiled function (a graph's adjacency), its tensors are read at
every call like any captured tensor. ``coalesce`` and ``to_sparse`` find positions from values (a
data-dependent number of entries), so under ``kiln.compile`` they stop the trace, as in eager code
they run at once.

>>> import kiln
>>> adj = kiln.sparse_coo_tensor(kiln.tensor([[0, 1, 1], [1, 0, 2]]), kiln.tensor([1.0, 2.0, 3.0]), (2, 3))
>>> (adj @ kiln.ones(3, 1)).tolist()
[[1.0], [5.0]]
"""

from __future__ import annotations

import numpy as np

from ...ir import dtypes as dt
from ...ir.types import Device
from ..tensor import Size, Tensor, method, sparse_coo
from ._util import cast
from .checks import check_range
from .copies import cat
from .creation import tensor as _tensor
from .creation import zeros
from .indexing import index_add, index_put, index_select, nonzero
from .shape import reshape, unsqueeze

__all__ = ["SparseTensor", "sparse_coo_tensor", "spmm", "sparse_coo"]  # (sparse_coo: the layout, from tensor.py)


class SparseTensor:
    """A COO sparse tensor of ``size``: ``values[i]`` at the position ``indices[:, i]``; duplicate
    positions add up (``coalesce`` sums them and sorts the positions)."""

    is_sparse = True
    layout = sparse_coo

    def __init__(self, indices: Tensor, values: Tensor, size: tuple[int, ...], coalesced: bool = False) -> None:
        self._indices_t, self._values_t, self._size, self._coalesced = indices, values, tuple(size), coalesced

    # ------------------------------------------------------------------ metadata
    @property
    def shape(self) -> Size:
        return Size(self._size)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self._size[dim]

    def dim(self) -> int:
        return len(self._size)

    ndim = property(dim)

    @property
    def dtype(self) -> dt.DType:
        return self._values_t.dtype

    @property
    def device(self):
        return self._values_t.device

    @property
    def requires_grad(self) -> bool:
        return self._values_t.requires_grad

    @property
    def grad(self):
        return self._values_t.grad

    def requires_grad_(self, requires_grad: bool = True) -> SparseTensor:
        self._values_t.requires_grad_(requires_grad)
        return self

    def sparse_dim(self) -> int:
        return self._indices_t.shape[0]

    def dense_dim(self) -> int:
        return self._values_t.ndim - 1

    def _nnz(self) -> int:
        return self._values_t.shape[0]

    def _indices(self) -> Tensor:
        return self._indices_t

    def _values(self) -> Tensor:
        return self._values_t

    def indices(self) -> Tensor:
        self._require_coalesced("indices")
        return self._indices_t

    def values(self) -> Tensor:
        self._require_coalesced("values")
        return self._values_t

    def is_coalesced(self) -> bool:
        return self._coalesced

    def _require_coalesced(self, what: str) -> None:
        if not self._coalesced:
            raise RuntimeError(f"Cannot get {what} on an uncoalesced tensor, please call .coalesce() first")

    def __repr__(self) -> str:
        return (f"tensor(indices={self._indices_t!r},\n       values={self._values_t!r},\n       size={self._size}, "
                f"nnz={self._nnz()}, layout=kiln.sparse_coo)")  # fmt: skip

    # ------------------------------------------------------------------ conversions
    def coalesce(self) -> SparseTensor:
        """Positions sorted and unique, the values of repeated positions summed (differentiable in them)."""
        if self._coalesced:
            return self
        flat = _linear_positions(self._indices_t, self._size[: self.sparse_dim()])
        keys = flat.numpy()  # a data-dependent number of entries: a trace stops here, with the reason
        unique, slot = np.unique(keys, return_inverse=True)
        slot_t = _tensor(slot.astype(np.int64), device=self.device)
        dense_shape = tuple(self._values_t.shape[1:])
        values = index_add(zeros(len(unique), *dense_shape, dtype=self.dtype, device=self.device), 0, slot_t,
                           self._values_t)  # fmt: skip
        positions = np.stack(np.unravel_index(unique, self._size[: self.sparse_dim()])) if len(unique) else (
            np.zeros((self.sparse_dim(), 0), np.int64))  # fmt: skip
        return SparseTensor(_tensor(positions.astype(np.int64), device=self.device), values, self._size, True)

    def to_dense(self) -> Tensor:
        """The dense tensor (repeated positions added), differentiable in the values."""
        out = zeros(*self._size, dtype=self.dtype, device=self.device)
        rows = tuple(self._indices_t[d] for d in range(self.sparse_dim()))
        return index_put(out, rows, self._values_t, accumulate=True)

    def to(self, *args, **kwargs) -> SparseTensor:
        return SparseTensor(self._indices_t.to(*_device_only(args), **_device_only(kwargs)),
                            self._values_t.to(*args, **kwargs), self._size, self._coalesced)  # fmt: skip

    def float(self) -> SparseTensor:
        return self.to(dt.float32)

    def double(self) -> SparseTensor:
        return self.to(dt.float64)

    def cpu(self) -> SparseTensor:
        return self.to("cpu")

    def cuda(self, device=None) -> SparseTensor:
        return self.to(device or "cuda")

    def t(self) -> SparseTensor:
        """The transpose of a sparse matrix (its index rows swapped; no longer sorted)."""
        if self.sparse_dim() != 2 or self.dense_dim():
            raise RuntimeError(f"t() expects a sparse matrix, got sparse dims {self.sparse_dim()} and dense dims "
                               f"{self.dense_dim()}")  # fmt: skip
        swapped = self._indices_t.flip(0)
        return SparseTensor(swapped, self._values_t, self._size[::-1], False)

    # ------------------------------------------------------------------ products
    def mm(self, other: Tensor) -> Tensor:
        return spmm(self, other)

    def matmul(self, other: Tensor) -> Tensor:
        return spmm(self, other)

    __matmul__ = matmul

    def __rmatmul__(self, other: Tensor) -> Tensor:
        return _dense_times_sparse(other, self)

    def __add__(self, other) -> SparseTensor:
        """``sparse + sparse`` of one size: both entry lists (not coalesced). PyTorch refuses ``sparse +
        dense`` (``dense + sparse`` is dense: ``elementwise.add``), and so does kiln."""
        if isinstance(other, Tensor):
            raise RuntimeError("add(sparse, dense) is not supported. Use add(dense, sparse) instead.")
        if not isinstance(other, SparseTensor):
            return NotImplemented
        if other._size != self._size:
            raise RuntimeError(f"add: sparse tensors of sizes {list(self._size)} and {list(other._size)} differ")
        values = other._values_t.to(self.dtype) if other.dtype is not self.dtype else other._values_t
        return SparseTensor(cat([self._indices_t, other._indices_t], 1), cat([self._values_t, values]), self._size)

    def __sub__(self, other) -> SparseTensor:
        if isinstance(other, SparseTensor):
            return self + other * -1
        return self + other

    def __mul__(self, other) -> SparseTensor:
        if isinstance(other, Tensor) and other.ndim:
            raise RuntimeError("a sparse tensor times a dense one is supported for numbers and 0-d tensors only")
        return SparseTensor(self._indices_t, self._values_t * other, self._size, self._coalesced)

    __rmul__ = __mul__


def _device_only(args):
    """The device among ``to``'s arguments (indices keep their int64 dtype)."""
    if isinstance(args, dict):
        return {k: v for k, v in args.items() if k == "device"}
    return tuple(a for a in args if isinstance(a, str | Device))


def _linear_positions(indices: Tensor, shape: tuple[int, ...]) -> Tensor:
    strides = np.cumprod((1,) + tuple(shape[:0:-1]))[::-1].astype(np.int64)
    weights = reshape(_tensor(strides.copy(), device=indices.device), (-1, 1))
    return (indices * weights).sum(0)


def sparse_coo_tensor(indices, values, size=None, *, dtype=None, device=None, requires_grad: bool = False,
                      check_invariants=None, is_coalesced: bool | None = None) -> SparseTensor:  # fmt: skip
    """A COO sparse tensor with ``values[i]`` at ``indices[:, i]`` (``torch.sparse_coo_tensor``); ``size``
    defaults to the smallest that holds every index. Indices are checked against ``size``."""
    indices = indices if isinstance(indices, Tensor) else _tensor(indices, device=device)
    values = values if isinstance(values, Tensor) else _tensor(values, dtype=dtype, device=device)
    if dtype is not None:
        values = values.to(dtype)
    if indices.ndim != 2 or indices.dtype not in (dt.int64, dt.int32):
        raise RuntimeError(f"sparse_coo_tensor: indices must be a 2-D int64 tensor (sparse dims x nnz), got "
                           f"{indices.dtype.name} of shape {list(indices.shape)}")  # fmt: skip
    indices = cast(indices, dt.int64)
    sparse_dims, nnz = indices.shape
    if values.ndim < 1 or values.shape[0] != nnz:
        raise RuntimeError(f"sparse_coo_tensor: values must have one entry per index column ({nnz}), got shape "
                           f"{list(values.shape)}")  # fmt: skip
    if size is None:
        high = indices.amax(1).tolist() if nnz else [-1] * sparse_dims
        size = tuple(h + 1 for h in high) + tuple(values.shape[1:])
    size = tuple(int(s) for s in size)
    if len(size) != sparse_dims + values.ndim - 1 or tuple(size[sparse_dims:]) != tuple(values.shape[1:]):
        raise RuntimeError(f"sparse_coo_tensor: size {list(size)} does not fit {sparse_dims} sparse dims and values "
                           f"of shape {list(values.shape)}")  # fmt: skip
    if nnz and sparse_dims:
        for d in range(sparse_dims):
            check_range(indices[d], 0, size[d], RuntimeError,
                        f"sparse_coo_tensor: index {{value}} is out of bounds for sparse dim {d} of size {size[d]}")  # fmt: skip
    if requires_grad:
        values.requires_grad_(True)
    return SparseTensor(indices, values, size, bool(is_coalesced) or nnz <= 1)


def spmm(input: SparseTensor, mat2: Tensor) -> Tensor:
    """``input @ mat2`` for a sparse matrix and a dense matrix or vector: each dense row its columns
    name, times its value, added into the row its rows name. Gradients flow to ``mat2`` and the values."""
    if not isinstance(input, SparseTensor):
        raise TypeError(f"spmm(): expected a sparse matrix first, got {type(input).__name__}")
    if input.sparse_dim() != 2 or input.dense_dim():
        raise RuntimeError(f"spmm(): expected a 2-D sparse matrix, got sparse dims {input.sparse_dim()} and dense "
                           f"dims {input.dense_dim()}")  # fmt: skip
    if not isinstance(mat2, Tensor) or mat2.ndim not in (1, 2):
        raise RuntimeError(f"spmm(): expected a dense matrix or vector second, got {getattr(mat2, 'shape', mat2)}")
    rows, cols = input._size
    if mat2.shape[0] != cols:
        raise RuntimeError(f"spmm(): shapes {list(input._size)} and {list(mat2.shape)} cannot be multiplied")
    if mat2.dtype is not input.dtype:
        raise RuntimeError(f"spmm(): expected both inputs to have the same dtype, got {input.dtype.name} and "
                           f"{mat2.dtype.name}")  # fmt: skip
    row, col = input._indices_t[0], input._indices_t[1]
    values = input._values_t if mat2.ndim == 1 else unsqueeze(input._values_t, 1)
    picked = index_select(mat2, 0, col) * values
    out = zeros(rows, *mat2.shape[1:], dtype=mat2.dtype, device=mat2.device)
    return index_add(out, 0, row, picked)


def _dense_times_sparse(dense: Tensor, sparse: SparseTensor) -> Tensor:
    """``dense @ sparse`` as ``(sparse.t() @ dense.t()).t()``."""
    if dense.ndim == 1:
        return spmm(sparse.t(), dense)
    return spmm(sparse.t(), dense.t()).t()


@method("to_sparse")
def to_sparse(input: Tensor, sparse_dim: int | None = None) -> SparseTensor:
    """The non-zero entries as a coalesced COO tensor (over the first ``sparse_dim`` dims: all by default)."""
    sparse_dim = input.ndim if sparse_dim is None else sparse_dim
    if not 0 < sparse_dim <= input.ndim:
        raise RuntimeError(f"to_sparse: sparse_dim must be in [1, {input.ndim}], got {sparse_dim}")
    lead = reshape(input, (*input.shape[:sparse_dim], -1)) if sparse_dim < input.ndim else input
    present = (lead != 0).any(-1) if sparse_dim < input.ndim else lead != 0
    positions = nonzero(present)  # data-dependent: stops a trace, as coalesce does
    where = tuple(positions[:, d] for d in range(sparse_dim))
    values = input[where] if where else input
    return SparseTensor(positions.t().contiguous(), values, tuple(input.shape), True)
