"""Results wrapped without checks only when the program made them as new memory of their own
(``CompiledProgram.fresh_outputs``): an input, a view of one, a value handed out twice, a
write-back or a new ``.grad`` keep going through ``signature.apply``'s claims and copies."""

from __future__ import annotations

import numpy as np

import kiln


def _spec(fn, *args):
    compiled = kiln.compile(fn)
    for _ in range(2):
        out = compiled(*args)
    return compiled.state.specializations[-1], out


def test_kernel_results_are_wrapped_directly_and_never_share_memory():
    x = kiln.arange(4.0)
    spec, (a, b) = _spec(lambda t: (t + 1, t * 2), x)
    assert spec._fresh_results is not None
    assert not np.shares_memory(a.numpy(), b.numpy()) and not np.shares_memory(a.numpy(), x.numpy())
    np.testing.assert_array_equal(a.numpy(), [1, 2, 3, 4])


def test_inputs_views_repeats_and_write_backs_take_the_checked_path():
    x = kiln.arange(4.0)
    for fn in (lambda t: (t + 1, t), lambda t: (t + 1)[1:], lambda t: ((y := t + 1), y)):
        spec, out = _spec(fn, x)
        assert spec._fresh_results is None
    spec, (y, z) = _spec(lambda t: ((y := t + 1), y), x)
    assert y is z  # one tensor returned twice, as in eager
    w = kiln.zeros(4)

    def update(t):
        w.add_(t)
        return t * 3

    spec, _ = _spec(update, x)
    assert spec._fresh_results is None


def test_made_fresh_only_when_every_made_result_and_grad_is_a_fresh_output():
    from kiln.frontend.jit.signature import Argument, Result, SetGrad, Signature, made_fresh
    from kiln.ir.types import CPU

    sig = Signature([Argument(0)], [Result(0), Result(1)], devices=(CPU, CPU, CPU))
    assert made_fresh(sig, frozenset({0, 1})) and made_fresh(sig, frozenset({0, 1, 2}))
    assert not made_fresh(sig, frozenset({0})) and not made_fresh(sig, frozenset())
    with_grad = Signature([Argument(0)], [Result(0)], grads=[SetGrad(0, 1)], devices=(CPU, CPU))
    assert made_fresh(with_grad, frozenset({0, 1})) and not made_fresh(with_grad, frozenset({0}))
    assert not made_fresh(Signature([Argument(0)], [], devices=()), frozenset({0}))  # nothing made


def test_a_step_with_write_backs_hands_out_new_results_without_reading_the_inputs_owners():
    # A training step: it writes its state back and returns new values (the loss). The results are
    # fresh (``apply(fresh=True)``): new memory, none of an input's or of each other's, equal to eager's.
    w, w_eager = kiln.zeros(4), kiln.zeros(4)

    def step(t, state):
        state.add_(t)
        return (state * 3).sum(), t + 1

    compiled = kiln.compile(step)
    for k in range(4):
        x = kiln.arange(4.0) + k
        loss, y = compiled(x, w)
        loss_eager, y_eager = step(x, w_eager)
        np.testing.assert_allclose(loss.numpy(), loss_eager.numpy(), rtol=1e-6)
        np.testing.assert_array_equal(y.numpy(), y_eager.numpy())
        np.testing.assert_array_equal(w.numpy(), w_eager.numpy())
        for a in (x, w):
            assert not np.shares_memory(y.numpy(), a.numpy()) and not np.shares_memory(loss.numpy(), a.numpy())
    spec = compiled.state.specializations[-1]
    assert spec._fresh_results is None and spec._made_fresh, "the step does not take apply(fresh=True)"
