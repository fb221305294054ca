"""``index_reduce(_)``, ``scatter_reduce_``, ``renorm_``, ``resize_`` and ``resize_as_`` against PyTorch:
values, dtypes, errors, gradients by finite differences in float64 where kiln differentiates, and
compiled against eager (``more_indexing.index_reduce``, ``tensor_methods``, ``inplace_views.resize_``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck
from tests.conftest import assert_close
from tests.frontend.jit.helpers import check_against_eager, compiled_calls, state_of

rng = np.random.default_rng(9)
REDUCTIONS = ("prod", "mean", "amax", "amin")


def _index_reduce(lib, x, dim, index, source, reduce, include_self, inplace=False):
    args = (lib.from_numpy(x.copy()), dim, lib.from_numpy(index), lib.from_numpy(source.copy()), reduce)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (PyTorch's "index_reduce() is in beta")
        if inplace:
            target = args[0]
            out = target.index_reduce_(*args[1:], include_self=include_self)
            assert out is target
            return out
        return args[0].index_reduce(*args[1:], include_self=include_self)


@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_index_reduce_matches_torch(torch, reduce, include_self, dtype):
    for dim, shape in ((0, (4, 3)), (1, (3, 5)), (-1, (2, 3, 4))):
        x = rng.integers(-4, 5, size=shape).astype(dtype)
        n = shape[dim]
        index = rng.integers(0, n, size=6).astype(np.int64)
        source_shape = list(shape)
        source_shape[dim] = 6
        source = rng.integers(-4, 5, size=source_shape).astype(dtype)
        for inplace in (False, True):
            got = _index_reduce(kiln, x, dim, index, source, reduce, include_self, inplace)
            want = _index_reduce(torch, x, dim, index, source, reduce, include_self, inplace)
            assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_index_reduce_errors_match_torch(raises_as_torch):
    cases = [
        lambda lib: lib.zeros(3).index_reduce(0, lib.tensor([0]), lib.ones(1), "sum"),
        lambda lib: lib.zeros(3).index_reduce(0, lib.tensor([[0]]), lib.ones(1), "prod"),
        lambda lib: lib.zeros(3).index_reduce(0, lib.tensor([0, 1]), lib.ones(1), "prod"),
        lambda lib: lib.zeros(3).index_reduce(0, lib.tensor([5]), lib.ones(1), "prod"),
        lambda lib: lib.zeros(3).index_reduce(0, lib.tensor([0, 0]), lib.tensor([3, 4]), "amax"),
    ]
    raises_as_torch(cases)
    assert kiln.zeros(3).index_reduce(0, kiln.tensor([2], dtype=kiln.int32), kiln.ones(1), "amax").tolist() == [0, 0, 1]


def test_index_reduce_mean_gradient():
    index = kiln.tensor([0, 2, 0, 1, 2])
    for include_self in (True, False):
        x = kiln.tensor(rng.normal(size=(3, 4)), dtype=kiln.float64, requires_grad=True)
        s = kiln.tensor(rng.normal(size=(5, 4)), dtype=kiln.float64, requires_grad=True)
        fn = lambda a, b, i=include_self: a.index_reduce(0, index, b, "mean", include_self=i)  # noqa: E731
        assert gradcheck(fn, (x, s), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_index_reduce_compiled_matches_eager():
    index = kiln.tensor([1, 0, 1, 3])

    def fn(x, s):
        return x.index_reduce(1, index, s, "mean") * 2, x.clone().index_reduce_(1, index, s, "mean", include_self=False)

    def make():
        return kiln.from_numpy(rng.normal(size=(3, 5))), kiln.from_numpy(rng.normal(size=(3, 4)))

    compiled = check_against_eager(fn, make, calls=4, rtol=1e-12, atol=1e-12, fullgraph=True)
    assert compiled_calls(compiled) == [3] and not state_of(compiled).specializations[0].report.declined

    def amax(x, s):  # (amax runs numpy's ufunc.at: the call runs eagerly, saying why)
        return x.index_reduce(1, index, s, "amax")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_against_eager(amax, make, calls=3, rtol=0, atol=0)
    assert any("scatter_reduce(reduce='amax') has no compiled form" in str(w.message) for w in caught)


def test_scatter_reduce_and_renorm_in_place_match_torch(torch):
    x = rng.normal(size=(3, 4))
    index = rng.integers(0, 3, size=(2, 4))
    src = rng.normal(size=(2, 4))
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            outs = []
            for lib in (kiln, torch):
                target = lib.from_numpy(x.copy())
                out = target.scatter_reduce_(
                    0, lib.from_numpy(index), lib.from_numpy(src), reduce, include_self=include_self
                )
                assert out is target
                outs.append(out)
            assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)
    for p, dim, maxnorm in ((2, 0, 1.0), (1, 1, 0.5), (3.0, -1, 10.0)):
        a, b = kiln.from_numpy(x.copy()), torch.from_numpy(x.copy())
        assert a.renorm_(p, dim, maxnorm) is a
        assert_close(a, b.renorm_(p, dim, maxnorm), rtol=1e-12, atol=1e-12)
    w = kiln.tensor(x, dtype=kiln.float64, requires_grad=True)
    assert gradcheck(lambda v: (v * 1).renorm_(2, 0, 1.0), (w,), eps=1e-6, atol=1e-6, rtol=1e-5)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        w.renorm_(2, 0, 1.0)


RESIZES = [
    ("grow", lambda lib: lib.arange(6.0).reshape(2, 3).clone().resize_(3, 3)[:2]),
    ("shrink", lambda lib: lib.arange(6.0).reshape(2, 3).clone().resize_(2, 2)),
    ("same", lambda lib: lib.arange(6.0).reshape(2, 3).clone().resize_(6)),
    ("list", lambda lib: lib.arange(6.0).clone().resize_([1, 2])),
    ("transposed", lambda lib: lib.arange(6.0).reshape(2, 3).clone().t().resize_(2, 2)),
    ("view", lambda lib: lib.arange(6.0).reshape(2, 3).clone()[1].resize_(2)),
    ("as another", lambda lib: lib.zeros(5).resize_as_(lib.ones(2, 2))),
    ("empty", lambda lib: lib.arange(6.0).clone().resize_(0, 4)),
]


@pytest.mark.parametrize("name", [n for n, _ in RESIZES])
def test_resize_matches_torch(torch, name):
    make = dict(RESIZES)[name]
    got, want = make(kiln), make(torch)
    assert (tuple(got.shape), got.stride(), got.storage_offset(), got.tolist()) == (
        tuple(want.shape), want.stride(), want.storage_offset(), want.tolist()
    )  # fmt: skip


def test_resize_keeps_memory_and_refuses_what_torch_refuses(torch):
    x = kiln.arange(6.0)
    pointer, version = x.data_ptr(), x._version_value
    assert x.resize_(2, 2) is x and x.data_ptr() == pointer and x._version_value == version + 1
    grown = kiln.arange(4.0)
    assert grown.resize_(6).tolist() == [0.0, 1.0, 2.0, 3.0, 0.0, 0.0]  # (PyTorch's new elements: uninitialized)
    for lib in (kiln, torch):
        with pytest.raises(RuntimeError, match="cannot resize variables that require grad"):
            lib.zeros(3, requires_grad=True).resize_(2)
        with pytest.raises(RuntimeError, match="cannot resize variables that require grad"):
            (lib.zeros(3, requires_grad=True) * 1).resize_(3)
    with pytest.raises(RuntimeError, match="cannot grow"):  # kiln's refusal: PyTorch grows the base's storage
        kiln.zeros(2, 3)[1].resize_(5)


def test_resize_in_a_compiled_call_runs_eagerly():
    def fn(x):
        y = x * 2
        y.resize_(2)
        return y + 1

    compiled = kiln.compile(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert compiled(kiln.tensor([1.0, 2.0, 3.0])).tolist() == [3.0, 5.0]
    assert any("resize_ changes a tensor's shape" in str(w.message) for w in caught)
