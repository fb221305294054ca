"""``kiln.sparse``: PyTorch's ``torch.sparse`` names for COO sparse tensors (``kiln.frontend.ops.sparse``).

``mm(sparse, dense)`` is the sparse-dense product (``kiln.spmm``); ``FloatTensor(indices, values, size)``
and ``DoubleTensor`` are the legacy constructors older graph-network code still calls.
"""

from __future__ import annotations

from .frontend.ops.sparse import SparseTensor, sparse_coo_tensor, spmm
from .ir import dtypes as _dt

__all__ = ["mm", "SparseTensor", "FloatTensor", "DoubleTensor"]


def mm(sparse: SparseTensor, dense):
    """``sparse @ dense``, differentiable in ``dense`` and in the sparse values."""
    return spmm(sparse, dense)


def FloatTensor(indices, values, size) -> SparseTensor:  # noqa: N802 - PyTorch's name
    """A float32 COO sparse tensor (``torch.sparse.FloatTensor``, the legacy constructor)."""
    return sparse_coo_tensor(indices, values, tuple(size), dtype=_dt.float32)


def DoubleTensor(indices, values, size) -> SparseTensor:  # noqa: N802 - PyTorch's name
    """A float64 COO sparse tensor (``torch.sparse.DoubleTensor``)."""
    return sparse_coo_tensor(indices, values, tuple(size), dtype=_dt.float64)
