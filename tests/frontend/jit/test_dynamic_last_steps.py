"""Steps read from either end of a dynamic length (``out[:, -1]``, ``y[:, -3:]``, ``y[:, 1:-1]``, a CLS
token ``out[:, 0]``): a sequence model that reads them compiles once more for every length (issue 33,
items 2 and 5), forward and backward, its results and gradients equal to eager's at each length.

Before, the slice's start ``T-1`` was no known distance from its stop ``T`` (``_difference``), its
gradient, a pad by ``T-1``, had no symbolic shape, and a whole stop on a symbolic dim (``0:1``) was
refused: the call stayed static, one trace per length. A whole stop past the first two steps still is.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.ir.primitives.movement import _difference
from kiln.ir.types import Sym, sym_sum
from tests.conftest import assert_close

rng = np.random.default_rng(3)
T, U = Sym("T"), Sym("U")


def f32(*shape) -> np.ndarray:
    return rng.normal(size=shape).astype(np.float32)


def test_the_distance_from_a_start_to_a_stop_of_one_length():
    assert _difference(T, sym_sum([T], -1)) == 1  # y[:, -1]
    assert _difference(sym_sum([T], 2), sym_sum([T], -1)) == 3
    assert _difference(sym_sum([T, U], 0), U) == T
    assert _difference(sym_sum([T], -1), T) is None  # negative: not a size
    assert _difference(U, sym_sum([T], -1)) is None  # no known distance
    assert _difference(sym_sum([T], 0, 2), sym_sum([T], -1)) is None  # floor-divided


def _steps(kind: str):
    """A training-style call over ``(B, T, 4)`` that reads steps counted from the end: the loss and
    the weight's gradient."""
    kiln.manual_seed(0)
    w = nn.Parameter(kiln.randn(4, 4) * 0.5)

    def f(x):
        y = kiln.tanh(x @ w)
        if kind == "last":
            picked = y[:, -1]
        elif kind == "last_three":
            picked = y[:, -3:]
        elif kind == "inner":
            picked = y[:, 1:-1]
        elif kind == "first":  # a CLS token
            picked = y[:, 0] * 3 + y[:, 1]
        elif kind == "first_two":
            picked = y[:, :2]
        else:  # the second to last, and the last
            picked = y[:, -2] * 2 + y[:, -1]
        loss = (picked * picked).sum()
        loss.backward()
        grad = w.grad.clone()
        w.grad = None
        return loss.detach(), grad

    return f


@pytest.mark.parametrize("kind", ["last", "last_three", "inner", "second_to_last", "first", "first_two"])
@pytest.mark.parametrize("backend", ["interpreter", "llvm"])
def test_steps_from_the_end_of_a_varying_length_compile_once_more(kind, backend):
    f = _steps(kind)
    compiled = kiln.compile(f, options=kiln.CompileOptions(backend=backend))
    lengths = [5, 7, 4, 9, 12, 6, 5]
    for t in lengths:
        x = kiln.tensor(f32(3, t, 4))
        for got, want in zip(compiled(x), f(x), strict=True):
            assert_close(got, want, rtol=1e-5, atol=1e-6)
    specs = compiled.state.specializations
    assert len(specs) == 2 and specs[1].dynamic == [(0, 1)], [e.detail for e in compiled.state.events]
    assert specs[1].calls >= 4  # 4, 9, 12, 6: one program for every length after the trace


def test_a_classifier_on_the_last_hidden_state_trains_over_varying_lengths_as_eager():
    def build():
        kiln.manual_seed(1)
        rnn, head = nn.GRU(4, 8, batch_first=True), nn.Linear(8, 3)
        opt = kiln.optim.Adam([*rnn.parameters(), *head.parameters()], lr=0.01)

        def step(x, y):
            out, _ = rnn(x)
            loss = nn.functional.cross_entropy(head(out[:, -1]), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()

        return [*rnn.parameters(), *head.parameters()], step

    (params, step), (eager_params, eager_step) = build(), build()
    compiled = kiln.compile(step)
    for t in [6, 6, 9, 4, 11, 7, 9]:
        x, y = kiln.tensor(f32(5, t, 4)), kiln.tensor(rng.integers(0, 3, 5))
        assert_close(compiled(x, y), eager_step(x, y), rtol=1e-5, atol=1e-6)
    for p, q in zip(params, eager_params, strict=True):
        assert_close(p, q, rtol=1e-4, atol=1e-6)
    lengths = [s.dynamic for s in compiled.state.specializations if s.dynamic]
    assert lengths == [[(0, 1)]], [e.detail for e in compiled.state.events]


def test_a_whole_stop_past_the_first_two_steps_keeps_the_call_static():
    # a dynamic program serves every length >= 2, and x[:, :3] of a length 2 has 2 steps, not 3
    def f(x):
        return x[:, :3] * 2.0

    compiled = kiln.compile(f)
    for t in [5, 7, 9, 4]:
        x = kiln.tensor(f32(2, t, 3))
        assert_close(compiled(x), f(x), rtol=1e-6, atol=1e-7)
    assert all(s.dynamic is None for s in compiled.state.specializations)
    assert "slice over a symbolic size" in kiln.explain(compiled).reasons[1]
