"""Autograd: the engine, grad modes, hooks, higher order, custom Functions, version counters."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

import kiln
from kiln.autograd import Function, gradcheck, gradgradcheck
from tests.conftest import assert_close, to_torch


def f64(*values, requires_grad=True):
    return kiln.tensor(list(values), dtype=kiln.float64, requires_grad=requires_grad)


def test_backward_accumulates_into_leaves():
    x = f64(1.0, 2.0)
    (x * x).sum().backward()
    (x * 3).sum().backward()
    assert x.grad.tolist() == [2.0 + 3.0, 4.0 + 3.0]


def test_fan_out_sums_gradients(torch):
    x = f64(0.3, -1.2, 2.0)
    y = x.exp()
    z = (y * y + y.sin() * x).sum()
    z.backward()
    tx = to_torch(torch, x).requires_grad_()
    ty = tx.exp()
    (ty * ty + ty.sin() * tx).sum().backward()
    assert_close(x.grad, tx.grad, rtol=1e-12, atol=1e-12)


def test_second_backward_needs_retain_graph():
    x = f64(1.0)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert x.grad.tolist() == [4.0]
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_saved_tensors_are_freed_after_backward():
    x = f64(1.0, 2.0)
    y = x * x
    node = y.grad_fn
    y.sum().backward()
    assert node.saved_inputs is None


def test_non_scalar_backward_needs_a_gradient():
    x = f64(1.0, 2.0)
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        (x * 2).backward()
    (x * 2).backward(kiln.tensor([1.0, 10.0], dtype=kiln.float64))
    assert x.grad.tolist() == [2.0, 20.0]
    with pytest.raises(RuntimeError, match=r"shape \(3,\), expected \(2,\)"):
        (x * 2).backward(kiln.ones(3, dtype=kiln.float64))


def test_backward_without_grad_is_a_clear_error():
    with pytest.raises(RuntimeError, match="does not require grad"):
        kiln.ones(2).sum().backward()


def test_multiple_roots_and_backward_inputs():
    x, w = f64(1.0, 2.0), f64(3.0, 4.0)
    kiln.autograd.backward([(x * w).sum(), (x * x).sum()])
    assert x.grad.tolist() == [3.0 + 2.0, 4.0 + 4.0] and w.grad.tolist() == [1.0, 2.0]
    x.grad = None
    w.grad = None
    (x * w).sum().backward(inputs=[w])
    assert x.grad is None and w.grad.tolist() == [1.0, 2.0]


def test_autograd_grad_returns_without_accumulating():
    x, y = f64(1.0, 2.0), f64(5.0)
    out = (x * x).sum()
    (gx,) = kiln.autograd.grad(out, x)
    assert gx.tolist() == [2.0, 4.0] and x.grad is None
    with pytest.raises(RuntimeError, match="not used in the graph"):
        kiln.autograd.grad((x * 2).sum(), [x, y])
    gx, gy = kiln.autograd.grad((x * 2).sum(), [x, y], allow_unused=True)
    assert gy is None
    gx, gy = kiln.autograd.grad((x * 2).sum(), [x, y], allow_unused=True, materialize_grads=True)
    assert gy.tolist() == [0.0]


def test_grad_of_an_intermediate():
    x = f64(1.0, 2.0)
    h = x * 3
    out = (h * h).sum()
    (gh,) = kiln.autograd.grad(out, h)
    assert gh.tolist() == [6.0, 12.0]


def test_higher_order_gradients(torch):
    x = f64(0.5, -1.5)
    y = (x * x * x).sum()
    (g,) = kiln.autograd.grad(y, x, create_graph=True)
    assert g.requires_grad
    (h,) = kiln.autograd.grad(g.sum(), x, create_graph=True)
    (t,) = kiln.autograd.grad(h.sum(), x)
    assert g.tolist() == [0.75, 6.75] and h.tolist() == [3.0, -9.0] and t.tolist() == [6.0, 6.0]


def test_backward_with_create_graph_gives_differentiable_grads():
    x = f64(2.0)
    (x**3).sum().backward(create_graph=True)
    assert x.grad.requires_grad
    (g2,) = kiln.autograd.grad(x.grad.sum(), x)
    assert g2.tolist() == [12.0]


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, y: (x * y).tanh(),
        lambda x, y: x.exp() / (y * y + 1),
        lambda x, y: (x.sigmoid() - y).sqrt(),
        lambda x, y: kiln.where(x > 0, x * y, y.sin()),
        lambda x, y: kiln.maximum(x, y) ** 2,
    ],
)
def test_gradgradcheck(fn):
    rng = np.random.default_rng(3)
    x = kiln.from_numpy(rng.uniform(-2, 2, 4)).requires_grad_()
    y = kiln.from_numpy(rng.uniform(-2, -1, 4)).requires_grad_()
    assert gradgradcheck(fn, (x, y))


def test_gradcheck_catches_a_wrong_gradient():
    class Wrong(Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, g):
            return g  # should be 2x g

    x = f64(1.5, 2.5)
    assert not gradcheck(Wrong.apply, (x,), raise_exception=False)
    with pytest.raises(kiln.autograd.GradcheckError, match="Jacobian mismatch"):
        gradcheck(Wrong.apply, (x,))


class ScaledSquare(Function):
    @staticmethod
    def forward(ctx, x, scale: float, w):
        ctx.save_for_backward(x, w)
        ctx.scale = scale
        return x * x * w * scale, (x > 0)

    @staticmethod
    def backward(ctx, g, _g_mask):
        x, w = ctx.saved_tensors
        gx = g * 2 * x * w * ctx.scale if ctx.needs_input_grad[0] else None
        gw = g * x * x * ctx.scale if ctx.needs_input_grad[2] else None
        return gx, None, gw


def test_custom_function():
    x, w = f64(1.0, -2.0), f64(3.0, 0.5)
    out, mask = ScaledSquare.apply(x, 2.0, w)
    assert out.grad_fn.name() == "ScaledSquareBackward"
    assert mask.dtype is kiln.bool and not mask.requires_grad
    out.sum().backward()
    assert x.grad.tolist() == [12.0, -4.0] and w.grad.tolist() == [2.0, 8.0]
    assert gradcheck(lambda a, b: ScaledSquare.apply(a, 2.0, b)[0], (x.detach().clone().requires_grad_(), w))


@pytest.mark.parametrize("materialize", [True, False])
def test_custom_function_gets_none_for_an_unused_output_unless_it_materializes(materialize):
    seen = []

    class Pair(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(materialize)
            return x * 2, x * 3

        @staticmethod
        def backward(ctx, g1, g2):
            seen.append(g2)
            return g1 * 2 + (0 if g2 is None else g2 * 3)

    x = f64(1.0, 2.0)
    first, _ = Pair.apply(x)
    first.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]
    assert (seen[0] is None) is not materialize and (seen[0] is None or seen[0].tolist() == [0.0, 0.0])


def test_custom_function_sees_needs_input_grad_and_runs_without_graph():
    seen = []

    class Probe(Function):
        @staticmethod
        def forward(ctx, a, b):
            seen.append(ctx.needs_input_grad)
            return a + b

        @staticmethod
        def backward(ctx, g):
            return g, g

    Probe.apply(f64(1.0), f64(1.0, requires_grad=False)).backward()
    assert seen == [(True, False)]
    out = Probe.apply(kiln.ones(1), kiln.ones(1))
    assert out.grad_fn is None


def test_custom_function_saved_tensors_are_version_checked():
    class Square(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    a = f64(1.0, 2.0)
    h = a * 1
    y = Square.apply(h)
    h.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_hooks_on_leaves_and_intermediates():
    x = f64(1.0, 2.0)
    seen = []
    handle = x.register_hook(lambda g: g * 10)
    y = x * 3
    y.register_hook(lambda g: seen.append(g.tolist()))
    y.sum().backward()
    assert seen == [[1.0, 1.0]] and x.grad.tolist() == [30.0, 30.0]
    handle.remove()
    x.grad = None
    (x * 3).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        kiln.ones(1).register_hook(lambda g: g)


def test_retain_grad():
    x = f64(1.0, 2.0)
    y = x * x
    y.retain_grad()
    z = x * 3  # not retained
    (y * 2 + z).sum().backward()
    assert y.retains_grad and y.grad.tolist() == [2.0, 2.0]
    assert z.grad is None


def test_detach_shares_memory_and_version_but_not_history():
    x = f64(1.0, 2.0)
    y = x * 2
    d = y.detach()
    assert not d.requires_grad and d.grad_fn is None
    d.add_(1)
    assert y.tolist() == [3.0, 5.0] and y._version_value == d._version_value == 1
    with pytest.raises(RuntimeError, match="leaf variables"):
        y.requires_grad_(False)
    y.detach_()
    assert y.is_leaf and not y.requires_grad


def test_only_float_tensors_require_grad():
    with pytest.raises(RuntimeError, match="floating point"):
        kiln.tensor([1, 2], requires_grad=True)
    x = f64(1.0, 2.0)
    assert not (x > 1).requires_grad
    assert not x.argmax().requires_grad


def test_grad_modes():
    x = f64(1.0)
    with kiln.no_grad():
        assert not (x * 2).requires_grad
        with kiln.enable_grad():
            assert (x * 2).requires_grad
    with kiln.set_grad_enabled(False):
        assert not kiln.is_grad_enabled()
    assert kiln.is_grad_enabled()
    kiln.set_grad_enabled(False)
    assert not kiln.is_grad_enabled()
    kiln.set_grad_enabled(True)

    @kiln.no_grad()
    def f(t):
        return t * 2

    @kiln.set_grad_enabled(False)
    def g(t):
        return t * 2

    assert kiln.is_grad_enabled()
    assert not f(x).requires_grad and not g(x).requires_grad and (x * 2).requires_grad


def test_inference_mode_tensors_cannot_be_saved():
    w = f64(1.0, 2.0)
    with kiln.inference_mode():
        frozen = kiln.tensor([3.0, 4.0], dtype=kiln.float64)
        assert not (w * 2).requires_grad and kiln.autograd.is_inference_mode_enabled()
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved"):
        w * frozen


def test_views_share_the_version_counter():
    x = f64(1.0, 2.0, 3.0, requires_grad=False)
    v = x.reshape(3, 1)
    v.mul_(2)
    assert x._version_value == v._version_value == 1 and x.tolist() == [2.0, 4.0, 6.0]


def test_inplace_through_a_view_reaches_the_base_gradient(torch):
    def run(m, a, b):
        base = a * 1
        view = base.reshape(2, 2)
        view.mul_(b)  # b broadcasts over the view's rows
        return (base * base).sum()

    a = kiln.tensor([1.0, 2.0, 3.0, 4.0], dtype=kiln.float64, requires_grad=True)
    b = kiln.tensor([0.5, -1.0], dtype=kiln.float64, requires_grad=True)
    run(kiln, a, b).backward()
    ta, tb = to_torch(torch, a).requires_grad_(), to_torch(torch, b).requires_grad_()
    run(torch, ta, tb).backward()
    assert_close(a.grad, ta.grad, rtol=1e-12, atol=1e-12)
    assert_close(b.grad, tb.grad, rtol=1e-12, atol=1e-12)


def test_deep_chain_backward_is_iterative():
    depth = 100_000
    assert depth > sys.getrecursionlimit()
    x = kiln.tensor(1.0, requires_grad=True)
    y = x
    for _ in range(depth):
        y = y * 1.0
    y.backward()
    assert x.grad.item() == 1.0


def test_anomaly_mode_names_the_forward_op():
    x = f64(-1.0)
    with kiln.autograd.detect_anomaly():
        y = x.sqrt()  # nan forward, nan gradient
        with pytest.raises(RuntimeError, match=r"(?s)'SqrtBackward' returned nan values.*test_autograd.py"):
            y.sum().backward()
    assert not kiln.autograd.is_anomaly_enabled()


def test_integer_and_bool_results_carry_no_grad():
    x = f64(1.5, -2.5)
    assert not (x > 0).requires_grad
    assert not x.long().requires_grad
    y = x.floor()
    assert y.requires_grad
    y.sum().backward()
    assert x.grad.tolist() == [0.0, 0.0]


def test_grad_setter_validates():
    x = f64(1.0, 2.0)
    with pytest.raises(RuntimeError, match=r"shape \(3,\), expected \(2,\)"):
        x.grad = kiln.ones(3, dtype=kiln.float64)
    with pytest.raises(RuntimeError, match="dtype float32"):
        x.grad = kiln.ones(2)


def test_nan_propagates_through_backward():
    x = f64(math.nan, 1.0)
    (x * 2).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


def test_copy_of_a_leaf_into_a_tensor_with_history_carries_the_leaf_s_gradient(torch):
    def run(lib, make):
        g = make([1.0, -2.0, 3.0])
        src = make([0.5, 0.25, 2.0])
        t = g * 3
        t.copy_(src)
        (t * t).sum().backward()
        return src.grad

    got = run(kiln, lambda v: kiln.tensor(v, dtype=kiln.float64, requires_grad=True))
    expected = run(torch, lambda v: torch.tensor(v, dtype=torch.float64, requires_grad=True))
    assert got is not None
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-12, atol=1e-12)


def test_a_leaf_that_stopped_requiring_grad_gets_no_gradient(torch):
    """``requires_grad_(False)`` between the forward and the backward: the leaf's ``.grad`` stays
    None (its post-accumulate hooks still run), as in PyTorch; the graph's other leaves get theirs."""
    for lib in (kiln, torch):
        x, w = lib.ones(2, requires_grad=True), lib.ones(2, requires_grad=True)
        ran = []
        x.register_post_accumulate_grad_hook(ran.append)
        y = (x * w * 2).sum()
        x.requires_grad_(False)
        y.backward()
        assert x.grad is None and len(ran) == 1 and w.grad.tolist() == [2.0, 2.0], lib.__name__
