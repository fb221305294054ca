"""clamp with number bounds on the arrays (``frontend/ops/relu.py``'s ``clamp_eager``): the ops'
values bit for bit (signed zeros and nan included) and their gradient, PyTorch's both -- its
gradient is 0 at nan and a nan bound makes every value nan --, and the ops in traces and graphs."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

import kiln

elementwise = sys.modules["kiln.frontend.ops.elementwise"]

EDGES = np.array([-2, -1, -0.0, 0.0, 0.5, 1, 2, np.nan, np.inf, -np.inf])
BOUNDS = [(-1, 1), (None, 0.5), (0, None), (1, -1), (-0.0, 0.0), (0.0, -0.0), (None, -0.0), (0.25, 0.25),
          (math.inf, None), (None, -math.inf), (math.nan, 1.0), (None, math.nan)]  # fmt: skip


def _clamped(values: np.ndarray, low, high):
    x = kiln.from_numpy(values.copy()).requires_grad_()
    y = kiln.clamp(x, low, high)
    y.backward(kiln.ones_like(y))
    return y.grad_fn.name(), y.detach().numpy(), x.grad.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("low, high", BOUNDS)
def test_on_the_arrays_equals_the_ops(monkeypatch, dtype, low, high):
    values = EDGES.astype(dtype)
    name, y, gx = _clamped(values, low, high)
    monkeypatch.setattr(elementwise, "clamp_eager", lambda *args: None)
    ops_name, ops_y, ops_gx = _clamped(values, low, high)
    assert name == "ClampBackward1" and ops_name != name
    width = np.uint32 if dtype == np.float32 else np.uint64
    same_nan = np.isnan(y) & np.isnan(ops_y)
    np.testing.assert_array_equal(np.where(same_nan, 0, y.view(width)), np.where(same_nan, 0, ops_y.view(width)))
    np.testing.assert_array_equal(gx, ops_gx)


@pytest.mark.parametrize("low, high", BOUNDS)
def test_matches_pytorch(torch, low, high):
    name, y, gx = _clamped(EDGES, low, high)
    t = torch.tensor(EDGES, requires_grad=True)
    ref = torch.clamp(t, low, high)
    ref.backward(torch.ones_like(ref))
    np.testing.assert_array_equal(y, ref.detach().numpy())  # (nan equal to nan)
    np.testing.assert_array_equal(np.signbit(y), np.signbit(ref.detach().numpy()))
    np.testing.assert_array_equal(gx, t.grad.numpy())


def test_gradient_by_finite_differences():
    x = kiln.tensor(np.linspace(-2, 2, 9) + 0.05, dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradcheck(lambda t: kiln.clamp(t, -1.0, 1.5), (x,), eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("low, high", [(-1.0, 1.0), (None, 0.5), (math.nan, None)])
def test_compiled_agrees_with_eager(low, high):
    def step(x):
        return (kiln.clamp(x, low, high) * x).sum()

    compiled = kiln.compile(step, wait=True)
    for k in range(3):
        values = np.concatenate([EDGES[:7], np.random.default_rng(k).standard_normal(5)])
        xs = [kiln.tensor(values, requires_grad=True) for _ in range(2)]
        eager, traced = step(xs[0]), compiled(xs[1])
        eager.backward()
        traced.backward()
        np.testing.assert_allclose(traced.item(), eager.item(), rtol=1e-12, atol=1e-12, equal_nan=True)
        np.testing.assert_allclose(xs[1].grad.numpy(), xs[0].grad.numpy(), rtol=1e-12, atol=1e-12, equal_nan=True)


def test_the_ops_run_for_tensor_bounds_integers_and_second_derivatives():
    x = kiln.tensor([-2.0, 0.5, 3.0], requires_grad=True)
    assert kiln.clamp(x, kiln.tensor(-1.0), 1.0).grad_fn.name() != "ClampBackward1"
    assert kiln.clamp(kiln.tensor([-3, 4, 9]), 0, 5).tolist() == [0, 4, 5]
    (g,) = kiln.autograd.grad(kiln.clamp(x, -1.0, 1.0).sum(), x, create_graph=True)
    assert g.tolist() == [0.0, 1.0, 0.0]
