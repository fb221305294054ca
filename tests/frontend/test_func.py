"""kiln.func against torch.func: grad, grad_and_value, vjp, jacrev, jacfwd, hessian, vmap,
functional_call; and their compositions."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import func as kf
from tests.conftest import assert_close

# torch.func calls torch.jit.script internally, which warns in torch 2.13
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

rng = np.random.default_rng(0)
TOL = {"rtol": 1e-10, "atol": 1e-12}


def both(torch, *arrays):
    return [kiln.from_numpy(a.copy()) for a in arrays], [torch.from_numpy(a.copy()) for a in arrays]


def assert_tree(actual, expected):
    if isinstance(expected, tuple | list):
        assert isinstance(actual, tuple | list) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_tree(a, e)
    else:
        assert isinstance(actual, kiln.Tensor), type(actual)
        assert_close(actual, expected, **TOL)


def f_pair(lib):
    def f(x, y):
        return (lib.sin(x) * y).sum() + (x * x).sum() * y[0]

    return f


def test_grad_and_grad_and_value_match_torch(torch):
    (kx, ky), (tx, ty) = both(torch, rng.normal(size=3), rng.normal(size=3))
    for argnums in (0, 1, (0, 1), (1, 0)):
        assert_tree(kf.grad(f_pair(kiln), argnums)(kx, ky), torch.func.grad(f_pair(torch), argnums)(tx, ty))
        g, v = kf.grad_and_value(f_pair(kiln), argnums)(kx, ky)
        tg, tv = torch.func.grad_and_value(f_pair(torch), argnums)(tx, ty)
        assert_tree((g, v), (tg, tv))
    assert not kf.grad(f_pair(kiln))(kx, ky).requires_grad

    def with_aux(lib):
        return lambda x: ((x**2).sum(), x.mean())

    g, aux = kf.grad(with_aux(kiln), has_aux=True)(kx)
    tg, taux = torch.func.grad(with_aux(torch), has_aux=True)(tx)
    assert_tree((g, aux), (tg, taux))


def test_nested_grad_and_closures_stay_differentiable(torch):
    (kx,), (tx,) = both(torch, np.array(0.7))
    third = kf.grad(kf.grad(kf.grad(lambda x: kiln.sin(x) * x)))
    assert_close(third(kx), torch.func.grad(torch.func.grad(torch.func.grad(lambda x: torch.sin(x) * x)))(tx), **TOL)
    # a gradient penalty: the gradient with respect to the input, differentiated for the weight
    (kw, kx), (tw, tx) = both(torch, rng.normal(size=3), rng.normal(size=3))
    kw.requires_grad_()
    tw.requires_grad_()
    (kf.grad(lambda x: (kiln.tanh(kw * x)).sum())(kx) ** 2).sum().backward()
    (torch.func.grad(lambda x: (torch.tanh(tw * x)).sum())(tx) ** 2).sum().backward()
    assert_close(kw.grad, tw.grad, **TOL)


def test_vjp_matches_torch(torch):
    (kx, ky), (tx, ty) = both(torch, rng.normal(size=(2, 3)), rng.normal(size=3))
    out, fn = kf.vjp(lambda x, y: (x * y, (x @ y).exp()), kx, ky)
    tout, tfn = torch.func.vjp(lambda x, y: (x * y, (x @ y).exp()), tx, ty)
    assert_tree(out, tout)
    (c1, c2), (t1, t2) = both(torch, rng.normal(size=(2, 3)), rng.normal(size=2))
    assert_tree(fn((c1, c2)), tfn((t1, t2)))
    with pytest.raises(RuntimeError, match="cotangents"):
        fn((c1,))


def test_jvp_matches_torch(torch):
    (kx, ky, kv, kw), (tx, ty, tv, tw) = both(torch, *(rng.normal(size=3) for _ in range(4)))
    got = kf.jvp(lambda x, y: (x.sin() * y, (x * y).sum()), (kx, ky), (kv, kw))
    expected = torch.func.jvp(lambda x, y: (x.sin() * y, (x * y).sum()), (tx, ty), (tv, tw))
    assert_tree(got, expected)
    assert not got[1][0].requires_grad
    with pytest.raises(RuntimeError, match="tuples"):
        kf.jvp(lambda x: x, kx, kv)


@pytest.mark.parametrize("name", ["jacrev", "jacfwd"])
def test_jacobians_match_torch(torch, name):
    (kx, ky), (tx, ty) = both(torch, rng.normal(size=(2, 2)), rng.normal(size=2))
    kjac, tjac = getattr(kf, name), getattr(torch.func, name)
    assert_tree(kjac(lambda x: x.exp() @ x)(kx), tjac(lambda x: x.exp() @ x)(tx))
    assert_tree(kjac(lambda x, y: (x @ y, y.sum()), argnums=(0, 1))(kx, ky),
                tjac(lambda x, y: (x @ y, y.sum()), argnums=(0, 1))(tx, ty))  # fmt: skip
    assert_tree(kjac(lambda x, y: x * y, argnums=1)(kx, ky), tjac(lambda x, y: x * y, argnums=1)(tx, ty))
    assert not kjac(lambda x: x.exp())(kx).requires_grad


def test_hessian_matches_torch(torch):
    (kx,), (tx,) = both(torch, rng.normal(size=3))
    assert_tree(kf.hessian(lambda x: (x.sin() * x.prod()).sum())(kx),
                torch.func.hessian(lambda x: (x.sin() * x.prod()).sum())(tx))  # fmt: skip


def test_vmap_matches_torch_over_in_dims_and_out_dims(torch):
    (ka, kb), (ta, tb) = both(torch, rng.normal(size=(4, 3)), rng.normal(size=(3, 4)))
    assert_tree(kf.vmap(lambda a, b: a * b)(ka, kb.mT), torch.func.vmap(lambda a, b: a * b)(ta, tb.mT))
    assert_tree(
        kf.vmap(lambda a, b: a @ b, in_dims=(0, 1))(ka, kb), torch.func.vmap(lambda a, b: a @ b, in_dims=(0, 1))(ta, tb)
    )
    assert_tree(kf.vmap(lambda a, b: a + b, in_dims=(0, None))(ka, kb[:, 0]),
                torch.func.vmap(lambda a, b: a + b, in_dims=(0, None))(ta, tb[:, 0]))  # fmt: skip
    assert_tree(kf.vmap(lambda a: (a.sum(), a * 2), out_dims=(0, 1))(ka),
                torch.func.vmap(lambda a: (a.sum(), a * 2), out_dims=(0, 1))(ta))  # fmt: skip
    assert_tree(kf.vmap(kf.vmap(lambda x: x.exp()))(ka), torch.func.vmap(torch.func.vmap(lambda x: x.exp()))(ta))
    assert_tree(kf.vmap(lambda d: d["x"] * d["y"], in_dims=({"x": 0, "y": None},))({"x": ka, "y": kb[:, 0]}),
                torch.func.vmap(lambda d: d["x"] * d["y"], in_dims=({"x": 0, "y": None},))({"x": ta, "y": tb[:, 0]}))  # fmt: skip


def test_vmap_errors():
    with pytest.raises(ValueError, match="same size"):
        kf.vmap(lambda a, b: a + b)(kiln.ones(3, 2), kiln.ones(4, 2))
    with pytest.raises(ValueError, match="at least one input"):
        kf.vmap(lambda a: a, in_dims=None)(kiln.ones(3))
    with pytest.raises(ValueError, match="out of range"):
        kf.vmap(lambda a: a, in_dims=2)(kiln.ones(3))
    with pytest.raises(ValueError, match="in_dims"):
        kf.vmap(lambda a, b: a, in_dims=(0,))(kiln.ones(3), kiln.ones(3))


def test_per_example_gradients_compose_vmap_with_grad(torch):
    (kw, kx, ky), (tw, tx, ty) = both(torch, rng.normal(size=3), rng.normal(size=(5, 3)), rng.normal(size=5))

    def loss(lib):
        return lambda w, x, y: (lib.tanh(x @ w) - y) ** 2

    got = kf.vmap(kf.grad(loss(kiln)), in_dims=(None, 0, 0))(kw, kx, ky)
    expected = torch.func.vmap(torch.func.grad(loss(torch)), in_dims=(None, 0, 0))(tw, tx, ty)
    assert_tree(got, expected)
    # and the other way round: the gradient of a vmapped function
    total = kf.grad(lambda w: kf.vmap(lambda x, y: loss(kiln)(w, x, y))(kx, ky).sum())(kw)
    assert_close(total, expected.sum(0), **TOL)


def test_functional_call_matches_torch_and_restores_the_module(torch):
    kiln.manual_seed(0)
    layer = kiln.nn.Sequential(kiln.nn.Linear(3, 4), kiln.nn.Tanh(), kiln.nn.Linear(4, 2))
    tlayer = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()
    arrays = {name: rng.normal(size=tuple(p.shape)) for name, p in layer.named_parameters()}
    params = {k: kiln.from_numpy(v).float() for k, v in arrays.items()}
    tparams = {k: torch.from_numpy(v).float() for k, v in arrays.items()}
    tlayer = tlayer.float()
    x = rng.normal(size=(5, 3)).astype(np.float32)
    before = [p.detach().clone() for p in layer.parameters()]
    got = kf.functional_call(layer, params, (kiln.from_numpy(x),))
    expected = torch.func.functional_call(tlayer, tparams, (torch.from_numpy(x),))
    assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for p, b in zip(layer.parameters(), before, strict=True):
        assert_close(p, b, rtol=0, atol=0)
    assert isinstance(layer[0].weight, kiln.nn.Parameter)
    # gradients with respect to the given parameters, as torch.func's per-sample-gradient recipe
    g = kf.grad(lambda p, xb: kf.functional_call(layer, p, (xb,)).sum())(params, kiln.from_numpy(x))
    tg = torch.func.grad(lambda p, xb: torch.func.functional_call(tlayer, p, (xb,)).sum())(tparams, torch.from_numpy(x))
    for k in params:
        assert_close(g[k], tg[k], rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        kf.functional_call(layer, {"nope": kiln.ones(1)}, (kiln.from_numpy(x),))
    with pytest.raises(RuntimeError, match="Missing key"):
        kf.functional_call(layer, {"0.weight": params["0.weight"]}, (kiln.from_numpy(x),), strict=True)
