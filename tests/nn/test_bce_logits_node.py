"""``binary_cross_entropy_with_logits`` on plain eager CPU tensors is one autograd node: PyTorch's
values and gradients (at a logit of exactly 0 too, where the composite's abs() gave 1 - t), finite
differences in float64, double backward through the ops, and the composite where it must run."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend import dispatch

F = kiln.nn.functional
LOGITS = np.array([[-30.0, -2.5, 0.0], [0.0, 1e-3, 4.0], [25.0, -0.7, 0.3]])
TARGETS = np.array([[0.0, 1.0, 0.0], [1.0, 0.25, 1.0], [0.0, 0.5, 1.0]])


def _run(lib, reduction: str, dtype=np.float64, target_grad=True, **kw):
    x = lib.tensor(LOGITS.astype(dtype), requires_grad=True)
    t = lib.tensor(TARGETS.astype(dtype), requires_grad=target_grad)
    loss = lib.nn.functional.binary_cross_entropy_with_logits(x, t, reduction=reduction, **kw)
    g = np.linspace(-1, 2, 9).reshape(3, 3).astype(dtype) if reduction == "none" else np.asarray(1.5, dtype)
    loss.backward(lib.tensor(g))
    return loss, [loss.detach().numpy(), x.grad.numpy(), None if t.grad is None else t.grad.numpy()]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_values_and_gradients_match_torch(torch, reduction, dtype):
    loss, found = _run(kiln, reduction, dtype)
    assert type(loss.grad_fn).__name__ == "BinaryCrossEntropyWithLogitsBackward"
    _, expected = _run(torch, reduction, dtype)
    tolerance = 1e-6 if dtype == np.float32 else 1e-14
    for a, e in zip(found, expected, strict=True):
        np.testing.assert_allclose(a, e, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_the_composite_gives_sigmoid_minus_target_at_a_zero_logit(reduction):
    """A weight of ones takes the composite (ops), whose gradient at x = 0 was 1 - t, not 1/2 - t."""
    for kw in ({}, {"weight": kiln.ones(3, dtype=kiln.float64)}):
        x = kiln.zeros(3, dtype=kiln.float64, requires_grad=True)
        t = kiln.tensor([0.0, 0.5, 1.0], dtype=kiln.float64)
        F.binary_cross_entropy_with_logits(x, t, reduction="sum", **kw).backward()
        np.testing.assert_allclose(x.grad.numpy(), [0.5, 0.0, -0.5], rtol=0, atol=1e-15)
    _, on_ops = _run(kiln, reduction, weight=kiln.ones(3, dtype=kiln.float64))
    _, on_arrays = _run(kiln, reduction)
    for a, e in zip(on_arrays, on_ops, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-14, atol=1e-15)


def test_finite_differences_and_double_backward(torch):
    x = kiln.tensor(LOGITS[:, 1:], requires_grad=True)  # 0 among them: the loss is smooth there, the composite was not
    t = kiln.tensor(TARGETS[:, 1:], requires_grad=True)
    assert kiln.autograd.gradcheck(F.binary_cross_entropy_with_logits, (x, t))
    assert kiln.autograd.gradgradcheck(F.binary_cross_entropy_with_logits, (x, t))

    def double(lib):
        x = lib.tensor(LOGITS, requires_grad=True)
        (gx,) = lib.autograd.grad(lib.nn.functional.binary_cross_entropy_with_logits(x, lib.tensor(TARGETS)), (x,),
                                  create_graph=True)  # fmt: skip
        (gx * gx).sum().backward()
        return [gx.detach().numpy(), x.grad.numpy()]

    for a, e in zip(double(kiln), double(torch), strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-15)


def test_retain_graph_freed_graph_and_the_ops_in_profiles_and_traces():
    x = kiln.tensor(LOGITS, requires_grad=True)
    loss = F.binary_cross_entropy_with_logits(x, kiln.tensor(TARGETS))
    loss.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * first, rtol=1e-15)
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()
    with kiln.profiler.profile() as prof:
        F.binary_cross_entropy_with_logits(x, kiln.tensor(TARGETS))
    assert "log1p" in [e.name for e in prof.events()] and not dispatch.profiling_ops
    step = kiln.compile(lambda x: F.binary_cross_entropy_with_logits(x, kiln.tensor(TARGETS)))
    expected = F.binary_cross_entropy_with_logits(x.detach(), kiln.tensor(TARGETS)).item()
    for _ in range(3):
        np.testing.assert_allclose(step(x.detach()).item(), expected, rtol=1e-14)
