"""A hook registered on a tensor after its function was compiled: a compiled call runs the hooks its
program was traced with, so a specialization holds only while the hooks of its captured tensors and
of its tensor arguments are those it was traced with. Before, a parameter's gradient hook, an
argument's hook or a post-accumulate hook registered between calls was silently skipped by the
compiled calls (the gradient of the hook-less trace); each case below fails on that code."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kiln


def _run(lib, compiled: bool, change) -> list[float]:
    """Five calls of a training-style step; ``change(m, x, lib)`` before the third and fifth."""
    m = lib.nn.Linear(4, 3)
    with lib.no_grad():
        m.weight.copy_(lib.arange(12, dtype=lib.float32).reshape(3, 4) / 10)
        m.bias.fill_(0.5)
    x = lib.ones(5, 4, requires_grad=True)

    def step(x):
        m.zero_grad()
        x.grad = None
        y = m(x)
        y.pow(2).sum().backward()
        return m.weight.grad.sum() + x.grad.sum() + m.bias.grad.sum() + y.sum()

    fn = kiln.compile(step) if compiled else step
    out, handles = [], []
    for call in range(5):
        if call in (2, 4):
            handles.append(change(m, x, lib, handles))
        out.append(float(fn(x).detach()))
    return out


def _weight_hook(m, x, lib, handles):
    return m.weight.register_hook(lambda g: g * 3)


def _bias_hook(m, x, lib, handles):
    return m.bias.register_hook(lambda g: g * 11)


def _argument_hook(m, x, lib, handles):
    return x.register_hook(lambda g: g * 5)


def _post_accumulate_hook(m, x, lib, handles):
    def scale(p):
        p.grad.mul_(7)

    return m.weight.register_post_accumulate_grad_hook(scale)


def _hook_then_removed(m, x, lib, handles):
    """A hook at the third call, removed at the fifth: the calls go back to the first program."""
    if handles:
        handles[0].remove()
        return None
    return m.weight.register_hook(lambda g: g * 3)


def _second_hook(m, x, lib, handles):
    """A second hook beside one the first call was traced with (registered before the first call)."""
    return m.weight.register_hook(lambda g: g + 1)


CHANGES = [_weight_hook, _bias_hook, _argument_hook, _post_accumulate_hook, _hook_then_removed]


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.__name__.strip("_"))
def test_a_hook_registered_between_calls_runs_in_the_next_calls(change):
    eager, compiled = _run(kiln, False, change), _run(kiln, True, change)
    np.testing.assert_allclose(compiled, eager, rtol=1e-6, atol=1e-5)
    assert eager[2] != eager[1]  # the hook changes the result: the case tests something


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.__name__.strip("_"))
def test_a_hook_registered_between_calls_matches_pytorch(torch, change):
    np.testing.assert_allclose(_run(kiln, True, change), _run(torch, False, change), rtol=1e-6, atol=1e-5)


def test_a_second_hook_beside_a_traced_one():
    def run(compiled):
        m = kiln.nn.Linear(4, 3)
        with kiln.no_grad():
            m.weight.fill_(0.25)
            m.bias.zero_()
        m.weight.register_hook(lambda g: g * 2)
        x = kiln.ones(5, 4)

        def step():
            m.zero_grad()
            m(x).pow(2).sum().backward()
            return m.weight.grad.sum()

        fn = kiln.compile(step) if compiled else step
        out = []
        for call in range(4):
            if call == 2:
                _second_hook(m, x, kiln, [])
            out.append(float(fn()))
        return out

    eager = run(False)
    np.testing.assert_allclose(run(True), eager, rtol=1e-6, atol=1e-5)
    assert eager[2] != eager[1]


def test_the_retrace_names_the_hook():
    m = kiln.nn.Linear(2, 2)
    x = kiln.ones(1, 2, requires_grad=True)

    def step(x):
        return m(x).sum()

    fn = kiln.compile(step)
    fn(x)
    m.weight.register_hook(lambda g: g)
    x.register_hook(lambda g: g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn(x)
    reasons = " | ".join(e.detail for e in fn.state.events)
    assert "hooks" in reasons, reasons
    assert len(fn.state.specializations) == 2


def test_hooks_unchanged_cost_no_retrace():
    """Registering and removing hooks on tensors the function never reads leaves its program in use."""
    m = kiln.nn.Linear(2, 2)
    other = kiln.ones(2, requires_grad=True)
    fn = kiln.compile(lambda x: m(x).sum())
    x = kiln.ones(1, 2)
    fn(x)
    other.register_hook(lambda g: g).remove()
    handle = m.weight.register_hook(lambda g: g)
    handle.remove()  # the weight's hooks are those it was traced with again (none)
    fn(x)
    fn(x)
    assert len(fn.state.specializations) == 1
