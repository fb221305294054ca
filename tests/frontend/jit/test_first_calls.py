"""A first call that makes state costs no second trace (issue 33, item 5).

An optimizer's first step makes its state (``kiln.jit.make_state``: made outside the trace, so the
program reads and writes it like any captured tensor) and the first ``.grad`` values; whether a
captured tensor's ``.grad`` is set is guarded only where the call reads it before setting it
(``Trace.grad_reads``). Each test counts the traces and compares with eager calls.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend.jit import call_cache

from .helpers import array, compiled_calls, state_of

RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture
def traces(monkeypatch) -> list:
    """One entry per forward trace a compiled function starts."""
    started: list = []

    class Counted(call_cache.Trace):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(call_cache, "Trace", Counted)
    return started


def _training(opt_name: str, zero_grad_of: str = "opt"):
    kiln.manual_seed(7)
    model = kiln.nn.Sequential(kiln.nn.Linear(4, 8), kiln.nn.ReLU(), kiln.nn.Linear(8, 2))
    opt = getattr(kiln.optim, opt_name)(model.parameters(), lr=0.02)

    def step(x, y):
        (opt if zero_grad_of == "opt" else model).zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    return model, opt, step


def _batches(n: int):
    rng = np.random.default_rng(0)
    return [(kiln.tensor(rng.standard_normal((16, 4)).astype(np.float32)),
             kiln.tensor(rng.standard_normal((16, 2)).astype(np.float32))) for _ in range(n)]  # fmt: skip


def test_explain_on_a_fresh_adam_reports_one_specialization(traces):
    _, _, step = _training("Adam")
    x, y = _batches(1)[0]
    report = kiln.explain(step, x, y)
    assert len(report.specializations) == 1 and not report.not_cached, report.summary()
    assert "0 specialization" not in report.summary() and "Calls not cached" not in report.summary()
    assert len(traces) == 1


@pytest.mark.parametrize("opt_name", ["Adam", "AdamW", "RMSprop", "Adagrad", "NAdam", "Adadelta", "ASGD"])
def test_a_fresh_optimizers_first_step_is_the_only_trace(traces, opt_name):
    model_c, opt_c, step_c = _training(opt_name)
    model_e, opt_e, step_e = _training(opt_name)
    f = kiln.compile(step_c)
    for x, y in _batches(5):
        np.testing.assert_allclose(array(f(x, y)), array(step_e(x, y)), rtol=RTOL, atol=ATOL)
    for pc, pe in zip(model_c.parameters(), model_e.parameters(), strict=True):
        np.testing.assert_allclose(array(pc), array(pe), rtol=RTOL, atol=ATOL)
        for key, value in opt_e.state[pe].items():
            np.testing.assert_allclose(array(opt_c.state[pc][key]), array(value), rtol=RTOL, atol=ATOL, err_msg=key)
    assert len(traces) == 1 and compiled_calls(f) == [4], [e.detail for e in state_of(f).events]


def test_model_zero_grad_in_the_step_costs_no_second_trace(traces):
    model_c, _, step_c = _training("Adam", zero_grad_of="model")
    model_e, _, step_e = _training("Adam", zero_grad_of="model")
    f = kiln.compile(step_c)
    for x, y in _batches(4):
        np.testing.assert_allclose(array(f(x, y)), array(step_e(x, y)), rtol=RTOL, atol=ATOL)
    for pc, pe in zip(model_c.parameters(), model_e.parameters(), strict=True):
        np.testing.assert_allclose(array(pc), array(pe), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(array(pc.grad), array(pe.grad), rtol=RTOL, atol=ATOL)
    assert len(traces) == 1 and compiled_calls(f) == [3]


def test_a_compiled_model_does_not_trace_again_when_grad_is_first_set(traces):
    kiln.manual_seed(1)
    model = kiln.nn.Linear(4, 3)
    twin = kiln.nn.Linear(4, 3)
    twin.load_state_dict(model.state_dict())
    compiled = kiln.compile(model)
    for x, _ in _batches(4):
        compiled(x).pow(2).sum().backward()  # accumulates into .grad, which the first call set
        twin(x).pow(2).sum().backward()
        for pc, pe in zip(model.parameters(), twin.parameters(), strict=True):
            np.testing.assert_allclose(array(pc.grad), array(pe.grad), rtol=RTOL, atol=ATOL)
    assert len(traces) == 1 and compiled_calls(compiled) == [3]


def test_a_call_that_reads_grad_is_still_guarded_on_it(traces):
    w = kiln.tensor([1.0, 2.0], requires_grad=True)

    def f(x):
        bonus = 0.0 if w.grad is None else 10.0  # a branch on whether .grad is set
        return x * w.detach() + bonus

    g = kiln.compile(f)
    assert g(kiln.ones(2)).tolist() == f(kiln.ones(2)).tolist() == [1.0, 2.0]
    assert g(kiln.ones(2)).tolist() == [1.0, 2.0]
    w.grad = kiln.ones(2)
    for _ in range(2):
        assert g(kiln.ones(2)).tolist() == f(kiln.ones(2)).tolist() == [11.0, 12.0]
    assert len(traces) == 2 and ".grad is set False -> True" in state_of(g).events[-1].detail


def test_grad_set_to_none_unread_is_cleared_whatever_it_was():
    """Traced with ``.grad`` None, ``w.grad = None`` changes nothing; called with ``.grad`` set, the
    program must still clear it (the call did not read it, so it is no guard)."""
    w = kiln.tensor([1.0, 2.0], requires_grad=True)

    @kiln.compile
    def f(x):
        w.grad = None
        return x * w.detach()

    for call in range(4):
        if call >= 1:
            w.grad = kiln.full((2,), float(call))
        assert f(kiln.ones(2)).tolist() == [1.0, 2.0]
        assert w.grad is None, f"call {call}: .grad was left set"
    assert len(state_of(f).specializations) == 1 and compiled_calls(f) == [3]


def test_make_state_runs_outside_the_trace():
    from kiln.frontend.jit import state

    cache: dict = {}
    born: list = []

    @kiln.compile
    def f(x):
        if "count" not in cache:
            cache["count"] = kiln.jit.make_state(kiln.zeros, ())
            born.append((state.born_in_trace(cache["count"]), state.born_in_trace(x + 1)))
        cache["count"].add_(1)
        return x + cache["count"]

    results = [f(kiln.zeros(2)).tolist() for _ in range(4)]
    assert results == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]
    assert born == [(False, True)]  # state from outside the call; x + 1 is the call's own
    # (the store into the user's dict is a change of Python state the watch cannot tell from one made
    # at every call: that first call is not cached, the second traces; kiln's optimizers are trusted)
    assert len(state_of(f).specializations) == 1 and compiled_calls(f) == [2]
