"""Gradients after an in-place write over a tensor that has autograd history.

PyTorch's ``CopyBackwards``, ``FillBackward`` (``fill_``, ``zero_``) and the random fills keep an
edge to the overwritten tensor's old history, which receives a ZERO gradient: after
``v = conv2d(a, w); v.copy_(s); v.sum().backward()``, ``a.grad`` and ``w.grad`` are zeros, not
None (fuzzer, seed 5150005333). An optimizer with momentum or weight decay steps a zero gradient
and skips None, so the difference is real. The cases run on kiln and PyTorch in float64 (the
same source); the tests without PyTorch check hand-computed gradients.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln

A = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]])
B = np.array([[1.0, 2.0, -1.0], [0.5, -2.0, 3.0]])
S = np.array([[-0.5, 1.0, 0.75], [2.0, -1.5, 0.5]])


def _setitem(v, key, value):
    v[key] = value
    return v


def _view_rows(v, row, value):
    v[row].copy_(value)
    return v


# name -> fn(lib, a, b, s) returning the tensor whose sum is differentiated
CASES = {
    "copy_": lambda lib, a, b, s: (a * b).copy_(s),
    "copy_ from a tensor without grad": lambda lib, a, b, s: (a * b).copy_(s.detach()),
    "copy_ broadcast": lambda lib, a, b, s: (a * b).copy_(s[0]),
    "copy_ from another dtype": lambda lib, a, b, s: (a * b).copy_(s.float()),
    "copy_ of a value made from itself": lambda lib, a, b, s: (lambda v: v.copy_(v * 3))(a * b),
    "copy_ into a tensor without history": lambda lib, a, b, s: lib.zeros(2, 3, dtype=lib.float64).copy_(s),
    "fill_ with a number": lambda lib, a, b, s: (a * b).fill_(1.5),
    "fill_ with a 0-d tensor": lambda lib, a, b, s: (a * b).fill_(s[0, 1]),
    "zero_": lambda lib, a, b, s: (a * b).zero_(),
    "copy_ then fill_": lambda lib, a, b, s: (a * b).copy_(s).fill_(1.0),
    "setitem Ellipsis": lambda lib, a, b, s: _setitem(a * b, Ellipsis, s),
    "setitem [:]": lambda lib, a, b, s: _setitem(a * b, slice(None), s),
    "setitem [:] a number": lambda lib, a, b, s: _setitem(a * b, slice(None), 2.0),
    "setitem one row": lambda lib, a, b, s: _setitem(a * b, 1, s[0]),
    "copy_ into a view of one row": lambda lib, a, b, s: _view_rows(a * b, 0, s[1]),
    "copy_ into a view of the whole": lambda lib, a, b, s: (lambda v: (v.view(6).copy_(s.reshape(6)), v)[1])(a * b),
    "the whole view read": lambda lib, a, b, s: (a * b).view(6).copy_(s.reshape(6)),
    "masked_fill_ everywhere": lambda lib, a, b, s: (a * b).masked_fill_(lib.ones(2, 3, dtype=lib.bool), 1.0),
    "masked_fill_ a column": lambda lib, a, b, s: (a * b).masked_fill_(lib.tensor([[True, False, True]]), 1.0),
    "index_put_ every row": lambda lib, a, b, s: (a * b).index_put_((lib.tensor([0, 1]),), s),
    "clamp_": lambda lib, a, b, s: (a * b).clamp_(-0.1, 0.1),
    "mul_ (reads the old value)": lambda lib, a, b, s: (a * b).mul_(s),
    "read again after copy_": lambda lib, a, b, s: (lambda v: v.copy_(s) * a)(a * b),
    "maximum then copy_": lambda lib, a, b, s: lib.maximum(a, b).copy_(s),
    "uniform_": lambda lib, a, b, s: (a * b).uniform_(),
    "normal_": lambda lib, a, b, s: (a * b).normal_(),
    "bernoulli_": lambda lib, a, b, s: (a * b).bernoulli_(0.5),
}


def _run(lib, case):
    a, b, s = (lib.tensor(x, dtype=lib.float64, requires_grad=True) for x in (A, B, S))
    out = CASES[case](lib, a, b, s)
    out.sum().backward()
    return out.requires_grad, [None if t.grad is None else t.grad.detach().numpy() for t in (a, b, s)]


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_after_an_overwrite_match_pytorch(torch, case):
    got_requires, got = _run(kiln, case)
    want_requires, want = _run(torch, case)
    assert got_requires == want_requires
    for name, g, w in zip("abs", got, want, strict=True):
        assert (g is None) == (w is None), f"{case}: {name}.grad {g} where PyTorch gives {w}"
        if w is not None:
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=f"{case}: {name}.grad")


def _leaves():
    return [kiln.tensor(x, dtype=kiln.float64, requires_grad=True) for x in (A, B, S)]


def test_copy_sends_zeros_to_the_old_history_and_the_gradient_to_the_source():
    a, b, s = _leaves()
    v = a * b
    v.copy_(s)
    (v * 3).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), np.zeros((2, 3)))  # zeros, not None
    np.testing.assert_array_equal(b.grad.numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(s.grad.numpy(), np.full((2, 3), 3.0))


@pytest.mark.parametrize("write", ["zero_", "fill_", "normal_", "copy_ a constant"])
def test_a_tensor_overwritten_by_a_constant_still_requires_grad(write):
    a, _, _ = _leaves()
    v = a * 2
    {
        "zero_": v.zero_,
        "fill_": lambda: v.fill_(4.0),
        "normal_": v.normal_,
        "copy_ a constant": lambda: v.copy_(kiln.ones(2, 3, dtype=kiln.float64)),
    }[write]()
    assert v.requires_grad and v.grad_fn is not None
    (v * v).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), np.zeros((2, 3)))


def test_fill_with_a_0d_tensor_gives_it_the_sum_of_the_gradient():
    a, _, s = _leaves()
    value = s[1, 2]
    v = (a * 2).fill_(value)
    (v * kiln.tensor(B)).sum().backward()
    want = np.zeros((2, 3))
    want[1, 2] = B.sum()
    np.testing.assert_allclose(s.grad.numpy(), want, rtol=1e-12)
    np.testing.assert_array_equal(a.grad.numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(v.detach().numpy(), np.full((2, 3), S[1, 2]))


def test_fill_with_a_tensor_of_more_than_0_dims_is_refused():
    with pytest.raises(RuntimeError, match=r"fill_ only supports 0-dimension value tensor.*shape \(3,\)"):
        kiln.zeros(2, 3).fill_(kiln.ones(3))


def test_a_partial_overwrite_keeps_the_gradient_of_the_rest():
    a, b, s = _leaves()
    v = a * 2
    v[0].copy_(s[1])
    v.sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    np.testing.assert_array_equal(s.grad.numpy(), [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])


def test_retain_grad_keeps_the_gradient_of_the_new_value():
    a, b, s = _leaves()
    for write in (lambda v: v.copy_(s), lambda v: v.mul_(2)):
        v = a * b
        v.retain_grad()
        write(v)
        (v * 3).sum().backward()
        np.testing.assert_array_equal(v.grad.numpy(), np.full((2, 3), 3.0))


def test_retain_grad_on_a_base_written_through_a_view():
    a, _, s = _leaves()
    base = a * 2
    base.retain_grad()
    base[0].copy_(s[0])
    (base * 5).sum().backward()
    np.testing.assert_array_equal(base.grad.numpy(), np.full((2, 3), 5.0))


@pytest.mark.parametrize("write", ["mul_", "copy_"])
def test_retain_grad_on_a_view_whose_base_was_written(write):
    # the view's history is rebuilt from its base's at its next use: its retain_grad hook follows
    a, _, s = _leaves()
    base = a * 2
    view = base[0]
    view.retain_grad()
    base.mul_(3) if write == "mul_" else base.copy_(s * 1.0)
    (view * kiln.tensor([1.0, 2.0, 3.0], dtype=kiln.float64)).sum().backward()
    np.testing.assert_array_equal(view.grad.numpy(), [1.0, 2.0, 3.0])


def test_retain_grad_on_a_view_whose_base_was_written_matches_pytorch(torch):
    grads = []
    for lib in (kiln, torch):
        x = lib.ones(4, dtype=lib.float64, requires_grad=True)
        base = x * 2
        view = base[:2]
        view.retain_grad()
        base.mul_(3)
        (view * lib.tensor([1.0, 2.0], dtype=lib.float64)).sum().backward()
        grads.append([view.grad.detach().numpy(), x.grad.detach().numpy()])
    for got, want in zip(*grads, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_hook_on_the_old_value_sees_the_zero_gradient():
    a, b, s = _leaves()
    seen = []
    v = a * b
    v.register_hook(lambda g: seen.append(g.numpy().copy()))
    v.copy_(s)
    v.sum().backward()
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], np.zeros((2, 3)))


def test_double_backward_through_an_overwrite():
    a, b, s = _leaves()
    v = a * b
    v.copy_(s)
    (ga,) = kiln.autograd.grad((v * v).sum(), a, create_graph=True)
    np.testing.assert_array_equal(ga.detach().numpy(), np.zeros((2, 3)))
    assert ga.requires_grad  # zeros times b: b's gradient is zeros again
    ga.sum().backward()
    np.testing.assert_array_equal(b.grad.numpy(), np.zeros((2, 3)))
    (gs,) = kiln.autograd.grad((v * v).sum(), s, create_graph=True)
    np.testing.assert_allclose(gs.detach().numpy(), 2 * S, rtol=1e-12)


def test_weight_decay_steps_a_parameter_whose_output_was_overwritten():
    # the reason zeros and None differ: SGD with weight decay moves a parameter with a zero gradient
    w = kiln.nn.Parameter(kiln.tensor([1.0, -2.0], dtype=kiln.float64))
    opt = kiln.optim.SGD([w], lr=0.5, weight_decay=0.1)
    v = w * 3
    v.copy_(kiln.tensor([4.0, 5.0], dtype=kiln.float64))
    v.sum().backward()
    opt.step()
    np.testing.assert_allclose(w.detach().numpy(), [1.0 - 0.5 * 0.1 * 1.0, -2.0 + 0.5 * 0.1 * 2.0], rtol=1e-12)


def test_maximum_reads_only_its_inputs_so_its_output_may_be_overwritten():
    a, b, s = _leaves()
    v = kiln.maximum(a, b)
    v.copy_(s)
    v.sum().backward()  # maximum's backward no longer reads its (overwritten) output
    np.testing.assert_array_equal(a.grad.numpy(), np.zeros((2, 3)))


def test_maximum_and_minimum_gradients_at_ties_and_nans():
    # PyTorch's rule: a tie splits the gradient, the losing input gets 0, a nan passes it to both
    x = np.array([1.0, np.nan, 2.0, 3.0, np.nan, 0.0])
    y = np.array([1.0, 2.0, np.nan, 1.0, np.nan, 5.0])
    for fn, want_x, want_y in (
        (kiln.maximum, [0.5, 1, 1, 1, 1, 0], [0.5, 1, 1, 0, 1, 1]),
        (kiln.minimum, [0.5, 1, 1, 0, 1, 1], [0.5, 1, 1, 1, 1, 0]),
    ):
        a, b = kiln.tensor(x, requires_grad=True), kiln.tensor(y, requires_grad=True)
        fn(a, b).sum().backward()
        np.testing.assert_array_equal(a.grad.numpy(), want_x)
        np.testing.assert_array_equal(b.grad.numpy(), want_y)


def test_an_overwrite_whose_old_history_saved_a_changed_tensor_raises_as_in_pytorch():
    a, _, s = _leaves()
    v = a.exp()  # exp saves its output, v itself
    v.copy_(s)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        v.sum().backward()
