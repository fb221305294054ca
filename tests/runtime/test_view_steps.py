"""A view step of a compiled program (``ExternCall._view``: permute, reshape, expand, slice) keeps
the view it made of arrays met at two runs in a row (a weight's transpose) and gives it again while
its inputs are those arrays: every way the arrays behind a view can change must give a new one,
and arrays new at every run must not be kept alive by it. Each case compares with eager over several
calls; float32 products, rtol 1e-4 / atol 1e-5."""

from __future__ import annotations

import gc
import weakref

import numpy as np

import kiln
from kiln.runtime.executor import ExternCall

from ..conftest import assert_close

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _rand(*shape, seed=0) -> kiln.Tensor:
    return kiln.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _views(f) -> list[ExternCall]:
    steps = f.state.specializations[-1].program._steps
    views = [s for s in steps if isinstance(s, ExternCall) and not s.normalize]
    assert views, "no view step: the test tests nothing"
    return views


def test_a_weights_transpose_is_kept_and_follows_in_place_and_data_changes():
    w = _rand(5, 4, seed=1)

    def g(x):
        return x @ w.t()

    f = kiln.compile(g)
    x = _rand(3, 4)
    for _ in range(4):
        assert_close(f(x), g(x), **TOL)
    assert any(step.last is not None and step.last[1] is not None for step in _views(f)), "no view kept"
    w.mul_(-2.0)  # in place: the kept view is a window onto the same memory
    assert_close(f(x), g(x), **TOL)
    for k in range(3):  # another array of the same shape behind the weight: a view of it
        w.data = _rand(5, 4, seed=10 + k)
        for _ in range(2):
            assert_close(f(x), g(x), **TOL)
    assert len(f.state.specializations) == 1


def test_views_of_new_arrays_each_call_are_right_and_not_kept_alive():
    def g(x):
        return x @ x.t() + x.reshape(4, 3).t() @ x.t()

    f = kiln.compile(g)
    for k in range(5):
        x = _rand(3, 4, seed=k)
        assert_close(f(x), g(x), **TOL)
    _views(f)
    array = x.numpy()
    alive = weakref.ref(array)
    del x, array
    gc.collect()
    assert alive() is None, "a view step keeps the last call's argument alive"
