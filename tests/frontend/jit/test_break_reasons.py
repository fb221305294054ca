"""A trace break names the op that broke it: ``sort``, ``argsort`` and ``topk`` have no compiled form
(kiln has no sort primitive), and the reason says so with the user's line, not "Tensor.numpy()
reads a tensor's values" (kiln issue 35). The calls run eagerly and give eager's values."""

from __future__ import annotations

import os

import numpy as np
import pytest

import kiln

HERE = os.path.basename(__file__)


def _sort(x):
    return x.sort(dim=1, descending=True).values * 2


def _argsort(x):
    return kiln.argsort(x, dim=0) + 1


def _topk(x):
    values, indices = x.topk(2, dim=1)
    return values + 1, indices


@pytest.mark.parametrize(("fn", "op"), [(_sort, "sort"), (_argsort, "argsort"), (_topk, "topk")])
def test_the_break_reason_names_the_op_and_the_line(fn, op):
    compiled = kiln.compile(fn)
    for seed in range(3):
        x = kiln.tensor(np.random.default_rng(seed).standard_normal((3, 4)).astype(np.float32))
        got, expected = compiled(x), fn(x)
        for a, b in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,), strict=True):  # fmt: skip
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    (reason,) = {e.detail for e in compiled.state.events if e.kind == "break"}
    assert reason.startswith(f"{op} has no compiled form"), reason
    assert "numpy" not in reason and f"{HERE}:" in reason and fn.__name__ in reason, reason


def test_fullgraph_raises_naming_the_op():
    with pytest.raises(kiln.jit.TraceBreakError) as info:
        kiln.compile(_topk, fullgraph=True)(kiln.randn(3, 4))
    assert "topk has no compiled form" in str(info.value) and HERE in str(info.value)
