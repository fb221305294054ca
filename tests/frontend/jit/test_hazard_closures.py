"""The Python state a compiled call reaches through the user's closures and hooks: a list a helper
function's closure holds, or a tensor's or module's hook appends to, is state from outside the
call. A compiled call would not append to it, so the call runs eagerly with the reason said --
before, the hook ran in the traced call only and later calls silently skipped it (all five side
effect cases below fail on the old code: 1 hook call of 4)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kiln

from .helpers import compiled_calls


def _tensor_hook(seen):
    w = kiln.ones(3, requires_grad=True)
    w.register_hook(lambda g: seen.append(1))
    return lambda x: (x * w).sum()


def _post_accumulate_hook(seen):
    w = kiln.ones(3, requires_grad=True)
    w.register_post_accumulate_grad_hook(lambda t: seen.append(1))
    return lambda x: (x * w).sum()


def _module_forward_hook(seen):
    kiln.manual_seed(0)  # the eager and the compiled case hold the same weights
    m = kiln.nn.Linear(3, 1)
    m.register_forward_hook(lambda mod, inp, out: seen.append(1))
    return lambda x: m(x).sum()


def _parameter_hook(seen):
    kiln.manual_seed(0)  # the eager and the compiled case hold the same weights
    m = kiln.nn.Linear(3, 1)
    m.weight.register_hook(lambda g: seen.append(1))
    return lambda x: m(x).sum()


def _helper_closure(seen):
    def record():
        seen.append(1)

    w = kiln.ones(3, requires_grad=True)

    def loss(x):
        record()
        return (x * w).sum()

    return loss


@pytest.mark.parametrize(
    "case", [_tensor_hook, _post_accumulate_hook, _module_forward_hook, _parameter_hook, _helper_closure]
)
def test_a_list_a_hook_or_helper_closure_appends_to_is_appended_on_every_call(case):
    eager_seen: list = []
    compiled_seen: list = []
    eager_loss, compiled_loss = case(eager_seen), case(compiled_seen)

    def step(loss_of, x):
        loss = loss_of(x)
        loss.backward()
        return loss.detach()

    compiled = kiln.compile(lambda x: step(compiled_loss, x))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for call in range(4):
            x = kiln.full((2, 3), 1.0 + call)
            np.testing.assert_allclose(compiled(x).numpy(), step(eager_loss, x).numpy(), rtol=1e-6, atol=1e-6)
    assert len(compiled_seen) == len(eager_seen) == 4
    assert sum(compiled_calls(compiled)) == 0
    assert any("seen (list.append)" in str(w.message) for w in said)


def test_a_hook_without_side_effects_and_a_list_made_inside_the_call_still_compile():
    w = kiln.ones(3, requires_grad=True)
    w.register_hook(lambda g: g * 2)

    def f(x):
        made = []

        def note(v):
            made.append(v)

        note(1)
        loss = (x * w).sum()
        loss.backward()
        return loss.detach()

    compiled = kiln.compile(f)
    for call in range(3):
        w.grad = None
        compiled(kiln.full((3,), 1.0 + call))
        np.testing.assert_allclose(w.grad.numpy(), 2 * (1.0 + call) * np.ones(3), rtol=1e-6, atol=1e-6)
    assert sum(compiled_calls(compiled)) == 2


def test_a_value_a_helper_reads_from_its_closure_is_guarded_not_a_stale_constant():
    """``scaled`` reads ``cfg["scale"]`` from its closure; the compiled function names only
    ``scaled``. The old code compiled 2.0 into the program and returned 2.0 after the change."""

    def make():
        cfg = {"scale": 2.0}

        def scaled(x):
            return x * cfg["scale"]

        return scaled, cfg

    scaled, cfg = make()
    compiled = kiln.compile(lambda x: scaled(x))
    got = []
    for scale in (2.0, 2.0, 3.0, 3.0, 3.0):
        cfg["scale"] = scale
        got.append(float(compiled(kiln.ones(1)).numpy()[0]))
    assert got == [2.0, 2.0, 3.0, 3.0, 3.0]
    assert sum(compiled_calls(compiled)) >= 2  # each value compiled and reused
