"""softmax on the arrays (``frontend/ops/softmax_arrays.py``): the ops' values bit for bit and their
gradient within rounding, over dims, float64, strided inputs and -inf (a causal mask); PyTorch's;
an in-place change of the output is an error (as PyTorch's); the ops under create_graph and profiles."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend.ops import reductions

F = kiln.nn.functional


@pytest.mark.parametrize("shape, dim", [((4, 3, 16, 16), -1), ((6, 9), 0), ((5, 7, 3), 1)])
@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 1e-6), (np.float64, 1e-14)])
@pytest.mark.parametrize("strided", [False, True])
def test_on_the_arrays_equals_the_ops(monkeypatch, shape, dim, dtype, tolerance, strided):
    rng = np.random.default_rng(0)
    array = (rng.standard_normal(shape) * 5).astype(dtype)
    array.reshape(-1)[1::7] = -np.inf  # (no row all -inf: that row is nan in both)
    if strided:
        array = np.asfortranarray(array)
    g = rng.standard_normal(shape).astype(dtype)

    def run():
        x = kiln.from_numpy(array.copy(order="K")).requires_grad_()
        y = F.softmax(x, dim=dim)
        y.backward(kiln.from_numpy(g))
        return type(y.grad_fn).__name__, y.detach().numpy(), x.grad.numpy()

    name, y, gx = run()
    monkeypatch.setattr(reductions, "softmax_eager", lambda *args: None)
    ops_name, ops_y, ops_gx = run()
    assert name == "SoftmaxBackward" and ops_name != name  # (the ops' result: a check node)
    width = np.uint32 if dtype == np.float32 else np.uint64
    np.testing.assert_array_equal(np.ascontiguousarray(y).view(width), np.ascontiguousarray(ops_y).view(width))
    np.testing.assert_allclose(gx, ops_gx, rtol=tolerance, atol=tolerance)


def test_matches_pytorch(torch):
    rng = np.random.default_rng(1)
    array = rng.standard_normal((8, 4, 16, 16)).astype(np.float32) + np.triu(np.full((16, 16), -np.inf), 1)
    g = rng.standard_normal(array.shape).astype(np.float32)
    x, t = kiln.tensor(array, requires_grad=True), torch.tensor(array, requires_grad=True)
    y, ref = F.softmax(x, dim=-1), torch.softmax(t, dim=-1)
    y.backward(kiln.tensor(g))
    ref.backward(torch.tensor(g))
    np.testing.assert_allclose(y.detach().numpy(), ref.detach().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_an_in_place_change_of_the_output_is_an_error():
    y = F.softmax(kiln.randn(3, 4, requires_grad=True), dim=1)
    with kiln.no_grad():
        y.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_second_order_and_profiles_run_the_ops():
    x = kiln.randn(3, 5, dtype=kiln.float64, requires_grad=True)
    assert F.softmax(x, dim=1).grad_fn.name() == "SoftmaxBackward0"
    assert kiln.autograd.gradgradcheck(lambda x: F.softmax(x, dim=1), (x,))
    with kiln.profiler.profile() as prof:
        F.softmax(x, dim=1).sum().backward()
    assert "exp" in [e.name for e in prof.events()]
