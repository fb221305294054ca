"""``kiln.linalg``: PyTorch's ``torch.linalg`` over batched matrices (the last two dims).

The decompositions (inv, solve, cholesky, eigh, svd, qr, slogdet) are primitives of kind
``DECOMPOSITION`` (``kiln/ir/primitives/decompositions.py``): eager runs numpy.linalg's LAPACK
over the batch, a compiled function records them as nodes that run the same kernel at every call
(never a value baked in), and each has its gradient from the standard formulas. Everything else
here is written over those and kiln's other ops.

Gradients follow the usual conditions: distinct eigenvalues for ``eigh``, distinct nonzero
singular values for ``svd``, full column rank for ``qr``; ``eigh``'s gradient is taken with
respect to the triangle ``UPLO`` names (the only entries it reads).

>>> import kiln
>>> a = kiln.tensor([[2.0, 1.0], [1.0, 3.0]])
>>> kiln.linalg.solve(a, kiln.tensor([3.0, 5.0]))
tensor([0.8000, 1.4000])
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from .frontend import ops
from .frontend.dispatch import apply
from .frontend.tensor import Tensor
from .ir import dtypes as dt
from .ir.primitives import P
from .ir.primitives.decompositions import LinAlgError, layout, unpack

__all__ = [
    "LinAlgError", "norm", "vector_norm", "matrix_norm", "inv", "solve", "det", "slogdet", "cholesky", "eigh",
    "eigvalsh", "svd", "svdvals", "qr", "cross", "matrix_power", "vecdot", "multi_dot", "pinv", "lstsq",
    "matrix_rank", "solve_triangular", "diagonal", "matmul", "matrix_exp",
]  # fmt: skip

SlogdetResult = namedtuple("linalg_slogdet", ["sign", "logabsdet"])  # type: ignore[name-match]  # PyTorch's type name (torch.return_types)
EighResult = namedtuple("linalg_eigh", ["eigenvalues", "eigenvectors"])  # type: ignore[name-match]
SVDResult = namedtuple("linalg_svd", ["U", "S", "Vh"])  # type: ignore[name-match]
QRResult = namedtuple("linalg_qr", ["Q", "R"])  # type: ignore[name-match]
LstsqResult = namedtuple("linalg_lstsq", ["solution", "residuals", "rank", "singular_values"])  # type: ignore[name-match]


def _floating(x, op: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"linalg.{op}(): argument 'A' must be a Tensor, not {type(x).__name__}")
    if not x.is_floating_point():
        raise RuntimeError(f"linalg.{op}: Expected a floating point or complex tensor as input. Got {x.dtype.name}")


def _matrices(x, op: str, square: bool = True) -> None:
    _floating(x, op)
    if x.ndim < 2:
        raise RuntimeError(
            f"linalg.{op}: The input tensor A must have at least 2 dimensions, got shape {list(x.shape)}"
        )
    if square and x.shape[-1] != x.shape[-2]:
        raise RuntimeError(
            f"linalg.{op}: A must be batches of square matrices, but they are {x.shape[-2]} by {x.shape[-1]} matrices"
        )


def _mT(x: Tensor) -> Tensor:
    return ops.transpose(x, -1, -2)


# ----------------------------------------------------------------------------- decompositions
def inv(A: Tensor) -> Tensor:
    """The inverse of each square matrix; raises ``LinAlgError`` for a singular one."""
    _matrices(A, "inv")
    return apply(P["linalg_inv"], A)


def solve(A: Tensor, B: Tensor, *, left: bool = True) -> Tensor:
    """X with ``A @ X = B`` (``X @ A = B`` when ``left=False``); B may be a (batch of) vector(s)."""
    _matrices(A, "solve")
    _floating(B, "solve")
    if A.dtype is not B.dtype:
        raise RuntimeError(
            f"linalg.solve: Expected A and B to have the same dtype, but found {A.dtype.name} and {B.dtype.name}"
        )
    # PyTorch's rule: B is a vector (or a batch of them) if it is 1-D or has A's batch shape
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and tuple(B.shape) == tuple(A.shape[:-1]))
    if vector and not left:
        raise RuntimeError(
            f"linalg.solve: Incompatible shapes of A and B for the equation XA = B ({'x'.join(map(str, A.shape))} and "
            f"{'x'.join(map(str, B.shape))}): with left=False, B must be a (batch of) matrices"
        )
    if vector:
        return ops.squeeze(solve(A, ops.unsqueeze(B, -1), left=left), -1)
    if not left:
        return _mT(apply(P["linalg_solve"], _mT(A), _mT(B)))
    return apply(P["linalg_solve"], A, B)


def slogdet(A: Tensor) -> SlogdetResult:
    """``(sign, logabsdet)`` of each square matrix's determinant."""
    _matrices(A, "slogdet")
    sign, logabsdet = unpack(ops, apply(P["linalg_slogdet"], A), layout("linalg_slogdet", tuple(A.shape)))
    return SlogdetResult(sign.detach(), logabsdet)


def det(A: Tensor) -> Tensor:
    """The determinant of each square matrix, as ``sign * exp(logabsdet)``."""
    _matrices(A, "det")
    sign, logabsdet = slogdet(A)
    return ops.mul(sign, ops.exp(logabsdet))


def cholesky(A: Tensor, *, upper: bool = False) -> Tensor:
    """The Cholesky factor of each symmetric positive-definite matrix (from its lower triangle)."""
    _matrices(A, "cholesky")
    lower = apply(P["linalg_cholesky"], A)
    return _mT(lower) if upper else lower


def _symmetric_from(A: Tensor, uplo: str, op: str) -> Tensor:
    if uplo not in ("L", "U"):
        raise RuntimeError(f"linalg.{op}: Expected UPLO argument to be 'L' or 'U', but got {uplo}")
    if uplo == "L":
        return ops.add(ops.tril(A), _mT(ops.tril(A, -1)))
    return ops.add(ops.triu(A), _mT(ops.triu(A, 1)))


def eigh(A: Tensor, UPLO: str = "L") -> EighResult:
    """Eigenvalues (ascending) and eigenvectors (columns) of symmetric matrices, read from the
    ``UPLO`` triangle. Each eigenvector's entry of largest magnitude is positive."""
    _matrices(A, "eigh")
    packed = apply(P["linalg_eigh"], _symmetric_from(A, UPLO, "eigh"))
    return EighResult(*unpack(ops, packed, layout("linalg_eigh", tuple(A.shape))))


def eigvalsh(A: Tensor, UPLO: str = "L") -> Tensor:
    return eigh(A, UPLO).eigenvalues


def svd(A: Tensor, full_matrices: bool = True, *, driver=None) -> SVDResult:
    """``A = U @ diag(S) @ Vh`` with S descending; reduced factors when ``full_matrices=False``."""
    _matrices(A, "svd", square=False)
    packed = apply(P["linalg_svd"], A, full_matrices=bool(full_matrices))
    return SVDResult(*unpack(ops, packed, layout("linalg_svd", tuple(A.shape), full_matrices=bool(full_matrices))))


def svdvals(A: Tensor, *, driver=None) -> Tensor:
    return svd(A, full_matrices=False).S


def qr(A: Tensor, mode: str = "reduced") -> QRResult:
    """``A = Q @ R``; mode "reduced" (default), "complete", or "r" (Q is then empty)."""
    _matrices(A, "qr", square=False)
    packed = apply(P["linalg_qr"], A, mode=mode)
    q, r = unpack(ops, packed, layout("linalg_qr", tuple(A.shape), mode=mode))
    if mode == "r":
        q = ops.reshape(q, (0,))
    return QRResult(q, r)


def _tolerance(A: Tensor, s: Tensor, atol, rtol):
    """PyTorch's cut-off for "zero" singular values: max(atol, rtol * s_max), with rtol defaulting
    to eps * max(m, n) unless a positive atol is given."""
    if rtol is None:
        rtol = 0.0 if atol is not None and atol > 0 else float(np.finfo(A.dtype.np).eps) * max(A.shape[-2:])
    bound = ops.amax(s, -1, keepdim=True) * rtol if s.shape[-1] else s
    if atol is not None:
        bound = ops.maximum(bound, ops.full_like(bound, float(atol)))
    return bound


def pinv(A: Tensor, *, atol=None, rtol=None, hermitian: bool = False) -> Tensor:
    """The pseudo-inverse through the SVD; singular values at or below ``max(atol, rtol * s_max)``
    count as zero (default rtol: ``eps * max(m, n)``, as PyTorch)."""
    _matrices(A, "pinv", square=False)
    u, s, vh = svd(A, full_matrices=False)
    keep = ops.gt(s, _tolerance(A, s, atol, rtol))
    s_inv = ops.where(keep, ops.div(1.0, ops.where(keep, s, 1.0)), 0.0)
    return ops.matmul(_mT(vh) * ops.unsqueeze(s_inv, -2), _mT(u))


def matrix_rank(A: Tensor, *, atol=None, rtol=None, hermitian: bool = False) -> Tensor:
    """The number of singular values above ``max(atol, rtol * s_max)`` (int64)."""
    _matrices(A, "matrix_rank", square=False)
    s = svdvals(A).detach()
    return ops.sum(ops.gt(s, _tolerance(A, s, atol, rtol)), -1)


_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def lstsq(A: Tensor, B: Tensor, rcond=None, *, driver=None) -> LstsqResult:
    """The least-squares solution of ``A X = B`` of minimal norm, through the pseudo-inverse.

    As PyTorch's CPU drivers: ``rank`` for all but "gels"; ``residuals`` (squared, per column of B)
    when A is tall and of full rank, for all but "gelsy" (the default); ``singular_values`` for
    "gelsd" and "gelss"; the others are empty tensors.
    """
    _matrices(A, "lstsq", square=False)
    _floating(B, "lstsq")
    driver = "gelsy" if driver is None else driver
    if driver not in _LSTSQ_DRIVERS:
        raise RuntimeError(f"torch.linalg.lstsq: parameter `driver` should be one of {_LSTSQ_DRIVERS}, got {driver!r}")
    if B.ndim < 2 or B.shape[-2] != A.shape[-2]:
        raise RuntimeError(
            f"torch.linalg.lstsq: input.size(-2) should match other.size(-2), got shapes {list(A.shape)} and {list(B.shape)}"
        )
    m, n = A.shape[-2:]
    solution = ops.matmul(pinv(A, rtol=rcond), B)
    empty = ops.zeros(0, dtype=A.dtype)
    rank = matrix_rank(A, rtol=rcond) if driver != "gels" else ops.zeros(0, dtype=dt.int64)
    residuals = empty
    if driver != "gelsy" and m > n and bool(ops.all(ops.eq(matrix_rank(A, rtol=rcond), n))):
        residuals = ops.sum(ops.pow(ops.sub(ops.matmul(A, solution), B), 2), -2)
    singular_values = svdvals(A) if driver in ("gelsd", "gelss") else empty
    return LstsqResult(solution, residuals, rank, singular_values)


def solve_triangular(A: Tensor, B: Tensor, *, upper: bool, left: bool = True, unitriangular: bool = False) -> Tensor:
    """X with ``A @ X = B`` (``X @ A = B`` when ``left=False``), reading only the ``upper`` or lower
    triangle of A (and taking its diagonal as ones when ``unitriangular``)."""
    _matrices(A, "solve_triangular")
    triangle = ops.triu(A) if upper else ops.tril(A)
    if unitriangular:
        eye = ops.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        triangle = ops.add(ops.mul(triangle, ops.sub(1.0, eye)), eye)
    if B.ndim < 2:
        raise RuntimeError(f"linalg.solve_triangular: B must have at least 2 dimensions, got shape {list(B.shape)}")
    return solve(triangle, B, left=left)


def diagonal(A: Tensor, *, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    return ops.diagonal(A, offset, dim1, dim2)


def matmul(input: Tensor, other: Tensor) -> Tensor:
    return ops.matmul(input, other)


# ----------------------------------------------------------------------------- norms
def vector_norm(x: Tensor, ord=2, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """The vector ``ord``-norm over ``dim`` (all elements when None): any real ord, inf, -inf, 0."""
    _floating(x if dtype is None else x.to(dtype), "vector_norm")
    if isinstance(ord, str):
        raise RuntimeError(f"linalg.vector_norm: ord must be a number, got {ord!r}")
    return ops.norm(x, ord, dim, keepdim, dtype=dtype)


def matrix_norm(A: Tensor, ord="fro", dim=(-2, -1), keepdim: bool = False, *, dtype=None) -> Tensor:
    """The matrix norm over the two dims ``dim``: 'fro', 'nuc', inf, -inf, 1, -1, 2, -2."""
    if dtype is not None:
        A = A.to(dtype)
    _floating(A, "matrix_norm")
    if A.ndim < 2:
        raise RuntimeError(
            f"linalg.matrix_norm: The input tensor A must have at least 2 dimensions, got shape {list(A.shape)}"
        )
    dim = tuple(d % A.ndim for d in dim)
    if len(dim) != 2 or dim[0] == dim[1]:
        raise RuntimeError(f"linalg.matrix_norm: dim must be a 2-tuple of different dims, got {dim}")
    if ord == "fro":
        return ops.norm(A, 2, dim, keepdim)
    if ord in ("nuc", 2, -2):
        s = svdvals(ops.movedim(A, dim, (-2, -1)))
        out = ops.sum(s, -1) if ord == "nuc" else ops.amax(s, -1) if ord == 2 else ops.amin(s, -1)
        if keepdim:
            for d in sorted(dim):
                out = ops.unsqueeze(out, d)
        return out
    if ord in (math.inf, -math.inf, 1, -1):
        summed, kept = (dim[1], dim[0]) if abs(ord) == math.inf else (dim[0], dim[1])
        sums = ops.sum(ops.abs(A), summed, keepdim=True)
        out = ops.amax(sums, kept, keepdim=True) if ord > 0 else ops.amin(sums, kept, keepdim=True)
        return out if keepdim else ops.squeeze(ops.squeeze(out, max(dim)), min(dim))
    raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")


def norm(A: Tensor, ord=None, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """A vector norm (``dim`` an int, or 1-D input) or a matrix norm (``dim`` a pair, or 2-D input);
    with ``ord`` and ``dim`` both None, the 2-norm of all elements."""
    if isinstance(dim, int):
        dim = (dim,)
    if ord is None:
        if dim is not None and len(dim) == 2:
            return matrix_norm(A, "fro", dim, keepdim, dtype=dtype)
        return vector_norm(A, 2, dim, keepdim, dtype=dtype)
    if dim is None:
        if A.ndim not in (1, 2):
            raise RuntimeError(
                f"linalg.norm: If dim is not specified but ord is, the input must be 1D or 2D. Got {A.ndim}D."
            )
        dim = tuple(range(A.ndim))
    if len(dim) == 2:
        return matrix_norm(A, ord, dim, keepdim, dtype=dtype)
    if isinstance(ord, str):
        raise RuntimeError(f"linalg.norm: ord={ord!r} is a matrix norm, but dim={dim} names one dimension")
    return vector_norm(A, ord, dim, keepdim, dtype=dtype)


# ----------------------------------------------------------------------------- products
def cross(input: Tensor, other: Tensor, *, dim: int = -1) -> Tensor:
    """The cross product of 3-vectors along ``dim`` (the other dims broadcast)."""
    if input.ndim != other.ndim:
        raise RuntimeError(
            f"linalg.cross: inputs must have the same number of dimensions, got shapes {list(input.shape)} and "
            f"{list(other.shape)}"
        )
    for name, t in (("input", input), ("other", other)):
        if t.shape[dim] != 3:
            raise RuntimeError(f"linalg.cross: {name}.size({dim}) must be 3, but got {t.shape[dim]}")
    a = [ops.narrow(input, dim, i, 1) for i in range(3)]
    b = [ops.narrow(other, dim, i, 1) for i in range(3)]
    parts = [a[(i + 1) % 3] * b[(i + 2) % 3] - a[(i + 2) % 3] * b[(i + 1) % 3] for i in range(3)]
    return ops.cat(parts, dim)


def matrix_power(A: Tensor, n: int) -> Tensor:
    """A to the integer power n by repeated squaring (n < 0: the power of the inverse)."""
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"linalg.matrix_power: A must be batches of square matrices, got shape {list(A.shape)}")
    if n == 0:
        return ops.expand(ops.eye(A.shape[-1], dtype=A.dtype, device=A.device), tuple(A.shape)).clone()
    if n < 0:
        A, n = inv(A), -n
    result, square = None, A
    while n:
        if n & 1:
            result = square if result is None else ops.matmul(result, square)
        n >>= 1
        if n:
            square = ops.matmul(square, square)
    assert result is not None  # n > 0 here: the loop set it
    return result


def vecdot(x: Tensor, y: Tensor, *, dim: int = -1) -> Tensor:
    return ops.sum(x * y, dim)


def multi_dot(tensors) -> Tensor:
    """The product of a chain of matrices (first and last may be vectors), left to right."""
    tensors = list(tensors)
    if len(tensors) < 2:
        raise RuntimeError(f"multi_dot(): expected at least 2 tensors but got {len(tensors)}")
    out = tensors[0]
    for t in tensors[1:]:
        out = ops.matmul(out, t)
    return out


def matrix_exp(A: Tensor) -> Tensor:
    """exp(A) of each square matrix by scaling and squaring: A / 2^s with s from the largest
    inf-norm in the batch (so the scaled norm is at most 1), the Taylor series to degree 18 there
    (the remainder is below 1/19! ~ 1e-17), then s squarings. s is read from the values, so under
    ``kiln.compile`` the call runs eagerly (the trace stops at that read)."""
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise RuntimeError(
            f"linalg.matrix_exp: Expected a square matrix or batch of square matrices, got {list(A.shape)}"
        )
    _floating(A, "matrix_exp")
    n = A.shape[-1]
    if A.numel() == 0:
        return A.clone()
    norm = float(ops.amax(ops.sum(ops.abs(A.detach()), -1)).item()) if n else 0.0
    squarings = max(0, math.ceil(math.log2(norm))) if norm > 0 and math.isfinite(norm) else 0
    scaled = A * (0.5**squarings)
    eye = ops.expand(ops.eye(n, dtype=A.dtype, device=A.device), tuple(A.shape))
    result = eye
    for k in range(18, 0, -1):  # I + A/1 (I + A/2 (... (I + A/18)))
        result = eye + ops.matmul(scaled, result) * (1.0 / k)
    for _ in range(squarings):
        result = ops.matmul(result, result)
    return result


# The LU family and the ``_ex`` variants, written over the functions above (kiln/_linalg_lu.py).
from ._linalg_lu import (  # noqa: E402
    cholesky_ex,
    householder_product,
    inv_ex,
    lu,
    lu_factor,
    lu_factor_ex,
    lu_solve,
    solve_ex,
    tensorinv,
    tensorsolve,
    vander,
)

__all__ += ["lu_factor", "lu_factor_ex", "lu", "lu_solve", "solve_ex", "inv_ex", "cholesky_ex", "vander", "tensorinv",
            "tensorsolve", "householder_product"]  # fmt: skip
