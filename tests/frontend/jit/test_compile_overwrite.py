"""A compiled function that overwrites a tensor with history in place gives eager's gradients.

Eager autograd sends zeros to the overwritten tensor's old history (PyTorch's ``CopyBackwards``,
see tests/frontend/test_inplace_overwrite.py), so ``a.grad`` is zeros, not None, after
``v = conv2d(a, w); v.copy_(s); v.sum().backward()``. Compiled, the same held only where the
overwritten tensor was a view in the trace (a stride-2 conv's output), else the gradient was
None (fuzzer, seed 5150005333). Each test runs eager and compiled over several calls on the same
values and compares results and gradients, None against zeros included.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F

from .helpers import compiled_calls


def _args(call: int, *shapes, dtype=kiln.float64):
    rng = np.random.default_rng(100 + call)
    return [kiln.tensor(rng.standard_normal(shape), dtype=dtype, requires_grad=True) for shape in shapes]


def _grads(tensors) -> list:
    return [None if t.grad is None else t.grad.numpy().copy() for t in tensors]


def _assert_same(got: list, want: list, what: str) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g is None) == (w is None), f"{what}: gradient {i} is {g} where eager gives {w}"
        if w is not None:
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12, err_msg=f"{what}: gradient {i}")


def _check(fn, shapes, *, calls: int = 3, backward_inside: bool = False) -> list:
    """Run ``fn`` eagerly and compiled on the same fresh arguments at each call, the backward of the
    result's sum outside (or ``fn``'s own inside); returns the eager gradients of the last call."""
    compiled = kiln.compile(fn)
    for call in range(calls):
        runs = []
        for h in (fn, compiled):
            args = _args(call, *shapes)
            out = h(*args)
            if not backward_inside:
                out.sum().backward()
            runs.append((None if out is None else out.detach().numpy().copy(), _grads(args)))
        (want_out, want), (got_out, got) = runs
        if want_out is not None:
            np.testing.assert_allclose(got_out, want_out, rtol=1e-9, atol=1e-12)
        _assert_same(got, want, f"{fn.__name__}, call {call}")
    assert compiled_calls(compiled) == [calls - 1]  # traced at the first call, compiled after
    return want


def _copy(a, b, s):
    v = a * b
    v.copy_(s)
    return v


def _copy_a_constant(a, b, s):
    v = a * b
    v.copy_(kiln.ones(2, 3, dtype=kiln.float64))
    return v * s


def _fill(a, b, s):
    return (a * b).fill_(1.5) * s


def _zero(a, b, s):
    return (a * b).zero_() + s


def _setitem_whole(a, b, s):
    v = a * b
    v[...] = s
    return v


def _setitem_row(a, b, s):
    v = a * b
    v[0] = s[1]
    return v


def _copy_then_fill(a, b, s):
    return (a * b).copy_(s).fill_(1.0)


def _read_after_copy(a, b, s):
    v = a * b
    v.copy_(s)
    return v * a


def _fill_with_a_0d_tensor(a, b, s):
    return (a * b).fill_(s[0, 1])


@pytest.mark.parametrize(
    "fn",
    [_copy, _copy_a_constant, _fill, _zero, _setitem_whole, _setitem_row, _copy_then_fill, _read_after_copy,
     _fill_with_a_0d_tensor],
    ids=lambda fn: fn.__name__.strip("_"),
)  # fmt: skip
def test_an_overwrite_gives_eager_gradients_compiled(fn):
    grads = _check(fn, [(2, 3), (2, 3), (2, 3)])
    assert grads[1] is not None  # b reaches the result only through the overwritten history
    if fn is not _setitem_row and fn is not _read_after_copy:
        np.testing.assert_array_equal(grads[0], np.zeros((2, 3)))  # zeros, not None


@pytest.mark.parametrize("stride", [1, 2])
def test_an_overwritten_conv_output_gives_zero_weight_gradients(stride):
    # the fuzzer's program: a stride-2 conv's output was a view in the trace (zeros), stride 1 not (None)
    def conv_then_copy(a, w, s):
        v = F.conv2d(a, w, stride=stride)
        v.copy_(s)
        return v

    grads = _check(conv_then_copy, [(1, 3, 6, 6), (2, 3, 3, 3), (1,)])
    np.testing.assert_array_equal(grads[0], np.zeros((1, 3, 6, 6)))
    np.testing.assert_array_equal(grads[1], np.zeros((2, 3, 3, 3)))
    side = (6 - 3) // stride + 1
    np.testing.assert_array_equal(grads[2], [2 * side * side])  # s fills every output element


def test_a_backward_inside_the_call_leaves_zero_gradients():
    def step(a, b, s):
        v = a * b
        v.zero_()
        (v + s * s).sum().backward()

    grads = _check(step, [(2, 3), (2, 3), (2, 3)], backward_inside=True)
    np.testing.assert_array_equal(grads[0], np.zeros((2, 3)))
    np.testing.assert_array_equal(grads[1], np.zeros((2, 3)))


def test_a_training_step_with_weight_decay_moves_a_parameter_whose_output_is_overwritten():
    w = kiln.nn.Parameter(kiln.tensor([1.0, -2.0], dtype=kiln.float64))
    w_eager = kiln.nn.Parameter(w.detach().clone())

    def make_step(param):
        opt = kiln.optim.SGD([param], lr=0.5, momentum=0.9, weight_decay=0.1)

        def step(s):
            opt.zero_grad()
            v = param * 3
            v.copy_(s)
            (v * v).sum().backward()
            opt.step()

        return step

    eager, compiled = make_step(w_eager), kiln.compile(make_step(w))
    for call in range(4):
        s = kiln.tensor([4.0 + call, 5.0], dtype=kiln.float64)
        eager(s)
        compiled(s)
        np.testing.assert_allclose(w.detach().numpy(), w_eager.detach().numpy(), rtol=1e-12)
        np.testing.assert_array_equal(w.grad.numpy(), [0.0, 0.0])
    assert not np.allclose(w.detach().numpy(), [1.0, -2.0])  # weight decay moved it, with zero gradients


def test_an_overwrite_under_dynamic_batch_sizes():
    def zero_then_add(a, w, s):
        v = (a @ w).zero_()
        return v + s

    compiled = kiln.compile(zero_then_add, dynamic=True)
    for n in (2, 3, 5, 4):
        runs = []
        for h in (zero_then_add, compiled):
            a, w, s = _args(n, (n, 3), (3, 4), (n, 4))
            h(a, w, s).sum().backward()
            runs.append(_grads([a, w, s]))
        _assert_same(runs[1], runs[0], f"batch {n}")
        np.testing.assert_array_equal(runs[1][1], np.zeros((3, 4)))
    assert sum(compiled_calls(compiled)) >= 2  # sizes after the first ran a compiled program


def test_an_overwritten_output_that_its_own_backward_reads_raises_compiled_as_eager():
    # exp saves its output; copy_ overwrites it and the zeros sent to exp's backward read it: PyTorch
    # raises there, so eager does, and a compiled call must not return gradients instead
    def exp_then_copy(a, b, s):
        v = (a * b).exp()
        v.copy_(s)
        return v

    compiled = kiln.compile(exp_then_copy)
    for call in range(3):
        for h in (exp_then_copy, compiled):
            out = h(*_args(call, (2, 3), (2, 3), (2, 3)))
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                out.sum().backward()
