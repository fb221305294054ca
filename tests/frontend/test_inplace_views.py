"""PyTorch's in-place view ops (``unsqueeze_``, ``squeeze_``, ``transpose_``, ``t_``, ``swapaxes_``,
``swapdims_``, ``as_strided_``) and ``as_strided`` against PyTorch: the tensor's own shape, strides and
offset, values, version counter, autograd through them (finite differences in float64), the errors
PyTorch gives, and compiled against eager (``kiln/frontend/ops/inplace_views.py``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck
from tests.frontend.jit.helpers import check_against_eager, compiled_calls, events, state_of

rng = np.random.default_rng(5)
X = rng.normal(size=(3, 4))

# (name, call) pairs run on a tensor of shape (3, 4) or a view of one
OPS = [
    ("unsqueeze_(0)", lambda t: t.unsqueeze_(0)),
    ("unsqueeze_(-1)", lambda t: t.unsqueeze_(-1)),
    ("squeeze_()", lambda t: t.unsqueeze_(1).squeeze_()),
    ("squeeze_(dim)", lambda t: t.unsqueeze_(0).unsqueeze_(2).squeeze_(2)),
    ("squeeze_(tuple)", lambda t: t.unsqueeze_(0).unsqueeze_(2).squeeze_((0, 2))),
    ("squeeze_(non-1 dim)", lambda t: t.squeeze_(1)),
    ("transpose_", lambda t: t.transpose_(0, 1)),
    ("transpose_(-1, 0)", lambda t: t.unsqueeze_(1).transpose_(-1, 0)),
    ("swapaxes_", lambda t: t.swapaxes_(1, 0)),
    ("swapdims_", lambda t: t.unsqueeze_(0).swapdims_(0, 2)),
    ("t_", lambda t: t.t_()),
    ("t_ twice", lambda t: t.t_().t_()),
    ("as_strided_", lambda t: t.as_strided_((2, 3), (1, 2), 1)),
    ("as_strided_ default offset", lambda t: t.as_strided_((4,), (3,))),
]
MAKERS = {
    "contiguous": lambda lib: lib.from_numpy(X.copy()),
    "transposed view": lambda lib: lib.from_numpy(X.copy().T.copy()).t(),
    "sliced view": lambda lib: lib.from_numpy(np.concatenate([X, X]).copy())[2:5],
}


def _layout(t, base_data_ptr: int):
    # (the stride of a dim of size 1 moves nothing: kiln's unsqueeze keeps numpy's, which can differ from PyTorch's)
    strides = tuple(s for n, s in zip(t.shape, t.stride(), strict=True) if n != 1)
    return tuple(t.shape), strides, t.storage_offset(), t.tolist(), t.data_ptr() - base_data_ptr


def _run(lib, make, op):
    t = make(lib)
    origin = (t._base if isinstance(t, kiln.Tensor) and t._base is not None else t).data_ptr()
    if not isinstance(t, kiln.Tensor) and t._base is not None:
        origin = t._base.data_ptr()
    version = t._version if not isinstance(t, kiln.Tensor) else t._version_value
    try:
        out = op(t)
    except (IndexError, RuntimeError) as error:
        return type(error).__name__
    after = t._version if not isinstance(t, kiln.Tensor) else t._version_value
    return out is t, after > version, _layout(t, origin)


@pytest.mark.parametrize("maker", MAKERS)
@pytest.mark.parametrize("name", [n for n, _ in OPS])
def test_layout_values_and_version_match_torch(torch, maker, name):
    op = dict(OPS)[name]
    got, want = _run(kiln, MAKERS[maker], op), _run(torch, MAKERS[maker], op)
    assert got == want, f"{name} on a {maker} tensor: {got} vs torch {want}"


def test_errors_match_torch(raises_as_torch):
    cases = [
        lambda lib: lib.zeros(2, 3).unsqueeze_(3),
        lambda lib: lib.zeros(2, 3).squeeze_(5),
        lambda lib: lib.zeros(2, 3).transpose_(0, 2),
        lambda lib: lib.zeros(1, 3, 1).t_(),
        lambda lib: lib.arange(6.0).as_strided((2, 2), (-1, 2)),
        lambda lib: lib.arange(6.0).as_strided((2, 2), (1, 2), -1),
        lambda lib: lib.arange(6.0).as_strided((2,), (1,), 5),
        lambda lib: lib.arange(6.0).as_strided((3, 3), (4, 4)),
        lambda lib: lib.zeros(3, requires_grad=True).unsqueeze_(0),  # a leaf that requires grad
        lambda lib: lib.zeros(3, 4, requires_grad=True)[0].t_(),  # a view of one
    ]
    raises_as_torch(cases)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        kiln.zeros(3, requires_grad=True).t_()
    leaf = kiln.zeros(3, requires_grad=True)
    with kiln.no_grad():  # allowed without grad mode, as in PyTorch
        assert leaf.unsqueeze_(0).shape == (1, 3) and leaf.is_leaf


def test_as_strided_matches_torch(torch):
    cases = [((2, 2), (1, 2), 1), ((3, 3), (1, 2), None), ((2, 3), (0, 1), 2), ((0, 3), (1, 2), 12), ((), (), 4),
             ((4, 2), (2, 1), 0), ((2, 2, 2), (4, 1, 2), 3)]  # fmt: skip
    for size, stride, offset in cases:
        for view in (lambda t: t, lambda t: t[1:], lambda t: t.reshape(3, 4)[1:, 1:], lambda t: t.reshape(4, 3).t()):
            got = view(kiln.arange(12.0)).as_strided(size, stride, offset)
            want = view(torch.arange(12.0)).as_strided(size, stride, offset)
            assert (tuple(got.shape), got.stride(), got.storage_offset(), got.tolist()) == (
                tuple(want.shape), want.stride(), want.storage_offset(), want.tolist()
            ), (size, stride, offset)  # fmt: skip
    x, tx = kiln.zeros(6), torch.zeros(6)
    kiln.as_strided(x, (2, 2), (1, 2), 1).add_(1)  # a view: the write reaches the base
    torch.as_strided(tx, (2, 2), (1, 2), 1).add_(1)
    assert x.tolist() == tx.tolist()
    with pytest.raises(RuntimeError, match="dense block"):  # (kiln's storage is the base's own elements)
        kiln.from_numpy(np.arange(12.0)[::2]).as_strided((2,), (1,))


def test_views_made_before_follow_the_new_layout(torch):
    def run(lib):
        a = lib.from_numpy(X[:2, :3].copy()).requires_grad_()
        x = a * 1
        v = x[0]
        x.t_()
        v.mul_(2)  # a write through the view made before the transpose
        (x * lib.from_numpy(np.arange(6.0).reshape(3, 2))).sum().backward()
        return x.tolist(), a.grad.tolist()

    got, want = run(kiln), run(torch)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)


def test_gradients_by_finite_differences():
    w = kiln.from_numpy(rng.normal(size=(1, 4, 3)))
    checks = [
        (lambda a: (a * 1).t_().unsqueeze_(0) * w, X),
        (lambda a: (a * 1).unsqueeze_(1).squeeze_().transpose_(0, 1).exp(), X),
        (lambda a: (a * 1).swapdims_(0, 1).swapaxes_(0, 1).sin(), X),
        (lambda a: a.as_strided((3, 3), (1, 2), 1) ** 2, rng.normal(size=12)),  # overlapping elements
        (lambda a: a[2:].as_strided((2, 2), (3, 1)) * 3, rng.normal(size=12)),
        (lambda a: (a * 2).as_strided_((2, 5), (1, 1), 2).cos(), rng.normal(size=12)),
    ]
    for fn, value in checks:
        a = kiln.tensor(value, dtype=kiln.float64, requires_grad=True)
        assert gradcheck(fn, (a,), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradients_and_retained_grad_match_torch(torch):
    def run(lib):
        a = lib.from_numpy(X.copy()).requires_grad_()
        x = a * 2
        x.retain_grad()
        x.t_()  # a new history for x; retain_grad stays on the old one (x.grad is (3, 4), as PyTorch's)
        y = x.as_strided((2, 2), (1, 1))
        (y * y).sum().backward()
        return x.grad_fn is not None, a.grad.tolist(), x.grad.tolist()

    got, want = run(kiln), run(torch)
    assert got[0] and want[0]
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-12, atol=1e-12)


def test_a_saved_tensor_changed_by_a_view_op_raises_at_backward():
    """``exp`` saves its output; changing that output's layout in place is caught, as in PyTorch."""
    a = kiln.randn(3, requires_grad=True)
    b = a.exp()
    b.unsqueeze_(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        b.sum().backward()


def test_compiled_matches_eager_on_tensors_made_in_the_call():
    def fn(a, b):
        x = a * 2
        x.t_()
        x.unsqueeze_(0)
        y = x + b
        y.squeeze_(0)
        v = y[0]
        y.transpose_(0, 1)
        v.mul_(3)  # through a view made before the transpose
        z = a.as_strided((2, 2), (1, 2), 1)
        return y, x, z * 2, v, x.as_strided_((3,), (2,), 1) + 1

    def make():
        return kiln.from_numpy(rng.normal(size=(3, 4))), kiln.from_numpy(rng.normal(size=(4, 3)))

    compiled = check_against_eager(fn, make, calls=4, fullgraph=True)
    assert compiled_calls(compiled) == [3]
    assert all(not s.report.declined for s in state_of(compiled).specializations)


def test_compiled_backward_through_view_ops():
    def step(a, w):
        x = a * w
        x.t_()
        loss = (x.as_strided((2, 3), (1, 1)) ** 2).sum()
        loss.backward()
        return loss, w.grad

    compiled = kiln.compile(step)
    for _ in range(3):
        a = kiln.from_numpy(rng.normal(size=(3, 4)))
        w = kiln.from_numpy(rng.normal(size=(3, 4)))
        got = compiled(a, w.clone().requires_grad_())
        want = step(a, w.clone().requires_grad_())
        np.testing.assert_allclose(got[0].item(), want[0].item(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got[1].numpy(), want[1].numpy(), rtol=1e-12, atol=1e-12)
    assert compiled_calls(compiled) == [2] and [e.kind for e in events(compiled)] == ["compiled"]


def test_an_argument_changed_in_place_runs_eagerly_saying_why():
    """The caller's tensor changes shape, which a compiled program cannot do: each call runs eagerly."""

    def fn(a):
        a.unsqueeze_(0)
        return a * 2

    compiled = kiln.compile(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            a = kiln.ones(3)
            out = compiled(a)
            assert tuple(a.shape) == (1, 3) and out.tolist() == [[2.0, 2.0, 2.0]]
    assert any("unsqueeze_ changes the shape of a tensor from outside the call" in str(w.message) for w in caught)
    with pytest.raises(Exception, match="unsqueeze_ changes the shape"):
        kiln.compile(fn, fullgraph=True)(kiln.ones(3))
