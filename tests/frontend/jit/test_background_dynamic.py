"""A dynamic specialization compiles in the background, as a static one does (``wait=False``).

The call at a second size decides on its own thread whether its program is dynamic (the graphs
compared: ``PendingSpecialization.decide``) and caches its ``PendingEntry`` under the dynamic key;
the lowering runs on the pool. Calls at every size that program will serve run eagerly until it is
ready and trace nothing; a program that comes out static after all serves its own size alone.
Compiles off the caller's thread are held back by an event (``held``), so "meanwhile" is certain;
the caller's thread is never held, so a compile in front of the call (as before) fails the test
instead of hanging it. Every call is compared with the eager function on the same inputs.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kiln
from kiln.frontend.jit import build, symbolic_backward
from kiln.frontend.jit.symbolic_program import Unlowered

from .helpers import array, compiled_calls, state_of

RTOL, ATOL = 1e-5, 1e-6


def background(fn):
    return kiln.compile(fn, wait=False)


@pytest.fixture
def held(monkeypatch):
    """``(release, compiled in front)``: background compiles wait for ``release``; a compile on the
    caller's thread runs at once and is recorded."""
    release, in_front = threading.Event(), []
    original = build.PendingSpecialization.compile

    def compile(self):
        if threading.current_thread() is threading.main_thread():
            in_front.append(self)
        else:
            assert release.wait(60), "the test never released the compile"
        return original(self)

    monkeypatch.setattr(build.PendingSpecialization, "compile", compile)
    yield release, in_front
    release.set()


def rows(n: int, seed: int, width: int = 6) -> kiln.Tensor:
    return kiln.tensor(np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32))


def check(compiled, fn, n: int, seed: int) -> None:
    x = rows(n, seed)
    np.testing.assert_allclose(array(compiled(x)), array(fn(x)), rtol=RTOL, atol=ATOL)


def test_the_call_at_a_second_size_returns_before_its_dynamic_program_compiles(held):
    release, in_front = held
    w = kiln.tensor(np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32))

    def f(x):
        return (x @ w).tanh().sum(1) * 2.0

    g = background(f)
    check(g, f, 8, 1)
    release.set()
    assert kiln.jit.wait_compiled(60)  # the static program for 8
    release.clear()
    check(g, f, 5, 2)  # a second size: traced, decided here, lowered in the background
    state = state_of(g)
    assert in_front == [] and len(state.specializations) == 1
    (entry,) = state.pending
    assert entry.dynamic == [(0, 0)] and entry.key != state.specializations[0].key
    for n, seed in [(3, 3), (9, 4), (5, 5), (2, 6)]:  # every size it will serve runs eagerly, tracing nothing
        check(g, f, n, seed)
    assert len(state.pending) == 1 and len(state.specializations) == 1
    release.set()
    assert kiln.jit.wait_compiled(60)
    for n, seed in [(3, 7), (9, 8), (5, 9), (2, 10), (31, 11), (8, 12)]:
        check(g, f, n, seed)
    assert [s.dynamic for s in state.specializations] == [None, [(0, 0)]]
    assert compiled_calls(g) == [1, 5], "the dynamic program serves every size but the static one's"
    assert "dynamic: argument 0 dim 0" in kiln.explain(g).reasons[1]


def make_model(seed: int):
    kiln.manual_seed(seed)
    model = kiln.nn.Sequential(kiln.nn.Linear(6, 8), kiln.nn.Tanh(), kiln.nn.Linear(8, 2))
    return model, kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def assert_same_parameters(a, b) -> None:
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        np.testing.assert_allclose(array(pa), array(pb), rtol=RTOL, atol=ATOL)
        if pb.grad is not None:
            np.testing.assert_allclose(array(pa.grad), array(pb.grad), rtol=RTOL, atol=ATOL)


def test_gradients_outside_the_call_and_an_optimizer_step_match_eager_before_and_after_the_switch(held):
    """The results need gradients outside the call: the backward too is compared on the caller's
    thread and lowered symbolically in the background."""
    release, in_front = held
    (m_c, opt_c), (m_e, opt_e) = make_model(3), make_model(3)
    g = background(m_c)
    sizes = [8, 8, 5, 3, 9, 5, 8, 2, 13, 5]
    for i, n in enumerate(sizes):
        if i == 2:
            release.set()
            assert kiln.jit.wait_compiled(60)
            release.clear()  # the dynamic program (traced at 5) is held until the call at 8
        if i == 6:
            assert len(state_of(g).pending) == 1 and state_of(g).pending[0].dynamic == [(0, 0)]
            release.set()
            assert kiln.jit.wait_compiled(60)
        x, y = rows(n, i), rows(n, 100 + i, width=2)
        for opt, step in ((opt_c, g), (opt_e, m_e)):
            opt.zero_grad()
            loss = ((step(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
        assert_same_parameters(m_c, m_e)
    specs = state_of(g).specializations
    assert in_front == [] and [s.dynamic for s in specs] == [None, [(0, 0)]]
    assert specs[1].backward.traced.inputs[0].type.symbols, "the backward is symbolic too"
    assert compiled_calls(g) == [1, 3]  # 8 once it was ready; 2, 13, 5 (the dynamic one)


def test_a_program_whose_backward_stays_static_after_all_serves_its_own_size_alone(held, monkeypatch):
    """The backend lowers the backward per size only (as the CUDA one does): found in the background,
    after the entry was cached under the dynamic key. The dynamic key and its dims go, the static
    program serves its own size, and later sizes trace as static programs."""
    release, _ = held

    def per_size_only(*args, **kwargs):
        raise Unlowered("this backend generates code for static sizes only")

    monkeypatch.setattr(symbolic_backward, "lower_symbolic", per_size_only)
    w_c = kiln.tensor(np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32), requires_grad=True)
    w_e = kiln.tensor(array(w_c), requires_grad=True)

    def make(w):
        return lambda x: (x @ w).tanh().square().mean()

    g, f = background(make(w_c)), make(w_e)

    def step(n: int, seed: int) -> None:
        x = rows(n, seed)
        for fn, w in ((g, w_c), (f, w_e)):
            w.grad = None
            fn(x).backward()
        np.testing.assert_allclose(array(w_c.grad), array(w_e.grad), rtol=RTOL, atol=ATOL)

    step(8, 0)
    release.set()
    assert kiln.jit.wait_compiled(60)
    release.clear()
    step(5, 1)
    state = state_of(g)
    (entry,) = state.pending
    assert entry.dynamic == [(0, 0)] and state.dynamic
    step(3, 2)  # eagerly, under the dynamic key
    assert len(state.specializations) == 1
    release.set()
    assert kiln.jit.wait_compiled(60)
    assert state.dynamic == {} and entry.key not in state.cache and state.not_dynamic
    assert [s.dynamic for s in state.specializations] == [None, None]
    for n, seed in [(5, 3), (5, 4), (3, 5), (3, 6), (8, 7), (2, 8)]:
        step(n, seed)
        release.set()
        assert kiln.jit.wait_compiled(60)
    assert all(s.dynamic is None for s in state.specializations) and len(state.specializations) == 4
    assert compiled_calls(g)[:2] == [1, 2], "the static program traced at 5 serves 5 alone"
    assert "its sizes stay static: the backward is lowered per size" in kiln.explain(g).reasons[1]


def test_a_trace_that_cannot_be_dynamic_is_cached_static_before_its_compile_starts(held):
    """The comparison on the caller's thread says static (a slice's stop follows the size): its entry
    is the static key's, and later sizes trace static programs of their own."""
    release, in_front = held

    def f(x):
        return x[: x.shape[0] // 2] * 2.0

    g = background(f)
    check(g, f, 4, 0)
    check(g, f, 6, 1)
    state = state_of(g)
    assert in_front == [] and [e.dynamic for e in state.pending] == [None, None] and state.dynamic == {}
    assert state.not_dynamic
    release.set()
    assert kiln.jit.wait_compiled(60)
    for n, seed in [(4, 2), (6, 3), (10, 4), (10, 5)]:
        check(g, f, n, seed)
        assert kiln.jit.wait_compiled(60)
    assert [s.dynamic for s in state.specializations] == [None, None, None]
    assert sum("its sizes stay static" in r for r in kiln.explain(g).reasons) == 1  # 6 (10 is not compared)


def test_a_dynamic_compile_that_fails_leaves_sizes_to_trace_as_static_programs(held, monkeypatch):
    monkeypatch.delenv("KILN_JIT_STRICT", raising=False)
    release, _ = held
    original = build._lower_symbolic

    def broken(*args, **kwargs):
        raise RuntimeError("the symbolic code generator broke")

    w = kiln.tensor(np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32))

    def f(x):
        return (x @ w).sin().sum(1)

    g = background(f)
    release.set()
    check(g, f, 8, 0)
    assert kiln.jit.wait_compiled(60)
    monkeypatch.setattr(build, "_lower_symbolic", broken)
    with pytest.warns(kiln.CompileWarning, match="the compile failed in the background .*symbolic code generator"):
        check(g, f, 5, 1)
        assert kiln.jit.wait_compiled(60)
    monkeypatch.setattr(build, "_lower_symbolic", original)
    state = state_of(g)
    assert state.dynamic == {} and state.not_dynamic and state.pending == []
    for n, seed in [(5, 2), (5, 3), (3, 4), (3, 5)]:
        check(g, f, n, seed)
        assert kiln.jit.wait_compiled(60)
    assert [s.dynamic for s in state.specializations] == [None, None, None]
    assert compiled_calls(g) == [0, 1, 1]


def test_a_comparison_that_raises_is_said_from_the_background_and_the_call_returns_eagers_result(held, monkeypatch):
    monkeypatch.delenv("KILN_JIT_STRICT", raising=False)
    release, _ = held
    release.set()

    def broken(*args, **kwargs):
        raise RuntimeError("the comparison broke")

    def f(x):
        return x.exp().sum(1)

    g = background(f)
    check(g, f, 8, 0)
    assert kiln.jit.wait_compiled(60)
    monkeypatch.setattr(build, "_symbolic", broken)
    with pytest.warns(kiln.CompileWarning, match="the compile failed in the background .*the comparison broke"):
        check(g, f, 5, 1)  # no exception in the user's call
        assert kiln.jit.wait_compiled(60)
    check(g, f, 5, 2)
    check(g, f, 8, 3)
    assert compiled_calls(g) == [1] and state_of(g).dynamic == {}
