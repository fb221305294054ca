"""Fills made in a compiled function (``ones_like``, ``zeros``, ``full``) are one element expanded in
the program, not constants holding every element, and compute what eager does over several calls:
read as masks, written in place, returned."""

from __future__ import annotations

import numpy as np

import kiln

from .helpers import compiled_calls


def _masked_softmax(e, adj):
    # GAT's attention masking: a 92 MB constant per call for its (8, 1700, 1700) scores
    mask = -9e16 * kiln.ones_like(e)
    return kiln.softmax(kiln.where(adj > 0, e, mask), dim=-1)


def _written(x):
    z = kiln.zeros(100, 100)
    z[5:7] = x[:2]
    filled = kiln.full((100, 100), 2.5)
    filled.add_(x)
    return z.sum(0), filled, kiln.full((50, 100), -0.0) * x[:50]


def _largest_constant(f) -> int:
    return max((a.size for a in f.graph.constants.values()), default=0)


def test_a_mask_fill_is_not_a_constant_of_its_size():
    f = kiln.compile(_masked_softmax)
    rng = np.random.default_rng(0)
    for _ in range(4):
        e = kiln.tensor(rng.standard_normal((4, 64, 64), dtype=np.float32))
        adj = kiln.tensor(rng.standard_normal((64, 64), dtype=np.float32))
        np.testing.assert_allclose(f(e, adj).numpy(), _masked_softmax(e, adj).numpy(), rtol=1e-5, atol=1e-7)
    assert compiled_calls(f) == [3]
    assert _largest_constant(f) == 1


def test_fills_written_in_place_and_returned_equal_eager():
    f = kiln.compile(_written)
    rng = np.random.default_rng(1)
    for _ in range(4):
        x = kiln.tensor(rng.standard_normal((100, 100), dtype=np.float32))
        compiled, eager = f(x), _written(x)
        for c, e in zip(compiled, eager, strict=True):
            np.testing.assert_allclose(c.numpy(), e.numpy(), rtol=1e-6, atol=1e-6)
            assert np.array_equal(np.signbit(c.numpy()), np.signbit(e.numpy()))
            c.add_(1.0)  # a result is memory of its own: writing it changes no later call
    assert compiled_calls(f) == [3]
    assert _largest_constant(f) <= 200  # (an index table of the row assignment; no fill of 10,000)
