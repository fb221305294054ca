"""A loss's target changed in place after the loss was computed: the backward raises where
PyTorch's does (its nll_loss, mse_loss, smooth_l1_loss, huber_loss, binary_cross_entropy, kl_div...
keep the target), and gives the gradient where PyTorch's does (l1_loss keeps ``input - target``
only). Eager against torch, then compiled against eager: the compiled backward checks what eager's
checks (``frontend/jit/eager_checks``)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F

from ..frontend.jit.helpers import compiled_calls

RNG = np.random.default_rng(0)
LOGITS = RNG.normal(size=(4, 3))
INDICES = np.array([0, 2, 1, 2])
PROBS = RNG.dirichlet(np.ones(3), 4)
INSIDE = RNG.uniform(0.1, 0.9, (4, 3))

# name: (loss(F, input, target), input, target, whether the backward reads the target itself)
LOSSES = {
    "nll_loss": (lambda F, x, t: F.nll_loss(F.log_softmax(x, 1), t), LOGITS, INDICES, True),
    "nll_loss_none": (lambda F, x, t: F.nll_loss(x, t, reduction="none").sum(), LOGITS, INDICES, True),
    "cross_entropy": (lambda F, x, t: F.cross_entropy(x, t), LOGITS, INDICES, True),
    "cross_entropy_ignore": (lambda F, x, t: F.cross_entropy(x, t, ignore_index=2), LOGITS, INDICES, True),
    "cross_entropy_smoothing": (lambda F, x, t: F.cross_entropy(x, t, label_smoothing=0.1), LOGITS, INDICES, True),
    "cross_entropy_probabilities": (lambda F, x, t: F.cross_entropy(x, t), LOGITS, PROBS, True),
    "mse_loss": (lambda F, x, t: F.mse_loss(x, t), LOGITS, PROBS, True),
    "smooth_l1_loss": (lambda F, x, t: F.smooth_l1_loss(x, t, beta=0.5), LOGITS, PROBS, True),
    "huber_loss": (lambda F, x, t: F.huber_loss(x, t, reduction="sum"), LOGITS, PROBS, True),
    "binary_cross_entropy": (lambda F, x, t: F.binary_cross_entropy(x, t), INSIDE, PROBS, True),
    "l1_loss": (lambda F, x, t: F.l1_loss(x, t), LOGITS, PROBS, False),
    "smooth_l1_loss_beta0": (lambda F, x, t: F.smooth_l1_loss(x, t, beta=0.0), LOGITS, PROBS, False),
}
CHANGES = {"mul_": lambda t: t.mul_(0), "setitem": lambda t: t.__setitem__(0, 1)}


def _backward_after_change(lib, F, name: str, change: str):
    """None where the backward ran, else the RuntimeError's message."""
    loss_of, x, t, _ = LOSSES[name]
    input, target = lib.tensor(x).requires_grad_(True), lib.tensor(t)
    loss = loss_of(F, input, target)
    CHANGES[change](target)
    try:
        loss.backward()
    except RuntimeError as e:
        return str(e)
    return None


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_a_target_changed_in_place_raises_where_the_loss_reads_it(name, change):
    message = _backward_after_change(kiln, F, name, change)
    if LOSSES[name][3]:
        assert message is not None and "modified by an inplace operation" in message
    else:
        assert message is None


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_a_target_changed_in_place_raises_as_torch(torch, name, change):
    import torch.nn.functional as TF

    expected = _backward_after_change(torch, TF, name, change)
    got = _backward_after_change(kiln, F, name, change)
    assert (got is None) == (expected is None), (got, expected)


def test_the_error_names_the_loss():
    message = _backward_after_change(kiln, F, "cross_entropy", "mul_")
    assert "NllLossBackward" in message


@pytest.mark.parametrize("name", ["cross_entropy", "nll_loss", "mse_loss", "huber_loss", "l1_loss"])
def test_compiled_loss_checks_its_target_as_eager(name):
    loss_of, x, t, reads_target = LOSSES[name]
    f = kiln.compile(lambda input, target: loss_of(F, input, target))
    for call in range(3):  # an unchanged target: eager's gradients
        scale = 1.0 + 0.5 * call
        got, expected = kiln.tensor(x * scale).requires_grad_(True), kiln.tensor(x * scale).requires_grad_(True)
        f(got, kiln.tensor(t)).backward()
        loss_of(F, expected, kiln.tensor(t)).backward()
        np.testing.assert_allclose(got.grad.numpy(), expected.grad.numpy(), rtol=1e-6, atol=1e-9)
    assert sum(compiled_calls(f)) >= 2
    input, target = kiln.tensor(x).requires_grad_(True), kiln.tensor(t)
    loss = f(input, target)
    target.mul_(0)
    if reads_target:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
    else:
        loss.backward()
        expected = kiln.tensor(x).requires_grad_(True)
        loss_of(F, expected, kiln.tensor(t)).backward()  # the gradient of the target as it was
        np.testing.assert_allclose(input.grad.numpy(), expected.grad.numpy(), rtol=1e-6, atol=1e-9)
