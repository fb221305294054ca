"""``linalg.lu_factor``/``lu_factor_ex``/``lu``/``lu_solve``, ``solve_ex``, ``inv_ex``, ``cholesky_ex``,
``vander``, ``tensorinv``, ``tensorsolve``, ``householder_product`` and the older ``torch.lu``,
``lu_unpack``, ``lu_solve``, ``triangular_solve``, ``cholesky_solve``, ``cholesky_inverse``, ``qr``,
against torch; gradients by finite differences in float64; compiled calls against eager."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend.autograd import gradcheck
from tests.conftest import assert_results_close, torch_pair

# the oracle's own deprecation warnings (torch.lu, torch.triangular_solve...)
pytestmark = pytest.mark.filterwarnings("ignore:torch.*deprecated:UserWarning")

RNG = np.random.default_rng(2)
GRAD = {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-4}


_pair = torch_pair


def _close(ours, theirs, rtol=1e-9, atol=1e-10):
    assert_results_close(ours, theirs, rtol=rtol, atol=atol)


def _spd(*shape):
    a = RNG.standard_normal(shape)
    return a @ np.swapaxes(a, -1, -2) + shape[-1] * np.eye(shape[-1])


@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 3), (3, 3, 5), (1, 1), (7, 7), (0, 3, 3), (2, 0)])
def test_lu_factorizations_match_torch(torch, shape):
    a, ta = _pair(torch, RNG.standard_normal(shape))
    _close(kiln.linalg.lu_factor_ex(a), torch.linalg.lu_factor_ex(ta))
    _close(kiln.linalg.lu(a), torch.linalg.lu(ta))
    _close(kiln.lu(a, get_infos=True), torch.lu(ta, get_infos=True))
    _close(a.lu(), ta.lu())
    LU, pivots = kiln.linalg.lu_factor(a)
    _close(kiln.lu_unpack(LU, pivots), torch.lu_unpack(*torch.linalg.lu_factor(ta)))
    result = kiln.linalg.lu_factor(a)
    assert type(result).__name__ == "linalg_lu_factor" and result.LU is result[0]


def test_singular_and_tied_pivots_match_torch(torch):
    for array in (np.zeros((3, 3)), np.array([[1.0, 2.0], [2.0, 4.0]]), np.array([[1.0, 2.0], [-1.0, 5.0]]),
                  np.array([[0.0, 1.0, 2.0], [0.0, 3.0, 1.0], [0.0, -3.0, 4.0]])):  # fmt: skip
        a, ta = _pair(torch, array)
        _close(kiln.linalg.lu_factor_ex(a), torch.linalg.lu_factor_ex(ta))
        _close(kiln.linalg.lu(a), torch.linalg.lu(ta))
        _close(kiln.linalg.lu_factor_ex(a.requires_grad_()), torch.linalg.lu_factor_ex(ta))  # the ops' path


@pytest.mark.parametrize("shape", [(5, 5), (2, 3, 4, 6), (3, 6, 2), (0, 3, 3)])
def test_the_arrays_and_the_ops_eliminate_alike(shape):
    """Without history the elimination runs on the arrays; with it, over kiln's ops: bit for bit."""
    array = RNG.standard_normal(shape)
    array[..., 1, :] = array[..., 0, :]  # a tie in the first column's magnitudes
    plain = kiln.linalg.lu_factor_ex(kiln.tensor(array))
    tracked = kiln.linalg.lu_factor_ex(kiln.tensor(array, requires_grad=True))
    for a, b in zip(plain, tracked, strict=True):
        assert a.dtype is b.dtype
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


def test_lu_errors():
    with pytest.raises(RuntimeError, match=r"U\[2,2\] is zero"):
        kiln.linalg.lu_factor(kiln.tensor([[1.0, 2.0], [2.0, 4.0]]))
    with pytest.raises(kiln.linalg.LinAlgError):
        kiln.linalg.lu_factor_ex(kiln.zeros(2, 2), check_errors=True)
    with pytest.raises(RuntimeError, match="without pivoting"):
        kiln.linalg.lu_factor(kiln.eye(2), pivot=False)
    with pytest.raises(RuntimeError, match="floating point"):
        kiln.linalg.lu_factor(kiln.ones(2, 2, dtype=kiln.int64))


def test_lu_solve_matches_torch(torch):
    a, ta = _pair(torch, RNG.standard_normal((2, 4, 4)))
    LU, pivots = kiln.linalg.lu_factor(a)
    tLU, tpivots = torch.linalg.lu_factor(ta)
    for left in (True, False):
        for adjoint in (False, True):
            b, tb = _pair(torch, RNG.standard_normal((2, 4, 3) if left else (2, 3, 4)))
            _close(kiln.linalg.lu_solve(LU, pivots, b, left=left, adjoint=adjoint),
                   torch.linalg.lu_solve(tLU, tpivots, tb, left=left, adjoint=adjoint))  # fmt: skip
    b, tb = _pair(torch, RNG.standard_normal((4, 2)))  # broadcast over the factorization's batch
    _close(kiln.lu_solve(b, LU, pivots), torch.lu_solve(tb, tLU, tpivots))
    _close(b.lu_solve(LU, pivots), tb.lu_solve(tLU, tpivots))
    with pytest.raises(RuntimeError, match="Incompatible shapes"):
        kiln.linalg.lu_solve(LU, pivots, kiln.ones(3, 1, dtype=kiln.float64))


def test_ex_variants_match_torch(torch):
    a, ta = _pair(torch, RNG.standard_normal((3, 4, 4)))
    b, tb = _pair(torch, RNG.standard_normal((3, 4)))
    _close(kiln.linalg.solve_ex(a, b), torch.linalg.solve_ex(ta, tb))
    c, tc = _pair(torch, RNG.standard_normal((3, 2, 4)))
    _close(kiln.linalg.solve_ex(a, c, left=False), torch.linalg.solve_ex(ta, tc, left=False))
    _close(kiln.linalg.inv_ex(a), torch.linalg.inv_ex(ta))
    singular, tsingular = _pair(torch, np.array([[1.0, 2.0], [2.0, 4.0]]))
    ours, theirs = kiln.linalg.inv_ex(singular), torch.linalg.inv_ex(tsingular)
    assert ours.info.item() == theirs.info.item() == 2 and ours.info.dtype is kiln.int32
    assert not np.isfinite(ours.inverse.numpy()).all()
    with pytest.raises(kiln.linalg.LinAlgError):
        kiln.linalg.solve_ex(singular, kiln.ones(2, dtype=kiln.float64), check_errors=True)
    spd, tspd = _pair(torch, _spd(2, 3, 3))
    for upper in (False, True):
        _close(kiln.linalg.cholesky_ex(spd, upper=upper), torch.linalg.cholesky_ex(tspd, upper=upper))
    for array in (np.array([[1.0, 2.0], [2.0, 1.0]]), np.array([[-1.0, 2.0], [2.0, 1.0]]),
                  np.array([[4.0, 2, 0], [2, 5, 0], [0, 0, -1]])):  # fmt: skip
        m, tm = _pair(torch, array)
        _close(kiln.linalg.cholesky_ex(m), torch.linalg.cholesky_ex(tm))
    with pytest.raises(kiln.linalg.LinAlgError, match="positive-definite"):
        kiln.linalg.cholesky_ex(kiln.tensor([[1.0, 2.0], [2.0, 1.0]]), check_errors=True)


def test_vander_tensorinv_tensorsolve_householder_match_torch(torch):
    x, tx = _pair(torch, np.array([[0.0, 1.5, -2.0], [1.0, 2.0, 3.0]]))
    _close(kiln.linalg.vander(x), torch.linalg.vander(tx))
    _close(kiln.linalg.vander(x, N=5), torch.linalg.vander(tx, N=5))
    a, ta = _pair(torch, RNG.standard_normal((4, 6, 8, 3)))
    _close(kiln.linalg.tensorinv(a, ind=2), torch.linalg.tensorinv(ta, ind=2))
    with pytest.raises(RuntimeError, match="prod"):
        kiln.linalg.tensorinv(a, ind=1)
    a, ta = _pair(torch, RNG.standard_normal((2, 3, 6)))
    b, tb = _pair(torch, RNG.standard_normal((2, 3)))
    _close(kiln.linalg.tensorsolve(a, b), torch.linalg.tensorsolve(ta, tb))
    a, ta = _pair(torch, RNG.standard_normal((6, 2, 3)))
    _close(kiln.linalg.tensorsolve(a, b, dims=(0,)), torch.linalg.tensorsolve(ta, tb, dims=(0,)))
    for shape in ((5, 3), (2, 4, 4)):
        reflectors, tau = torch.geqrf(torch.from_numpy(RNG.standard_normal(shape)))
        ours = kiln.linalg.householder_product(kiln.from_numpy(reflectors.numpy()), kiln.from_numpy(tau.numpy()))
        _close(ours, torch.linalg.householder_product(reflectors, tau))
        _close(kiln.linalg.householder_product(kiln.from_numpy(reflectors.numpy()), kiln.from_numpy(tau[..., :2].numpy())),
               torch.linalg.householder_product(reflectors, tau[..., :2]))  # fmt: skip


def test_older_torch_forms_match_torch(torch):
    a, ta = _pair(torch, RNG.standard_normal((2, 4, 4)))
    b, tb = _pair(torch, RNG.standard_normal((2, 4, 3)))
    for upper, transpose, unitriangular in [(True, False, False), (False, True, False), (False, False, True)]:
        _close(kiln.triangular_solve(b, a, upper, transpose, unitriangular),
               torch.triangular_solve(tb, ta, upper, transpose, unitriangular))  # fmt: skip
    result = b.triangular_solve(a)
    _close(result, tb.triangular_solve(ta))
    assert type(result).__name__ == "triangular_solve" and result.solution is result[0]
    spd, tspd = _pair(torch, _spd(2, 4, 4))
    for upper in (False, True):
        factor, tfactor = kiln.linalg.cholesky(spd, upper=upper), torch.linalg.cholesky(tspd, upper=upper)
        _close(kiln.cholesky_solve(b, factor, upper), torch.cholesky_solve(tb, tfactor, upper))
        _close(b.cholesky_solve(factor, upper=upper), tb.cholesky_solve(tfactor, upper=upper))
        _close(kiln.cholesky_inverse(factor, upper), torch.cholesky_inverse(tfactor, upper))
        _close(factor.cholesky_inverse(upper), tfactor.cholesky_inverse(upper))
    tall, ttall = _pair(torch, RNG.standard_normal((5, 3)))
    for some in (True, False):
        _close(kiln.qr(tall, some), torch.qr(ttall, some))
        _close(tall.qr(some), ttall.qr(some))


def test_gradients_by_finite_differences():
    a = kiln.tensor(RNG.standard_normal((2, 4, 4)), requires_grad=True)
    wide = kiln.tensor(RNG.standard_normal((3, 5)), requires_grad=True)
    b = kiln.tensor(RNG.standard_normal((2, 4, 2)), requires_grad=True)
    assert gradcheck(lambda t: kiln.linalg.lu_factor(t).LU, (a,), **GRAD)
    assert gradcheck(lambda t: kiln.linalg.lu(t)[1:], (wide,), **GRAD)
    assert gradcheck(lambda t, r: kiln.linalg.solve_ex(t, r).result, (a, b), **GRAD)
    assert gradcheck(lambda t: kiln.linalg.inv_ex(t).inverse, (a,), **GRAD)
    assert gradcheck(lambda t, r: kiln.linalg.lu_solve(*kiln.linalg.lu_factor(t), r, adjoint=True), (a, b), **GRAD)
    spd = kiln.tensor(_spd(3, 3), requires_grad=True)
    assert gradcheck(lambda t: kiln.linalg.cholesky_ex((t + t.mT) / 2).L, (spd,), **GRAD)
    factor = kiln.tensor(np.linalg.cholesky(_spd(4, 4)), requires_grad=True)
    assert gradcheck(lambda f, r: kiln.cholesky_solve(r, f), (factor, b), **GRAD)
    assert gradcheck(lambda f: kiln.cholesky_inverse(f), (factor,), **GRAD)
    assert gradcheck(lambda t, r: kiln.triangular_solve(r, t + 4 * kiln.eye(4, dtype=kiln.float64)).solution, (a, b),
                     **GRAD)  # fmt: skip
    x = kiln.tensor([0.0, 1.5, -2.0], dtype=kiln.float64, requires_grad=True)
    assert gradcheck(lambda t: kiln.linalg.vander(t, N=4), (x,), **GRAD)
    reflectors = kiln.tensor(RNG.standard_normal((5, 3)), requires_grad=True)
    tau = kiln.tensor(RNG.random(3), requires_grad=True)
    assert gradcheck(kiln.linalg.householder_product, (reflectors, tau), **GRAD)


def test_compiled_factor_and_solve_equal_eager():
    def f(a, b):
        LU, pivots, _ = kiln.linalg.lu_factor_ex(a)
        x = kiln.linalg.lu_solve(LU, pivots, b, adjoint=True)
        return x, kiln.linalg.solve_ex(a, b).result, kiln.linalg.householder_product(a, kiln.ones(3) * 0.5)

    compiled = kiln.compile(f, fullgraph=True)  # no value is read: one graph
    for _ in range(3):
        a, b = kiln.randn(4, 4), kiln.randn(4, 2)
        for got, want in zip(compiled(a, b), f(a, b), strict=True):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)

    factor = kiln.compile(lambda a: kiln.linalg.lu_factor_ex(a), fullgraph=True)
    for _ in range(3):
        a = kiln.randn(3, 5, 5)
        for got, want in zip(factor(a), kiln.linalg.lu_factor_ex(a), strict=True):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_compiled_gradients_equal_eager():
    """Inputs that require grad: the compiled program's backward (LU's through the elimination)
    gives eager's gradients."""

    def f(a, b):
        return (kiln.linalg.solve_ex(a, b).result ** 2).sum() + kiln.linalg.lu(a).U.sum()

    compiled = kiln.compile(f, fullgraph=True)
    for _ in range(3):
        a0, b0 = kiln.randn(3, 3, dtype=kiln.float64), kiln.randn(3, 2, dtype=kiln.float64)
        grads = []
        for fn in (compiled, f):
            a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
            fn(a, b).backward()
            grads.append((a.grad.numpy(), b.grad.numpy()))
        for got, want in zip(*grads, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-10)
