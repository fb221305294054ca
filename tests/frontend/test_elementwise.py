"""Elementwise ops through the public API: composites and promotion against PyTorch, gradients by
finite differences, operators, in-place forms and their errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln.frontend.tensor import make_tensor
from tests.conftest import assert_close, to_torch, tol

SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 25.0, -25.0, math.inf, -math.inf, math.nan]


def values(dtype=kiln.float32, shape=(3, 4), seed=0):
    rng = np.random.default_rng(seed)
    return kiln.from_numpy(rng.uniform(-3, 3, size=shape).astype(dtype.np))


COMPOSITES = [
    ("relu", lambda m, x: m.relu(x)),
    ("gelu", lambda m, x: (kiln.nn.functional if m is kiln else m.nn.functional).gelu(x)),
    ("gelu_tanh", lambda m, x: (kiln.nn.functional if m is kiln else m.nn.functional).gelu(x, approximate="tanh")),
    ("silu", lambda m, x: (kiln.nn.functional if m is kiln else m.nn.functional).silu(x)),
    (
        "softplus",
        lambda m, x: (kiln.nn.functional if m is kiln else m.nn.functional).softplus(x, beta=2.0, threshold=5.0),
    ),
    ("clamp", lambda m, x: m.clamp(x, -1.0, 0.5)),
    ("clamp_min", lambda m, x: m.clamp(x, min=0.25)),
    ("square", lambda m, x: m.square(x)),
    ("reciprocal", lambda m, x: m.reciprocal(x)),
    ("log2", lambda m, x: m.log2(x)),
    ("log10", lambda m, x: m.log10(x)),
    ("trunc", lambda m, x: m.trunc(x)),
    ("round2", lambda m, x: m.round(x, decimals=2)),
    ("div_floor", lambda m, x: m.div(x, 0.7, rounding_mode="floor")),
    ("div_trunc", lambda m, x: m.div(x, 0.7, rounding_mode="trunc")),
    ("lerp", lambda m, x: m.lerp(x, m.ones_like(x), 0.3)),
    ("isnan", lambda m, x: m.isnan(x)),
    ("isinf", lambda m, x: m.isinf(x)),
    ("isfinite", lambda m, x: m.isfinite(x)),
    ("pow_scalar", lambda m, x: m.pow(x, 3)),
    # the exponents PyTorch computes without pow (x * x * x, sqrt, rsqrt, 1 / x, 1 / (x * x)): its
    # results at -0.0 and -inf, as well as its speed (numpy's pow of a negative base is slow)
    ("pow_3.0", lambda m, x: m.pow(x, 3.0)),
    ("pow_0.5", lambda m, x: x**0.5),
    ("pow_-0.5", lambda m, x: m.pow(x, -0.5)),
    ("pow_-1", lambda m, x: m.pow(x, -1)),
    ("pow_-2", lambda m, x: x**-2.0),
    ("pow_1.5", lambda m, x: m.pow(x, 1.5)),
    ("rpow", lambda m, x: 2.0**x),
    ("rsub", lambda m, x: 1 - x),
    ("rtruediv", lambda m, x: 3 / x),
]


@pytest.mark.parametrize(("name", "fn"), COMPOSITES, ids=[c[0] for c in COMPOSITES])
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_composites_match_pytorch(name, fn, dtype, torch):
    special = SPECIAL
    if name == "gelu" and dtype is kiln.float32:
        special = [v for v in SPECIAL if v != math.inf]  # PyTorch's float32 kernel gives nan for gelu(inf); kiln inf
    for x in (values(dtype), kiln.tensor(special, dtype=dtype), values(dtype, ()), values(dtype, (0, 2))):
        assert_close(fn(kiln, x), fn(torch, to_torch(torch, x)), **tol(dtype))


DIFFERENTIABLE = [
    c for c in COMPOSITES if c[0] not in {"trunc", "round2", "div_floor", "div_trunc", "isnan", "isinf", "isfinite"}
]


@pytest.mark.parametrize(("name", "fn"), DIFFERENTIABLE, ids=[c[0] for c in DIFFERENTIABLE])
def test_composite_gradients_match_finite_differences(name, fn):
    x = values(kiln.float64, (7,), seed=1).clone().requires_grad_()
    if name in {"log2", "log10", "reciprocal", "rtruediv", "pow_0.5", "pow_-0.5", "pow_-1", "pow_-2", "pow_1.5"}:
        x = (x.detach().abs() + 0.5).requires_grad_()
    kiln.autograd.gradcheck(lambda t: fn(kiln, t), (x,), atol=1e-6, rtol=1e-4)


def test_special_powers_compile_as_they_run_eagerly():
    def powers(x):
        return x**3.0, x.abs() ** 0.5, kiln.pow(x, -0.5), x**-1, x**-2.0, x.abs() ** 1.5

    f = kiln.compile(powers, wait=True)
    for seed in range(3):
        x = kiln.tensor([-0.0, 0.0, -math.inf, math.inf, math.nan, -2.0, 3.0] + values(seed=seed).reshape(-1).tolist())
        for got, want in zip(f(x), powers(x), strict=True):
            assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_relu_keeps_nan_and_has_zero_gradient_at_zero(torch):
    x = kiln.tensor([-1.0, 0.0, 2.0, math.nan], requires_grad=True)
    y = kiln.relu(x)
    assert math.isnan(y.tolist()[3])
    y.sum().backward()
    assert x.grad.tolist()[:3] == [0.0, 0.0, 1.0]


def test_clamp_gradient_is_one_on_the_bounds():
    x = kiln.tensor([-2.0, -1.0, 0.0, 1.0, 2.0], requires_grad=True)
    kiln.clamp(x, -1.0, 1.0).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]


def test_softplus_gradient_is_finite_for_large_inputs():
    x = kiln.tensor([-1000.0, 0.0, 1000.0], dtype=kiln.float64, requires_grad=True)
    kiln.nn.functional.softplus(x).sum().backward()
    assert np.allclose(x.grad.numpy(), [0.0, 0.5, 1.0])


def test_integer_ops_match_pytorch(torch):
    a = kiln.tensor([[-7, 7, 5], [-5, 0, 9]])
    b = kiln.tensor([[2, -2, 3], [-3, 4, -4]])
    ta, tb = to_torch(torch, a), to_torch(torch, b)
    for op in ("floor_divide", "remainder", "mul", "add", "sub", "maximum", "minimum", "eq", "lt"):
        assert_close(getattr(kiln, op)(a, b), getattr(torch, op)(ta, tb), rtol=0, atol=0)
    assert_close(kiln.div(a, b, rounding_mode="trunc"), torch.div(ta, tb, rounding_mode="trunc"), rtol=0, atol=0)
    assert_close(a // 2, ta // 2, rtol=0, atol=0)
    assert_close(-a % 3, -ta % 3, rtol=0, atol=0)


def test_integer_division_by_zero_raises():
    with pytest.raises(ZeroDivisionError):
        kiln.tensor([1, 2]) // kiln.tensor([1, 0])


def test_float_division_by_zero_is_inf_without_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = kiln.tensor([1.0, -1.0, 0.0]) / 0.0
    assert out.tolist()[:2] == [math.inf, -math.inf] and math.isnan(out.tolist()[2])


def test_operators_and_reflected_forms():
    x = kiln.tensor([1.0, 2.0, 4.0])
    assert (x + 1).tolist() == [2.0, 3.0, 5.0]
    assert (1 + x).tolist() == [2.0, 3.0, 5.0]
    assert (10 - x).tolist() == [9.0, 8.0, 6.0]
    assert (2 * x).tolist() == [2.0, 4.0, 8.0]
    assert (8 / x).tolist() == [8.0, 4.0, 2.0]
    assert (x**2).tolist() == [1.0, 4.0, 16.0]
    assert (2**x).tolist() == [2.0, 4.0, 16.0]
    assert (-x).tolist() == [-1.0, -2.0, -4.0]
    assert (x > 1.5).tolist() == [False, True, True]
    assert ((x > 1.5) & (x < 3)).tolist() == [False, True, False]
    assert (~(x > 1.5)).tolist() == [True, False, False]
    assert (np.float32(2.0) * x).tolist() == [2.0, 4.0, 8.0]


def test_bitwise_operators_on_integers_and_floats():
    """(Parity over every dtype: tests/frontend/test_bitwise_ops.py.)"""
    assert (kiln.tensor([1, 2]) & kiln.tensor([1, 0])).tolist() == [1, 0]
    with pytest.raises(NotImplementedError, match="not implemented for 'Float'"):
        kiln.tensor([1.0, 2.0]) & 1


def test_inplace_ops_write_into_the_same_memory_and_bump_the_version():
    x = kiln.tensor([1.0, 2.0, 3.0])
    ptr, version = x.data_ptr(), x._version_value
    y = x
    y += 1
    x.mul_(2).sub_(1)
    assert y is x and x.data_ptr() == ptr
    assert x.tolist() == [3.0, 5.0, 7.0]
    assert x._version_value == version + 3


def test_inplace_result_type_must_fit():
    x = kiln.tensor([1, 2, 3])
    with pytest.raises(RuntimeError, match="can't be cast"):
        x.add_(1.5)
    x.add_(True)
    assert x.tolist() == [2, 3, 4]


def test_inplace_broadcast_shape_must_match():
    x = kiln.zeros(3)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        x.add_(kiln.ones(2, 3))


def test_inplace_on_leaf_requiring_grad_is_an_error_but_allowed_under_no_grad():
    w = kiln.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        w.add_(1)
    with kiln.no_grad():
        w.add_(1)
    assert w.tolist() == [2.0, 2.0, 2.0] and w.requires_grad


def test_inplace_on_a_non_leaf_is_differentiable(torch):
    def run(m, a):
        y = a * 3
        y.add_(1)
        y.mul_(2)  # mul by a constant does not need y's old value: no version error
        return (y * a).sum()

    a = kiln.tensor([0.5, 1.0, 2.0], dtype=kiln.float64, requires_grad=True)
    run(kiln, a).backward()
    ta = to_torch(torch, a).requires_grad_()
    run(torch, ta).backward()
    assert_close(a.grad, ta.grad, rtol=1e-12, atol=1e-12)


def test_modifying_a_saved_tensor_in_place_makes_backward_fail_naming_the_op():
    a = kiln.tensor([0.5, 1.0, 2.0], requires_grad=True)
    y = a * 3
    y.exp_()  # exp saves its result, which is y
    y.mul_(a)  # so this write invalidates it (PyTorch fails here too)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation: it was saved by ExpBackward"):
        y.sum().backward()


def test_mixing_devices_is_a_clear_error():
    cpu = kiln.ones(2)
    fake_cuda = make_tensor(np.ones(2, dtype=np.float32), kiln.device("cuda:0"))
    with pytest.raises(RuntimeError, match=r"same device, but found at least two devices, cpu and cuda:0!"):
        cpu + fake_cuda


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(4,\)"):
        kiln.ones(2, 3) + kiln.ones(4)


def test_where_checks_its_condition():
    with pytest.raises(TypeError, match="boolean"):
        kiln.where(kiln.ones(2), kiln.ones(2), kiln.zeros(2))
    out = kiln.where(kiln.tensor([True, False]), 1.0, kiln.tensor([5, 6]))
    assert out.dtype is kiln.float32 and out.tolist() == [1.0, 6.0]


def test_unary_float_ops_promote_integers(torch):
    x = kiln.tensor([1, 2, 3])
    for op in ("exp", "log", "sqrt", "sin", "tanh", "sigmoid", "erf"):
        assert_close(getattr(kiln, op)(x), getattr(torch, op)(to_torch(torch, x)), rtol=1e-6, atol=1e-6)


def test_float16_ops_stay_float16(torch):
    x = kiln.tensor([0.1, 0.2, 3.0], dtype=kiln.float16)
    assert_close(x * 3 + 1, to_torch(torch, x) * 3 + 1, **tol(kiln.float16))
    assert_close(kiln.exp(x), torch.exp(to_torch(torch, x)), **tol(kiln.float16))
