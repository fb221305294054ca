"""The order statistics and value-dependent names of ``kiln/frontend/ops/order_stats.py`` against
torch (nan rows, ties where torch's choice is documented, integer inputs, keepdim), their
gradients by finite differences in float64, and the trace break that names the op."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck
from tests.conftest import assert_close
from tests.frontend.jit.helpers import check_against_eager

rng = np.random.default_rng(2)
HERE = os.path.basename(__file__)
X = rng.normal(size=(4, 7))
XN = X.copy()
XN[1, 3], XN[2, :], XN[3, [0, 5]] = math.nan, math.nan, math.nan
INTS = rng.integers(0, 3, size=(5, 9))


def _both(torch, name, *args, **kwargs):
    def conv(a, lib):
        return lib.from_numpy(np.array(a)) if isinstance(a, np.ndarray) else a

    return getattr(kiln, name)(*[conv(a, kiln) for a in args], **kwargs), getattr(torch, name)(
        *[conv(a, torch) for a in args], **kwargs
    )


def _same(ours, theirs, indices: bool = True, rtol: float = 1e-12):
    if isinstance(theirs, tuple):
        assert len(ours) == len(theirs)
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if i == 0 or indices:
                _same(a, b, rtol=rtol)
        return
    assert_close(ours, theirs, rtol=rtol, atol=1e-12)


@pytest.mark.parametrize("name", ["median", "nanmedian"])
def test_medians(torch, name):
    for a in (X, XN, X[:, :6]):
        _same(*_both(torch, name, a))
        for dim in (0, 1, -1):
            for keepdim in (False, True):
                # indices of an all-nan row are not specified; elsewhere they match torch's
                _same(*_both(torch, name, a, dim, keepdim), indices=not np.isnan(a).all(axis=dim).any())
    _same(*_both(torch, name, np.array(3.0), 0))
    _same(*_both(torch, name, INTS, 1), indices=False)  # ties: torch's index among equal values is unspecified
    assert math.isnan(getattr(kiln, name)(kiln.zeros(0)).item())
    with pytest.raises(IndexError):
        getattr(kiln, name)(kiln.zeros(2, 0), 1)


def test_kthvalue_mode_msort(torch):
    for k in (1, 3, 7):
        _same(*_both(torch, "kthvalue", X, k, 1))
    _same(*_both(torch, "kthvalue", X, 2, 0, True))
    with pytest.raises(IndexError, match="out of range"):
        kiln.kthvalue(kiln.from_numpy(X), 8)
    _same(*_both(torch, "mode", INTS, 1))  # the smallest of the most frequent, its last position
    _same(*_both(torch, "mode", INTS, 0, True))
    _same(*_both(torch, "mode", np.array([3.0, 1.0, 3.0, 1.0])))
    _same(*_both(torch, "msort", X))


def test_cummax_cummin(torch):
    for a in (X, XN, INTS, np.array([1.0, 3.0, 3.0, 2.0, math.nan, 5.0]), np.array(2.5), np.zeros((0, 2))):
        for dim in range(max(a.ndim, 1)):
            _same(*_both(torch, "cummax", a, dim))
            _same(*_both(torch, "cummin", a, dim))


@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_quantiles(torch, interpolation):
    for q in (0.5, 0.0, 1.0, 0.37, np.array([0.1, 0.5, 0.9]), np.array(0.25)):
        for dim in (None, 0, 1):
            for keepdim in (False, True):
                kw = {"interpolation": interpolation}
                _same(*_both(torch, "quantile", X, q, dim, keepdim, **kw))
                _same(*_both(torch, "quantile", XN, q, dim, keepdim, **kw))
                _same(*_both(torch, "nanquantile", XN, q, dim, keepdim, **kw))
    x32 = X.astype(np.float32)
    _same(*_both(torch, "quantile", x32, 0.3, 1), rtol=1e-6)
    with pytest.raises(RuntimeError, match="range"):
        kiln.quantile(kiln.from_numpy(X), 1.5)
    with pytest.raises(RuntimeError, match="same dtype"):
        kiln.quantile(kiln.from_numpy(X), kiln.tensor([0.5], dtype=kiln.float32))
    with pytest.raises(RuntimeError, match="float or double"):
        kiln.quantile(kiln.tensor([1, 2]), 0.5)


def test_unique_family(torch):
    u = rng.integers(0, 5, size=(3, 4))
    for dim in (None, 0, 1):
        _same(*_both(torch, "unique", u, return_inverse=True, return_counts=True, dim=dim))
    _same(*_both(torch, "unique", u))
    _same(*_both(torch, "unique", XN[1]))
    runs = np.array([1, 1, 2, 2, 3, 1, 1, 2])
    _same(*_both(torch, "unique_consecutive", runs, return_inverse=True, return_counts=True))
    _same(*_both(torch, "unique_consecutive", u[[0, 0, 1, 2]], return_inverse=True, return_counts=True, dim=0))
    _same(*_both(torch, "unique_consecutive", u[:, [0, 0, 1, 1]], return_counts=True, dim=1))
    _same(*_both(torch, "unique", np.zeros(0)))


def test_counting_and_searching(torch):
    b, w = rng.integers(0, 6, size=20), rng.normal(size=20)
    _same(*_both(torch, "bincount", b))
    _same(*_both(torch, "bincount", b, w, minlength=9))
    _same(*_both(torch, "bincount", b, w.astype(np.float32)), rtol=1e-6)  # kiln sums in float64
    _same(*_both(torch, "bincount", np.zeros(0, np.int64)))
    with pytest.raises(RuntimeError, match="non-negative"):
        kiln.bincount(kiln.tensor([1, -1]))
    x32 = X.astype(np.float32)
    for args in [(10, 0, 0), (4, -1, 1), (7, -0.5, 3)]:
        _same(*_both(torch, "histc", x32, *args))
        _same(*_both(torch, "histc", X, *args))
    seq, values = np.sort(rng.integers(0, 10, size=12)).astype(np.float64), np.array([[0.0, 3.0, 5.0, math.nan, 11.0]])
    for right in (False, True):
        _same(*_both(torch, "searchsorted", seq, values, right=right))
        _same(*_both(torch, "bucketize", values, seq, right=right))
        rows, v2 = np.sort(X, 1), rng.normal(size=(4, 3))
        _same(*_both(torch, "searchsorted", rows, v2, right=right, out_int32=True))
    _same(*_both(torch, "searchsorted", np.array([1, 3, 5]), 3))
    _same(*_both(torch, "searchsorted", seq, values, side="right"))
    order = rng.permutation(12)
    sorter = np.argsort(seq[order])
    ours = kiln.searchsorted(kiln.from_numpy(seq[order]), kiln.from_numpy(values), sorter=kiln.from_numpy(sorter))
    _same(
        ours,
        torch.searchsorted(torch.from_numpy(seq[order]), torch.from_numpy(values), sorter=torch.from_numpy(sorter)),
    )


def test_value_gradients():
    def check(fn, shape):
        x = kiln.tensor(rng.normal(size=shape), dtype=kiln.float64, requires_grad=True)
        assert gradcheck(fn, (x,), eps=1e-6, atol=1e-6, rtol=1e-5)

    check(lambda x: kiln.median(x, 1).values, (3, 5))
    check(lambda x: kiln.median(x), (3, 5))
    check(lambda x: kiln.nanmedian(x, 0, keepdim=True).values, (4, 3))
    check(lambda x: kiln.kthvalue(x, 2, 1).values, (3, 5))
    check(lambda x: kiln.cummax(x, 1).values, (3, 5))
    check(lambda x: kiln.cummin(x, 0).values, (4, 3))
    check(lambda x: kiln.quantile(x, kiln.tensor([0.2, 0.7], dtype=kiln.float64), 1), (3, 6))
    check(lambda x: kiln.nanquantile(x, 0.4), (3, 6))
    check(lambda x: kiln.msort(x), (4, 3))


def _order_program(x):
    out = kiln.median(x, 1).values * 2 + kiln.quantile(x, 0.5, 1) + kiln.nanmedian(x, 1, keepdim=True).values.squeeze(1)
    q = kiln.tensor([0.25, 0.75], dtype=x.dtype)
    return out + kiln.kthvalue(x, 2, 1).values + kiln.nanquantile(x, q, 1, interpolation="nearest").sum(0), kiln.median(
        x
    )


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
def test_rank_statistics_compile(backend):
    """median, kthvalue and the quantiles (the sort is an extern node) and cummax/cummin compile, nan rows included."""

    def make_args():
        x = rng.normal(size=(3, 6))
        x[rng.integers(0, 3), rng.integers(0, 6)] = math.nan
        return (kiln.tensor(x),)

    check_against_eager(_order_program, make_args, calls=3, rtol=1e-12, atol=1e-12, fullgraph=True,
                        options=kiln.CompileOptions(backend=backend))  # fmt: skip


def _search_program(seq, rows, values, sorter):
    return (kiln.searchsorted(seq, values), kiln.searchsorted(seq, values, right=True),
            kiln.bucketize(values, seq, out_int32=True), kiln.searchsorted(rows, values.reshape(2, -1), side="right"),
            kiln.searchsorted(seq[sorter], values, sorter=kiln.argsort(seq[sorter])), kiln.searchsorted(seq, 0.5))  # fmt: skip


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
def test_searching_compiles_and_matches_eager(torch, backend):
    def make_args():
        seq = np.sort(rng.integers(0, 6, size=9)).astype(np.float64)  # ties
        rows = np.sort(rng.normal(size=(2, 5)), 1)
        values = np.concatenate([rng.integers(-1, 7, size=5).astype(np.float64), [math.nan]])
        return kiln.tensor(seq), kiln.tensor(rows), kiln.tensor(values), kiln.tensor(rng.permutation(9))

    compiled = check_against_eager(_search_program, make_args, calls=3, rtol=0, atol=0, fullgraph=True,
                                   options=kiln.CompileOptions(backend=backend))  # fmt: skip
    seq, rows, values, sorter = make_args()
    got = compiled(seq, rows, values, sorter)
    t = torch.from_numpy
    assert_close(got[0], torch.searchsorted(t(seq.numpy()), t(values.numpy())), rtol=0, atol=0)
    assert_close(got[1], torch.searchsorted(t(seq.numpy()), t(values.numpy()), right=True), rtol=0, atol=0)
    assert_close(got[2], torch.bucketize(t(values.numpy()), t(seq.numpy()), out_int32=True), rtol=0, atol=0)


def test_compiled_quantile_checks_q():
    compiled = kiln.compile(lambda x, q: kiln.quantile(x, q))
    x = kiln.tensor(rng.normal(size=5))
    compiled(x, kiln.tensor([0.5], dtype=x.dtype))
    with pytest.raises(RuntimeError, match="range"):
        compiled(x, kiln.tensor([1.5], dtype=x.dtype))


@pytest.mark.parametrize(("fn", "op"), [(lambda x: kiln.unique(x) + 1, "unique"),
                                        (lambda x: kiln.bincount((x.abs() * 3).long().flatten()), "bincount"),
                                        (lambda x: kiln.mode(x, 1).values, "mode")])  # fmt: skip
def test_compiled_calls_break_naming_the_op_and_match_eager(fn, op):
    compiled = kiln.compile(fn)
    for seed in range(3):
        x = kiln.tensor(np.random.default_rng(seed).standard_normal((3, 4)))
        np.testing.assert_array_equal(compiled(x).numpy(), fn(x).numpy())
    (reason,) = {e.detail for e in compiled.state.events if e.kind == "break"}
    assert reason.startswith(f"{op} has no compiled form"), reason
    with pytest.raises(kiln.jit.TraceBreakError, match=f"{op} has no compiled form"):
        kiln.compile(fn, fullgraph=True)(kiln.randn(3, 4))


@pytest.mark.parametrize(
    "call",
    [lambda lib, x: lib.median(x), lambda lib, x: lib.kthvalue(x, 1), lambda lib, x: lib.trapezoid(x),
     lambda lib, x: lib.cov(x), lambda lib, x: lib.isin(x, x), lambda lib, x: lib.bucketize(x, x),
     lambda lib, x: lib.renorm(x.reshape(2, 2), 2, 0, 1.0)],
)  # fmt: skip
def test_bool_inputs_are_refused_as_torch(torch, call):
    mask = np.array([True, False, True, True])
    with pytest.raises((RuntimeError, NotImplementedError)):
        call(torch, torch.from_numpy(mask))
    with pytest.raises((RuntimeError, NotImplementedError)):
        call(kiln, kiln.from_numpy(mask))
