"""An optimizer's state changed between compiled calls by the Python paths to it: ``opt.state.clear()``,
``del opt.state[p]``, ``opt.load_state_dict(...)``. The compiled step reads the moments as captured
tensors, found by identity; before, only the per-parameter dicts holding them were guarded, so after
``opt.state.clear()`` the compiled calls went on updating the old moments (which the guards kept alive)
and never made new state, where eager starts again from zeros (the clear and del cases fail on that
code; so do the load cases, whose compiled calls went on updating the old state's tensors)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import kiln


def _change(kind: str, lib, opt, m, saved):
    if kind == "clear":
        opt.state.clear()
    elif kind == "del":
        del opt.state[m.weight]
    elif kind == "load":
        opt.load_state_dict(saved)
    elif kind == "reload":  # a checkpoint round trip: new tensors in a new ``opt.state``, the same values
        opt.load_state_dict(copy.deepcopy(opt.state_dict()))


def _run(lib, compiled: bool, optimizer: str, kind: str) -> tuple[list[float], np.ndarray]:
    m = lib.nn.Linear(3, 2)
    with lib.no_grad():
        m.weight.copy_(lib.tensor([[0.1, 0.2, 0.3], [0.4, -0.5, 0.6]]))
        m.bias.fill_(0.1)
    if optimizer == "adam":
        opt = lib.optim.Adam(m.parameters(), lr=0.1)
    else:
        opt = lib.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    x = lib.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])

    def step():
        opt.zero_grad()
        loss = m(x).pow(2).sum()
        loss.backward()
        opt.step()
        return loss

    fn = kiln.compile(step) if compiled else step
    out, saved = [], None
    for call in range(7):
        if call == 2:
            saved = opt.state_dict()
        if call == 4:
            _change(kind, lib, opt, m, saved)
        out.append(float(fn().detach()))
    state = [float(v.sum()) for _, v in sorted(opt.state[m.weight].items())]  # the state eager left (the moments, step)
    return out + state, m.weight.detach().numpy().copy()


CASES = [(o, k) for o in ("adam", "sgd") for k in ("clear", "del", "load", "reload")]


@pytest.mark.parametrize(("optimizer", "kind"), CASES)
def test_compiled_steps_follow_a_replaced_state_as_eager_does(optimizer, kind):
    (eager, w_eager), (compiled, w_compiled) = _run(kiln, False, optimizer, kind), _run(kiln, True, optimizer, kind)
    np.testing.assert_allclose(compiled, eager, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w_compiled, w_eager, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("optimizer", "kind"), CASES)
def test_compiled_steps_after_a_replaced_state_match_pytorch(torch, optimizer, kind):
    (ours, w_ours), (theirs, w_theirs) = _run(kiln, True, optimizer, kind), _run(torch, False, optimizer, kind)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w_ours, w_theirs, rtol=1e-4, atol=1e-5)


def test_the_retrace_says_which_state_changed():
    m = kiln.nn.Linear(3, 2)
    opt = kiln.optim.Adam(m.parameters(), lr=0.1)
    x = kiln.ones(4, 3)

    def step():
        opt.zero_grad()
        m(x).sum().backward()
        opt.step()

    fn = kiln.compile(step)
    fn()
    fn()
    opt.state.clear()
    fn()
    reasons = [e.detail for e in fn.state.events]
    assert any("tensor of shape (2, 3)" in r for r in reasons), reasons
