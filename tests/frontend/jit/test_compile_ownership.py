"""What a compiled call hands out and writes back is exactly what the eager call would: results
own their memory unless eager's share it, tensors that existed before the call keep their
identity, writes whose first touch is the write are written back, gradients flow as eager's do,
and aliasing between arguments and captured state is guarded.

Each test runs the same function eagerly and compiled (both backends) for several calls, with the
caller mutating what it got back between calls where that is the hazard.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln

from .helpers import compiled_calls, events

BACKENDS = ["llvm", "interpreter"]


def _compile(fn, backend):
    return kiln.compile(fn, options=kiln.CompileOptions(backend=backend))


def _values(t) -> list:
    return t.detach().numpy().tolist()


# ---------------------------------------------------------------------- results own their memory
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_constant_result_is_new_memory_on_every_call(backend):
    def f(x):
        return x + 1, kiln.tensor([0, 0]), kiln.zeros(2).reshape(1, 2)

    c = _compile(f, backend)
    for _ in range(4):
        for fn in (f, c):
            _, b, z = fn(kiln.ones(2))
            assert _values(b) == [0, 0] and _values(z) == [[0.0, 0.0]]
            b.add_(1)  # the caller owns what it got
            z.add_(1)
    assert sum(compiled_calls(c)) >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_results_merged_by_the_passes_do_not_share_memory(backend):
    def f(x):
        a = x.exp()
        return a, kiln.maximum(a, a), a * 1.0, a.clone()

    c = _compile(f, backend)
    for _ in range(4):
        results = c(kiln.zeros(2))
        results[0].add_(1)
        assert [_values(r) for r in results] == [[2.0, 2.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    assert sum(compiled_calls(c)) >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_result_read_before_the_argument_is_written_keeps_the_old_value(backend):
    def f(a):
        b = kiln.logical_not(kiln.logical_not(a))  # simplified to ``a`` itself
        a.logical_not_()
        return b

    c = _compile(f, backend)
    for _ in range(4):
        a = kiln.tensor([True, False])
        assert _values(c(a)) == [True, False]
        assert _values(a) == [False, True]
    assert sum(compiled_calls(c)) >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_result_read_before_a_capture_is_written_keeps_the_old_value(backend):
    state = kiln.tensor([1.0, 2.0])

    def f(c):
        r = kiln.where(c, state, state)
        state.add_(1)
        return r

    compiled = _compile(f, backend)
    for step in range(4):
        r = compiled(kiln.tensor([True, False]))
        assert _values(r) == [1.0 + step, 2.0 + step]
        assert _values(state) == [2.0 + step, 3.0 + step]
    assert sum(compiled_calls(compiled)) >= 2


# ---------------------------------------------------------------------- identity of tensors from before the call
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_untouched_captured_tensor_is_returned_itself(backend):
    g = kiln.arange(6.0).reshape(2, 3)  # a view: its base is the arange
    h = kiln.ones(3)

    c = _compile(lambda x: (x + 1, g, h), backend)
    for _ in range(3):
        _, rg, rh = c(kiln.ones(1))
        assert rg is g and rh is h
    assert sum(compiled_calls(c)) >= 2


def test_a_new_grad_returned_is_the_grad_itself():
    w = kiln.ones(3, requires_grad=True)

    @kiln.compile
    def step(x):
        (w * x).sum().backward()
        return w.grad

    for i in range(4):
        w.grad = None
        g = step(kiln.full((3,), float(i)))
        assert g is w.grad and _values(g) == [float(i)] * 3
    assert sum(compiled_calls(step)) >= 2


# ---------------------------------------------------------------------- writes are written back
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("write", ["copy_", "fill_", "zero_", "view"])
def test_a_capture_whose_first_use_is_a_write_is_written_back(backend, write):
    target = kiln.zeros(3)

    def f(x):
        if write == "copy_":
            target.copy_(x)
        elif write == "fill_":
            target.fill_(2.0)
        elif write == "zero_":
            target.zero_()
        else:
            target[1:].copy_(x[:2])
        return x * 2

    c = _compile(f, backend)
    for step in range(4):
        target.fill_(-1.0)
        x = kiln.full((3,), float(step + 1))
        c(x)
        expected = {"copy_": [step + 1.0] * 3, "fill_": [2.0] * 3, "zero_": [0.0] * 3,
                    "view": [-1.0, step + 1.0, step + 1.0]}[write]  # fmt: skip
        assert _values(target) == expected
    assert sum(compiled_calls(c)) >= 2


def test_zero_grad_without_set_to_none_inside_a_step_clears_the_stale_grad():

    def run(compile_it):
        kiln.manual_seed(0)
        model = kiln.nn.Linear(3, 2)
        opt = kiln.optim.SGD(model.parameters(), lr=0.1)

        def step(x):
            opt.zero_grad(set_to_none=False)
            loss = model(x).pow(2).sum()
            loss.backward()
            opt.step()
            return loss.detach()

        fn = kiln.compile(step) if compile_it else step
        model(kiln.ones(1, 3)).sum().backward()  # a stale gradient before the first step
        losses = [fn(kiln.full((4, 3), 0.1 * i)).item() for i in range(5)]
        return losses, [p.detach().numpy().copy() for p in model.parameters()], fn

    eager_losses, eager_params, _ = run(False)
    losses, params, compiled = run(True)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-6, atol=1e-7)
    for p, e in zip(params, eager_params, strict=True):
        np.testing.assert_allclose(p, e, rtol=1e-6, atol=1e-7)
    assert sum(compiled_calls(compiled)) >= 2


def test_a_modules_zero_grad_without_set_to_none_zeroes_where_a_trace_sees_it():
    """Module.zero_grad(set_to_none=False) once replaced each .grad behind the trace's back: from
    the call that found the gradients set, compiled gradients accumulated across calls."""

    def run(compile_it):
        kiln.manual_seed(0)
        model = kiln.nn.Linear(3, 2)

        def step(x):
            model.zero_grad(set_to_none=False)
            loss = model(x).square().sum()
            loss.backward()
            return loss.detach()

        fn = kiln.compile(step) if compile_it else step
        grads = []
        for i in range(4):
            fn(kiln.full((4, 3), 0.5 + i))
            grads.append([p.grad.numpy().copy() for p in model.parameters()])
        return grads

    for ours, eager in zip(run(True), run(False), strict=True):
        for a, b in zip(ours, eager, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------- gradients through compiled calls
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_argument_that_is_a_view_of_another_gets_eager_gradients(backend):
    def f(a0, a1):
        return a1.sum() + (a0 * a0).sum()

    c = _compile(f, backend)
    for _ in range(4):
        grads = []
        for fn in (f, c):
            a0 = kiln.arange(4.0, dtype=kiln.float64).requires_grad_()
            fn(a0, a0[::2]).backward()
            grads.append(_values(a0.grad))
        assert grads[1] == grads[0] == [1.0, 2.0, 5.0, 6.0]
    assert sum(compiled_calls(c)) >= 2


def test_an_argument_given_autograd_history_in_place_runs_eagerly_and_says_why():
    h = kiln.ones(3, requires_grad=True)

    def f(a):
        a.lerp_(h, 0.25)
        return (a * 2).detach()

    c = kiln.compile(f)
    for _ in range(3):
        a, b = kiln.zeros(3), kiln.zeros(3)
        f(b)
        c(a)
        assert a.requires_grad and a.grad_fn is not None
        assert _values(a) == _values(b)
        a.sum().backward()  # the history reaches h, as eager's does
    assert compiled_calls(c) == []
    assert any("autograd history" in e.detail for e in events(c, "break"))


# ---------------------------------------------------------------------- arguments aliasing captured state
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_argument_that_was_the_captured_tensor_is_guarded(backend):
    g = kiln.arange(6.0).reshape(2, 3)

    def f(x):
        return x * 1 + 0, g.transpose(0, 1)

    c = _compile(f, backend)
    c(g), c(g)
    for other in (kiln.ones(2, 3), g, kiln.zeros(2, 3)):
        got, expected = c(other), f(other)
        assert _values(got[0]) == _values(expected[0])
        assert _values(got[1]) == _values(expected[1]) == _values(g.transpose(0, 1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_captured_tensor_passed_as_the_argument_later_is_guarded(backend):
    g = kiln.zeros(3)

    def f(x):
        x.add_(1)
        return g * 2

    c = _compile(f, backend)
    c(kiln.zeros(3)), c(kiln.zeros(3))
    for _ in range(3):
        before = _values(g)
        r = c(g)  # eager: g is incremented first, then read
        assert _values(g) == [v + 1 for v in before]
        assert _values(r) == [2 * (v + 1) for v in before]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mutated_argument_returned_twice_is_the_argument_twice(backend):
    def f(a):
        a.mul_(2)
        return a, a, a + 1

    c = _compile(f, backend)
    for _ in range(3):
        a = kiln.ones(2)
        r0, r1, r2 = c(a)
        assert r0 is a and r1 is a and _values(a) == [2.0, 2.0] and _values(r2) == [3.0, 3.0]
    assert sum(compiled_calls(c)) >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_results_sharing_memory_made_in_the_call_share_it_as_eager_s_do(backend):
    def f(x):
        a = x * 2
        b = x + 1
        return a, a[0], a.t(), b[1:], b[:1], x - 1

    c = _compile(f, backend)
    for _ in range(4):
        outs = []
        for fn in (f, c):
            results = fn(kiln.ones(2, 3))
            results[0].add_(1)  # seen through a[0] and a.t()
            results[3].mul_(5)  # seen by neither b[:1] nor x - 1
            outs.append([(_values(r), r.stride(), r.is_contiguous()) for r in results])
        assert outs[1] == outs[0]
    assert sum(compiled_calls(c)) >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_argument_copied_from_another_that_changes_later_keeps_the_old_value(backend):
    def f(a, b):
        b.copy_(a)
        r = a * 2
        a.fill_(-1.0)
        return r

    c = _compile(f, backend)
    for step in range(4):
        a, b = kiln.full((3,), float(step)), kiln.zeros(3)
        c(a, b)
        assert _values(a) == [-1.0] * 3 and _values(b) == [float(step)] * 3
    assert sum(compiled_calls(c)) >= 2


def test_a_loss_returned_after_backward_inside_requires_grad_as_eager_s_does():
    w = kiln.ones(3, requires_grad=True)

    def step(x):
        loss = (w * x).sum()
        loss.backward()
        return loss

    c = kiln.compile(step)
    for _ in range(3):
        for fn in (step, c):
            loss = fn(kiln.ones(3))
            assert loss.requires_grad and loss.grad_fn is not None
            with pytest.raises(RuntimeError, match="backward through the graph a second time"):
                loss.backward()
    assert sum(compiled_calls(c)) >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_results_sharing_a_permuted_tensor_made_in_the_call_share_it(backend):
    def f(x):
        v = x.permute(0, 2, 1) / 1.5  # numpy keeps the permuted layout: not C-contiguous
        return v.permute(2, 1, 0), v

    c = _compile(f, backend)
    for _ in range(4):
        outs = []
        for fn in (f, c):
            r0, r1 = fn(kiln.arange(24.0).reshape(2, 3, 4)[:, :, :])
            r1.add_(1)  # seen through r0
            outs.append([(_values(r), r.stride()) for r in (r0, r1)])
        assert outs[1] == outs[0]
    assert sum(compiled_calls(c)) >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_argument_with_history_returned_keeps_its_own_grad_fn(backend):
    def f(a, b):
        return a * 2, b

    c = _compile(f, backend)
    for _ in range(4):
        grads = []
        for fn in (f, c):
            w = kiln.arange(4.0, dtype=kiln.float64).requires_grad_()
            b = w[::2]  # a view with history: its grad_fn leads to w
            history = b.grad_fn
            r, rb = fn(w, b)
            assert rb is b and rb.grad_fn is history
            (r.sum() + (rb * 3).sum()).backward()
            grads.append(_values(w.grad))
        assert grads[1] == grads[0] == [5.0, 2.0, 5.0, 2.0]
    assert sum(compiled_calls(c)) >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_captured_view_whose_first_use_is_a_write_is_returned_itself(backend):
    g = kiln.arange(8.0)[::2]

    def f():
        g.fill_(0.75)
        return g

    c = _compile(f, backend)
    for _ in range(4):
        g.copy_(kiln.arange(4.0))
        assert c() is g and _values(g) == [0.75] * 4
    assert sum(compiled_calls(c)) >= 2
