"""The LU family and the ``_ex`` variants of ``torch.linalg``: ``lu_factor``, ``lu_factor_ex``, ``lu``,
``lu_solve``, ``solve_ex``, ``inv_ex``, ``cholesky_ex``, with ``vander``, ``tensorinv``,
``tensorsolve`` and ``householder_product``; ``kiln.linalg`` exports them.

kiln has no LU primitive: ``lu_factor_ex`` is Gaussian elimination with partial pivoting (LAPACK's
``getrf``: at each column the row of largest magnitude, the first one on a tie) written over
kiln's ops, one column per step over the whole batch. The pivot rows are chosen with ``argmax`` and
applied with ``gather``, so no value is read: the factorization carries gradients (those of the
elimination with its pivots fixed, which are LU's) and compiles. It costs about ten ops per column;
where no history is needed (no grad, not traced) the same steps run on the numpy arrays instead,
with the same arithmetic. Either way it suits the small and moderate matrices ported programs
factor (hundreds of rows, not thousands). ``lu_solve`` runs kiln's triangular solves; where U has a zero pivot it gives nan rather
than raising (LAPACK's substitution gives inf or nan there). ``solve_ex`` and ``inv_ex`` solve with
these, so their ``info`` is the factorization's.
``cholesky_ex`` needs to know whether each matrix is positive-definite before it can use the
Cholesky primitive; it reads that with numpy, so under ``kiln.compile`` its trace stops there.

This module is written over ``kiln.linalg``'s functions above the frontend; ``kiln/linalg.py``
imports it at its end.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from . import linalg
from .frontend import ops
from .frontend.autograd.grad_mode import is_grad_enabled
from .frontend.jit import state as _jit
from .frontend.tensor import Tensor
from .ir import dtypes as dt
from .ir.primitives.decompositions import LinAlgError

__all__ = ["lu_factor", "lu_factor_ex", "lu", "lu_solve", "solve_ex", "inv_ex", "cholesky_ex", "vander", "tensorinv",
           "tensorsolve", "householder_product"]  # fmt: skip

LUFactorResult = namedtuple("linalg_lu_factor", ["LU", "pivots"])  # type: ignore[name-match]  # torch.return_types
LUFactorExResult = namedtuple("linalg_lu_factor_ex", ["LU", "pivots", "info"])  # type: ignore[name-match]
LUResult = namedtuple("linalg_lu", ["P", "L", "U"])  # type: ignore[name-match]
SolveExResult = namedtuple("linalg_solve_ex", ["result", "info"])  # type: ignore[name-match]
InvExResult = namedtuple("linalg_inv_ex", ["inverse", "info"])  # type: ignore[name-match]
CholeskyExResult = namedtuple("linalg_cholesky_ex", ["L", "info"])  # type: ignore[name-match]


def _mT(x: Tensor) -> Tensor:
    return ops.transpose(x, -1, -2)


def _swap_first(rows: Tensor, pick: Tensor) -> Tensor:
    """The index that swaps entry 0 with entry ``pick`` (per batch element) of the last dim of ``rows``."""
    index = ops.arange(rows.shape[-1], device=rows.device).expand(*rows.shape)
    pick = ops.unsqueeze(pick, -1)
    return ops.where(ops.eq(index, 0), pick, ops.where(ops.eq(index, pick), 0, index))


def lu_factor_ex(A: Tensor, *, pivot: bool = True, check_errors: bool = False) -> LUFactorExResult:
    """``A = P L U`` packed as LAPACK's ``getrf``: L's multipliers below the diagonal and U on and above
    it in ``LU``, the (1-based, int32) row swapped with row i at step i in ``pivots``, and in ``info``
    the first (1-based) step whose pivot was zero, or 0. Any (..., m, n) matrices.

    >>> import kiln
    >>> kiln.linalg.lu_factor_ex(kiln.tensor([[1.0, 2.0], [3.0, 4.0]])).pivots
    tensor([2, 2], dtype=kiln.int32)
    """
    linalg._matrices(A, "lu_factor_ex", square=False)
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
    if _jit.tracing or (is_grad_enabled() and A.requires_grad):
        LU, pivot_rows, info = _eliminate(A)
    else:  # the same steps on the arrays: no history to record, a hundred times fewer dispatches
        arrays = _eliminate_arrays(A.detach()._host())
        LU, pivot_rows, info = (ops.tensor(x, device=A.device) for x in arrays)
    if check_errors and bool(ops.any(ops.ne(info, 0))):
        raise LinAlgError(f"torch.linalg.lu_factor_ex: U[{_first_zero(info)}] is zero (the factorization is singular)")
    return LUFactorExResult(LU, pivot_rows, info)


def _eliminate(A: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``getrf`` over kiln's ops, one column per step for the whole batch: differentiable, traceable."""
    m, n = A.shape[-2:]
    k = min(m, n)
    batch = tuple(A.shape[:-2])
    work = A  # rows j.. of the working matrix: L's multipliers left of column j, the Schur complement right
    finished, pivots = [], []
    info = ops.zeros(batch, dtype=dt.int32, device=A.device)
    for j in range(k):
        pick = ops.argmax(ops.abs(work[..., :, j].detach()), -1)  # the first row of largest magnitude
        swap = _swap_first(work[..., :, j].detach(), pick)
        work = ops.gather(work, -2, ops.expand(ops.unsqueeze(swap, -1), tuple(work.shape)))
        top, below = work[..., 0, :], work[..., 1:, :]
        head = top[..., j]
        zero = ops.eq(head, 0)
        info = ops.where(ops.logical_and(zero, ops.eq(info, 0)), j + 1, info)
        # LAPACK leaves a zero pivot's column as it is (all zeros below it, since it was the largest)
        multipliers = below[..., j] / ops.unsqueeze(ops.where(zero, 1.0, head), -1)
        rest = below[..., j + 1 :] - ops.unsqueeze(multipliers, -1) * ops.unsqueeze(top[..., j + 1 :], -2)
        work = ops.cat([below[..., :j], ops.unsqueeze(multipliers, -1), rest], -1)
        finished.append(top)
        pivots.append((pick + (j + 1)).to(dt.int32))
    rows = ops.stack(finished, -2) if finished else work[..., :0, :]
    LU = ops.cat([rows, work], -2) if m > k else rows
    pivot_rows = ops.stack(pivots, -1) if pivots else ops.zeros((*batch, 0), dtype=dt.int32, device=A.device)
    return LU, pivot_rows, info


def _eliminate_arrays(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_eliminate``'s steps in place on a copy of the array: the same arithmetic, so the same values."""
    m, n = a.shape[-2:]
    k = min(m, n)
    batch = a.shape[:-2]
    flat = np.array(a.reshape(math.prod(batch), m, n), copy=True)
    pivots = np.zeros((flat.shape[0], k), dtype=np.int32)
    info = np.zeros(flat.shape[0], dtype=np.int32)
    each = np.arange(flat.shape[0])
    for j in range(k):
        pick = j + np.argmax(np.abs(flat[:, j:, j]), axis=1)
        pivots[:, j] = pick + 1
        picked = flat[each, pick].copy()
        flat[each, pick] = flat[:, j]
        flat[:, j] = picked
        head = flat[:, j, j]
        zero = head == 0
        info[(info == 0) & zero] = j + 1
        multipliers = flat[:, j + 1 :, j] / np.where(zero, 1.0, head)[:, None]
        flat[:, j + 1 :, j] = multipliers
        flat[:, j + 1 :, j + 1 :] -= multipliers[:, :, None] * flat[:, j, None, j + 1 :]
    return flat.reshape(a.shape), pivots.reshape(*batch, k), info.reshape(batch)


def _first_zero(info: Tensor) -> str:
    step = int(ops.amax(info).item())
    return f"{step},{step}"


def lu_factor(A: Tensor, *, pivot: bool = True) -> LUFactorResult:
    """``lu_factor_ex``'s ``(LU, pivots)``; raises where a square matrix is singular (an exactly
    zero pivot), as PyTorch, since ``lu_solve`` would divide by zero."""
    LU, pivots, info = lu_factor_ex(A, pivot=pivot)
    if A.shape[-1] == A.shape[-2] and bool(ops.any(ops.ne(info, 0))):
        step = int(ops.amax(info).item())
        raise RuntimeError(f"torch.linalg.lu_factor: U[{step},{step}] is zero and using it on lu_solve would result "
                           "in a division by zero. If you still want to perform the factorization, consider calling "
                           "linalg.lu(A, pivot) or linalg.lu_factor_ex(A, pivot)")  # fmt: skip
    return LUFactorResult(LU, pivots)


def _permutation(pivots: Tensor, m: int) -> Tensor:
    """The row order ``pivots`` (LAPACK's swaps) puts A in: ``A[..., order, :] = L U``. The swaps
    are sequential: eagerly numpy applies them to the integers (exact, a few microseconds a swap);
    traced, they are gathers in the graph, so no value is read."""
    if not _jit.tracing:
        swaps = pivots.detach()._host().astype(np.int64) - 1
        order = np.broadcast_to(np.arange(m), (*swaps.shape[:-1], m)).copy()
        rows = np.ogrid[tuple(slice(0, n) for n in swaps.shape[:-1])] if swaps.ndim > 1 else ()
        for i in range(swaps.shape[-1]):
            target = swaps[..., i]
            here, there = order[..., i].copy(), order[(*rows, target)] if rows else order[target]
            order[..., i] = there
            if rows:
                order[(*rows, target)] = here
            else:
                order[target] = here
        return ops.tensor(order, device=pivots.device)
    order = ops.arange(m, device=pivots.device).expand(*pivots.shape[:-1], m)
    swaps_t = pivots.long() - 1
    for i in range(pivots.shape[-1]):
        index = ops.arange(m, device=pivots.device).expand(*order.shape)
        target_t = swaps_t[..., i : i + 1]
        index = ops.where(ops.eq(index, i), target_t, ops.where(ops.eq(index, target_t), i, index))
        order = ops.gather(order, -1, index)
    return order


def lu_unpack(LU_data: Tensor, LU_pivots: Tensor, unpack_data: bool = True, unpack_pivots: bool = True) -> LUResult:
    """``(P, L, U)`` from ``lu_factor``'s packed form: L unit lower (m, k), U upper (k, n), P the
    permutation matrix (m, m) with ``A = P @ L @ U``; an output not asked for is empty."""
    m, n = LU_data.shape[-2:]
    k = min(m, n)
    empty = ops.zeros(0, dtype=LU_data.dtype, device=LU_data.device)
    L = U = P = empty
    if unpack_data:
        eye = ops.eye(m, k, dtype=LU_data.dtype, device=LU_data.device)
        L = ops.tril(LU_data[..., :, :k], -1) + eye
        U = ops.triu(LU_data[..., :k, :])
    if unpack_pivots:
        P = _one_hot_t(_permutation(LU_pivots, m), m, LU_data)
    return LUResult(P, L, U)


def _one_hot_t(order: Tensor, m: int, like: Tensor) -> Tensor:
    """``P[..., r, i] = (order[..., i] == r)``: the permutation matrix with ``A = P A[order]``."""
    rows = ops.arange(m, device=like.device)
    return ops.eq(ops.unsqueeze(order, -2), ops.unsqueeze(rows, -1)).to(like.dtype)


def lu(A: Tensor, *, pivot: bool = True) -> LUResult:
    """``A = P @ L @ U`` of any (..., m, n) matrices, singular ones included."""
    LU, pivots, _ = lu_factor_ex(A, pivot=pivot)
    return lu_unpack(LU, pivots)


def lu_solve(LU: Tensor, pivots: Tensor, B: Tensor, *, left: bool = True, adjoint: bool = False) -> Tensor:
    """X with ``A X = B`` from A's ``lu_factor`` (``X A = B`` when ``left=False``; A's transpose when
    ``adjoint``)."""
    linalg._matrices(LU, "lu_solve")
    if B.ndim < 2:
        raise RuntimeError(f"linalg.lu_solve: Expected B to have at least 2 dimensions, got shape {list(B.shape)}")
    if not left:  # X A = B is A^T X^T = B^T
        return _mT(lu_solve(LU, pivots, _mT(B), left=True, adjoint=not adjoint))
    if B.shape[-2] != LU.shape[-1]:
        raise RuntimeError(f"linalg.lu_solve: Incompatible shapes of A and B for the equation AX = B "
                           f"({'x'.join(map(str, LU.shape[-2:]))} and {'x'.join(map(str, B.shape[-2:]))})")  # fmt: skip
    batch = ops.broadcast_shapes(tuple(LU.shape[:-2]), tuple(B.shape[:-2]))
    LU = ops.expand(LU, (*batch, *LU.shape[-2:]))
    B = ops.expand(B, (*batch, *B.shape[-2:]))
    order = _permutation(ops.expand(pivots, (*batch, pivots.shape[-1])), LU.shape[-1])
    if not adjoint:  # L U X = B[order]
        rows = ops.gather(B, -2, ops.expand(ops.unsqueeze(order, -1), tuple(B.shape)))
        return _substitute(LU, _substitute(LU, rows, lower=True), lower=False)
    # A^T X = B with A = P L U: U^T L^T P^T X = B, so P^T X = L^-T U^-T B and X = P (that)
    z = _substitute(_mT(LU), _substitute(_mT(LU), B, lower=True, unit=False), lower=False, unit=True)
    inverse = ops.argsort(order, -1)  # X[order] = z, so X = z[inverse order]
    return ops.gather(z, -2, ops.expand(ops.unsqueeze(inverse, -1), tuple(z.shape)))


def _substitute(T: Tensor, B: Tensor, *, lower: bool, unit: bool | None = None) -> Tensor:
    """X with ``T X = B`` for T's lower (or upper) triangle; ``unit`` (default: ``lower``) takes the
    diagonal as ones, as L's in ``LU``. A zero on the diagonal makes LAPACK's substitution divide by
    zero, and PyTorch's result there is not meaningful (the ``_ex`` functions' ``info`` says so);
    kiln's triangular solve would raise, so such a pivot is solved as 1 and that matrix's X is
    made all nan instead."""
    unit = lower if unit is None else unit
    if unit:
        return linalg.solve_triangular(T, B, upper=not lower, unitriangular=True)
    pivots = ops.diagonal(T, 0, -2, -1)
    zero = ops.eq(pivots, 0)
    safe = T + ops.diag_embed(zero.to(T.dtype))  # the zero pivots as 1
    X = linalg.solve_triangular(safe, B, upper=not lower)
    return ops.where(ops.unsqueeze(ops.unsqueeze(ops.any(zero, -1), -1), -1), math.nan, X)


def solve_ex(A: Tensor, B: Tensor, *, left: bool = True, check_errors: bool = False) -> SolveExResult:
    """``linalg.solve`` through ``lu_factor_ex``, with its ``info`` (0: solved; i: U[i, i] is zero and the
    result is nan, where PyTorch's holds inf or nan) instead of an error unless ``check_errors``."""
    linalg._matrices(A, "solve_ex")
    LU, pivots, info = lu_factor_ex(A, check_errors=check_errors)
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and tuple(B.shape) == tuple(A.shape[:-1]))
    if vector:
        return SolveExResult(ops.squeeze(lu_solve(LU, pivots, ops.unsqueeze(B, -1), left=left), -1), info)
    return SolveExResult(lu_solve(LU, pivots, B, left=left), info)


def inv_ex(A: Tensor, *, check_errors: bool = False) -> InvExResult:
    """``linalg.inv`` through ``lu_factor_ex``, with its ``info`` instead of an error."""
    linalg._matrices(A, "inv_ex")
    LU, pivots, info = lu_factor_ex(A, check_errors=check_errors)
    eye = ops.expand(ops.eye(A.shape[-1], dtype=A.dtype, device=A.device), tuple(A.shape))
    return InvExResult(lu_solve(LU, pivots, eye), info)


def _cholesky_failure(a: np.ndarray) -> tuple[int, np.ndarray]:
    """LAPACK's unblocked ``potf2`` on one matrix: the first (1-based) column whose pivot is not positive,
    and the factor as far as it got (that pivot stored unrooted, later columns as the input's)."""
    a = np.tril(a).astype(np.float64)
    for j in range(a.shape[0]):
        d = a[j, j] - a[j, :j] @ a[j, :j]
        if not d > 0:
            a[j, j] = d
            return j + 1, a
        a[j, j] = math.sqrt(d)
        a[j + 1 :, j] = (a[j + 1 :, j] - a[j + 1 :, :j] @ a[j, :j]) / a[j, j]
    return 0, a


def cholesky_ex(A: Tensor, *, upper: bool = False, check_errors: bool = False) -> CholeskyExResult:
    """``linalg.cholesky`` with an ``info`` per matrix (0, or the order of the first leading minor that
    is not positive-definite) instead of an error unless ``check_errors``; where it fails the factor
    is LAPACK's partial one. Reads the values with numpy: the trace stops here under compile."""
    linalg._matrices(A, "cholesky_ex")
    if _jit.tracing:
        _jit.unsafe("linalg.cholesky_ex reads the values to find the matrices that are not positive-definite")
    values = A.detach()._host()
    flat = values.reshape(-1, *values.shape[-2:])
    found = [_cholesky_failure(m) for m in flat]  # only failures need this: cheap next to the checks below
    info = np.array([i for i, _ in found], dtype=np.int32).reshape(values.shape[:-2])
    if not info.any():
        return CholeskyExResult(linalg.cholesky(A, upper=upper), ops.tensor(info, device=A.device))
    if check_errors:
        raise LinAlgError(f"linalg.cholesky_ex: The factorization could not be completed because the input is not "
                          f"positive-definite (the leading minor of order {int(info.max())} is not "
                          "positive-definite).")  # fmt: skip
    factor = np.stack([f for _, f in found]).reshape(values.shape).astype(values.dtype)
    L = ops.tensor(np.swapaxes(factor, -1, -2).copy() if upper else factor, device=A.device)
    return CholeskyExResult(L, ops.tensor(info, device=A.device))


# ----------------------------------------------------------------------------- built over the solvers
def vander(x: Tensor, *, N: int | None = None) -> Tensor:
    """``x``'s powers 0..N-1 along a new last dim (N defaults to x's last size): ``x^0, x^1, ...``."""
    if x.ndim < 1:
        raise RuntimeError("linalg.vander: x must have at least one dimension")
    n = x.shape[-1] if N is None else N
    if n < 1:
        raise RuntimeError(f"linalg.vander: N must be greater than 1, got {n}")
    powers = [ops.ones_like(x)]
    for _ in range(n - 1):  # products, not pow: the gradient of x^0 at x = 0 stays 0
        powers.append(powers[-1] * x)
    return ops.stack(powers, -1)


def tensorinv(A: Tensor, ind: int = 2) -> Tensor:
    """The inverse for ``tensordot(A, X, ind)``: A reshaped to a square matrix (its first ``ind``
    dims against the rest), inverted, and shaped ``A.shape[ind:] + A.shape[:ind]``."""
    if ind <= 0:
        raise RuntimeError(f"Expected a strictly positive integer for 'ind', but got {ind}")
    rows, cols = math.prod(A.shape[:ind]), math.prod(A.shape[ind:])
    if rows != cols:
        raise RuntimeError(f"Expected self to satisfy the requirement prod(self.shape[ind:]) == prod(self.shape[:ind]),"
                           f" but got {cols} != {rows}")  # fmt: skip
    return ops.reshape(linalg.inv(ops.reshape(A, (rows, cols))), (*A.shape[ind:], *A.shape[:ind]))


def tensorsolve(A: Tensor, B: Tensor, dims=None) -> Tensor:
    """X with ``tensordot(A, X, X.ndim) = B``; ``dims`` of A move to its end first."""
    if dims is not None:
        dims = [d % A.ndim for d in dims]
        A = ops.movedim(A, dims, list(range(A.ndim - len(dims), A.ndim)))
    result_shape = tuple(A.shape[B.ndim :])
    rows, cols = B.numel(), math.prod(result_shape)
    if tuple(A.shape[: B.ndim]) != tuple(B.shape) or rows != cols:
        raise RuntimeError(f"Expected self to satisfy the requirement prod(self.shape[other.ndim:]) == "
                           f"prod(self.shape[:other.ndim]), but got {cols} != {rows}")  # fmt: skip
    return ops.reshape(linalg.solve(ops.reshape(A, (rows, cols)), ops.reshape(B, (rows,))), result_shape)


def householder_product(A: Tensor, tau: Tensor) -> Tensor:
    """The first n columns of ``H_1 ... H_k``, ``H_i = I - tau_i v_i v_i^T`` with ``v_i`` column i of A
    below the diagonal and 1 on it (LAPACK's ``orgqr``, with ``geqrf``'s reflectors)."""
    linalg._matrices(A, "householder_product", square=False)
    m, n = A.shape[-2:]
    k = tau.shape[-1]
    if m < n:
        raise RuntimeError("torch.linalg.householder_product: input.shape[-2] must be greater than or equal to "
                           "input.shape[-1]")  # fmt: skip
    if k > n:
        raise RuntimeError("torch.linalg.householder_product: input.shape[-1] must be greater than or equal to "
                           "tau.shape[-1]")  # fmt: skip
    if tuple(tau.shape[:-1]) != tuple(A.shape[:-2]):
        raise RuntimeError(f"torch.linalg.householder_product: Expected batch dimensions of tau to be equal to "
                           f"input.shape[:-2], but got {list(tau.shape[:-1])}")  # fmt: skip
    reflectors = ops.tril(A, -1) + ops.eye(m, n, dtype=A.dtype, device=A.device)
    Q = ops.expand(ops.eye(m, n, dtype=A.dtype, device=A.device), tuple(A.shape))
    for i in range(k - 1, -1, -1):  # H_1 (H_2 (... (H_k I))): each step a rank-one update
        v = reflectors[..., :, i : i + 1]
        Q = Q - tau[..., i : i + 1, None] * ops.matmul(v, ops.matmul(_mT(v), Q))
    return Q
