"""Matrix decompositions through ``numpy.linalg``: inverse, solve, cholesky, eigh, svd, qr, slogdet.

These are primitives of kind ``DECOMPOSITION``: no code generator fuses them, so a compiled
graph runs them as extern nodes with their eager kernel (numpy's LAPACK over the batch), exactly
as eager does, and reads new inputs at every call. Their VJPs are the standard formulas written
with kiln ops, so they run eagerly, build higher-order graphs and are recorded when traced.

A decomposition with several results (eigh, svd, qr, slogdet) has one packed output: each result
is flattened over its matrix dims and they are concatenated along one last axis, in the order
``layout`` lists them; ``unpack`` reads them back (the frontend with kiln ops, a VJP with the
``ops`` it receives), so one node and one LAPACK call give all results.

Eigenvectors and singular vectors are unique only up to sign; the kernels make the entry of
largest magnitude of each eigenvector (each left singular vector) positive, so results are one
deterministic function of the input whatever LAPACK computed them.
"""

from __future__ import annotations

import math

import numpy as np

from ..shapes import broadcast_shapes
from ..types import TensorType
from . import Kind, Primitive, Sample, register


class LinAlgError(RuntimeError):
    """A matrix was singular or not positive-definite (``torch.linalg.LinAlgError``)."""


def _square(t: TensorType, op: str) -> object:
    if t.ndim < 2 or t.shape[-1] != t.shape[-2]:
        raise RuntimeError(
            f"linalg.{op}: A must be batches of square matrices, but they are {' by '.join(map(str, t.shape[-2:]))} "
            f"matrices (shape {list(t.shape)})"
        )
    if not t.dtype.is_floating_point:
        raise RuntimeError(f"linalg.{op}: Expected a floating point tensor as input. Got {t.dtype.name}")
    return t.shape[-1]


def _lapack(xp, fn, op: str, *arrays):
    # cupy raises numpy's LinAlgError, or its own where it has one
    errors = (np.linalg.LinAlgError, getattr(xp.linalg, "LinAlgError", np.linalg.LinAlgError))
    try:
        return fn(*arrays)
    except errors as error:
        raise LinAlgError(f"linalg.{op}: {error} (the input is singular or not positive-definite)") from None


# ----------------------------------------------------------------------------- packing several results
def layout(op: str, shape: tuple, **attrs) -> list[tuple[int, ...]]:
    """The matrix shapes (without batch dims) of the results packed in ``op``'s output."""
    m, n = shape[-2], shape[-1]
    k = min(m, n)
    if op == "linalg_eigh":
        return [(n,), (n, n)]
    if op == "linalg_svd":
        full = attrs["full_matrices"]
        return [(m, m if full else k), (k,), (n if full else k, n)]
    if op == "linalg_qr":
        mode = attrs["mode"]
        q_cols = m if mode == "complete" else k
        return [(m, q_cols) if mode != "r" else (0,), (q_cols if mode != "r" else k, n)]
    if op == "linalg_slogdet":
        return [(), ()]
    raise AssertionError(op)


def _pack(xp, arrays, batch: tuple):
    flat = [a.reshape(batch + (math.prod(a.shape[len(batch) :]),)) for a in arrays]
    return xp.ascontiguousarray(xp.concatenate(flat, axis=-1))


def unpack(ops, packed, shapes) -> list:
    """The results in ``packed`` (a kiln tensor), each reshaped to batch dims + its matrix shape."""
    batch = tuple(packed.shape[:-1])
    out, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        out.append(ops.reshape(ops.narrow(packed, -1, start, size), batch + tuple(shape)))
        start += size
    return out


def _packed_type(op: str, a: TensorType, **attrs) -> TensorType:
    total = sum(math.prod(s) for s in layout(op, a.shape, **attrs))
    return TensorType((*a.shape[:-2], total), a.dtype, a.device)


def _sign_fix(xp, vectors):
    """Signs making each column's entry of largest magnitude positive (ties: the first one)."""
    if vectors.shape[-2] == 0:
        return xp.ones(vectors.shape[:-2] + vectors.shape[-1:], vectors.dtype)
    rows = xp.argmax(xp.abs(vectors), axis=-2)[..., None, :]
    return xp.where(xp.take_along_axis(vectors, rows, axis=-2)[..., 0, :] < 0, -1.0, 1.0).astype(vectors.dtype)


# ----------------------------------------------------------------------------- helpers for the VJPs
def _mT(ops, x):
    return ops.transpose(x, -1, -2)


def _inv(ops, x):
    return ops.apply(P_INV, x)


def _solve(ops, a, b):
    return ops.apply(P_SOLVE, a, b)


def _off_diagonal_reciprocal(ops, values):
    """F[i, j] = 1 / (values[j] - values[i]) off the diagonal and 0 on it (values distinct)."""
    diff = ops.sub(ops.unsqueeze(values, -2), ops.unsqueeze(values, -1))
    eye = ops.eye(values.shape[-1], dtype=values.dtype)
    return ops.where(ops.eq(eye, 1.0), 0.0, ops.div(1.0, ops.where(ops.eq(eye, 1.0), 1.0, diff)))


def _sym(ops, x):
    return ops.mul(ops.add(x, _mT(ops, x)), 0.5)


# ----------------------------------------------------------------------------- inv
def _inv_infer(a: TensorType) -> TensorType:
    _square(a, "inv")
    return a


def _inv_vjp(ops, c, g):
    inv_t = _mT(ops, c.output)
    return (ops.neg(ops.matmul(inv_t, ops.matmul(g, inv_t))),)


def _inv_eager(xp, a):
    return _lapack(xp, xp.linalg.inv, "inv", a) if a.size else a.copy()


def _well_conditioned(rng, *shape):
    # a random matrix plus n times the identity: far from singular, so float32 agrees with float64
    return rng.normal(size=shape) + shape[-1] * np.eye(shape[-1])


def _spd(rng, *shape):
    x = rng.normal(size=shape)
    return x @ x.swapaxes(-1, -2) + shape[-1] * np.eye(shape[-1])


P_INV = register(Primitive(
    "linalg_inv", Kind.DECOMPOSITION, _inv_infer, _inv_eager, _inv_vjp, save_output=True,
    reference=lambda torch, a: torch.linalg.inv(a),
    samples=lambda rng: [Sample((_well_conditioned(rng, 3, 3),)), Sample((_well_conditioned(rng, 2, 4, 4),)),
                         Sample((_well_conditioned(rng, 0, 2, 2),))],
    doc="the inverse of each square matrix over the last two dims (LinAlgError when singular)",
))  # fmt: skip


# ----------------------------------------------------------------------------- solve
def _solve_infer(a: TensorType, b: TensorType) -> TensorType:
    n = _square(a, "solve")
    if b.ndim < 2 or b.shape[-2] != n:
        raise RuntimeError(
            f"linalg.solve: Incompatible shapes of A and B for the equation AX = B ({list(a.shape)} and {list(b.shape)})"
        )
    if a.dtype is not b.dtype:
        raise RuntimeError(
            f"linalg.solve: Expected A and B to have the same dtype, but found {a.dtype.name} and {b.dtype.name}"
        )
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return TensorType((*batch, n, b.shape[-1]), a.dtype, a.device)


def _solve_eager(xp, a, b):
    batch = xp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = xp.broadcast_to(a, batch + a.shape[-2:])
    b = xp.broadcast_to(b, batch + b.shape[-2:])
    if a.size == 0 or b.size == 0:
        return xp.zeros(batch + b.shape[-2:], a.dtype)
    return _lapack(xp, xp.linalg.solve, "solve", a, b)


def _solve_vjp(ops, c, g):
    # X = A^-1 B: gB = A^-T g, gA = -gB X^T, each summed over the batch dims it was broadcast along.
    a, b = c.inputs
    ta, tb = c.input_types
    gb = _solve(ops, _mT(ops, a), g)
    ga = ops.sum_to(ops.neg(ops.matmul(gb, _mT(ops, c.output))), ta.shape) if c.needs_input_grad[0] else None
    return ga, ops.sum_to(gb, tb.shape) if c.needs_input_grad[1] else None


P_SOLVE = register(Primitive(
    "linalg_solve", Kind.DECOMPOSITION, _solve_infer, _solve_eager, _solve_vjp, save_inputs=True, save_output=True,
    reference=lambda torch, a, b: torch.linalg.solve(a, b),
    samples=lambda rng: [Sample((_well_conditioned(rng, 3, 3), rng.normal(size=(3, 2)))),
                         Sample((_well_conditioned(rng, 2, 3, 3), rng.normal(size=(3, 1)))),
                         Sample((_well_conditioned(rng, 3, 3), rng.normal(size=(2, 3, 2))))],
    doc="X with A @ X = B for square A (..., n, n) and B (..., n, k); batch dims broadcast",
))  # fmt: skip


# ----------------------------------------------------------------------------- cholesky
def _cholesky_infer(a: TensorType) -> TensorType:
    _square(a, "cholesky")
    return a


def _cholesky_eager(xp, a):
    return _lapack(xp, xp.linalg.cholesky, "cholesky", a) if a.size else a.copy()


def _cholesky_vjp(ops, c, g):
    # A = L L^T (LAPACK reads the lower triangle): with P = Phi(L^T gL), Phi keeping the lower
    # triangle and halving the diagonal, gA = L^-T P L^-1, symmetrized and then folded onto the
    # lower triangle that the kernel reads.
    lower = c.output
    phi = ops.tril(ops.matmul(_mT(ops, lower), g))
    phi = ops.sub(phi, ops.mul(ops.tril(ops.triu(phi)), 0.5))
    inv = _inv(ops, lower)
    s = _sym(ops, ops.matmul(_mT(ops, inv), ops.matmul(phi, inv)))
    return (ops.sub(ops.mul(ops.tril(s), 2.0), ops.tril(ops.triu(s))),)


P_CHOLESKY = register(Primitive(
    "linalg_cholesky", Kind.DECOMPOSITION, _cholesky_infer, _cholesky_eager, _cholesky_vjp, save_output=True,
    reference=lambda torch, a: torch.linalg.cholesky(a),
    samples=lambda rng: [Sample((_spd(rng, 3, 3),)), Sample((_spd(rng, 2, 4, 4),))],
    doc="the lower Cholesky factor L of each symmetric positive-definite matrix (read from its lower triangle)",
))  # fmt: skip


# ----------------------------------------------------------------------------- eigh
def _eigh_infer(a: TensorType) -> TensorType:
    _square(a, "eigh")
    return _packed_type("linalg_eigh", a)


def _eigh_eager(xp, a):
    # The kernel takes the symmetric part, so its derivative is defined for every input; the
    # frontend builds the symmetric matrix from the triangle that UPLO names.
    sym = (a + a.swapaxes(-1, -2)) * 0.5
    values, vectors = xp.linalg.eigh(sym) if a.size else (xp.zeros(a.shape[:-1], a.dtype), sym.copy())
    vectors = vectors * _sign_fix(xp, vectors)[..., None, :]
    return _pack(xp, [values.astype(a.dtype), vectors.astype(a.dtype)], a.shape[:-2])


def _eigh_vjp(ops, c, g):
    values, vectors = unpack(ops, c.output, layout("linalg_eigh", c.input_types[0].shape))
    g_values, g_vectors = unpack(ops, g, layout("linalg_eigh", c.input_types[0].shape))
    inner = ops.mul(_off_diagonal_reciprocal(ops, values), ops.matmul(_mT(ops, vectors), g_vectors))
    inner = ops.add(inner, ops.mul(ops.eye(values.shape[-1], dtype=values.dtype), ops.unsqueeze(g_values, -2)))
    return (_sym(ops, ops.matmul(vectors, ops.matmul(inner, _mT(ops, vectors)))),)


def _torch_eigh(torch, a):
    values, vectors = torch.linalg.eigh((a + a.mT) / 2)
    return torch.cat([values, (vectors * _torch_signs(torch, vectors)).flatten(-2)], -1)


def _torch_signs(torch, vectors):
    rows = vectors.abs().argmax(-2, keepdim=True)
    return torch.where(vectors.gather(-2, rows) < 0, -1.0, 1.0).to(vectors.dtype)


P_EIGH = register(Primitive(
    "linalg_eigh", Kind.DECOMPOSITION, _eigh_infer, _eigh_eager, _eigh_vjp, save_output=True,
    reference=_torch_eigh,
    samples=lambda rng: [Sample((rng.normal(size=(3, 3)),)), Sample((rng.normal(size=(2, 4, 4)),))],
    doc="eigenvalues (ascending) and eigenvectors of the symmetric part of each matrix, packed: see ``layout``",
))  # fmt: skip


# ----------------------------------------------------------------------------- svd
def _svd_infer(a: TensorType, *, full_matrices: bool) -> TensorType:
    if a.ndim < 2:
        raise RuntimeError(f"linalg.svd: The input tensor A must have at least 2 dimensions, got shape {list(a.shape)}")
    if not a.dtype.is_floating_point:
        raise RuntimeError(f"linalg.svd: Expected a floating point tensor as input. Got {a.dtype.name}")
    return _packed_type("linalg_svd", a, full_matrices=full_matrices)


def _svd_eager(xp, a, *, full_matrices):
    shapes = layout("linalg_svd", a.shape, full_matrices=full_matrices)
    batch = a.shape[:-2]
    if a.size == 0:
        u = xp.broadcast_to(xp.eye(*shapes[0], dtype=a.dtype), batch + shapes[0])
        v = xp.broadcast_to(xp.eye(*shapes[2], dtype=a.dtype), batch + shapes[2])
        return _pack(xp, [u, xp.zeros(batch + shapes[1], a.dtype), v], batch)
    u, s, vh = _lapack(xp, lambda x: xp.linalg.svd(x, full_matrices=full_matrices), "svd", a)
    signs = _sign_fix(xp, u)
    u = u * signs[..., None, :]
    k = s.shape[-1]
    vh = xp.concatenate([vh[..., :k, :] * signs[..., :k, None], vh[..., k:, :]], axis=-2)
    return _pack(xp, [u, s, vh], batch)


def _svd_vjp(ops, c, g):
    # Reduced SVD A = U S V^T (Townsend, "Differentiating the singular value decomposition"),
    # with F[i, j] = 1 / (s_j^2 - s_i^2) off the diagonal:
    # gA = U [ (F o (U^T gU - gU^T U)) S + diag(gS) + S (F o (V^T gV - gV^T V)) ] V^T
    #      + (I - U U^T) gU S^-1 V^T + U S^-1 gV^T (I - V V^T)
    shape = c.input_types[0].shape
    if c.attrs["full_matrices"] and shape[-1] != shape[-2]:
        raise RuntimeError(
            "linalg.svd: the gradient of full_matrices=True is not defined for non-square matrices; "
            "use full_matrices=False"
        )
    shapes = layout("linalg_svd", shape, **c.attrs)
    u, s, vh = unpack(ops, c.output, shapes)
    gu, gs, gvh = unpack(ops, g, shapes)
    v, gv = _mT(ops, vh), _mT(ops, gvh)
    f = _off_diagonal_reciprocal(ops, ops.mul(s, s))
    s_row = ops.unsqueeze(s, -2)  # X S scales the columns of X, S X its rows
    ut_gu, vt_gv = ops.matmul(_mT(ops, u), gu), ops.matmul(_mT(ops, v), gv)
    inner = ops.mul(ops.mul(f, ops.sub(ut_gu, _mT(ops, ut_gu))), s_row)
    inner = ops.add(inner, ops.mul(_mT(ops, s_row), ops.mul(f, ops.sub(vt_gv, _mT(ops, vt_gv)))))
    inner = ops.add(inner, ops.mul(ops.eye(s.shape[-1], dtype=s.dtype), ops.unsqueeze(gs, -2)))
    ga = ops.matmul(u, ops.matmul(inner, vh))
    inv_s = ops.div(1.0, s_row)
    if shape[-2] > shape[-1]:  # U has columns outside the span only for tall matrices
        gu_out = ops.sub(gu, ops.matmul(u, ut_gu))
        ga = ops.add(ga, ops.matmul(ops.mul(gu_out, inv_s), vh))
    if shape[-1] > shape[-2]:
        gv_out = ops.sub(gv, ops.matmul(v, vt_gv))
        ga = ops.add(ga, ops.matmul(ops.mul(u, inv_s), _mT(ops, gv_out)))
    return (ga,)


def _torch_svd(torch, a, *, full_matrices):
    u, s, vh = torch.linalg.svd(a, full_matrices=full_matrices)
    signs = _torch_signs(torch, u)
    k = s.shape[-1]
    u = u * signs
    vh = torch.cat([vh[..., :k, :] * signs[..., 0, :k, None], vh[..., k:, :]], -2)
    return torch.cat([u.flatten(-2), s, vh.flatten(-2)], -1)


P_SVD = register(Primitive(
    "linalg_svd", Kind.DECOMPOSITION, _svd_infer, _svd_eager, _svd_vjp, save_output=True, reference=_torch_svd,
    samples=lambda rng: [Sample((rng.normal(size=(3, 3)),), {"full_matrices": False}),
                         Sample((rng.normal(size=(4, 2)),), {"full_matrices": False}),
                         Sample((rng.normal(size=(2, 2, 3)),), {"full_matrices": False}),
                         Sample((rng.normal(size=(4, 2)),), {"full_matrices": True}, gradcheck=False)],
    doc="U, S (descending) and Vh of each matrix, packed: see ``layout``",
))  # fmt: skip


# ----------------------------------------------------------------------------- qr
_QR_MODES = ("reduced", "complete", "r")


def _qr_infer(a: TensorType, *, mode: str) -> TensorType:
    if a.ndim < 2:
        raise RuntimeError(f"linalg.qr: The input tensor A must have at least 2 dimensions, got shape {list(a.shape)}")
    if mode not in _QR_MODES:
        raise RuntimeError(
            f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), 'r', or 'complete'"
        )
    return _packed_type("linalg_qr", a, mode=mode)


def _qr_eager(xp, a, *, mode):
    if mode not in _QR_MODES:  # numpy takes "full" and "economic" with a warning; infer says what is expected
        raise ValueError(f"linalg.qr: mode {mode!r}")
    shapes = layout("linalg_qr", a.shape, mode=mode)
    batch = a.shape[:-2]
    if a.size == 0:
        q = (
            xp.broadcast_to(xp.eye(*shapes[0], dtype=a.dtype), batch + shapes[0])
            if mode != "r"
            else xp.zeros(batch + (0,), a.dtype)
        )
        return _pack(xp, [q, xp.zeros(batch + shapes[1], a.dtype)], batch)
    if mode == "r":
        return _pack(xp, [xp.zeros(batch + (0,), a.dtype), xp.linalg.qr(a, mode="r")], batch)
    q, r = xp.linalg.qr(a, mode=mode)
    return _pack(xp, [q, r], batch)


def _qr_vjp(ops, c, g):
    # Reduced QR with m >= n: M = R gR^T - gQ^T Q, gA = (gQ + Q copyltu(M)) R^-T, where copyltu
    # mirrors the lower triangle of M onto the upper one.
    shape = c.input_types[0].shape
    if c.attrs["mode"] == "r" or (c.attrs["mode"] == "complete" and shape[-2] > shape[-1]) or shape[-2] < shape[-1]:
        raise RuntimeError(
            f"linalg.qr: the derivative is implemented for mode='reduced' (or 'complete' on square matrices) with "
            f"at least as many rows as columns; got mode={c.attrs['mode']!r} and shape {list(shape)}"
        )
    q, r = unpack(ops, c.output, layout("linalg_qr", shape, **c.attrs))
    gq, gr = unpack(ops, g, layout("linalg_qr", shape, **c.attrs))
    m = ops.sub(ops.matmul(r, _mT(ops, gr)), ops.matmul(_mT(ops, gq), q))
    m = ops.add(ops.tril(m), _mT(ops, ops.tril(m, -1)))
    rhs = ops.add(gq, ops.matmul(q, m))
    return (_mT(ops, _solve(ops, r, _mT(ops, rhs))),)


def _torch_qr(torch, a, *, mode):
    q, r = torch.linalg.qr(a, mode=mode)
    return torch.cat([q.flatten(-2) if q.numel() else q.reshape(a.shape[:-2] + (0,)), r.flatten(-2)], -1)


P_QR = register(Primitive(
    "linalg_qr", Kind.DECOMPOSITION, _qr_infer, _qr_eager, _qr_vjp, save_output=True, reference=_torch_qr,
    samples=lambda rng: [Sample((rng.normal(size=(3, 3)),), {"mode": "reduced"}),
                         Sample((rng.normal(size=(2, 4, 3)),), {"mode": "reduced"}),
                         Sample((rng.normal(size=(4, 3)),), {"mode": "complete"}, gradcheck=False),
                         Sample((rng.normal(size=(3, 4)),), {"mode": "r"}, gradcheck=False)],
    doc="Q and R of each matrix (Householder, LAPACK's signs), packed: see ``layout``",
))  # fmt: skip


# ----------------------------------------------------------------------------- slogdet
def _slogdet_infer(a: TensorType) -> TensorType:
    _square(a, "slogdet")
    return _packed_type("linalg_slogdet", a)


def _slogdet_eager(xp, a):
    sign, logabsdet = xp.linalg.slogdet(a)
    return _pack(xp, [xp.asarray(sign, a.dtype)[..., None], xp.asarray(logabsdet, a.dtype)[..., None]], a.shape[:-2])


def _slogdet_vjp(ops, c, g):
    # d log|det A| = tr(A^-1 dA): the gradient is g A^-T; the sign is piecewise constant.
    (a,) = c.inputs
    g_log = ops.narrow(g, -1, 1, 1)
    return (ops.mul(ops.unsqueeze(g_log, -1), _mT(ops, _inv(ops, a))),)


P_SLOGDET = register(Primitive(
    "linalg_slogdet", Kind.DECOMPOSITION, _slogdet_infer, _slogdet_eager, _slogdet_vjp, save_inputs=True,
    reference=lambda torch, a: torch.stack(torch.linalg.slogdet(a), -1),
    samples=lambda rng: [Sample((_well_conditioned(rng, 3, 3),)), Sample((rng.normal(size=(2, 4, 4)),))],
    doc="the sign and the log of the absolute value of each square matrix's determinant, packed (..., 2)",
))  # fmt: skip
