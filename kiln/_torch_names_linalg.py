"""The older ``torch.*`` linear algebra beside ``torch.linalg``: ``lu``, ``lu_unpack``, ``lu_solve``,
``triangular_solve``, ``cholesky_solve``, ``cholesky_inverse`` and ``qr``, and their Tensor methods.

Their argument orders and results are the older ones: ``torch.lu_solve(B, LU, pivots)`` takes the
right-hand side first, ``triangular_solve(B, A)`` solves with the *upper* triangle by default and
returns ``(solution, cloned_coefficient)``, ``qr(A, some=True)`` takes a bool, not a mode. Each is
written over ``kiln.linalg`` (the LU family is ``kiln/_linalg_lu.py``'s), so each carries gradients.
This module sits on the public side, as ``_torch_aliases`` does.
"""

from __future__ import annotations

from collections import namedtuple

from . import linalg
from ._linalg_lu import lu_unpack
from .frontend import ops
from .frontend.tensor import Tensor, method

__all__ = ["lu", "lu_unpack", "lu_solve", "triangular_solve", "cholesky_solve", "cholesky_inverse", "qr"]

TriangularSolveResult = namedtuple("triangular_solve", ["solution", "cloned_coefficient"])  # type: ignore[name-match]
QRResult = namedtuple("qr", ["Q", "R"])  # type: ignore[name-match]  # torch.return_types names


def lu(A: Tensor, pivot: bool = True, get_infos: bool = False):
    """``(LU, pivots)``, with ``infos`` when ``get_infos``: ``linalg.lu_factor_ex``'s."""
    LU, pivots, info = linalg.lu_factor_ex(A, pivot=pivot)
    return (LU, pivots, info) if get_infos else (LU, pivots)


def lu_solve(b: Tensor, LU_data: Tensor, LU_pivots: Tensor) -> Tensor:
    """The older order of ``linalg.lu_solve``: the right-hand side first."""
    return linalg.lu_solve(LU_data, LU_pivots, b)


def triangular_solve(b: Tensor, A: Tensor, upper: bool = True, transpose: bool = False,
                     unitriangular: bool = False) -> TriangularSolveResult:  # fmt: skip
    """X with ``op(A) X = b`` over A's ``upper`` (default) or lower triangle, ``op`` the transpose
    when ``transpose``; returns the solution and a copy of A, as PyTorch's deprecated form."""
    if A.ndim < 2 or b.ndim < 2:
        raise RuntimeError(f"torch.triangular_solve: Expected b and A to have at least 2 dimensions, but they have "
                           f"{b.ndim} and {A.ndim} dimensions instead.")  # fmt: skip
    batch = ops.broadcast_shapes(tuple(A.shape[:-2]), tuple(b.shape[:-2]))
    coefficient = ops.expand(A, (*batch, *A.shape[-2:]))
    rhs = ops.expand(b, (*batch, *b.shape[-2:]))
    matrix = ops.transpose(coefficient, -1, -2) if transpose else coefficient
    solution = linalg.solve_triangular(matrix, rhs, upper=upper != transpose, unitriangular=unitriangular)
    return TriangularSolveResult(solution, coefficient.clone())


def cholesky_solve(B: Tensor, L: Tensor, upper: bool = False) -> Tensor:
    """X with ``A X = B`` for ``A = L L^T`` (``U^T U`` when ``upper``), given the Cholesky factor."""
    if B.ndim < 2 or L.ndim < 2:
        raise RuntimeError(f"torch.cholesky_solve: Expected b and u to have at least 2 dimensions, but they have "
                           f"{B.ndim} and {L.ndim} dimensions instead.")  # fmt: skip
    batch = ops.broadcast_shapes(tuple(L.shape[:-2]), tuple(B.shape[:-2]))
    L = ops.expand(L, (*batch, *L.shape[-2:]))
    B = ops.expand(B, (*batch, *B.shape[-2:]))
    lower = ops.transpose(L, -1, -2) if upper else L
    y = linalg.solve_triangular(lower, B, upper=False)
    return linalg.solve_triangular(ops.transpose(lower, -1, -2), y, upper=True)


def cholesky_inverse(L: Tensor, upper: bool = False) -> Tensor:
    """The inverse of ``A = L L^T`` (``U^T U`` when ``upper``) from its Cholesky factor."""
    if L.ndim < 2 or L.shape[-1] != L.shape[-2]:
        raise RuntimeError(f"cholesky_inverse: A must be batches of square matrices, got shape {list(L.shape)}")
    eye = ops.expand(ops.eye(L.shape[-1], dtype=L.dtype, device=L.device), tuple(L.shape))
    return cholesky_solve(eye, L, upper)


def qr(A: Tensor, some: bool = True) -> QRResult:
    """``linalg.qr`` with the older flag: reduced factors when ``some``, complete ones otherwise."""
    return QRResult(*linalg.qr(A, "reduced" if some else "complete"))


method("lu")(lu)
method("lu_solve")(lu_solve)
method("triangular_solve")(triangular_solve)
method("cholesky_solve")(cholesky_solve)
method("cholesky_inverse")(cholesky_inverse)
method("qr")(qr)
