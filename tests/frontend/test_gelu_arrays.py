"""gelu(approximate="tanh") on the arrays (``frontend/ops/gelu_arrays.py``): the ops' values bit for
bit, their gradient within rounding, PyTorch's both; the ops under create_graph and profiles."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend.ops import elementwise

F = kiln.nn.functional


def _values(dtype, shape=(37, 53)):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    x.reshape(-1)[:6] = [np.nan, -0.0, np.inf, -np.inf, 20.0, -20.0]
    return x


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 2e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("strided", [False, True])
def test_on_the_arrays_equals_the_ops(monkeypatch, dtype, rtol, strided):
    array = _values(dtype)
    if strided:
        array = array.T
    g = np.random.default_rng(1).standard_normal(array.shape).astype(dtype)

    def run():
        x = kiln.from_numpy(array.copy(order="K")).requires_grad_()
        y = F.gelu(x, approximate="tanh")
        y.backward(kiln.from_numpy(g))
        return y.grad_fn.name(), y.detach().numpy(), x.grad.numpy()

    name, y, gx = run()
    monkeypatch.setattr(elementwise, "gelu_tanh_eager", lambda *args: None)
    ops_name, ops_y, ops_gx = run()
    assert name == "GeluBackward" and ops_name != name
    width = np.uint32 if dtype == np.float32 else np.uint64
    np.testing.assert_array_equal(y.view(width), ops_y.view(width))  # the forward: bit for bit
    np.testing.assert_allclose(gx, ops_gx, rtol=rtol, atol=rtol)  # (nan where the ops give nan)


def test_matches_pytorch(torch):
    array = _values(np.float32)[:, 6:]  # (PyTorch's tanh-GELU gradient at inf is nan, the formula's 0)
    x, t = kiln.from_numpy(array.copy()).requires_grad_(), torch.tensor(array, requires_grad=True)
    y, ref = F.gelu(x, approximate="tanh"), torch.nn.functional.gelu(t, approximate="tanh")
    g = np.random.default_rng(2).standard_normal(array.shape).astype(np.float32)
    y.backward(kiln.from_numpy(g))
    ref.backward(torch.tensor(g))
    np.testing.assert_allclose(y.detach().numpy(), ref.detach().numpy(), rtol=1e-6, atol=1e-6)
    # (where x < -4 the float32 derivative is a difference of near-equal terms, as the ops' is too)
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_second_derivative_runs_the_ops():
    x = kiln.tensor(np.linspace(-3, 3, 13), requires_grad=True)
    (gx,) = kiln.autograd.grad(F.gelu(x, approximate="tanh").sum(), x, create_graph=True)
    (gxx,) = kiln.autograd.grad(gx.sum(), x)
    h = 1e-5  # central differences of the first derivative, in float64
    xs = x.detach().numpy()

    def first(v):
        t = kiln.tensor(v, requires_grad=True)
        (d,) = kiln.autograd.grad(F.gelu(t, approximate="tanh").sum(), t)
        return d.numpy()

    np.testing.assert_allclose(gxx.numpy(), (first(xs + h) - first(xs - h)) / (2 * h), rtol=1e-6, atol=1e-8)


def test_an_in_place_change_of_the_input_is_an_error_and_profiles_see_the_ops():
    x = kiln.randn(4, 4, requires_grad=True)
    z = x * 1.0
    y = F.gelu(z, approximate="tanh")
    z.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    with kiln.profiler.profile() as prof:
        F.gelu(x, approximate="tanh").sum().backward()
    assert "tanh" in [e.name for e in prof.events()]
