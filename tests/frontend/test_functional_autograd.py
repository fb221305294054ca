"""kiln.autograd.functional against torch.autograd.functional (structure, values, strict,
create_graph), and against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.autograd import functional as F
from tests.conftest import assert_close

rng = np.random.default_rng(0)
TOL = {"rtol": 1e-10, "atol": 1e-12}


def normal(*shape):
    return kiln.from_numpy(rng.normal(size=shape))


def assert_tree(actual, expected):
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(expected), (type(actual), actual)
        for a, e in zip(actual, expected, strict=True):
            assert_tree(a, e)
    else:
        assert isinstance(actual, kiln.Tensor), type(actual)
        assert_close(actual, expected, **TOL)


def cases(torch):
    """(kiln function, torch function, input arrays, single input?) over the structures torch knows."""
    return [
        (lambda x: kiln.tanh(x) * x.sum(), lambda x: torch.tanh(x) * x.sum(), (rng.normal(size=3),), True),
        (lambda x: (x**3).sum(), lambda x: (x**3).sum(), (rng.normal(size=(2, 2)),), True),
        (lambda a, b: (a @ b).exp(), lambda a, b: (a @ b).exp(), (rng.normal(size=(2, 3)), rng.normal(size=(3, 2))), False),
        (lambda a, b: (a * b, (a - b).sum()), lambda a, b: (a * b, (a - b).sum()), (rng.normal(size=3), rng.normal(size=3)),
         False),
        (lambda a, b: a.sin(), lambda a, b: a.sin(), (rng.normal(size=3), rng.normal(size=2)), False),  # b unused
    ]  # fmt: skip


def args(arrays, single, lib):
    tensors = tuple(kiln.from_numpy(a.copy()) if lib == "kiln" else lib.from_numpy(a.copy()) for a in arrays)
    return tensors[0] if single else tensors


def test_jacobian_matches_torch(torch):
    for fk, ft, arrays, single in cases(torch):
        got = F.jacobian(fk, args(arrays, single, "kiln"))
        expected = torch.autograd.functional.jacobian(ft, args(arrays, single, torch))
        assert_tree(got, expected)


def test_vjp_and_jvp_match_torch(torch):
    for fk, ft, arrays, single in cases(torch):
        out_t = ft(*args(arrays, False, torch))
        outs = out_t if isinstance(out_t, tuple) else (out_t,)
        v_out = [rng.normal(size=tuple(o.shape)) for o in outs]
        v_in = [rng.normal(size=a.shape) for a in arrays]

        def pack(vs, lib, as_tuple):
            ts = tuple(kiln.from_numpy(v) if lib == "kiln" else lib.from_numpy(v) for v in vs)
            return ts if as_tuple else ts[0]

        out_tuple = isinstance(out_t, tuple)
        got = F.vjp(fk, args(arrays, single, "kiln"), pack(v_out, "kiln", out_tuple))
        expected = torch.autograd.functional.vjp(ft, args(arrays, single, torch), pack(v_out, torch, out_tuple))
        assert_tree(got, expected)
        got = F.jvp(fk, args(arrays, single, "kiln"), pack(v_in, "kiln", not single))
        expected = torch.autograd.functional.jvp(ft, args(arrays, single, torch), pack(v_in, torch, not single))
        assert_tree(got, expected)


def test_hessian_hvp_vhp_match_torch(torch):
    scalar_cases = [
        (lambda x: (x**3).sum() + x.prod(), lambda x: (x**3).sum() + x.prod(), (rng.normal(size=3),), True),
        (lambda a, b: (a.exp() * b).sum() + (b @ b), lambda a, b: (a.exp() * b).sum() + (b @ b),
         (rng.normal(size=2), rng.normal(size=2)), False),
        (lambda a, b: (a * a).sum(), lambda a, b: (a * a).sum(), (rng.normal(size=2), rng.normal(size=3)), False),
    ]  # fmt: skip
    for fk, ft, arrays, single in scalar_cases:
        assert_tree(F.hessian(fk, args(arrays, single, "kiln")),
                    torch.autograd.functional.hessian(ft, args(arrays, single, torch)))  # fmt: skip
        vs = [rng.normal(size=a.shape) for a in arrays]
        vk = tuple(kiln.from_numpy(v) for v in vs)
        vt = tuple(torch.from_numpy(v) for v in vs)
        for name in ("hvp", "vhp"):
            got = getattr(F, name)(fk, args(arrays, single, "kiln"), vk[0] if single else vk)
            expected = getattr(torch.autograd.functional, name)(
                ft, args(arrays, single, torch), vt[0] if single else vt
            )
            assert_tree(got, expected)


def test_jacobian_matches_finite_differences():
    x = normal(2, 3)
    jac = F.jacobian(lambda t: kiln.softmax(t, -1) * t.sum(), x).numpy()
    eps = 1e-6
    flat = x.numpy().reshape(-1)
    numeric = np.zeros((2, 3, 6))
    for k in range(6):
        plus, minus = flat.copy(), flat.copy()
        plus[k] += eps
        minus[k] -= eps

        def f(values):
            t = kiln.from_numpy(values.reshape(2, 3))
            return (kiln.softmax(t, -1) * t.sum()).numpy()

        numeric[..., k] = (f(plus) - f(minus)) / (2 * eps)
    np.testing.assert_allclose(jac.reshape(2, 3, 6), numeric, rtol=1e-6, atol=1e-8)


def test_strict_rejects_independent_inputs_and_outputs(torch):
    a, b = normal(3), normal(2)
    with pytest.raises(RuntimeError, match="independent of input 1"):
        F.jacobian(lambda x, y: x.sin(), (a, b), strict=True)
    with pytest.raises(RuntimeError, match="independent"):
        F.vjp(lambda x, y: x.sin(), (a, b), kiln.ones(3, dtype=kiln.float64), strict=True)
    # without strict: zeros, as torch
    jac = F.jacobian(lambda x: kiln.ones(2, dtype=kiln.float64), a)
    assert_close(jac, torch.zeros(2, 3, dtype=torch.float64), rtol=0, atol=0)


def test_v_is_required_unless_the_output_has_one_element():
    with pytest.raises(RuntimeError, match="one element"):
        F.vjp(lambda x: x * 2, normal(3))
    out, g = F.vjp(lambda x: (x * 2).sum(), normal(3))
    assert_close(g, np.full(3, 2.0), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="shape"):
        F.vjp(lambda x: x * 2, normal(3), kiln.ones(4, dtype=kiln.float64))
    with pytest.raises(TypeError, match="Tensor"):
        F.jacobian(lambda x: x, [1.0, 2.0])
    with pytest.raises(RuntimeError, match="single Tensor with one element"):
        F.hessian(lambda x: x * 2, normal(3))


def test_results_are_detached_unless_create_graph():
    x = normal(3).requires_grad_()
    out, g = F.vjp(lambda t: (t**3).sum(), x)
    assert not out.requires_grad and not g.requires_grad and x.grad is None
    out, g = F.vjp(lambda t: (t**3).sum(), x, create_graph=True)
    assert g.requires_grad
    g.sum().backward()  # d/dx sum(3 x^2) = 6 x
    assert_close(x.grad, 6 * x.detach().numpy(), **TOL)
    h = F.hessian(lambda t: (t**4).sum(), x, create_graph=True)
    (dx,) = kiln.autograd.grad(h.sum(), x)  # d/dx sum(diag(12 x^2)) = 24 x
    assert_close(dx, 24 * x.detach().numpy(), **TOL)
    assert kiln.autograd.functional is F
