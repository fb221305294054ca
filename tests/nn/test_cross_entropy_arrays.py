"""Cross-entropy against class indices on the arrays (``nn/_cross_entropy_arrays.py``): the ops'
loss and gradient within rounding for each reduction, ignore_index, float64 and strided logits;
PyTorch's; the ops' errors (a target out of range), their checks of the target, and the ops under
create_graph and profiles."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.nn import _loss

F = kiln.nn.functional


def _run(logits, target, **kwargs):
    x = kiln.from_numpy(logits.copy(order="K")).requires_grad_()
    loss = F.cross_entropy(x, kiln.from_numpy(target), **kwargs)
    g = np.linspace(0.5, 1.5, loss.numel()).astype(logits.dtype).reshape(loss.shape)
    loss.backward(kiln.from_numpy(g))
    return loss.grad_fn.name(), loss.detach().numpy(), x.grad.numpy()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore", [False, True])
@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 1e-6), (np.float64, 1e-14)])
@pytest.mark.parametrize("strided", [False, True])
def test_on_the_arrays_equals_the_ops(monkeypatch, reduction, ignore, dtype, tolerance, strided):
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((33, 7)) * 4).astype(dtype)
    logits[0, :] = [-1e4, 50.0, 50.0, 0.0, 1.0, -50.0, 3.0]  # a large spread: the peak matters
    if strided:
        logits = np.asfortranarray(logits)
    target = rng.integers(0, 7, 33)
    kwargs = {"reduction": reduction}
    if ignore:
        target[::4] = 3
        kwargs["ignore_index"] = 3
    name, loss, gx = _run(logits, target, **kwargs)
    monkeypatch.setattr(_loss, "cross_entropy_on_arrays", lambda *args: None)
    ops_name, ops_loss, ops_gx = _run(logits, target, **kwargs)
    assert name == "NllLossBackward0" and ops_name != name
    assert loss.dtype == ops_loss.dtype and loss.shape == ops_loss.shape
    np.testing.assert_allclose(loss, ops_loss, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(gx, ops_gx, rtol=tolerance, atol=tolerance)


def test_matches_pytorch(torch):
    rng = np.random.default_rng(1)
    logits, target = rng.standard_normal((64, 10)).astype(np.float32), rng.integers(0, 10, 64)
    x, t = kiln.tensor(logits, requires_grad=True), torch.tensor(logits, requires_grad=True)
    loss = F.cross_entropy(x, kiln.tensor(target), ignore_index=2)
    ref = torch.nn.functional.cross_entropy(t, torch.tensor(target), ignore_index=2)
    loss.backward()
    ref.backward()
    np.testing.assert_allclose(loss.item(), ref.item(), rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_the_ops_errors_and_checks_remain():
    x = kiln.randn(4, 3, requires_grad=True)
    with pytest.raises(IndexError, match="Target 3 is out of bounds"):
        F.cross_entropy(x, kiln.tensor([0, 1, 3, 2]))
    target = kiln.tensor([0, 1, 2, 2])
    loss = F.cross_entropy(x, target)
    assert loss.grad_fn.name() == "NllLossBackward0"
    target.add_(0)  # an in-place change of the target the loss keeps, as PyTorch's nll_loss
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_second_order_and_profiles_run_the_ops():
    x = kiln.randn(5, 4, dtype=kiln.float64, requires_grad=True)
    target = kiln.tensor([0, 3, 1, 1, 2])
    assert kiln.autograd.gradgradcheck(lambda x: F.cross_entropy(x, target), (x,))
    with kiln.profiler.profile() as prof:
        F.cross_entropy(x, target).backward()
    assert "gather" in [e.name for e in prof.events()]
