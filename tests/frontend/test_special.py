"""kiln.special against torch.special (values, special points, dtypes), gradients against finite
differences, compiled against eager."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck, gradgradcheck
from tests.conftest import assert_close, to_torch
from tests.frontend.jit.helpers import check_against_eager

rng = np.random.default_rng(0)
WIDE = np.concatenate([rng.normal(size=300) * 3, rng.uniform(-40, 40, 300), [0.0, 1.0, 2.0, -1.0, -2.5, 0.5, 1e-300]])
SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, -2.0, 3.0, math.inf, -math.inf, math.nan])
UNIT = rng.uniform(-1, 1, 500)
PROB = rng.uniform(1e-6, 1 - 1e-6, 500)

# name: (inputs, rtol, atol) in float64; float32 is compared with rtol 2e-6 and FLOAT32_ATOL (or 1e-30)
CASES = {
    "erf": (WIDE, 1e-15, 1e-300),
    "erfc": (WIDE, 5e-15, 1e-300),
    "erfcx": (WIDE[WIDE < 25], 5e-15, 1e-300),
    "erfinv": (UNIT, 2e-15, 1e-300),
    "expit": (WIDE, 1e-15, 1e-300),
    "logit": (PROB, 1e-14, 1e-15),
    "log1p": (np.abs(WIDE), 1e-15, 1e-300),
    "expm1": (WIDE, 1e-15, 1e-300),
    "exp2": (WIDE, 1e-14, 1e-300),
    "gammaln": (WIDE, 1e-13, 1e-13),
    "digamma": (WIDE, 1e-12, 1e-12),
    "i0": (WIDE, 1e-14, 1e-300),
    "i0e": (WIDE, 1e-14, 1e-300),
    "i1": (WIDE, 1e-14, 1e-300),
    "i1e": (WIDE, 1e-14, 1e-300),
    "sinc": (WIDE, 1e-13, 1e-15),
    "entr": (np.abs(WIDE), 1e-15, 1e-300),
    "ndtr": (WIDE, 1e-15, 1e-16),  # torch's ndtr is 0.5 (1 + erf): no tail accuracy to compare with
    "ndtri": (PROB, 1e-13, 1e-15),
    "log_ndtr": (WIDE, 1e-13, 1e-13),
}


# Near a zero of the function a few ulps of the argument are a large relative error: compare
# absolutely there. torch's float32 ndtr is 0.5 (1 + erf(x / sqrt 2)), good to about 1e-7 absolute.
FLOAT32_ATOL = {"gammaln": 2e-6, "digamma": 2e-6, "log_ndtr": 1e-6, "ndtri": 1e-6, "ndtr": 1e-7}


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_match_torch(torch, name):
    x, rtol, atol = CASES[name]
    kiln_fn, torch_fn = getattr(kiln.special, name), getattr(torch.special, name)
    assert_close(kiln_fn(kiln.from_numpy(x)), torch_fn(torch.from_numpy(x)), rtol=rtol, atol=atol)
    x32 = x.astype(np.float32)
    assert_close(
        kiln_fn(kiln.from_numpy(x32)), torch_fn(torch.from_numpy(x32)), rtol=2e-6, atol=FLOAT32_ATOL.get(name, 1e-30)
    )


@pytest.mark.parametrize("name", ["erf", "erfc", "erfcx", "erfinv", "expit", "gammaln", "digamma", "i0", "i0e", "i1",
                                  "i1e", "sinc", "entr", "ndtr", "log_ndtr", "logit", "ndtri", "exp2"])  # fmt: skip
def test_special_points_match_torch(torch, name):
    x = np.concatenate([SPECIAL, [0.5, 1e-20]]) if name not in ("i0", "i1", "i0e", "i1e") else SPECIAL[:6]
    got = getattr(kiln.special, name)(kiln.from_numpy(x))
    assert_close(got, getattr(torch.special, name)(torch.from_numpy(x)), rtol=1e-13, atol=1e-300)


def test_tails_keep_their_relative_accuracy():
    x = np.array([1.5, 3.0, 6.0, 10.0, 25.5, 26.5])
    got = kiln.special.erfc(kiln.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, [math.erfc(v) for v in x], rtol=2e-15)
    z = np.array([-5.0, -10.0, -20.0, -37.0])
    np.testing.assert_allclose(kiln.special.ndtr(kiln.from_numpy(z)).numpy(), [0.5 * math.erfc(-v / math.sqrt(2)) for v in z],
                               rtol=1e-14)  # fmt: skip
    np.testing.assert_allclose(
        kiln.special.log_ndtr(kiln.tensor([-100.0], dtype=kiln.float64)).numpy(), [-5005.524208694205], rtol=1e-13
    )  # log of the normal tail, by its asymptotic series
    p = kiln.tensor([1e-300, 1e-20, 1 - 2**-53], dtype=kiln.float64)
    # ndtr(y) at y = -37 moves by 37^2 ulps of y: the round trip is as good as the conditioning allows
    np.testing.assert_allclose(kiln.special.ndtr(kiln.special.ndtri(p)).numpy(), p.numpy(), rtol=1e-12)
    x = kiln.tensor([1 - 2**-52, -(1 - 2**-40)], dtype=kiln.float64)
    np.testing.assert_allclose(kiln.special.erf(kiln.special.erfinv(x)).numpy(), x.numpy(), rtol=1e-16)


def test_integers_compute_in_the_default_float_dtype(torch):
    x = kiln.tensor([0, 1, 2, 3])
    for name in ("erf", "erfc", "gammaln", "digamma", "i0", "sinc", "expit", "exp2"):
        got = getattr(kiln.special, name)(x)
        expected = getattr(torch.special, name)(to_torch(torch, x))
        assert got.dtype == kiln.float32 and str(expected.dtype) == "torch.float32", name
        assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_binary_and_reduction_functions_match_torch(torch):
    x, y = rng.normal(size=(3, 4)), rng.uniform(0, 2, size=(3, 4))
    x[0, :2] = 0.0
    y[0, 0] = math.nan
    kx, ky, tx, ty = kiln.from_numpy(x), kiln.from_numpy(y), torch.from_numpy(x), torch.from_numpy(y)
    assert_close(kiln.special.xlogy(kx, ky), torch.special.xlogy(tx, ty), rtol=1e-15, atol=0)
    assert_close(kiln.special.xlog1py(kx, ky), torch.special.xlog1py(tx, ty), rtol=1e-15, atol=0)
    # a Python number beside a float64 tensor computes in float64 (it took the log of a float32 2.0)
    for other in (2.0, 0.3):
        assert_close(kiln.special.xlogy(kx, other), torch.special.xlogy(tx, other), rtol=1e-15, atol=0)
        assert_close(kiln.special.xlogy(other, ky), torch.special.xlogy(other, ty), rtol=1e-15, atol=0)
        assert_close(kiln.special.xlog1py(kx, other), torch.special.xlog1py(tx, other), rtol=1e-15, atol=1e-15)
    assert_close(kiln.special.logsumexp(kx, 1), torch.special.logsumexp(tx, 1), rtol=1e-15, atol=0)
    assert_close(kiln.special.softmax(kx, 0), torch.special.softmax(tx, 0), rtol=1e-15, atol=1e-16)
    assert_close(kiln.special.log_softmax(kx, -1), torch.special.log_softmax(tx, -1), rtol=1e-15, atol=1e-15)
    assert_close(kiln.special.logit(kiln.from_numpy(y / 2), eps=0.1), torch.special.logit(ty / 2, eps=0.1), rtol=1e-15,
                 atol=0)  # fmt: skip
    a = rng.uniform(2, 5, size=5)
    assert_close(kiln.special.multigammaln(kiln.from_numpy(a), 3), torch.special.multigammaln(torch.from_numpy(a), 3),
                 rtol=1e-13, atol=1e-13)  # fmt: skip
    # below (p - 1) / 2 PyTorch 2.13 computes the same sum of log-gammas, without a check that would read values
    low = np.array([0.2, 0.7, -1.3])
    assert_close(kiln.special.multigammaln(kiln.from_numpy(low), 3), torch.special.multigammaln(torch.from_numpy(low), 3),
                 rtol=1e-13, atol=1e-13)  # fmt: skip
    r = rng.normal(size=6) * 10
    assert_close(kiln.special.round(kiln.from_numpy(r), decimals=1), torch.special.round(torch.from_numpy(r), decimals=1),
                 rtol=0, atol=0)  # fmt: skip
    assert kiln.special.psi is kiln.special.digamma


GRADIENT_INPUTS = {
    "erfc": rng.normal(size=5) * 2, "erfcx": rng.normal(size=5) * 2, "erfinv": rng.uniform(-0.95, 0.95, 5),
    "gammaln": np.array([0.3, 1.0, 1.7, 2.0, 5.5, -1.5, -0.2, 20.0]), "digamma": np.array([0.3, 1.7, 5.5, -1.5, 15.0]),
    "i0": np.array([0.5, -3.0, 10.0, 60.0]), "i1": np.array([0.5, -3.0, 10.0, 60.0]),
    "i0e": np.array([0.5, -3.0, 60.0]), "i1e": np.array([0.5, -3.0, 60.0]), "sinc": np.array([0.3, -1.2, 2.5]),
    "entr": np.array([0.3, 1.2, 2.5]), "ndtr": rng.normal(size=4) * 3, "ndtri": np.array([0.01, 0.3, 0.9]),
    "log_ndtr": np.array([-8.0, -2.0, 0.5, 3.0]), "logit": np.array([0.2, 0.7]), "expit": rng.normal(size=4),
    "exp2": rng.normal(size=4),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(GRADIENT_INPUTS))
def test_gradients_match_finite_differences(name):
    x = kiln.from_numpy(GRADIENT_INPUTS[name]).requires_grad_()
    assert gradcheck(getattr(kiln.special, name), (x,), atol=1e-7, rtol=1e-5)


def test_second_derivatives_match_finite_differences():
    for name, values in (("gammaln", [0.7, 3.5]), ("erfinv", [-0.4, 0.8]), ("i0", [0.5, 4.0])):
        x = kiln.tensor(values, dtype=kiln.float64, requires_grad=True)
        assert gradgradcheck(getattr(kiln.special, name), (x,), atol=1e-6, rtol=1e-4)
    xs, ys = (kiln.tensor([0.5, 2.0], dtype=kiln.float64, requires_grad=True) for _ in range(2))
    assert gradcheck(kiln.special.xlogy, (xs, ys))
    assert gradcheck(kiln.special.xlog1py, (xs, ys))
    assert gradcheck(
        lambda a: kiln.special.multigammaln(a, 3), (kiln.tensor([2.5, 4.0], dtype=kiln.float64, requires_grad=True),)
    )


def test_gradient_is_finite_where_a_branch_is_not_taken():
    x = kiln.tensor([0.0, 1.0, -3.0], dtype=kiln.float64, requires_grad=True)
    (
        kiln.special.sinc(x) + kiln.special.erfc(x) + kiln.special.gammaln(x + 4) + kiln.special.xlogy(x, x + 4)
    ).sum().backward()
    assert np.isfinite(x.grad.numpy()).all()


def test_compiled_special_functions_match_eager():
    def fn(x, p):
        return kiln.special.gammaln(x) + kiln.special.digamma(x) * kiln.special.erfc(x), kiln.special.erfinv(p)

    check_against_eager(fn, lambda: (kiln.from_numpy(rng.uniform(0.1, 8, 16)), kiln.from_numpy(rng.uniform(-1, 1, 16))),
                        rtol=1e-12, atol=1e-14)  # fmt: skip
