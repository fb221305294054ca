"""Sorting inside compiled code (issue 33: programs compile whole): ``sort``, ``argsort``, ``topk`` and
``randperm`` order with the ``argsort`` primitive, an extern node of the compiled program, so a call
that sorts compiles -- before, each stopped the trace and the call ran eagerly.

Compiled calls must equal eager ones exactly over several calls (ties keep their order, nan sorts as
the largest value), the values' gradients too, ``randperm`` must draw eager's permutation and leave
the generator where eager leaves it, and a varying batch must make one dynamic program.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend.autograd import gradcheck

from .helpers import compiled_calls

RNG = np.random.default_rng(0)


def _inputs(n: int, rows: int = 3) -> list:
    out = []
    for _ in range(n):
        x = RNG.integers(-2, 3, size=(rows, 5)).astype(np.float32)  # ties
        x[0, RNG.integers(0, 5)] = np.nan
        out.append(kiln.tensor(x))
    return out


def _sort(x):
    return x.sort(dim=1, descending=True).values * 2, kiln.argsort(x, dim=0)


def _topk(x):
    values, indices = x.topk(2, dim=1)
    smallest = kiln.topk(x, 3, dim=1, largest=False)
    return values + 1, indices, smallest.values, smallest.indices


@pytest.mark.parametrize("fn", [_sort, _topk], ids=["sort", "topk"])
@pytest.mark.parametrize("backend", ["interpreter", "llvm"])
def test_sorting_compiles_and_equals_eager(fn, backend):
    compiled = kiln.compile(fn, fullgraph=True, options=kiln.CompileOptions(backend=backend))
    for x in _inputs(4):
        for a, b in zip(compiled(x), fn(x), strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert compiled_calls(compiled) == [3]


def test_the_gradient_of_sorted_and_top_values_equals_eager_and_finite_differences():
    def loss(x):
        values = x.sort(dim=-1).values
        top = x.topk(2, dim=0).values
        return (values * kiln.arange(1.0, 6.0, dtype=x.dtype)).sum() + (top**2).sum()

    def step(x):
        x = x.detach().requires_grad_()
        loss(x).backward()
        return x.grad

    compiled = kiln.compile(step)
    for _ in range(3):
        x = kiln.tensor(RNG.standard_normal((4, 5)))
        np.testing.assert_allclose(compiled(x).numpy(), step(x).numpy(), rtol=1e-12, atol=1e-12)
    assert sum(compiled_calls(compiled)) == 2
    assert gradcheck(loss, (kiln.tensor(RNG.standard_normal((4, 5)), requires_grad=True),))


def _mix(x):
    """mixup: each row mixed with the row a random permutation puts there."""
    perm = kiln.randperm(x.shape[0])
    return 0.7 * x + 0.3 * x[perm], perm


def test_randperm_in_a_compiled_call_draws_eagers_permutation():
    inputs = [kiln.tensor(RNG.standard_normal((6, 2)).astype(np.float32)) for _ in range(4)]

    def runs(fn):
        kiln.manual_seed(11)
        out = []
        for x in inputs:
            mixed, perm = fn(x)
            out.append((mixed.numpy().copy(), perm.numpy().copy(), kiln.get_rng_state().numpy().copy()))
        return out, kiln.rand(2).numpy()

    compiled = kiln.compile(_mix, fullgraph=True)
    got, expected = runs(compiled), runs(_mix)
    for g, e in zip(got[0], expected[0], strict=True):
        for a, b in zip(g, e, strict=True):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got[1], expected[1])
    assert compiled_calls(compiled) == [3]
    assert len({tuple(p) for _, p, _ in got[0]}) > 1  # a fresh permutation per call


def test_sorting_over_a_varying_batch_makes_one_dynamic_program():
    def f(x):
        return x.sort(dim=1).values.cumsum(1), x.topk(2, dim=1).indices

    compiled = kiln.compile(f)
    for rows in (4, 4, 7, 2, 9, 5):
        x = _inputs(1, rows)[0]
        for a, b in zip(compiled(x), f(x), strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    specs = compiled.state.specializations
    assert len(specs) == 2 and specs[1].dynamic == [(0, 0)] and specs[1].calls == 3, compiled.state.events
