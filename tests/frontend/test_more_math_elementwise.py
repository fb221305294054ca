"""The elementwise torch.* names of ``kiln/frontend/ops/more_elementwise.py`` and the linalg/special
aliases of ``kiln/_torch_aliases.py``: values against torch (float64, float32, integer inputs,
nan/inf/signed zeros), gradients by finite differences in float64, compiled against eager on
both backends."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck
from tests.conftest import assert_close
from tests.frontend.jit.helpers import check_against_eager

rng = np.random.default_rng(0)
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, math.inf, -math.inf, math.nan, 1e-300, -1e-10, 1e300, 700.0, -800.0]
WIDE = np.concatenate([rng.normal(size=200) * 3, rng.uniform(-1, 1, 200), rng.uniform(-30, 30, 50), SPECIAL])
OTHER = np.concatenate([rng.normal(size=200) * 3, rng.uniform(-1, 1, 200), rng.uniform(-30, 30, 50),
                        [0.0, 0.0, -0.0, -1.0, math.inf, -math.inf, math.nan, 1.0, -math.inf, -0.0, 2.0,
                         math.inf, math.nan, -700.0, 3.0]])  # fmt: skip

UNARY = [
    "tan", "sinh", "cosh", "asinh", "acosh", "atanh", "atan", "asin", "acos", "arctan", "arcsin", "arccos",
    "arcsinh", "arccosh", "arctanh", "exp2", "deg2rad", "rad2deg", "frac", "signbit", "isposinf", "isneginf",
    "nan_to_num", "sgn", "absolute", "isreal", "digamma", "lgamma", "erfinv", "erfc", "i0", "sinc", "logit",
]  # fmt: skip
BINARY = [
    "atan2", "arctan2", "hypot", "logaddexp", "logaddexp2", "fmod", "copysign", "fmax", "fmin", "ldexp",
    "float_power", "heaviside", "xlogy", "greater", "greater_equal", "less", "less_equal", "not_equal",
]  # fmt: skip
# Functions whose float32 results torch computes with a few more roundings than kiln (or fewer).
FLOAT32_RTOL = {"digamma": 1e-5, "lgamma": 1e-5, "i0": 1e-5, "erfinv": 1e-5}
FLOAT32_ATOL = {"digamma": 2e-6, "lgamma": 2e-6, "logit": 1e-6, "erfinv": 1e-6, "logaddexp": 1e-7, "logaddexp2": 1e-7}


def _compare(name, kiln_out, torch_out, dtype) -> None:
    if dtype == np.float64:
        assert_close(kiln_out, torch_out, rtol=1e-13, atol={"logaddexp2": 1e-15}.get(name, 1e-300))
    else:
        assert_close(kiln_out, torch_out, rtol=FLOAT32_RTOL.get(name, 2e-6), atol=FLOAT32_ATOL.get(name, 1e-30))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", UNARY)
def test_unary_values_match_torch(torch, name, dtype):
    with np.errstate(over="ignore"):
        x = WIDE.astype(dtype)
    if name in ("digamma", "lgamma"):
        x = x[np.abs(x) < 100]  # torch's float32 digamma/lgamma near poles differ by more than rounding
    with np.errstate(all="ignore"):
        _compare(name, getattr(kiln, name)(kiln.from_numpy(x)), getattr(torch, name)(torch.from_numpy(x)), dtype)
    if hasattr(torch.Tensor, name):  # the method form too
        _compare(name, getattr(kiln.from_numpy(x), name)(), getattr(torch.from_numpy(x), name)(), dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", BINARY)
def test_binary_values_match_torch(torch, name, dtype):
    with np.errstate(over="ignore"):
        x, y = WIDE.astype(dtype), OTHER.astype(dtype)
    kiln_fn, torch_fn = getattr(kiln, name), getattr(torch, name)
    _compare(
        name, kiln_fn(kiln.from_numpy(x), kiln.from_numpy(y)), torch_fn(torch.from_numpy(x), torch.from_numpy(y)), dtype
    )
    # broadcasting, and a Python number as the second operand where torch takes one
    if name not in ("heaviside", "xlogy"):
        a, b = x[:12].reshape(3, 4), y[:4]
        _compare(
            name,
            kiln_fn(kiln.from_numpy(a), kiln.from_numpy(b)),
            torch_fn(torch.from_numpy(a), torch.from_numpy(b)),
            dtype,
        )
        try:
            expected = torch_fn(torch.from_numpy(a), 1.5)
        except TypeError:  # torch takes a tensor only there
            return
        _compare(name, kiln_fn(kiln.from_numpy(a), 1.5), expected, dtype)


@pytest.mark.parametrize("name", ["tan", "sinh", "atan", "asin", "exp2", "deg2rad", "sgn", "signbit", "nan_to_num",
                                  "absolute", "isposinf", "digamma", "erfc", "sinc"])  # fmt: skip
def test_integer_inputs_promote_as_torch(torch, name):
    x = np.array([-3, -1, 0, 1, 2, 5], dtype=np.int64)
    with np.errstate(all="ignore"):
        ours, theirs = getattr(kiln, name)(kiln.from_numpy(x)), getattr(torch, name)(torch.from_numpy(x))
    assert_close(ours, theirs, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["atan2", "hypot", "fmod", "copysign", "logaddexp", "fmax", "float_power", "ldexp"])
def test_integer_binary_promotion_matches_torch(torch, name):
    a, b = np.array([-7, 7, -7, 3, 0]), np.array([3, -3, -3, 2, 5])
    if name in ("hypot", "logaddexp"):  # torch refuses integers there, and so does kiln
        with pytest.raises((RuntimeError, NotImplementedError), match="not implemented"):
            getattr(kiln, name)(kiln.from_numpy(a), kiln.from_numpy(b))
        return
    assert_close(getattr(kiln, name)(kiln.from_numpy(a), kiln.from_numpy(b)),
                 getattr(torch, name)(torch.from_numpy(a), torch.from_numpy(b)), rtol=1e-6, atol=1e-7)  # fmt: skip


def test_edge_cases_and_errors(torch):
    for x in (np.zeros(0), np.array(0.7)):  # empty and 0-d
        for name in ("atan", "cosh", "frac", "nan_to_num"):
            assert_close(
                getattr(kiln, name)(kiln.from_numpy(x)), getattr(torch, name)(torch.from_numpy(x)), rtol=1e-15, atol=0
            )
    # fmod keeps the dividend's sign, exactly (remainder takes the divisor's)
    a, b = rng.normal(size=300).astype(np.float32) * 10, rng.normal(size=300).astype(np.float32)
    np.testing.assert_array_equal(kiln.fmod(kiln.from_numpy(a), kiln.from_numpy(b)).numpy(),
                                  torch.fmod(torch.from_numpy(a), torch.from_numpy(b)).numpy())  # fmt: skip
    assert math.copysign(1.0, kiln.fmod(kiln.tensor(-4.0), 2.0).item()) == -1.0
    with pytest.raises(ZeroDivisionError):
        kiln.fmod(kiln.tensor([1, 2]), 0)
    with pytest.raises(RuntimeError, match="frac"):
        kiln.frac(kiln.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="different dtypes"):
        kiln.heaviside(kiln.tensor([1.0]), kiln.tensor([1]))
    x = kiln.tensor([math.nan, math.inf, -math.inf, 1.0])
    assert kiln.nan_to_num(x, nan=2.0, posinf=3.0, neginf=-4.0).tolist() == [2.0, 3.0, -4.0, 1.0]
    assert kiln.clamp_min(kiln.tensor([1, 5]), 3).tolist() == [3, 5]
    assert kiln.tensor([1.0, 5.0]).clamp_max(2.0).tolist() == [1.0, 2.0]
    assert kiln.float_power(kiln.tensor([2], dtype=kiln.int32), 2).dtype == kiln.float64
    t = kiln.tensor([1.0])
    assert kiln.positive(t) is t
    with pytest.raises(TypeError):
        kiln.positive(kiln.tensor([True]))


def test_in_place_forms():
    x = np.array([0.3, -0.7, 2.0])
    for name in ("tan", "atan", "asinh", "exp2", "frac", "deg2rad", "sgn", "lgamma", "digamma"):
        t = kiln.from_numpy(x.copy())
        assert getattr(t, name + "_")() is t
        np.testing.assert_allclose(t.numpy(), getattr(kiln, name)(kiln.from_numpy(x)).numpy(), rtol=1e-15)
    t = kiln.from_numpy(x.copy())
    t.atan2_(kiln.tensor([1.0, -1.0, 0.5], dtype=kiln.float64))
    np.testing.assert_allclose(t.numpy(), np.arctan2(x, [1.0, -1.0, 0.5]), rtol=1e-15)
    with pytest.raises(RuntimeError, match="float64"):
        kiln.tensor([1.0, 2.0], dtype=kiln.float32).float_power_(2)
    t = kiln.from_numpy(x.copy())
    assert t.float_power_(2) is t and t.tolist() == (x**2).tolist()
    t = kiln.from_numpy(x.copy())
    t.multiply_(2.0).subtract_(1.0).divide_(4.0)
    np.testing.assert_allclose(t.numpy(), (x * 2 - 1) / 4, rtol=1e-15)


def test_aliases_are_the_same_functions():
    assert kiln.det is kiln.linalg.det and kiln.inverse is kiln.linalg.inv and kiln.slogdet is kiln.linalg.slogdet
    assert kiln.matrix_power is kiln.linalg.matrix_power and kiln.digamma is kiln.special.digamma
    assert (
        kiln.lgamma is kiln.special.gammaln and kiln.erfinv is kiln.special.erfinv and kiln.xlogy is kiln.special.xlogy
    )
    assert kiln.arctan2 is kiln.atan2 and kiln.Tensor.arcsin is kiln.Tensor.asin and kiln.greater is kiln.gt


def test_linalg_aliases_match_torch(torch):
    a = rng.normal(size=(2, 4, 4))
    ka, ta = kiln.from_numpy(a), torch.from_numpy(a)
    for name in ("det", "inverse", "logdet", "pinverse"):
        assert_close(getattr(ka, name)(), getattr(ta, name)(), rtol=1e-10, atol=1e-12)
    sign, logabsdet = ka.slogdet()
    tsign, tlog = ta.slogdet()
    assert_close(sign, tsign, rtol=0, atol=0)
    assert_close(logabsdet, tlog, rtol=1e-12, atol=1e-12)
    u, s, v = kiln.svd(ka)
    tu, ts, tv = torch.svd(ta)
    assert_close(s, ts, rtol=1e-12, atol=1e-12)
    assert_close(u @ kiln.diag_embed(s) @ v.mT, ka, rtol=1e-10, atol=1e-12)  # V, not Vh
    np.testing.assert_allclose(np.abs(v.numpy()), np.abs(tv.numpy()), rtol=1e-10, atol=1e-12)
    spd = a @ np.swapaxes(a, -1, -2) + 4 * np.eye(4)
    assert_close(
        kiln.cholesky(kiln.from_numpy(spd), True), torch.cholesky(torch.from_numpy(spd), True), rtol=1e-12, atol=1e-12
    )
    assert_close(kiln.from_numpy(a).matrix_power(3), ta.matrix_power(3), rtol=1e-12, atol=1e-12)
    b, c = rng.normal(size=(4, 3, 3)), rng.normal(size=(4, 3, 3))
    with pytest.warns(UserWarning):
        expected = torch.cross(torch.from_numpy(b), torch.from_numpy(c))  # the first dim of size 3
    assert_close(kiln.cross(kiln.from_numpy(b), kiln.from_numpy(c)), expected, rtol=1e-14, atol=1e-14)
    neg = np.diag([-1.0, 2.0, 3.0])
    assert math.isnan(kiln.logdet(kiln.from_numpy(neg)).item())


GRADIENTS = {
    "tan": (lambda x: kiln.tan(x), (-1.2, 1.2)),
    "sinh": (kiln.sinh, (-3, 3)), "cosh": (kiln.cosh, (-3, 3)), "asinh": (kiln.asinh, (-3, 3)),
    "acosh": (kiln.acosh, (1.1, 4)), "atanh": (kiln.atanh, (-0.9, 0.9)), "atan": (kiln.atan, (-4, 4)),
    "asin": (kiln.asin, (-0.9, 0.9)), "acos": (kiln.acos, (-0.9, 0.9)), "exp2": (kiln.exp2, (-2, 2)),
    "frac": (kiln.frac, (0.1, 0.9)), "deg2rad": (kiln.deg2rad, (-3, 3)),
}  # fmt: skip
BINARY_GRADIENTS = ["atan2", "hypot", "logaddexp", "logaddexp2", "fmod", "copysign", "fmax", "float_power", "ldexp"]


@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_unary_gradients(name):
    fn, (lo, hi) = GRADIENTS[name]
    x = kiln.tensor(rng.uniform(lo, hi, size=(3, 4)), dtype=kiln.float64, requires_grad=True)
    assert gradcheck(fn, (x,), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", BINARY_GRADIENTS)
def test_binary_gradients(name):
    a = rng.uniform(0.5, 3, size=(3, 4)) * rng.choice([-1, 1], size=(3, 4))
    b = rng.uniform(0.5, 3, size=(4,)) * rng.choice([-1, 1], size=4)
    if name == "float_power":
        a = np.abs(a)
    if name == "fmod":
        b = b + 0.1234  # away from the jumps of a multiple of b
    x = kiln.tensor(a, requires_grad=True)
    y = kiln.tensor(b, requires_grad=name not in ("copysign",))
    assert gradcheck(getattr(kiln, name), (x, y), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradients_at_special_points_match_torch(torch):
    points = np.array([0.0, -0.0, 1e-8, -1e-8, 0.25, 3.0])
    for name in ("atan", "asinh", "sinh", "atanh", "tan"):
        x, tx = kiln.tensor(points, requires_grad=True), torch.tensor(points, requires_grad=True)
        getattr(kiln, name)(x).sum().backward()
        getattr(torch, name)(tx).sum().backward()
        assert_close(x.grad, tx.grad, rtol=1e-14, atol=1e-300)
    for name in ("atan2", "fmod"):
        a = kiln.tensor([0.0, 2.0, -3.0, -0.0], dtype=kiln.float64, requires_grad=True)
        b = kiln.tensor([5.0, 0.0 if name == "atan2" else 0.7, -0.5, 2.0], dtype=kiln.float64, requires_grad=True)
        getattr(kiln, name)(a, b).sum().backward()
        ta = torch.tensor(a.detach().numpy(), requires_grad=True)
        tb = torch.tensor(b.detach().numpy(), requires_grad=True)
        getattr(torch, name)(ta, tb).sum().backward()
        assert_close(a.grad, ta.grad, rtol=1e-14, atol=1e-300)
        assert_close(b.grad, tb.grad, rtol=1e-14, atol=1e-300)


def _composite(x, y):
    return (kiln.atan2(x, y) + kiln.asin(kiln.tanh(x)) + kiln.acos(kiln.tanh(y)) + kiln.sinh(x) - kiln.cosh(y)
            + kiln.hypot(x, y) + kiln.logaddexp(x, y) + kiln.fmod(x, y) + kiln.copysign(x, y) + kiln.atanh(kiln.tanh(x) * 0.5)
            + kiln.nan_to_num(kiln.log(x)) + kiln.exp2(y) + kiln.tan(x * 0.3) + kiln.asinh(y) + kiln.frac(x))  # fmt: skip


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_compiled_matches_eager(backend, dtype):
    draws = np.random.default_rng(7)  # (its own stream: the module's depends on which tests ran first)

    def make_args():
        x = kiln.from_numpy(np.concatenate([draws.normal(size=30) * 3, [0.0, -0.0, 1.0, -2.0]])).to(dtype)
        y = kiln.from_numpy(np.concatenate([draws.normal(size=30) * 3, [0.0, 0.0, -0.0, 0.5]])).to(dtype)
        return x, y

    # float32: a sum of fifteen terms, sinh and cosh of |x| up to ~9 among them (thousands, whose ulp is
    # ~1e-4): compiled and eager round each term apart (CI drew a 3.8e-6 difference at a 0.5)
    rtol, atol = (1e-5, 1e-4) if dtype == kiln.float32 else (1e-13, 1e-13)
    check_against_eager(_composite, make_args, calls=3, rtol=rtol, atol=atol,
                        fullgraph=True, options=kiln.CompileOptions(backend=backend))  # fmt: skip


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
def test_compiled_gradients_match_eager(backend):
    def step(x, y):
        x.grad = y.grad = None
        (kiln.atan2(x, y) * kiln.asinh(x) + kiln.logaddexp(x, y)).sum().backward()
        return x.grad, y.grad

    def make_args():
        x = kiln.tensor(rng.normal(size=16), dtype=kiln.float64, requires_grad=True)
        return x, kiln.tensor(rng.normal(size=16), dtype=kiln.float64, requires_grad=True)

    check_against_eager(step, make_args, calls=3, rtol=1e-12, atol=1e-12,
                        fullgraph=True, options=kiln.CompileOptions(backend=backend))  # fmt: skip


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 6])
def test_polygamma_matches_torch(torch, n):
    positive = np.concatenate([np.linspace(0.01, 50, 200), [1e-3, 0.5, 1.0, 2.0, 15.99, 16.0, 16.01, 100.0, 1e3]])
    negative = np.array([-0.3, -0.5, -2.5, -9.7, -10.3, -25.25])
    # torch's trigamma (n = 1) is good to about 5e-10; kiln's series to a few ulps
    rtol = 1e-9 if n == 1 else 1e-12
    assert_close(
        kiln.polygamma(n, kiln.from_numpy(positive)), torch.polygamma(n, torch.from_numpy(positive)), rtol=rtol, atol=0
    )
    # by reflection: cot's derivatives cancel against psi^(n)(1 - x), losing digits as n grows
    assert_close(
        kiln.polygamma(n, kiln.from_numpy(negative)), torch.polygamma(n, torch.from_numpy(negative)), rtol=1e-9, atol=0
    )
    x32 = positive.astype(np.float32)[:-1]
    assert_close(kiln.from_numpy(x32).polygamma(n), torch.from_numpy(x32).polygamma(n), rtol=1e-5, atol=0)
    assert_close(
        kiln.polygamma(n, kiln.tensor([0.0])), torch.polygamma(n, torch.tensor([0.0])), rtol=0, atol=0
    )  # the pole
    with pytest.raises(RuntimeError, match="negative n"):
        kiln.polygamma(-1, kiln.tensor([1.0]))


def test_polygamma_gradient():
    x = kiln.tensor(rng.uniform(0.2, 5, size=6), dtype=kiln.float64, requires_grad=True)
    assert gradcheck(lambda t: kiln.polygamma(2, t), (x,), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_matrix_exp_matches_torch(torch):
    draw = np.random.default_rng(299)  # a stream of its own: which matrices overflow must not depend on test order
    for scale in (0.0, 0.1, 1.0, 3.0, 30.0):
        a = draw.normal(size=(3, 4, 4)) * scale
        expected = torch.matrix_exp(torch.from_numpy(a))
        assert_close(
            kiln.matrix_exp(kiln.from_numpy(a)), expected, rtol=1e-12, atol=1e-13 * float(expected.abs().max())
        )
        a32 = a.astype(np.float32)
        expected32, got32 = torch.from_numpy(a32).matrix_exp().numpy(), kiln.from_numpy(a32).matrix_exp().numpy()
        for e, g in zip(expected32, got32, strict=True):
            if not np.isfinite(e).all():  # float32 overflowed on the way (torch: nan, inf - inf): so must kiln's
                assert not np.isfinite(g).all()
                continue
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5 * float(np.abs(e).max()))
    assert kiln.matrix_exp(kiln.zeros(0, 0)).shape == (0, 0)
    with pytest.raises(RuntimeError, match="square"):
        kiln.matrix_exp(kiln.zeros(2, 3))
    x = kiln.tensor(rng.normal(size=(3, 3)) * 2, dtype=kiln.float64, requires_grad=True)
    assert gradcheck(kiln.matrix_exp, (x,), eps=1e-6, atol=1e-6, rtol=1e-5)
