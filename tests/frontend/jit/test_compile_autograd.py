"""Autograd through compiled functions (backward outside), and autograd features used inside them:
no_grad/enable_grad blocks, custom kiln.autograd.Function, tensor hooks."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck

from .helpers import assert_tree_close, compiled_calls

TOL64 = {"rtol": 1e-12, "atol": 1e-12}


def loss_fn(x, w):
    h = kiln.tanh(x @ w)
    return (h * h).sum() + (x.exp() * 0.1).mean()


def _leaf(*shape, seed, dtype=kiln.float64):
    kiln.manual_seed(seed)
    return kiln.randn(*shape, dtype=dtype).requires_grad_(True)


def _pair(*shape, seed):
    a = _leaf(*shape, seed=seed)
    return a, a.detach().clone().requires_grad_(True)


def test_backward_outside_gives_eager_gradients():
    f = kiln.compile(loss_fn)
    for i in range(4):
        x, xe = _pair(4, 3, seed=i)
        w, we = _pair(3, 5, seed=10 + i)
        loss = f(x, w)
        expected = loss_fn(xe, we)
        assert_tree_close(loss.detach(), expected.detach(), **TOL64)
        loss.backward()
        expected.backward()
        np.testing.assert_allclose(x.grad.numpy(), xe.grad.numpy(), **TOL64)
        np.testing.assert_allclose(w.grad.numpy(), we.grad.numpy(), **TOL64)
        if i >= 1:
            assert loss.grad_fn.name() == "CompiledFunctionBackward"
    assert compiled_calls(f) == [3]


def test_gradcheck_of_the_compiled_function_after_warm_up():
    f = kiln.compile(loss_fn)
    x, w = _leaf(4, 3, seed=1), _leaf(3, 5, seed=2)
    f(x, w)
    f(x, w)
    assert gradcheck(f, (x, w), eps=1e-6, atol=1e-6, rtol=1e-4)
    assert compiled_calls(f)[0] >= 3


def test_only_some_inputs_require_grad():
    f = kiln.compile(loss_fn)
    for _ in range(3):
        x = _leaf(4, 3, seed=1).detach()
        w, we = _pair(3, 5, seed=2)
        f(x, w).backward()
        loss_fn(x, we).backward()
        assert x.grad is None
        np.testing.assert_allclose(w.grad.numpy(), we.grad.numpy(), **TOL64)
    assert compiled_calls(f) == [2]


def test_gradient_flows_into_upstream_history_and_multiple_outputs():
    def f(a, b):
        return a * b, (a - b).sum(dim=0)

    g = kiln.compile(f)
    for _ in range(3):
        x, xe = _pair(3, 4, seed=5)
        y, ye = _pair(4, seed=6)
        p, q = g(x.sin(), y)  # the input has history: gradients continue into sin's backward
        pe, qe = f(xe.sin(), ye)
        ((p**2).sum() + (q * 3).sum()).backward()
        ((pe**2).sum() + (qe * 3).sum()).backward()
        np.testing.assert_allclose(x.grad.numpy(), xe.grad.numpy(), **TOL64)
        np.testing.assert_allclose(y.grad.numpy(), ye.grad.numpy(), **TOL64)
    assert compiled_calls(g) == [2]


def test_only_one_output_used_in_backward():
    def f(a):
        return a.exp(), a.cos()

    g = kiln.compile(f)
    for _ in range(3):
        x, xe = _pair(5, seed=1)
        g(x)[1].sum().backward()
        f(xe)[1].sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), xe.grad.numpy(), **TOL64)


def test_captured_parameter_gets_gradient_from_backward_outside():
    w, we = _pair(3, 2, seed=3)
    f = kiln.compile(lambda x: loss_fn(x, w))
    for i in range(5):
        x = _leaf(4, 3, seed=i).detach()
        f(x).backward()
        loss_fn(x, we).backward()  # accumulates, as the compiled side must
        np.testing.assert_allclose(w.grad.numpy(), we.grad.numpy(), **TOL64)
    # w.grad goes from None to set after the first backward: a guarded change, at most one retrace
    assert len(f.state.specializations) <= 2 and compiled_calls(f)[-1] >= 3


def test_no_grad_and_enable_grad_blocks_inside():
    def f(x, w):
        with kiln.no_grad():
            scale = (w * 2).sum()  # a constant for autograd
        y = x * scale
        with kiln.no_grad():
            with kiln.enable_grad():
                z = y * w.sum()
        return z.sum(), scale

    g = kiln.compile(f)
    for _ in range(3):
        x, xe = _pair(3, seed=1)
        w, we = _pair(3, seed=2)
        (out, scale), (eout, escale) = g(x, w), f(xe, we)
        assert not scale.requires_grad and not escale.requires_grad
        assert_tree_close(out.detach(), eout.detach(), **TOL64)
        out.backward()
        eout.backward()
        np.testing.assert_allclose(x.grad.numpy(), xe.grad.numpy(), **TOL64)
        np.testing.assert_allclose(w.grad.numpy(), we.grad.numpy(), **TOL64)
    assert compiled_calls(g) == [2]


class ClampedSquare(kiln.autograd.Function):
    """x**2 forward; the backward is deliberately NOT the true derivative (2x clipped to [-1, 1]),
    so that using it (rather than differentiating the forward ops) is visible."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (2 * x).clamp(-1.0, 1.0)


def test_custom_function_inside_uses_its_backward():
    def f(x):
        return ClampedSquare.apply(x * 3).sum()

    g = kiln.compile(f)
    for _ in range(3):
        x, xe = _pair(6, seed=4)
        g(x).backward()
        f(xe).backward()
        np.testing.assert_allclose(x.grad.numpy(), xe.grad.numpy(), **TOL64)
        assert np.abs(x.grad.numpy()).max() <= 3.0 + 1e-12
    assert compiled_calls(g) == [2]


def test_custom_function_with_backward_inside():
    def f(x):
        x.grad = None
        ClampedSquare.apply(x).sum().backward()
        return x.grad * 1

    g = kiln.compile(f)
    for _ in range(3):
        x, xe = _pair(6, seed=4)
        assert_tree_close(g(x), f(xe), **TOL64)


def test_tensor_hook_inside():
    def f(x, w):
        y = x * w
        y.register_hook(lambda grad: grad * 10)
        return (y * y).sum()

    g = kiln.compile(f)
    for _ in range(3):
        x, xe = _pair(4, seed=1)
        w, we = _pair(4, seed=2)
        g(x, w).backward()
        f(xe, we).backward()
        np.testing.assert_allclose(x.grad.numpy(), xe.grad.numpy(), **TOL64)
        np.testing.assert_allclose(w.grad.numpy(), we.grad.numpy(), **TOL64)
    assert compiled_calls(g) == [2]


def test_hook_on_input_inside_with_backward_inside():
    def f(x):
        x.register_hook(lambda grad: grad * 2)
        (x * x).sum().backward()
        return x.grad * 1

    g = kiln.compile(f)
    for _ in range(3):
        x, xe = _pair(4, seed=1)
        assert_tree_close(g(x), f(xe), **TOL64)
        np.testing.assert_allclose(x.grad.numpy(), 4 * xe.detach().numpy(), **TOL64)


def test_second_backward_without_retain_graph_raises():
    f = kiln.compile(loss_fn)
    x, w = _leaf(4, 3, seed=1), _leaf(3, 5, seed=2)
    for _ in range(2):
        f(x, w)
    loss = f(x, w)
    loss.backward()
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_float32_gradients_match_eager():
    f = kiln.compile(loss_fn)
    for _ in range(3):
        x = _leaf(4, 3, seed=1, dtype=kiln.float32)
        xe = x.detach().clone().requires_grad_(True)
        w = _leaf(3, 5, seed=2, dtype=kiln.float32)
        we = w.detach().clone().requires_grad_(True)
        f(x, w).backward()
        loss_fn(xe, we).backward()
        np.testing.assert_allclose(x.grad.numpy(), xe.grad.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(w.grad.numpy(), we.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert compiled_calls(f) == [2]


def test_a_saved_value_the_graph_makes_a_view_of_a_mutated_input_keeps_the_old_values():
    # v.copy_(a) then a.add_(2): in eager v is memory of its own holding a's old value; the graph
    # knows values only and makes v a view of a (expand). The backward of v @ w reads v, and the
    # call writes a's new value back: the saved value must be a copy (fuzzer, seed 43000287).
    w = kiln.tensor(np.array([[0.5, -1.0, 2.0, 0.25]], np.float32)).requires_grad_()
    x = kiln.tensor(np.ones((1, 5, 1), np.float32)).requires_grad_()

    def f(x, a):
        # (maximum of a copy: copy_ sends zeros to v's old history, whose backward then reads what
        # maximum saved, and a itself is changed in place below, which PyTorch's backward refuses)
        v = kiln.maximum(x, a + 0)
        v.copy_(a)
        a.add_(2)
        return v @ w

    compiled = kiln.compile(f)
    for call in range(4):
        grads = []
        for fn in (f, compiled):
            a = kiln.tensor(np.float32(0.5 + call))
            w.grad = None
            fn(x, a).sum().backward()
            grads.append(w.grad.numpy().copy())
            assert a.item() == 2.5 + call
        np.testing.assert_allclose(grads[1], grads[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(grads[0], np.full((1, 4), 5 * (0.5 + call)), rtol=1e-6, atol=1e-6)
    assert compiled_calls(compiled) == [3]
