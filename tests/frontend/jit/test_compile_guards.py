"""Guards and recompilation: what makes a new specialization, what reuses one, the recompile limit."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import kiln
import kiln.nn as nn

from .helpers import assert_tree_close, compiled_calls, events, state_of

RTOL, ATOL = 1e-6, 1e-7


def _f(x, n=1):
    return (x * 2 + n).sum(dim=0)


def _x(*shape, dtype=None, seed=0, requires_grad=False):
    kiln.manual_seed(seed)
    x = kiln.randn(*shape, dtype=dtype)
    return x.requires_grad_(True) if requires_grad else x


def _compiled_details(f) -> list[str]:
    return [e.detail for e in events(f, "compiled")]


@pytest.mark.parametrize(
    ("second", "word"),
    [
        (lambda: (_x(5, 3), 1), "shape"),
        (lambda: (_x(4, 3, dtype=kiln.float64), 1), "dtype"),
        (lambda: (_x(4, 3, requires_grad=True), 1), "requires_grad"),
        (lambda: (_x(3, 4).T, 1), "strides"),
        (lambda: (_x(4, 3), 2), "argument 1: 1 -> 2"),
    ],
    ids=["shape", "dtype", "requires_grad", "strides", "plain-int"],
)
def test_changed_guard_makes_a_new_specialization_and_says_which(second, word):
    f = kiln.compile(_f, dynamic=False)  # static sizes: a new size is a new key (test_dynamic_sizes.py: dynamic ones)
    first = (_x(4, 3), 1)
    for _ in range(3):
        assert_tree_close(f(*first), _f(*first), rtol=RTOL, atol=ATOL)
    args = second()
    for _ in range(3):
        got = f(*args)
        assert_tree_close(got, _f(*args), rtol=RTOL, atol=ATOL)
    assert len(f.state.specializations) == 2
    assert compiled_calls(f) == [2, 2]
    detail = _compiled_details(f)[1]
    assert word in detail, detail
    # the first key still matches the first specialization: no new one
    f(*first)
    assert compiled_calls(f) == [3, 2] and len(f.state.specializations) == 2


def test_plain_int_value_is_baked_in_and_guarded():
    f = kiln.compile(_f)
    x = _x(4, 3)
    for n in (1, 2, 3, 1, 2, 3, 3):
        assert_tree_close(f(x, n), _f(x, n), rtol=RTOL, atol=ATOL)
    assert len(f.state.specializations) == 3 and sum(compiled_calls(f)) == 4
    assert "1 -> 2" in _compiled_details(f)[1]


def test_float_argument_values_guarded_including_negative_zero():
    @kiln.compile
    def f(x, a):
        return x / a

    x = _x(3)
    for a in (2.0, -0.0, 2.0, 0.0, -0.0):
        np.testing.assert_array_equal(f(x, a).numpy(), (x / a).numpy())


def test_grad_mode_change_makes_a_new_specialization():
    f = kiln.compile(_f)
    x = _x(4, 3, requires_grad=True)
    for _ in range(3):
        out = f(x)
        assert out.requires_grad
    with kiln.no_grad():
        for _ in range(3):
            out = f(x)
            assert not out.requires_grad and out.grad_fn is None
            assert_tree_close(out, _f(x), rtol=RTOL, atol=ATOL)
    assert len(f.state.specializations) == 2 and compiled_calls(f) == [2, 2]
    assert "grad mode" in _compiled_details(f)[1]


def test_aliasing_between_arguments_is_guarded():
    def g(a, b):
        a.add_(1)
        return a * b

    f = kiln.compile(g)
    x, y = _x(4, seed=1), _x(4, seed=2)
    for _ in range(3):
        xe, ye = x.clone(), y.clone()
        assert_tree_close(f(x, y), g(xe, ye), rtol=RTOL, atol=ATOL)
    for _ in range(3):  # the same tensor twice: the mutation is seen through b
        xe = x.clone()
        assert_tree_close(f(x, x), g(xe, xe), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(x.numpy(), xe.numpy(), rtol=RTOL, atol=ATOL)
    assert len(f.state.specializations) == 2


def test_recompile_limit_runs_new_shapes_eagerly_and_cached_ones_compiled(caplog):
    caplog.set_level(logging.WARNING, logger="kiln")
    f = kiln.compile(_f, options=kiln.CompileOptions(recompile_limit=2, dynamic=False))
    shapes = [(2, 3), (3, 3), (4, 3)]
    for shape in shapes:
        for _ in range(3):
            x = _x(*shape)
            assert_tree_close(f(x), _f(x), rtol=RTOL, atol=ATOL)
    assert len(f.state.specializations) == 2 and compiled_calls(f) == [2, 2]
    limit = events(f, "recompile limit")
    assert len(limit) == 1 and "limit of 2" in limit[0].detail
    assert "shape" in limit[0].detail
    messages = [r.getMessage() for r in caplog.records if "limit" in r.getMessage()]
    assert len(messages) == 1
    for _ in range(2):  # cached shapes still run compiled
        f(_x(2, 3))
        f(_x(3, 3))
    assert compiled_calls(f) == [4, 4]


def test_recompile_limit_zero_is_plain_eager():
    f = kiln.compile(_f, options=kiln.CompileOptions(recompile_limit=0))
    x = _x(4, 3)
    for _ in range(3):
        assert_tree_close(f(x), _f(x), rtol=RTOL, atol=ATOL)
    assert f.state.specializations == [] and events(f, "recompile limit")


def _bn_drop(seed: int):
    kiln.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Dropout(0.4))


def test_train_and_eval_are_different_specializations_and_both_correct():
    m, e = _bn_drop(0), _bn_drop(0)
    cm = kiln.compile(m)
    x = _x(8, 6, seed=4)
    for mode in ("train", "eval", "train", "eval"):
        getattr(cm, mode)()
        getattr(e, mode)()
        for _ in range(3):
            kiln.manual_seed(99)
            got = cm(x)
            kiln.manual_seed(99)
            expected = e(x)
            np.testing.assert_allclose(got.detach().numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-6)
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                np.testing.assert_allclose(
                    getattr(m[1], name).numpy(), getattr(e[1], name).numpy(), rtol=1e-5, atol=1e-6, err_msg=name
                )
    specs = state_of(cm).specializations
    assert len(specs) == 2 and all(c >= 4 for c in compiled_calls(cm))
    assert any("training" in d for d in _compiled_details(cm))
    # eval: deterministic and no dropout zeros
    cm.eval()
    a, b = cm(x), cm(x)
    np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


GLOBAL_W = kiln.ones(3)


def _reads_global(x):
    return x * GLOBAL_W


def test_rebinding_a_global_tensor_retraces():
    global GLOBAL_W
    f = kiln.compile(_reads_global)
    x = _x(3)
    try:
        for _ in range(3):
            assert_tree_close(f(x), x * GLOBAL_W, rtol=RTOL, atol=ATOL)
        GLOBAL_W = kiln.full((3,), 7.0)
        for _ in range(3):
            assert_tree_close(f(x), x * GLOBAL_W, rtol=RTOL, atol=ATOL)
        assert len(f.state.specializations) == 2
        assert "GLOBAL_W" in _compiled_details(f)[1]
        GLOBAL_W = kiln.full((4,), 2.0)
        with pytest.raises(Exception, match=r"3|4"):  # broadcasting error, as eager
            f(x)
    finally:
        GLOBAL_W = kiln.ones(3)


class _Holder:
    step = 1.0


HOLDER = _Holder()
step = 0  # a global that shares its name with the attribute the function reads


def _reads_attribute(x):
    return x * HOLDER.step


def test_an_attribute_name_is_not_guarded_as_a_global():
    """``HOLDER.step`` names the attribute ``step``, not the global ``step``: rebinding the global
    (a training loop's counter) must not retrace."""
    global step
    f = kiln.compile(_reads_attribute)
    x = _x(3)
    try:
        for step in range(4):  # noqa: B007 - the global is what changes
            assert_tree_close(f(x), x * HOLDER.step, rtol=RTOL, atol=ATOL)
        assert len(f.state.specializations) == 1
    finally:
        step = 0


def test_rebinding_a_closure_variable_retraces():
    scale = kiln.full((3,), 2.0)

    def g(x):
        return x * scale

    f = kiln.compile(g)
    x = _x(3)
    for _ in range(3):
        assert_tree_close(f(x), x * scale, rtol=RTOL, atol=ATOL)
    scale = kiln.full((3,), -1.0)  # noqa: F841 - read through the closure
    for _ in range(3):
        assert_tree_close(f(x), g(x), rtol=RTOL, atol=ATOL)
    assert len(f.state.specializations) == 2


def _compiled_scale_by(w):
    """``x.sum() * w`` compiled, with ``w`` captured, after three calls; and its argument."""

    @kiln.compile
    def f(x):
        return x.sum() * w

    x = _x(3)
    for _ in range(3):
        f(x)
    return f, x


def _agrees_with_eager(f, x, w, calls: int = 2) -> None:
    for _ in range(calls):
        assert_tree_close(f(x), x.sum() * w, rtol=RTOL, atol=ATOL)


def test_captured_tensor_shape_change_retraces():
    w = kiln.ones(3)
    f, x = _compiled_scale_by(w)
    w.data = kiln.full((4,), 3.0)
    _agrees_with_eager(f, x, w, calls=3)
    assert len(f.state.specializations) == 2


def test_a_captured_tensor_given_new_data_of_another_layout_is_seen_every_time():
    # the guards compare array identity first (the arrays of the last matching call): a new array of
    # the same shape but other strides, or requires_grad turned on, must still be seen
    w = kiln.ones(2, 3)
    f, x = _compiled_scale_by(w)
    w.data = kiln.arange(6.0).reshape(3, 2).t()  # (2, 3), transposed strides
    _agrees_with_eager(f, x, w)
    w.data = kiln.full((2, 3), 2.0)  # C order again: the first specialization's layout
    _agrees_with_eager(f, x, w)
    w.requires_grad_()
    assert f(x).requires_grad
    assert len(f.state.specializations) == 3


def test_grad_presence_of_argument_is_guarded():
    def g(p):
        (p * p).sum().backward()

    f = kiln.compile(g)
    p, q = _x(3, requires_grad=True), _x(3, requires_grad=True)
    for _ in range(3):
        p.grad, q.grad = None, None
        f(p)
        g(q)
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=RTOL, atol=ATOL)
    for _ in range(3):  # now .grad is set: accumulation, a different specialization
        f(p)
        g(q)
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=RTOL, atol=ATOL)
    assert len(f.state.specializations) == 2 and compiled_calls(f) == [2, 2]
