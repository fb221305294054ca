"""torch.compiler's names on ``kiln.compiler`` (kiln/jit.py): what a PyTorch program calls there
ports by changing the import, compiled against eager over several calls."""

from __future__ import annotations

import numpy as np

import kiln
import kiln.compiler
from kiln.jit import TORCH_COMPILER_NAMES

from .helpers import compiled_calls, events

RTOL, ATOL = 1e-6, 1e-7


def test_the_names_are_torch_compilers(torch):
    for name in TORCH_COMPILER_NAMES:
        assert callable(getattr(kiln.compiler, name)) and callable(getattr(torch.compiler, name)), name


def test_is_compiling_is_true_in_the_trace_and_its_compiled_calls_keep_that_branch():
    def f(x):
        return x * 2 if kiln.compiler.is_compiling() else x * 3

    g = kiln.compile(f, wait=True)
    x = kiln.ones(3)
    assert [g(x).tolist() for _ in range(3)] == [[2.0] * 3] * 3  # torch.compile's too
    assert f(x).tolist() == [3.0] * 3 and not kiln.compiler.is_compiling()
    assert sum(compiled_calls(g)) == 2


def test_a_disabled_function_makes_the_call_run_eagerly_and_says_why():
    seen = []

    @kiln.compiler.disable(reason="appends to a log")
    def log(x):
        seen.append(float(x.sum()))
        return x

    def step(x):
        return log(x * 2) + 1

    g = kiln.compile(step, wait=True)
    for i in range(3):
        x = kiln.full((3,), float(i))
        np.testing.assert_allclose(g(x).numpy(), step(x).numpy(), rtol=RTOL, atol=ATOL)
    assert seen == [0.0, 0.0, 6.0, 6.0, 12.0, 12.0]  # every call ran it, compiled or not
    assert compiled_calls(g) == []
    assert "log is marked torch.compiler.disable (appends to a log)" in events(g)[0].detail
    assert kiln.compile(log) is log and kiln.compiler.disable(step)(kiln.ones(1)).tolist() == [3.0]


def test_reset_forgets_what_was_compiled():
    g = kiln.compile(lambda x: x * 2, wait=True)
    x = kiln.ones(2)
    g(x), g(x)
    assert len(g.state.specializations) == 1
    kiln.compiler.reset()
    assert g.state.specializations == [] and g(x).tolist() == [2.0, 2.0]
    assert len(g.state.specializations) == 1 and g(x).tolist() == [2.0, 2.0]


def test_the_rest_return_what_they_are_given():
    def f(x):
        return x

    assert kiln.compiler.allow_in_graph(f) is f and kiln.compiler.assume_constant_result(f) is f
    assert kiln.compiler.cudagraph_mark_step_begin() is None


def test_deterministic_algorithms_read_in_a_trace_are_a_guard():
    def f(x):
        return x * (2.0 if kiln.are_deterministic_algorithms_enabled() else 3.0)

    g = kiln.compile(f, wait=True)
    try:
        for mode in (False, True, True, False):
            kiln.use_deterministic_algorithms(mode)
            assert g(kiln.ones(2)).tolist() == f(kiln.ones(2)).tolist()
            assert kiln.are_deterministic_algorithms_enabled() is mode
    finally:
        kiln.use_deterministic_algorithms(False)
    assert "use_deterministic_algorithms' mode changed: False -> True" in events(g)[1].detail
    assert not kiln.is_deterministic_algorithms_warn_only_enabled()


def test_reset_while_a_compile_runs_in_the_background(caplog):
    g = kiln.compile(lambda x: x * 3 + 1, wait=False)
    x = kiln.ones(4)
    assert g(x).tolist() == [4.0] * 4  # traced; its program compiles in the background
    kiln.compiler.reset()  # waits for it, then forgets it
    assert g.state.specializations == [] and not g.state.pending
    for _ in range(3):
        assert g(x).tolist() == [4.0] * 4
    assert kiln.jit.wait_compiled() and len(g.state.specializations) == 1
    # (without the wait, the first compile settled into the state reset made, and raised in its thread)
    assert "a background compile raised" not in caplog.text
