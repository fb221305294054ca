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
from kiln.ir.dtypes import float32
from kiln.ir.graph import GraphBuilder
from kiln.ir.primitives import PRIMITIVES
from kiln.ir.types import TensorType
from kiln.runtime.direct_views import direct_view
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
    program = f.state.specializations[-1].program
    assert any(run == step._run_kept_view for step, run in zip(program._steps, program._runs, strict=True))
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


def test_direct_views_equal_the_eager_kernels_on_strided_arrays():
    """A static slice, reshape or permute runs as one numpy call (``direct_views``): the same view (shape,
    strides, memory) as its primitive's eager kernel, on a strided input too; none for a 0-d input."""
    base = np.arange(2 * 6 * 10, dtype=np.float32).reshape(2, 6, 10)
    x = base[:, :, 2:7]  # rows of 5 in rows of 10
    b = GraphBuilder()
    v = b.input(TensorType(x.shape, float32))
    cases = [("slice", {"starts": (0, 1, 0), "stops": (2, 6, 5), "steps": (1, 2, 1)}),
             ("reshape", {"shape": (12, 5)}), ("permute", {"perm": (2, 0, 1)})]  # fmt: skip
    for op, attrs in cases:
        b.node(op, [v], attrs)
        view = direct_view(b.nodes[-1])
        assert view is not None, op
        got, want = view(x), PRIMITIVES[op].eager(np, x, **attrs)
        assert got.shape == want.shape and got.strides == want.strides, op
        assert np.shares_memory(got, base) == np.shares_memory(want, base), op
        np.testing.assert_array_equal(got, want)
    scalar = b.input(TensorType((), float32))
    b.node("reshape", [scalar], {"shape": (1,)})
    assert direct_view(b.nodes[-1]) is None


def test_a_view_of_arrays_new_at_every_run_is_made_anew():
    """A view of a kernel's new output or an extern's own result (new arrays at every run) is not kept
    (``CompiledProgram._keep_views``): no weak references to make and compare each run; a view of a
    weight still is. Results match eager over several calls, the weight replaced midway."""
    w = _rand(5, 4, seed=1)

    def g(x):
        h = x @ w.t()  # the extern's result, an output: new at every run
        y = x * 2.0 + 1.0  # a kernel's new output
        return h, h.t() @ x + (y.t() @ y[:, 1:])[:1].sum()

    f = kiln.compile(g)
    for k in range(4):
        if k == 2:
            w.data = _rand(5, 4, seed=7)
        x = _rand(3, 4, seed=k)
        for got, want in zip(f(x), g(x), strict=True):
            assert_close(got, want, **TOL)
    program = f.state.specializations[-1].program
    made = {slot for call in program.kernel_calls for slot, *_ in call.allocate}
    made |= {s.out for s in program._steps if isinstance(s, ExternCall) and s.normalize and s.into < 0}
    anew = [s for s in _views(f) if set(s.args) & made]
    assert anew, "no view of a new array: the test tests nothing"
    for step in anew:
        assert not step.keep_views and step.last is None, step.describe()
    assert any(step.keep_views and step.last is not None for step in _views(f)), "the weight's view is not kept"
