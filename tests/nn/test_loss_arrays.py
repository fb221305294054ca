"""smooth_l1_loss and huber_loss on the arrays (``kiln/nn/_loss_arrays.py``): one node before the
reduction; the ops' values bit for bit and their gradients, PyTorch's both; the ops under create_graph
and in traces; a target changed in place before the backward is an error, as in PyTorch."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import kiln

F = kiln.nn.functional
regression = sys.modules["kiln.nn._loss_regression"]
CASES = [("smooth_l1_loss", {"beta": 0.7}), ("smooth_l1_loss", {}), ("huber_loss", {"delta": 1.3})]


def _values(dtype):
    rng = np.random.default_rng(0)
    x, t = (rng.standard_normal((5, 7)) * 2).astype(dtype), rng.standard_normal((5, 7)).astype(dtype)
    x[0, :3], t[0, 1] = [np.nan, 1.0, -0.0], 1.0  # nan, a zero difference, a signed zero
    return x, t


def _run(name, kwargs, x, t, reduction):
    a, b = kiln.from_numpy(x.copy()).requires_grad_(), kiln.from_numpy(t.copy()).requires_grad_()
    loss = getattr(F, name)(a, b, reduction=reduction, **kwargs)
    loss.sum().backward()
    return loss, a.grad.numpy(), b.grad.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name, kwargs", CASES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_on_the_arrays_equals_the_ops(monkeypatch, dtype, name, kwargs, reduction):
    x, t = _values(dtype)
    loss, gx, gt = _run(name, kwargs, x, t, reduction)
    monkeypatch.setattr(regression, "pointwise_eager", lambda *args: None)
    ops_loss, ops_gx, ops_gt = _run(name, kwargs, x, t, reduction)
    np.testing.assert_array_equal(loss.detach().numpy(), ops_loss.detach().numpy())
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(gx, ops_gx, **tol)
    np.testing.assert_allclose(gt, ops_gt, **tol)


@pytest.mark.parametrize("name, kwargs", CASES)
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_matches_pytorch(torch, name, kwargs, reduction):
    x, t = _values(np.float64)
    loss, gx, gt = _run(name, kwargs, x, t, reduction)
    a, b = torch.tensor(x, requires_grad=True), torch.tensor(t, requires_grad=True)
    expected = getattr(torch.nn.functional, name)(a, b, reduction=reduction, **kwargs)
    expected.sum().backward()
    np.testing.assert_allclose(loss.detach().numpy(), expected.detach().numpy(), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(gx, a.grad.numpy(), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(gt, b.grad.numpy(), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("name, kwargs", CASES)
def test_one_node_and_finite_differences(name, kwargs):
    rng = np.random.default_rng(1)
    x = kiln.from_numpy(rng.standard_normal((3, 4)) * 2).requires_grad_()
    t = kiln.from_numpy(rng.standard_normal((3, 4))).requires_grad_()
    loss = getattr(F, name)(x, t, reduction="none", **kwargs)
    assert loss.grad_fn.name() in ("SmoothL1LossBackward0", "HuberLossBackward0")
    assert kiln.autograd.gradcheck(lambda a, b: getattr(F, name)(a, b, **kwargs), (x, t), eps=1e-6, atol=1e-8)
    assert kiln.autograd.gradgradcheck(lambda a, b: getattr(F, name)(a, b, **kwargs), (x, t), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("name, kwargs", CASES)
def test_compiled_agrees_with_eager(name, kwargs):
    def step(x, t):
        loss = getattr(F, name)(x * 1.5, t, **kwargs)
        loss.backward()
        return loss.detach()

    compiled = kiln.compile(step, wait=True)
    for k in range(3):
        rng = np.random.default_rng(k)
        x, t = rng.standard_normal((4, 3)) * 2, rng.standard_normal((4, 3))
        xs = [kiln.from_numpy(x.copy()).requires_grad_() for _ in range(2)]
        np.testing.assert_allclose(compiled(xs[0], kiln.from_numpy(t)).item(), step(xs[1], kiln.from_numpy(t)).item(),
                                   rtol=1e-12, atol=1e-12)  # fmt: skip
        np.testing.assert_allclose(xs[0].grad.numpy(), xs[1].grad.numpy(), rtol=1e-12, atol=1e-12)


def test_a_target_changed_in_place_before_the_backward_is_an_error():
    x, t = kiln.zeros(3, requires_grad=True), kiln.ones(3)
    loss = F.smooth_l1_loss(x, t)
    t.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_broadcasting_takes_the_ops_and_a_bad_reduction_raises():
    x = kiln.zeros(2, 3, requires_grad=True)
    assert F.smooth_l1_loss(x, kiln.ones(3), reduction="none").grad_fn.name() != "SmoothL1LossBackward0"
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        F.huber_loss(x, kiln.ones(2, 3), reduction="avg")
