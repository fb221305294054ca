"""kiln.linalg against torch.linalg, gradients against finite differences, compiled against eager."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck
from tests.conftest import assert_close, to_torch, tol
from tests.frontend.jit.helpers import check_against_eager, compiled_calls

rng = np.random.default_rng(0)


def well_conditioned(*shape, dtype=np.float64):
    return kiln.from_numpy((rng.normal(size=shape) + shape[-1] * np.eye(shape[-1])).astype(dtype))


def spd(*shape):
    x = rng.normal(size=shape)
    return kiln.from_numpy(x @ x.swapaxes(-1, -2) + shape[-1] * np.eye(shape[-1]))


def normal(*shape, dtype=np.float64):
    return kiln.from_numpy(rng.normal(size=shape).astype(dtype))


def leaf(t):
    return t.detach().clone().requires_grad_()


# ----------------------------------------------------------------------------- values against torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (0, 2, 2)])
def test_inv_det_slogdet_match_torch(torch, dtype, shape):
    a = well_conditioned(*shape, dtype=dtype)
    t = to_torch(torch, a)
    t_tol = tol(a.dtype) if dtype == np.float64 else {"rtol": 1e-4, "atol": 1e-5}
    assert_close(kiln.linalg.inv(a), torch.linalg.inv(t), **t_tol)
    assert_close(kiln.linalg.det(a), torch.linalg.det(t), **t_tol)
    sign, logabsdet = kiln.linalg.slogdet(a)
    expected = torch.linalg.slogdet(t)
    assert_close(sign, expected.sign, **t_tol)
    assert_close(logabsdet, expected.logabsdet, **t_tol)


@pytest.mark.parametrize(("a_shape", "b_shape"), [((3, 3), (3,)), ((3, 3), (3, 2)), ((2, 3, 3), (2, 3)),
                                                  ((2, 3, 3), (3, 4)), ((3, 3), (5, 3, 1))])  # fmt: skip
@pytest.mark.parametrize("left", [True, False])
def test_solve_matches_torch_with_vectors_and_broadcast_batches(torch, a_shape, b_shape, left):
    a = well_conditioned(*a_shape)
    if not left and len(b_shape) >= 2:
        b_shape = b_shape[:-2] + (b_shape[-1], b_shape[-2])
    b = normal(*b_shape)
    try:
        expected = torch.linalg.solve(to_torch(torch, a), to_torch(torch, b), left=left)
    except RuntimeError:  # shapes torch refuses (a vector B with left=False, for one): kiln refuses them too
        with pytest.raises(RuntimeError, match="Incompatible shapes"):
            kiln.linalg.solve(a, b, left=left)
        return
    assert_close(kiln.linalg.solve(a, b, left=left), expected, **tol(kiln.float64))


def test_cholesky_eigh_svd_qr_match_torch(torch):
    a = spd(2, 4, 4)
    t = to_torch(torch, a)
    assert_close(kiln.linalg.cholesky(a), torch.linalg.cholesky(t), **tol(a.dtype))
    assert_close(kiln.linalg.cholesky(a, upper=True), torch.linalg.cholesky(t, upper=True), **tol(a.dtype))
    m = normal(3, 5, 5)
    for uplo in ("L", "U"):
        values, vectors = kiln.linalg.eigh(m, UPLO=uplo)
        expected = torch.linalg.eigh(to_torch(torch, m), UPLO=uplo)
        assert_close(values, expected.eigenvalues, **tol(m.dtype))
        assert_close(kiln.linalg.eigvalsh(m, UPLO=uplo), expected.eigenvalues, **tol(m.dtype))
        # eigenvectors agree up to the sign of each column
        signs = np.sign(np.sum(vectors.numpy() * expected.eigenvectors.numpy(), axis=-2, keepdims=True))
        np.testing.assert_allclose(vectors.numpy() * signs, expected.eigenvectors.numpy(), atol=1e-10)
    for shape in ((4, 3), (3, 5), (2, 4, 4)):
        x = normal(*shape)
        for full in (True, False):
            u, s, vh = kiln.linalg.svd(x, full_matrices=full)
            tu, ts, tvh = torch.linalg.svd(to_torch(torch, x), full_matrices=full)
            assert (u.shape, s.shape, vh.shape) == (tu.shape, ts.shape, tvh.shape)
            assert_close(s, ts, **tol(x.dtype))
            k = s.shape[-1]
            np.testing.assert_allclose((u[..., :k] * s.unsqueeze(-2)) @ vh[..., :k, :], x.numpy(), atol=1e-12)
            np.testing.assert_allclose((u.mT @ u).numpy(), np.broadcast_to(np.eye(u.shape[-1]), u.shape[:-2] +
                                       (u.shape[-1],) * 2), atol=1e-12)  # fmt: skip
        assert_close(kiln.linalg.svdvals(x), torch.linalg.svdvals(to_torch(torch, x)), **tol(x.dtype))
        for mode in ("reduced", "complete", "r"):
            q, r = kiln.linalg.qr(x, mode=mode)
            tq, tr = torch.linalg.qr(to_torch(torch, x), mode=mode)
            assert_close(r, tr, **tol(x.dtype))
            assert_close(q, tq, **tol(x.dtype))


def test_result_types_are_named_tuples():
    a = spd(3, 3)
    assert kiln.linalg.svd(a).S.shape == (3,)
    assert kiln.linalg.eigh(a).eigenvectors.shape == (3, 3)
    assert kiln.linalg.qr(a).R.shape == (3, 3)
    assert kiln.linalg.slogdet(a).logabsdet.shape == ()


@pytest.mark.parametrize("ord", [None, "fro", "nuc", math.inf, -math.inf, 1, -1, 2, -2])
@pytest.mark.parametrize("keepdim", [False, True])
def test_matrix_norms_match_torch(torch, ord, keepdim):
    a = normal(2, 3, 4)
    t = to_torch(torch, a)
    if ord is not None:
        for dim in ((-2, -1), (0, 2), (2, 1)):
            assert_close(kiln.linalg.matrix_norm(a, ord, dim, keepdim), torch.linalg.matrix_norm(t, ord, dim, keepdim),
                         **tol(a.dtype))  # fmt: skip
    assert_close(kiln.linalg.norm(a[0], ord, keepdim=keepdim), torch.linalg.norm(t[0], ord, keepdim=keepdim),
                 **tol(a.dtype))  # fmt: skip


@pytest.mark.parametrize("ord", [2, 1, 3.5, math.inf, -math.inf, 0, -1])
def test_vector_norms_match_torch(torch, ord):
    a = normal(3, 4, dtype=np.float32)
    t = to_torch(torch, a)
    for dim in (None, 1, (0, 1)):
        assert_close(kiln.linalg.vector_norm(a, ord, dim), torch.linalg.vector_norm(t, ord, dim), rtol=1e-5, atol=1e-6)
    assert_close(kiln.linalg.norm(a, ord, dim=1), torch.linalg.norm(t, ord, dim=1), rtol=1e-5, atol=1e-6)
    assert_close(kiln.linalg.norm(a), torch.linalg.norm(t), rtol=1e-5, atol=1e-6)


def test_cross_matrix_power_pinv_multi_dot_vecdot_match_torch(torch):
    a, b = normal(2, 4, 3), normal(2, 1, 3)
    assert_close(kiln.linalg.cross(a, b), torch.linalg.cross(to_torch(torch, a), to_torch(torch, b)), **tol(a.dtype))
    c, d = normal(3, 5), normal(3, 5)
    assert_close(kiln.linalg.cross(c, d, dim=0), torch.linalg.cross(to_torch(torch, c), to_torch(torch, d), dim=0),
                 **tol(a.dtype))  # fmt: skip
    m = well_conditioned(2, 3, 3)
    for n in (0, 1, 2, 5, -1, -3):
        assert_close(kiln.linalg.matrix_power(m, n), torch.linalg.matrix_power(to_torch(torch, m), n), rtol=1e-9,
                     atol=1e-9)  # fmt: skip
    x = normal(2, 5, 3)
    assert_close(kiln.linalg.pinv(x), torch.linalg.pinv(to_torch(torch, x)), rtol=1e-9, atol=1e-10)
    mats = [normal(2, 3), normal(3, 4), normal(4)]
    assert_close(kiln.linalg.multi_dot(mats), torch.linalg.multi_dot([to_torch(torch, t) for t in mats]),
                 **tol(a.dtype))  # fmt: skip
    assert_close(kiln.linalg.vecdot(c, d), torch.linalg.vecdot(to_torch(torch, c), to_torch(torch, d)), **tol(a.dtype))


@pytest.mark.parametrize("driver", [None, "gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("shape", [(5, 3), (2, 6, 4), (3, 5)])
def test_lstsq_matches_torch(torch, driver, shape):
    a, b = normal(*shape), normal(*shape[:-1], 2)
    got = kiln.linalg.lstsq(a, b, driver=driver)
    expected = torch.linalg.lstsq(to_torch(torch, a), to_torch(torch, b), driver=driver)
    if driver == "gels" and shape[-2] < shape[-1]:  # torch's gels gives a non-minimal-norm solution for wide A
        np.testing.assert_allclose((a @ got.solution).numpy(), b.numpy(), atol=1e-10)
    else:
        assert_close(got.solution, expected.solution, rtol=1e-9, atol=1e-10)
    for field in ("residuals", "rank", "singular_values"):
        assert_close(getattr(got, field), getattr(expected, field), rtol=1e-9, atol=1e-10)


def test_matrix_rank_solve_triangular_diagonal_match_torch(torch):
    low_rank = normal(2, 5, 2) @ normal(2, 2, 4)
    t = to_torch(torch, low_rank)
    assert_close(kiln.linalg.matrix_rank(low_rank), torch.linalg.matrix_rank(t), rtol=0, atol=0)
    assert_close(kiln.linalg.matrix_rank(low_rank, atol=1.0, rtol=0.0), torch.linalg.matrix_rank(t, atol=1.0, rtol=0.0),
                 rtol=0, atol=0)  # fmt: skip
    a, b = well_conditioned(2, 4, 4), normal(2, 4, 3)
    ta, tb = to_torch(torch, a), to_torch(torch, b)
    for upper in (True, False):
        for unit in (True, False):
            assert_close(kiln.linalg.solve_triangular(a, b, upper=upper, unitriangular=unit),
                         torch.linalg.solve_triangular(ta, tb, upper=upper, unitriangular=unit), rtol=1e-9, atol=1e-10)  # fmt: skip
        assert_close(kiln.linalg.solve_triangular(a, b.mT, upper=upper, left=False),
                     torch.linalg.solve_triangular(ta, tb.mT, upper=upper, left=False), rtol=1e-9, atol=1e-10)  # fmt: skip
    assert_close(kiln.linalg.diagonal(a, offset=1), torch.linalg.diagonal(ta, offset=1), rtol=0, atol=0)


# ----------------------------------------------------------------------------- gradients
def test_gradients_match_finite_differences():
    checks = [
        (kiln.linalg.inv, (well_conditioned(2, 3, 3),)),
        (kiln.linalg.det, (well_conditioned(3, 3),)),
        (lambda a, b: kiln.linalg.solve(a, b), (well_conditioned(2, 3, 3), normal(3))),
        (lambda a: kiln.linalg.cholesky(a @ a.mT + 3 * kiln.eye(3, dtype=kiln.float64)), (normal(3, 3),)),
        (lambda a: kiln.linalg.eigh(a, "U"), (normal(4, 4),)),
        (lambda a: kiln.linalg.svd(a, full_matrices=False), (normal(4, 3),)),
        (lambda a: kiln.linalg.svd(a, full_matrices=False), (normal(2, 3, 5),)),
        (lambda a: kiln.linalg.svd(a), (normal(3, 3),)),
        (kiln.linalg.qr, (normal(5, 3),)),
        (lambda a: kiln.linalg.matrix_norm(a, "nuc"), (normal(3, 4),)),
        (lambda a: kiln.linalg.matrix_norm(a, 2), (normal(3, 4),)),
        (lambda a: kiln.linalg.matrix_norm(a, math.inf), (normal(3, 4),)),
        (lambda a: kiln.linalg.matrix_norm(a, -1, dim=(0, 1)), (normal(3, 4),)),
        (lambda a: kiln.linalg.norm(a), (normal(3, 4),)),
        (lambda a: kiln.linalg.vector_norm(a, 3.5, dim=1), (normal(3, 4),)),
        (kiln.linalg.pinv, (normal(4, 3),)),
        (lambda a: kiln.linalg.matrix_power(a, -2), (well_conditioned(3, 3),)),
        (kiln.linalg.cross, (normal(2, 3), normal(2, 3))),
        (lambda a, b: kiln.linalg.lstsq(a, b).solution, (normal(5, 3), normal(5, 2))),
        (lambda a, b: kiln.linalg.solve_triangular(a, b, upper=True), (well_conditioned(3, 3), normal(3, 2))),
    ]
    for fn, inputs in checks:
        assert gradcheck(fn, tuple(leaf(t) for t in inputs), atol=1e-6, rtol=1e-4)


def test_eigh_gradient_flows_through_a_symmetric_construction_as_torch(torch):
    x = normal(4, 4)
    weights = kiln.arange(4, dtype=kiln.float64) + 1
    xk, xt = leaf(x), to_torch(torch, x).requires_grad_()
    (kiln.linalg.eigh(xk @ xk.mT).eigenvalues * weights).sum().backward()
    (torch.linalg.eigh(xt @ xt.mT).eigenvalues * to_torch(torch, weights)).sum().backward()
    assert_close(xk.grad, xt.grad, rtol=1e-8, atol=1e-10)


def test_second_derivatives_match_finite_differences():
    for fn, a in ((lambda x: kiln.linalg.inv(x).sum(), well_conditioned(3, 3)),
                  (lambda x: kiln.linalg.svdvals(x).sum(), normal(3, 2)),
                  (lambda x: kiln.linalg.eigvalsh(x)[-1], normal(3, 3))):  # fmt: skip
        assert kiln.autograd.gradgradcheck(fn, (leaf(a),), atol=1e-5, rtol=1e-3)


# ----------------------------------------------------------------------------- errors
def test_errors_name_what_was_expected():
    with pytest.raises(kiln.linalg.LinAlgError, match="singular"):
        kiln.linalg.inv(kiln.zeros(3, 3))
    with pytest.raises(kiln.linalg.LinAlgError):
        kiln.linalg.cholesky(-kiln.eye(3))
    with pytest.raises(RuntimeError, match="square"):
        kiln.linalg.inv(kiln.zeros(2, 3))
    with pytest.raises(RuntimeError, match="floating point"):
        kiln.linalg.inv(kiln.eye(3, dtype=kiln.int64))
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        kiln.linalg.svd(kiln.ones(3))
    with pytest.raises(RuntimeError, match="UPLO"):
        kiln.linalg.eigh(kiln.eye(3), UPLO="X")
    with pytest.raises(RuntimeError, match="unrecognized mode"):
        kiln.linalg.qr(kiln.eye(3), mode="full")
    with pytest.raises(RuntimeError, match="must be 3"):
        kiln.linalg.cross(kiln.ones(4), kiln.ones(4))
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        kiln.linalg.cross(kiln.ones(2, 3), kiln.ones(3))
    assert issubclass(kiln.linalg.LinAlgError, RuntimeError)


# ----------------------------------------------------------------------------- compiled
def test_compiled_decompositions_read_new_inputs_each_call():
    def fn(a, b):
        inv = kiln.linalg.inv(a)
        u, s, vh = kiln.linalg.svd(a, full_matrices=False)
        return inv @ b + 1.0, s * 2, kiln.linalg.solve(a, b).sum(), kiln.linalg.eigh(a).eigenvalues.exp()

    compiled = check_against_eager(fn, lambda: (well_conditioned(2, 3, 3), normal(3, 2)), calls=4, rtol=1e-10,
                                   atol=1e-12)  # fmt: skip
    assert sum(compiled_calls(compiled)) >= 3  # the compiled program ran; nothing fell back to eager


def test_compiled_training_step_through_inv_matches_eager():
    def step(w, a):
        loss = (kiln.linalg.inv(a + w) ** 2).sum() + kiln.linalg.slogdet(a + w).logabsdet
        loss.backward()
        return loss

    def make():
        return leaf(well_conditioned(3, 3)), well_conditioned(3, 3)

    compiled = kiln.compile(step)
    for _ in range(3):
        w, a = make()
        w2 = leaf(w)
        assert_close(compiled(w, a), step(w2, a), rtol=1e-10, atol=1e-12)
        assert_close(w.grad, w2.grad, rtol=1e-10, atol=1e-12)
    assert sum(compiled_calls(compiled)) >= 2


def test_compiled_forward_with_backward_outside_matches_eager():
    def loss(a, w):
        return (kiln.linalg.solve(a, w) ** 2).sum() + kiln.linalg.eigh(a @ a.mT).eigenvalues.sum()

    compiled = kiln.compile(loss)
    for _ in range(3):
        a, w = leaf(well_conditioned(3, 3)), leaf(normal(3, 2))
        a2, w2 = leaf(a), leaf(w)
        compiled(a, w).backward()
        loss(a2, w2).backward()
        assert_close(a.grad, a2.grad, rtol=1e-10, atol=1e-12)
        assert_close(w.grad, w2.grad, rtol=1e-10, atol=1e-12)
    assert sum(compiled_calls(compiled)) >= 2


def test_a_compiled_singular_input_raises_as_eager():
    compiled = kiln.compile(lambda a: kiln.linalg.inv(a) * 2)
    for _ in range(3):
        compiled(well_conditioned(3, 3))
    with pytest.raises(kiln.linalg.LinAlgError):
        compiled(kiln.zeros(3, 3, dtype=kiln.float64))
