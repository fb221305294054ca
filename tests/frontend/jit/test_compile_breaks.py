"""Trace breaks: each value read falls back to eager with its reason and the user's line, logged once;
``fullgraph=True`` raises ``kiln.jit.TraceBreakError`` naming the cause and the line."""

from __future__ import annotations

import inspect
import logging

import numpy as np
import pytest

import kiln

from .helpers import assert_tree_close, clone_tree, events


def _line(fn, marker: str = "# BREAK") -> int:
    lines, start = inspect.getsourcelines(fn)
    for i, text in enumerate(lines):
        if marker in text:
            return start + i
    raise AssertionError(f"no {marker} in {fn.__name__}")


def item(x):
    s = x.sum().item()  # BREAK
    return x * s


def if_bool(x):
    if x.sum() > 0:  # BREAK
        return x + 1
    return x - 1


def to_float(x):
    return x * float(x.max())  # BREAK


def to_int(x):
    return x * int(x.argmax())  # BREAK


def tolist(x):
    values = x.tolist()  # BREAK
    return x + len(values)


def to_numpy(x):
    a = x.numpy()  # BREAK
    return x * a.shape[0]


def printing(x):
    y = x * 2
    print(y)  # BREAK
    return y + 1


def bool_mask(x):
    y = x * 3
    return y[y > 0]  # BREAK


def nonzero(x):
    return kiln.nonzero(x > 0)  # BREAK


# What the reason must name (any of): the cause in words, before " at file:line".
CASES = {
    item: ("item()",),
    if_bool: ("bool(",),
    to_float: ("float(", "item()"),  # float(t) reads through Tensor.item()
    to_int: ("int(", "item()"),
    tolist: ("tolist()",),
    to_numpy: ("numpy()",),
    printing: ("print",),
    bool_mask: ("data-dependent", "nonzero", "mask"),
    nonzero: ("nonzero",),
}


def _names_cause(fn, text: str) -> bool:
    reason = text.split(" at ")[0]
    return any(word in reason for word in CASES[fn])


def _inputs(i: int):
    kiln.manual_seed(i)
    return kiln.randn(4, 3) * (1 if i % 2 else -1)


@pytest.mark.parametrize("fn", list(CASES), ids=lambda f: f.__name__)
def test_break_falls_back_with_reason_and_line_logged_once(fn, caplog, capsys):
    caplog.set_level(logging.WARNING, logger="kiln")
    f = kiln.compile(fn)
    for i in range(4):
        x = _inputs(i)
        expected = fn(clone_tree(x))
        assert_tree_close(f(x), expected, rtol=1e-6, atol=1e-7)
    breaks = events(f, "break")
    assert len(breaks) == 1 and f.state.specializations == []
    line = _line(fn)
    detail = breaks[0].detail
    assert f"test_compile_breaks.py:{line}" in detail, detail
    assert _names_cause(fn, detail), detail
    warnings = [r for r in caplog.records if r.name == "kiln" and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert f":{line}" in warnings[0].getMessage()


@pytest.mark.parametrize("fn", list(CASES), ids=lambda f: f.__name__)
def test_fullgraph_raises_naming_cause_and_line(fn, capsys):
    f = kiln.compile(fn, fullgraph=True)
    with pytest.raises(kiln.jit.TraceBreakError, match="fullgraph") as info:
        f(_inputs(0))
    message = str(info.value)
    assert f"test_compile_breaks.py:{_line(fn)}" in message, message
    assert _names_cause(fn, message.replace("kiln.compile(fullgraph=True): ", "")), message
    # the failed trace left nothing behind: a later eager run of the same code works untraced
    assert_tree_close(fn(_inputs(1)), fn(_inputs(1)), rtol=0, atol=0)


def test_branch_on_value_is_never_baked_in():
    f = kiln.compile(if_bool)
    x_pos = kiln.ones(2, 2)
    for _ in range(3):
        np.testing.assert_array_equal(f(x_pos).numpy(), (x_pos + 1).numpy())
        np.testing.assert_array_equal(f(-x_pos).numpy(), (-x_pos - 1).numpy())


def test_break_after_mutation_still_leaves_eager_state():
    def fn(x):
        x.add_(1)
        s = float(x.sum())  # BREAK
        x.mul_(s)
        return x

    f = kiln.compile(fn)
    for i in range(3):
        x = _inputs(i)
        e = clone_tree(x)
        out = f(x)
        fn(e)
        assert out is x
        np.testing.assert_allclose(x.numpy(), e.numpy(), rtol=1e-6, atol=1e-6)


def test_check_values_does_not_break_and_raises_on_compiled_calls():
    @kiln.compile(fullgraph=True)
    def f(x):
        kiln.jit.check_values(x > -100, ValueError, "too small: {value}", shown=x)
        return x * 2

    for i in range(3):
        x = _inputs(i)
        assert_tree_close(f(x), x * 2, rtol=0, atol=0)
    assert len(f.state.specializations) == 1
    with pytest.raises(ValueError, match="too small: -200.0"):
        f(kiln.full_like(_inputs(0), -200.0))
    assert len(f.state.specializations) == 1  # the compiled program raised: no retrace, no eager run
