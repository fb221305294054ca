"""The indexing, integer and predicate names of ``kiln/frontend/ops/more_indexing.py`` against
torch, their gradients by finite differences in float64, compiled against eager on both
backends, and the trace break of the integer ops kiln runs with numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck
from tests.conftest import assert_close
from tests.frontend.jit.helpers import check_against_eager

rng = np.random.default_rng(3)
X = rng.normal(size=(4, 5))


def _pair(torch, a):
    return kiln.from_numpy(np.array(a)), torch.from_numpy(np.array(a))


def _same(ours, theirs):
    if isinstance(theirs, tuple | list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            _same(a, b)
    elif hasattr(theirs, "numpy"):
        assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    else:
        assert ours == theirs


def test_copies_into_slices(torch):
    x, tx = _pair(torch, X)
    idx, tidx = _pair(torch, np.array([3, 0]))
    for dim, shape in ((1, (4, 2)), (0, (2, 5))):
        s, ts = _pair(torch, rng.normal(size=shape))
        _same(x.index_copy(dim, idx, s), tx.index_copy(dim, tidx, ts))
    _same(kiln.index_fill(x, 1, idx, -2.0), torch.index_fill(tx, 1, tidx, -2.0))
    neg, tneg = _pair(torch, np.array([-1]))
    _same(
        x.index_fill(0, neg, kiln.tensor(5.0, dtype=kiln.float64)),
        tx.index_fill(0, tneg, torch.tensor(5.0, dtype=torch.float64)),
    )
    mask, tmask = _pair(torch, rng.random(size=(4, 5)) > 0.5)
    source, tsource = _pair(torch, rng.normal(size=30))
    _same(x.masked_scatter(mask, source), tx.masked_scatter(tmask, tsource))
    _same(x.masked_scatter(mask[0], source), tx.masked_scatter(tmask[0], tsource))  # a broadcast mask
    column, tcolumn = _pair(torch, rng.normal(size=4))
    _same(kiln.select_scatter(x, column, 1, -2), torch.select_scatter(tx, tcolumn, 1, -2))
    for dim, start, end, step in [(1, 1, 4, 2), (0, None, None, 2), (1, -3, None, 1)]:
        shape = list(X.shape)
        shape[dim] = len(range(X.shape[dim])[slice(start, end, step)])
        s, ts = _pair(torch, rng.normal(size=shape))
        _same(kiln.slice_scatter(x, s, dim, start, end, step), torch.slice_scatter(tx, ts, dim, start, end, step))
    with pytest.raises(RuntimeError, match="same dtype"):
        x.index_copy(1, idx, kiln.zeros(4, 2))


@pytest.mark.parametrize("reduce", ["sum", "mean", "prod", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(torch, reduce, include_self):
    index, tindex = _pair(torch, rng.integers(0, 4, size=(3, 5)))
    for base, src in (
        (X, rng.normal(size=(3, 5))),
        (rng.integers(-9, 9, size=(4, 5)), rng.integers(-9, 9, size=(3, 5))),
    ):
        (b, tb), (s, ts) = _pair(torch, base), _pair(torch, src)
        _same(kiln.scatter_reduce(b, 0, index, s, reduce, include_self=include_self),
              torch.scatter_reduce(tb, 0, tindex, ts, reduce, include_self=include_self))  # fmt: skip
    if reduce in ("prod", "amax", "amin"):
        with pytest.raises(RuntimeError, match="no gradient"):
            kiln.scatter_reduce(kiln.from_numpy(X).requires_grad_(), 0, index, kiln.from_numpy(src * 1.0), reduce)


def test_unravel_pdist_integers_predicates(torch):
    flat, tflat = _pair(torch, np.array([0, 7, 22, 59]))
    _same(kiln.unravel_index(flat, (3, 4, 5)), torch.unravel_index(tflat, (3, 4, 5)))
    _same(kiln.unravel_index(kiln.tensor(7), (3, 4)), torch.unravel_index(torch.tensor(7), (3, 4)))
    x, tx = _pair(torch, X)
    for p in (2.0, 1.0, math.inf, 0.5):
        _same(kiln.pdist(x, p), torch.pdist(tx, p))
    (a, ta), (b, tb) = _pair(torch, rng.integers(-20, 20, size=10)), _pair(torch, rng.integers(-20, 20, size=10))
    for name in ("gcd", "lcm", "bitwise_and", "bitwise_or", "bitwise_xor"):
        _same(getattr(kiln, name)(a, b), getattr(torch, name)(ta, tb))
        _same(getattr(a, name)(b), getattr(ta, name)(tb))
        if name.startswith("bitwise"):
            _same(getattr(kiln, name)(a > 0, b > 0), getattr(torch, name)(ta > 0, tb > 0))
    _same(kiln.bitwise_not(a), torch.bitwise_not(ta))
    _same(kiln.bitwise_not(a > 0), torch.bitwise_not(ta > 0))
    _same(kiln.bitwise_and(a, 6), torch.bitwise_and(ta, 6))
    with pytest.raises(RuntimeError, match="not implemented"):
        kiln.gcd(kiln.tensor([1.0]), kiln.tensor([2.0]))
    special = np.array([0.0, -0.0, 1.5, -3.0, 1e-310, math.inf, math.nan, 8.0])
    for dtype in (np.float64, np.float32):
        _same(kiln.frexp(kiln.from_numpy(special.astype(dtype))), torch.frexp(torch.from_numpy(special.astype(dtype))))
    _same(kiln.angle(kiln.from_numpy(special)), torch.angle(torch.from_numpy(special)))
    _same(kiln.angle(a), torch.angle(ta))
    assert kiln.tensor([0.5]).is_nonzero() and not kiln.tensor(0).is_nonzero()
    with pytest.raises(RuntimeError, match="more than one"):
        kiln.tensor([1, 2]).is_nonzero()
    assert x.is_same_size(x) and not x.is_same_size(x[0])
    assert x.is_signed() and not kiln.tensor([1], dtype=kiln.uint8).is_signed()
    assert x.get_device() == tx.get_device() == -1
    assert tuple(x.new_empty_strided((2, 3), (3, 1)).shape) == (2, 3)


def test_gradients():
    def check(fn, *arrays):
        inputs = tuple(kiln.tensor(a, dtype=kiln.float64, requires_grad=True) for a in arrays)
        assert gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)

    index = kiln.tensor([3, 0])
    check(lambda x, s: kiln.index_copy(x, 1, index, s), X, rng.normal(size=(4, 2)))
    check(lambda x: kiln.index_fill(x, 0, index, 1.5), X)
    mask = kiln.from_numpy(rng.random(size=(4, 5)) > 0.5)
    check(lambda x, s: x.masked_scatter(mask, s), X, rng.normal(size=25))
    check(lambda x, s: kiln.select_scatter(x, s, 0, 1), X, rng.normal(size=5))
    check(lambda x, s: kiln.slice_scatter(x, s, 1, 0, 5, 2), X, rng.normal(size=(4, 3)))
    scatter_index = kiln.from_numpy(rng.integers(0, 4, size=(3, 5)))
    for reduce in ("sum", "mean"):
        check(
            lambda x, s, r=reduce: kiln.scatter_reduce(x, 0, scatter_index, s, r, include_self=False),
            X,
            rng.normal(size=(3, 5)),
        )
    check(lambda x: kiln.pdist(x), X)


def _program(x, mask, source, index):
    y = x.masked_scatter(mask, source) + kiln.index_copy(x, 0, index, x[:2] * 2)
    y = y + kiln.scatter_reduce(x, 0, index.unsqueeze(1).expand(2, 5), x[:2], "mean", include_self=False)
    rows, cols = kiln.unravel_index(index * 3, (2, 5))
    return y + kiln.pdist(x).sum() + kiln.angle(x) + (rows + cols).sum()


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
def test_compiled_matches_eager(backend):
    def make_args():
        return (kiln.tensor(rng.normal(size=(4, 5))), kiln.from_numpy(rng.random(size=(4, 5)) > 0.5),
                kiln.tensor(rng.normal(size=20)), kiln.tensor([3, 1]))  # fmt: skip

    check_against_eager(_program, make_args, calls=3, rtol=1e-5, atol=1e-5, fullgraph=True,
                        options=kiln.CompileOptions(backend=backend))  # fmt: skip


def test_integer_ops_break_the_trace_naming_the_op():
    def fn(a, b):
        return kiln.gcd(a, b) + 1

    compiled = kiln.compile(fn)
    for _ in range(3):
        a, b = kiln.from_numpy(rng.integers(1, 50, size=6)), kiln.from_numpy(rng.integers(1, 50, size=6))
        np.testing.assert_array_equal(compiled(a, b).numpy(), fn(a, b).numpy())
    (reason,) = {e.detail for e in compiled.state.events if e.kind == "break"}
    assert reason.startswith("gcd has no compiled form"), reason


def test_argwhere(torch):
    for a in (np.array([[1, 0], [0, 3]]), np.array([0.0, 2.0, math.nan]), np.array(5), np.array(0), np.zeros((2, 0))):
        ours, theirs = _pair(torch, a)
        _same(kiln.argwhere(ours), torch.argwhere(theirs))
        _same(ours.argwhere(), theirs.argwhere())
