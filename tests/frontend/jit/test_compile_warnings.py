"""What kiln.compile did instead of compiling is said by default: a CompileWarning once per function
and reason, pointing at the user's call (kiln's logger has only a NullHandler, so a log record alone
never reached a user with default logging)."""

from __future__ import annotations

import inspect
import time
import warnings

import numpy as np
import pytest

import kiln


def test_a_trace_break_warns_once_at_the_users_call():
    @kiln.compile
    def f(x):
        return x * x.sum().item()

    with pytest.warns(kiln.CompileWarning, match=r"running eagerly: the trace stopped: Tensor.item\(\)") as record:
        for _ in range(3):
            f(kiln.ones(2))  # the line the warning points at
    lines, first = inspect.getsourcelines(test_a_trace_break_warns_once_at_the_users_call)
    call = first + next(i for i, line in enumerate(lines) if "the line the warning points at" in line)
    assert len(record) == 1
    assert record[0].filename == __file__ and record[0].lineno == call


def test_a_branch_on_a_tensor_warns_once():
    @kiln.compile
    def f(x):
        if x.sum() > 0:  # if tensor: the trace stops, the call finishes eagerly
            return x * 2
        return -x

    with pytest.warns(kiln.CompileWarning, match=r"running eagerly: the trace stopped: bool\(Tensor\)") as record:
        for sign in (1, -1, 1):
            assert f(kiln.ones(2) * sign).tolist() == ([2.0, 2.0] if sign > 0 else [1.0, 1.0])
    assert sum("bool(Tensor)" in str(w.message) for w in record) == 1


def test_the_recompile_limit_says_calls_now_run_eagerly():
    g = kiln.compile(lambda x: x + 1.0, options=kiln.CompileOptions(recompile_limit=1))
    with pytest.warns(kiln.CompileWarning, match="now run eagerly") as record:
        for n in (1, 2, 3, 4):
            assert g(kiln.ones(n)).tolist() == [2.0] * n
    assert sum("limit of 1 specializations" in str(w.message) for w in record) == 1


def test_an_int_argument_that_changes_at_every_call_is_told_to_be_a_tensor():
    x = kiln.randn(4)

    def f(x, t):
        return x * 0.99**t + x.mean() * t

    g = kiln.compile(f, options=kiln.CompileOptions(recompile_limit=2), wait=True)
    with pytest.warns(kiln.CompileWarning, match=r"an int argument \(argument 1\) is compiled for each of its values"):
        for t in range(4):
            np.testing.assert_allclose(g(x, t).numpy(), f(x, t).numpy(), rtol=1e-6, atol=1e-7)
    # as the warning says: a 0-d tensor is read at each call, one program for every value
    g = kiln.compile(f, wait=True)
    for t in range(6):
        np.testing.assert_allclose(g(x, kiln.tensor(t)).numpy(), f(x, t).numpy(), rtol=1e-6, atol=1e-7)
    assert len(g.state.specializations) == 1


def test_the_warning_is_silenced_as_any_warning():
    @kiln.compile
    def h(x):
        return x * float(x.sum())

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=kiln.CompileWarning)
        assert h(kiln.ones(2)).tolist() == [2.0, 2.0]


def test_a_compile_that_takes_long_says_so(monkeypatch):
    from kiln.frontend.jit import call_cache as compiler

    build = compiler.build_specialization

    def slow_build(*args, **kwargs):
        time.sleep(0.3)  # a compile longer than the notice's threshold, whatever the disk cache holds
        return build(*args, **kwargs)

    monkeypatch.setattr(compiler, "SLOW_COMPILE_SECONDS", 0.05)
    monkeypatch.setattr(compiler, "build_specialization", slow_build)

    @kiln.compile
    def f(x):
        return (x.exp() + 1).log().sum()

    with pytest.warns(
        kiln.CompileWarning, match=r"compiling \S*f \(\d+ nodes\)\.\.\. over 0.05 s so far; this call"
    ) as record:
        assert f(kiln.ones(64)).item() == pytest.approx(64 * float(np.log(np.e + 1)), rel=1e-5)
    assert record[0].filename == __file__


def test_a_quick_compile_says_nothing():
    @kiln.compile
    def g(x):
        return x + 1.0

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g(kiln.ones(3))
