"""The shape and product torch.* names (``more_shape.py``, ``more_linalg.py``, ``more_reductions.py``)
against torch: shapes, dtypes and values, including empty, 0-d and integer inputs; gradients
by finite differences in float64; compiled against eager on both backends."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck
from tests.conftest import assert_close
from tests.frontend.jit.helpers import check_against_eager

rng = np.random.default_rng(1)


def _k(a):
    return kiln.from_numpy(np.array(a))


def _same(ours, theirs, rtol=1e-12, atol=1e-12):
    if isinstance(theirs, tuple | list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            _same(a, b, rtol, atol)
        return
    assert_close(ours, theirs, rtol=rtol, atol=atol)


def _both(torch, name, *arrays, **kwargs):
    """kiln.name and torch.name on the same arrays (non-arrays passed as they are)."""
    ours = getattr(kiln, name)(*[_k(a) if isinstance(a, np.ndarray) else a for a in arrays], **kwargs)
    theirs = getattr(torch, name)(
        *[torch.from_numpy(np.array(a)) if isinstance(a, np.ndarray) else a for a in arrays], **kwargs
    )
    return ours, theirs


A, B, V, S, C3 = (
    rng.normal(size=(3, 4)),
    rng.normal(size=(3, 4)),
    rng.normal(size=5),
    np.array(2.0),
    rng.normal(size=(2, 3, 4)),
)
INTS = rng.integers(-4, 5, size=(3, 5))


@pytest.mark.parametrize("name", ["hstack", "vstack", "dstack", "column_stack", "row_stack"])
def test_stacks(torch, name):
    for pair in [(A, B), (V, V), (S, S), (C3, C3), (INTS[:, :4], A)]:
        if name in ("column_stack",) and pair[0].ndim == 3:
            continue
        ours = getattr(kiln, name)([_k(x) for x in pair])
        theirs = getattr(torch, name)([torch.from_numpy(np.array(x)) for x in pair])
        _same(ours, theirs)
    for fn in ("atleast_1d", "atleast_2d", "atleast_3d"):
        for x in (S, V, A, C3):
            _same(*_both(torch, fn, x))


def test_splits_flips_rotations(torch):
    for sections in (2, 3, 5, [1, 3], [0, -1], [2, 10], [3, 1]):
        _same(*_both(torch, "tensor_split", C3, sections, 2))
    _same(*_both(torch, "tensor_split", V, np.array([1, 3])))
    _same(*_both(torch, "hsplit", A, 2))
    _same(*_both(torch, "vsplit", C3, [1]))
    _same(*_both(torch, "dsplit", C3, 2))
    _same(_k(V).split_with_sizes([2, 3]), torch.from_numpy(V).split_with_sizes([2, 3]))
    with pytest.raises(RuntimeError, match="divisible"):
        kiln.hsplit(_k(A), 3)
    _same(*_both(torch, "fliplr", A))
    _same(*_both(torch, "flipud", C3))
    for k in range(-5, 6):
        for dims in [(0, 1), (1, 0), (2, 0), (-1, 1)]:
            _same(*_both(torch, "rot90", C3, k, dims))
    with pytest.raises(RuntimeError, match="different"):
        kiln.rot90(_k(A), 1, (0, 0))


def test_diff_ravel_broadcast_take_along(torch):
    for n in range(4):
        _same(*_both(torch, "diff", C3, n, 1))
    ours = kiln.diff(_k(A), 2, prepend=_k(A[:, :1]), append=_k(B))
    _same(ours, torch.diff(torch.from_numpy(A), 2, prepend=torch.from_numpy(A[:, :1]), append=torch.from_numpy(B)))
    _same(*_both(torch, "diff", rng.integers(0, 2, size=7).astype(bool)))
    _same(*_both(torch, "diff", INTS, 2, 0))
    _same(*_both(torch, "ravel", A.T))
    assert tuple(kiln.broadcast_shapes((3, 1), (4,), 1)) == tuple(torch.broadcast_shapes((3, 1), (4,), 1))
    with pytest.raises(RuntimeError, match="Shape mismatch"):
        kiln.broadcast_shapes((3,), (4,))
    _same(*_both(torch, "broadcast_tensors", A[:, :1], V[:4]))
    idx = rng.integers(0, 4, size=(3, 2))
    _same(*_both(torch, "take_along_dim", A, idx, 1))
    _same(*_both(torch, "take_along_dim", A, idx[:1], 1))
    _same(*_both(torch, "take_along_dim", A, idx))
    _same(_k(C3).sum_to_size(1, 3, 1), torch.from_numpy(C3).sum_to_size(1, 3, 1))
    _same(_k(V[:4]).reshape_as(_k(A[:2, :2])), torch.from_numpy(V[:4]).reshape_as(torch.from_numpy(A[:2, :2])))


def test_index_grids_and_blocks(torch):
    _same(*_both(torch, "block_diag", A, V, S, INTS))
    _same(*_both(torch, "cartesian_prod", V[:2], V[:3]))
    _same(*_both(torch, "cartesian_prod", V[:3]))
    for r in range(5):
        for replacement in (False, True):
            _same(*_both(torch, "combinations", V[:3], r, replacement))
    for args in [(3, 3), (4, 5, 1), (5, 4, -2), (0, 3), (3, 3, 10)]:
        _same(*_both(torch, "tril_indices", *args))
        _same(*_both(torch, "triu_indices", *args))
    for args in [(1, 2, 1), (2, 3, 1), (2, 1, 3), (2, 4, 4), (0, 1, 1)]:
        _same(_k(C3).unfold(*args), torch.from_numpy(C3).unfold(*args))


def test_add_products(torch):
    m, a, b, v, w = (
        rng.normal(size=(3, 5)),
        rng.normal(size=(3, 4)),
        rng.normal(size=(4, 5)),
        rng.normal(size=4),
        rng.normal(size=5),
    )
    b1, b2 = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 4, 5))
    nan = np.full((3, 5), math.nan)
    for beta, alpha in [(1, 1), (0, 1), (2, 0.5), (0, 0), (1, 0), (0.5, 0)]:
        kw = {"beta": beta, "alpha": alpha}
        _same(*_both(torch, "addmm", m, a, b, **kw))
        _same(*_both(torch, "addmm", nan, a, b, beta=0, alpha=alpha))  # beta=0 ignores nan in input
        _same(*_both(torch, "addmv", m[:, 0], a, v, **kw))
        _same(*_both(torch, "addr", b, v, w, **kw))
        _same(*_both(torch, "addbmm", m, b1, b2, **kw))
        _same(*_both(torch, "baddbmm", rng.normal(size=(2, 1, 5)), b1, b2, **kw))
    _same(*_both(torch, "addmm", w, a, b))
    ints = rng.integers(-5, 5, size=(3, 4)), rng.integers(-5, 5, size=(4, 2))
    _same(*_both(torch, "addmm", ints[0][:, :2], *ints, beta=2, alpha=3))
    with pytest.raises(RuntimeError, match="dtype"):
        kiln.addmm(_k(m).float(), _k(a), _k(b))
    x = _k(m.copy())
    x.addmm_(_k(a), _k(b), beta=0.5)
    _same(x, torch.addmm(torch.from_numpy(m), torch.from_numpy(a), torch.from_numpy(b), beta=0.5))


def test_products(torch):
    a, v = rng.normal(size=(3, 4)), rng.normal(size=4)
    _same(*_both(torch, "mv", a, v))
    for x, y in [(a, rng.normal(size=(5, 4))), (v, v), (rng.normal(size=(2, 3, 4)), a), (np.array(2.0), a)]:
        _same(*_both(torch, "inner", x, y))
    _same(*_both(torch, "vdot", v, v))
    for x, y in [
        (a, rng.normal(size=(4, 5))),
        (v, rng.normal(size=(2, 2))),
        (rng.normal(size=(2, 1, 3)), a),
        (INTS, np.ones(3)),
    ]:
        _same(*_both(torch, "kron", x, y))
    x = rng.normal(size=(2, 3, 4))
    for y, dims in [(rng.normal(size=(3, 4, 5)), 2), (rng.normal(size=(4, 5)), 1), (rng.normal(size=(2, 2)), 0),
                    (rng.normal(size=(3, 2, 5)), ([1, 0], [0, 1])), (rng.normal(size=(3, 4, 5)), ([2], [1]))]:  # fmt: skip
        _same(*_both(torch, "tensordot", x, y, dims))
    mats = [rng.normal(size=s) for s in [(3, 4), (4, 5), (5, 2)]]
    with pytest.warns(UserWarning):
        _same(*_both(torch, "chain_matmul", *mats))


@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, 3.0, math.inf, 0.5])
def test_distances(torch, p):
    x1, x2 = rng.normal(size=(2, 3, 4)), rng.normal(size=(5, 4))
    x2[0] = x1[0, 0]  # a zero distance
    _same(*_both(torch, "cdist", x1, x2, p), rtol=1e-10)
    _same(*_both(torch, "dist", x1, x2[:3], p), rtol=1e-10)


def test_scans_and_statistics(torch):
    x = rng.normal(size=(4, 7))
    x[1, 2] = 0.0
    for a in (x, INTS, INTS.astype(bool), x[:, :1], np.zeros((0, 3))):
        for dim in range(a.ndim):
            _same(*_both(torch, "cumprod", a, dim))
    _same(kiln.cumprod(_k(INTS), 1, dtype=kiln.float32), torch.cumprod(torch.from_numpy(INTS), 1, dtype=torch.float32))
    wide = x * 300
    wide[0, 0], wide[2, :] = -math.inf, -math.inf
    for dim in (0, 1):
        _same(*_both(torch, "logcumsumexp", wide, dim))
    _same(*_both(torch, "std_mean", x, 1))
    _same(*_both(torch, "var_mean", x, 0, keepdim=True, correction=0))
    _same(*_both(torch, "aminmax", INTS))
    _same(*_both(torch, "aminmax", INTS, dim=1, keepdim=True))
    _same(*_both(torch, "trapezoid", x))
    _same(*_both(torch, "trapezoid", x, dx=0.3, dim=0))
    _same(*_both(torch, "trapezoid", x, np.sort(rng.normal(size=7))))
    _same(*_both(torch, "cov", x))
    _same(*_both(torch, "cov", x[0]))
    _same(*_both(torch, "cov", INTS), rtol=1e-6, atol=1e-6)
    fw, aw = rng.integers(1, 4, size=7), rng.uniform(0.1, 1, size=7)
    ours = kiln.cov(_k(x), fweights=_k(fw), aweights=_k(aw))
    _same(ours, torch.cov(torch.from_numpy(x), fweights=torch.from_numpy(fw), aweights=torch.from_numpy(aw)))
    _same(*_both(torch, "corrcoef", x))
    for p in (1, 2, 3, math.inf):
        for dim in (0, 1):
            _same(*_both(torch, "renorm", x, p, dim, 1.5))
    tests = rng.integers(0, 5, size=4)
    _same(*_both(torch, "isin", INTS, tests))
    _same(*_both(torch, "isin", INTS, tests, invert=True))
    _same(*_both(torch, "isin", np.array([1.0, math.nan]), np.array([math.nan, 1.0])))
    for n in (None, 0, 1, 3, 6):
        for increasing in (False, True):
            _same(*_both(torch, "vander", V[:4], n, increasing))
            _same(*_both(torch, "vander", INTS[0].astype(np.int32), n, increasing))
    _same(kiln.logspace(-1, 3.5, 7), torch.logspace(-1, 3.5, 7), rtol=1e-6, atol=0)
    _same(kiln.logspace(0, 2, 3, base=2, dtype=kiln.int64), torch.logspace(0, 2, 3, base=2, dtype=torch.int64))


def _gradcheck(fn, *shapes):
    inputs = tuple(kiln.tensor(rng.normal(size=s), dtype=kiln.float64, requires_grad=True) for s in shapes)
    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradients():
    _gradcheck(lambda m, a, b: kiln.addmm(m, a, b, beta=0.5, alpha=2.0), (3, 5), (3, 4), (4, 5))
    _gradcheck(lambda m, a, b: kiln.baddbmm(m, a, b, alpha=-1.5), (2, 3, 5), (2, 3, 4), (2, 4, 5))
    _gradcheck(lambda m, a, b: kiln.addbmm(m, a, b, beta=2), (3, 5), (2, 3, 4), (2, 4, 5))
    _gradcheck(lambda x, y: kiln.kron(x, y), (2, 3), (3, 2))
    _gradcheck(lambda x, y: kiln.tensordot(x, y, ([1, 2], [0, 1])), (2, 3, 4), (3, 4, 2))
    _gradcheck(lambda x, y: kiln.cdist(x, y), (3, 4), (5, 4))
    _gradcheck(lambda x, y: kiln.cdist(x, y, p=1.5), (3, 4), (5, 4))
    _gradcheck(lambda x: kiln.cumprod(x, 1), (3, 6))
    _gradcheck(lambda x: kiln.logcumsumexp(x, 0), (5, 3))
    _gradcheck(lambda x: kiln.rot90(x, 1, (0, 1)) * kiln.tensor(np.arange(12.0).reshape(4, 3)), (3, 4))
    _gradcheck(lambda x: kiln.diff(x, 2, 1), (3, 6))
    _gradcheck(lambda x: kiln.cov(x), (3, 6))
    _gradcheck(lambda x: kiln.corrcoef(x), (3, 6))
    _gradcheck(lambda x: kiln.renorm(x, 2, 0, 1.0), (3, 4))
    _gradcheck(lambda x: kiln.trapezoid(x), (3, 6))
    _gradcheck(lambda x: kiln.vander(x, 4), (5,))
    _gradcheck(lambda x: x.unfold(1, 3, 2) * 2.0, (2, 7))
    _gradcheck(lambda x, y: kiln.hstack([x, y]).sum(0), (3, 2), (3, 4))


def test_cumprod_gradient_with_zeros_matches_torch(torch):
    data = np.array([[2.0, 0.0, 3.0, 0.0, 5.0], [1.5, -2.0, 0.0, 4.0, 1.0]])
    x, tx = kiln.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    kiln.cumprod(x, 1).sum().backward()
    torch.cumprod(tx, 1).sum().backward()
    assert_close(x.grad, tx.grad, rtol=1e-14, atol=1e-14)


def _program(m, a, b, x):
    out = kiln.addmm(m, a, b, beta=0.5) + kiln.cdist(a, a)[:, :1] + kiln.cumprod(m, 1) * 0.1
    out = out + kiln.logcumsumexp(m, 1) + kiln.rot90(kiln.kron(x, x), 1)[:3, :4].sum(1, keepdim=True)
    out = out + kiln.diff(kiln.hstack([m, m]), 1, 1)[:, :5] + kiln.tensordot(a, b, 1)
    return out + kiln.trapezoid(m, dim=0) + kiln.vstack([x[0], x[1]]).sum()


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
def test_compiled_matches_eager(backend):
    def make_args():
        return (kiln.tensor(rng.normal(size=(3, 5))), kiln.tensor(rng.normal(size=(3, 4))),
                kiln.tensor(rng.normal(size=(4, 5))), kiln.tensor(rng.normal(size=(2, 3))))  # fmt: skip

    check_against_eager(_program, make_args, calls=3, rtol=1e-5, atol=1e-5, fullgraph=True,
                        options=kiln.CompileOptions(backend=backend))  # fmt: skip
