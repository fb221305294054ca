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
