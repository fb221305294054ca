"""Losses against torch.nn.functional: values and gradients, every option, hand values, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from tests.conftest import assert_close
from tests.nn.helpers import check_parity, leaves

rng = np.random.default_rng(3)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_class_indices_match_torch(torch, reduction, label_smoothing, weighted):
    logits = rng.normal(size=(6, 5))
    target = np.array([0, 4, 2, -100, 1, 4])  # one ignored sample
    args = [logits, target] + ([rng.uniform(0.5, 2.0, size=5)] if weighted else [])
    kw = {"reduction": reduction, "label_smoothing": label_smoothing}
    check_parity(torch, lambda *a: F.cross_entropy(*a, **kw), lambda *a: torch.nn.functional.cross_entropy(*a, **kw),
                 args, grad=(0,))  # fmt: skip


def test_cross_entropy_spatial_layout_and_custom_ignore_index(torch):
    logits = rng.normal(size=(2, 4, 3, 2))  # (N, C, d1, d2)
    target = rng.integers(0, 4, size=(2, 3, 2))
    target[0, 1, 1] = 7
    kw = {"ignore_index": 7, "label_smoothing": 0.1}
    check_parity(torch, lambda *a: F.cross_entropy(*a, **kw), lambda *a: torch.nn.functional.cross_entropy(*a, **kw),
                 [logits, target, rng.uniform(0.5, 2, size=4)], grad=(0,))  # fmt: skip


def test_cross_entropy_unbatched_and_probability_targets(torch):
    check_parity(
        torch, F.cross_entropy, torch.nn.functional.cross_entropy, [rng.normal(size=5), np.array(3)], grad=(0,)
    )
    probs = rng.dirichlet(np.ones(4), size=(3,))
    for kw in [{}, {"label_smoothing": 0.3, "reduction": "sum"}, {"reduction": "none"}]:
        check_parity(torch, lambda *a, kw=kw: F.cross_entropy(*a, **kw),
                     lambda *a, kw=kw: torch.nn.functional.cross_entropy(*a, **kw),
                     [rng.normal(size=(3, 4)), probs, rng.uniform(0.5, 2, size=4)], grad=(0, 1))  # fmt: skip


def test_cross_entropy_hand_computed_and_float32():
    logits = kiln.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    target = kiln.tensor([1, 0])
    # -log(1/2) and -log(3/4), averaged
    assert F.cross_entropy(logits, target).item() == pytest.approx((math.log(2) + math.log(4 / 3)) / 2, rel=1e-6)
    assert F.cross_entropy(logits, target).dtype is kiln.float32
    assert math.isnan(F.cross_entropy(logits, kiln.tensor([-100, -100])).item())  # 0 / 0, as in PyTorch


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_matches_torch(torch, reduction):
    logp = np.log(rng.dirichlet(np.ones(4), size=(5,)))
    target = np.array([3, 0, -100, 2, 2])
    check_parity(torch, lambda *a: F.nll_loss(*a, reduction=reduction),
                 lambda *a: torch.nn.functional.nll_loss(*a, reduction=reduction),
                 [logp, target, rng.uniform(0.5, 2, size=4)], grad=(0,))  # fmt: skip


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_and_binary_losses_match_torch(torch, reduction):
    x, y = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    tf = torch.nn.functional
    for kfn, tfn in [(F.mse_loss, tf.mse_loss), (F.l1_loss, tf.l1_loss)]:
        check_parity(torch, lambda a, b, kfn=kfn: kfn(a, b, reduction=reduction),
                     lambda a, b, tfn=tfn: tfn(a, b, reduction=reduction),
                     [x, y], grad=(0, 1))  # fmt: skip
    p, t, w = rng.uniform(0.05, 0.95, size=(3, 4)), rng.uniform(size=(3, 4)), rng.uniform(size=(4,))
    check_parity(torch, lambda *a: F.binary_cross_entropy(*a, reduction=reduction),
                 lambda *a: tf.binary_cross_entropy(*a, reduction=reduction), [p, t, w], grad=(0, 1))  # fmt: skip
    logits, pos = rng.normal(size=(3, 4)) * 30, rng.uniform(0.5, 3, size=(4,))  # large logits: must stay finite
    check_parity(torch, lambda a, b, c, d: F.binary_cross_entropy_with_logits(a, b, c, reduction=reduction, pos_weight=d),
                 lambda a, b, c, d: tf.binary_cross_entropy_with_logits(a, b, c, reduction=reduction, pos_weight=d),
                 [logits, t, w, pos], grad=(0, 1))  # fmt: skip


def test_binary_cross_entropy_clamps_the_log_like_torch(torch):
    p, t = np.array([0.0, 1.0, 0.5]), np.array([1.0, 0.0, 1.0])
    out = check_parity(torch, lambda a, b: F.binary_cross_entropy(a, b, reduction="none"),
                       lambda a, b: torch.nn.functional.binary_cross_entropy(a, b, reduction="none"), [p, t])  # fmt: skip
    assert out.tolist()[:2] == [100.0, 100.0]


def test_losses_gradcheck():
    x, probs = leaves(rng.normal(size=(3, 4)), rng.dirichlet(np.ones(4), size=(3,)))
    target = kiln.tensor([1, -100, 3])
    (w,) = leaves(rng.uniform(0.5, 2, size=4))
    assert kiln.autograd.gradcheck(lambda a, b: F.cross_entropy(a, target, b, label_smoothing=0.1), (x, w))
    assert kiln.autograd.gradcheck(lambda a, b: F.cross_entropy(a, b, label_smoothing=0.2), (x, probs))
    assert kiln.autograd.gradgradcheck(lambda a: F.cross_entropy(a, target), (x,))
    p, t = leaves(rng.uniform(0.1, 0.9, size=(2, 3)), rng.uniform(size=(2, 3)))
    assert kiln.autograd.gradcheck(F.binary_cross_entropy, (p, t))
    assert kiln.autograd.gradcheck(lambda a, b: F.binary_cross_entropy_with_logits(a, b, pos_weight=kiln.tensor(
        [1.0, 2.0, 3.0], dtype=kiln.float64)), (p, t))  # fmt: skip
    assert kiln.autograd.gradcheck(lambda a, b: F.mse_loss(a, b) + F.l1_loss(a, b, reduction="sum"), (p, t))


def test_loss_errors():
    x = kiln.zeros(3, 4)
    with pytest.raises(IndexError, match=r"Target 4 is out of bounds"):
        F.cross_entropy(x, kiln.tensor([0, 4, 1]))
    with pytest.raises(IndexError, match=r"Target -1 is out of bounds"):
        F.nll_loss(x, kiln.tensor([0, -1, 1]))
    with pytest.raises(ValueError, match=r"expected target of shape \[3\] .* got \[2\]"):
        F.cross_entropy(x, kiln.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="weight tensor should be defined either for all 4 classes"):
        F.cross_entropy(x, kiln.tensor([0, 1, 2]), weight=kiln.ones(3))
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        F.mse_loss(x, x, reduction="average")
    with pytest.raises(ValueError, match="label_smoothing must be between 0.0 and 1.0"):
        F.cross_entropy(x, kiln.tensor([0, 1, 2]), label_smoothing=1.5)
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(kiln.tensor([1.5]), kiln.tensor([1.0]))
    with pytest.raises(ValueError, match="different to the input size"):
        F.binary_cross_entropy_with_logits(kiln.zeros(3), kiln.zeros(2))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_finite_gradient_at_zero_and_one(torch, reduction):
    # A saturated float32 sigmoid gives exactly 0 or 1: PyTorch's gradient stays finite there.
    p = np.array([0.0, 1.0, 0.0, 1.0, 0.3, 1.0], dtype=np.float32)
    t = np.array([0.0, 0.0, 1.0, 1.0, 0.5, 0.25], dtype=np.float32)
    out = check_parity(torch, lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction),
                       lambda a, b: torch.nn.functional.binary_cross_entropy(a, b, reduction=reduction), [p, t],
                       grad=(0, 1),
                       rtol=1e-6, atol=1e-6, dtype=np.float32)  # fmt: skip
    assert np.isfinite(out.detach().numpy()).all()


def test_bce_loss_module_gradient_through_saturated_sigmoid(torch):
    x = np.array([-120.0, 120.0, 0.5], dtype=np.float32)
    t = np.array([1.0, 0.0, 1.0], dtype=np.float32)
    kx, tx = kiln.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    kiln.nn.BCELoss()(kiln.sigmoid(kx), kiln.tensor(t)).backward()
    torch.nn.BCELoss()(torch.sigmoid(tx), torch.tensor(t)).backward()
    assert np.isfinite(kx.grad.numpy()).all()
    assert_close(kx.grad, tx.grad, rtol=1e-6, atol=1e-6)


def test_binary_cross_entropy_compiled_gradient_equals_eager():
    def grad_of(x, t):
        x = x.detach().requires_grad_()
        F.binary_cross_entropy(kiln.sigmoid(x), t).backward()
        return x.grad

    f = kiln.compile(grad_of)
    for i in range(4):
        x = kiln.tensor(np.array([-120.0, 120.0, 0.5 * i, -1.0], dtype=np.float32))
        t = kiln.tensor(np.array([1.0, 0.0, 1.0, 0.5], dtype=np.float32))
        assert_close(f(x, t), grad_of(x, t), rtol=1e-6, atol=1e-6)


def test_cross_entropy_compiled_writes_no_log_softmax_and_its_backward_sums_nothing(torch):
    """Against class indices only the targets' log-probabilities count: compiled, the forward
    writes one array of the logits' size (the exponentials the backward reads; the log_softmax
    was a second) and the backward is softmax minus the one-hot, with no sum over the classes."""
    x = kiln.tensor(rng.normal(size=(16, 10)).astype(np.float32) * 300.0, requires_grad=True)  # exp would overflow
    target = kiln.tensor(rng.integers(0, 10, size=16))

    def fn(x, t):
        return F.cross_entropy(x, t)

    (spec,) = kiln.explain(fn, x, target).specializations
    full = [v for n in spec.graph.nodes for v in n.outputs if tuple(v.type.shape) == (16, 10)]
    assert len(full) == 1, full
    assert not [n for n in spec.backward.graph.nodes for b in n.bodies for m in b.nodes if m.op == "reduce_sum"]
    compiled = kiln.compile(fn)
    (eager_grad,) = kiln.autograd.grad(fn(x, target), (x,))
    (compiled_grad,) = kiln.autograd.grad(compiled(x, target), (x,))
    t = torch.tensor(x.detach().numpy(), requires_grad=True)
    loss = torch.nn.functional.cross_entropy(t, torch.tensor(target.numpy()))
    loss.backward()
    assert compiled(x, target).item() == pytest.approx(loss.item(), rel=1e-6)
    for grad in (eager_grad, compiled_grad):
        np.testing.assert_allclose(grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-7)
