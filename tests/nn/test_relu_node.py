"""``relu`` on eager CPU tensors is one autograd node (``ReluBackward0``): the same values and
gradients as the ``where(x <= 0, 0, x)`` ops it replaces (to the bit: nan, infinities and both
zeros) and as PyTorch's, with every autograd rule (create_graph, retain_graph, hooks, no_grad,
in place) and the ops where it must run."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import kiln
from kiln.frontend import dispatch
from kiln.frontend.ops.relu import relu_eager

F = kiln.nn.functional


def _array(shape=(3, 4, 5), dtype=np.float32, seed=0):
    """Normal values with the awkward ones among them: both zeros, nan and both infinities."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    x.reshape(-1)[:5] = [0.0, -0.0, np.nan, np.inf, -np.inf]
    return x


def _ops(x):
    """The ops relu ran before."""
    return kiln.where(x <= 0, kiln.tensor(0.0, dtype=x.dtype), x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("relu", [kiln.relu, F.relu, kiln.Tensor.relu, lambda x: kiln.nn.ReLU()(x)])
def test_relu_equals_its_ops_forward_and_backward_to_the_bit(relu, dtype):
    a = _array(dtype=dtype)
    seed = _array(seed=1, dtype=dtype)  # nan and infinities in the incoming gradient too
    found = []
    for fn in (relu, _ops):
        x = kiln.tensor(a, requires_grad=True)
        y = fn(x)
        y.backward(kiln.tensor(seed))
        found.append([y.detach().numpy(), x.grad.numpy()])
        assert y.dtype == x.dtype
    assert relu(kiln.tensor(a, requires_grad=True)).grad_fn.name() == "ReluBackward0"
    for got, expected in zip(*found, strict=True):
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), expected.view(f"u{got.itemsize}"))


def test_relu_matches_torch_with_double_backward(torch):
    a = np.nan_to_num(_array((5, 6), np.float64), posinf=2.0, neginf=-2.0)

    def run(lib):
        x = lib.tensor(a, requires_grad=True)
        y = lib.relu(x * 1.5)
        (gx,) = lib.autograd.grad((y * y * y).sum(), (x,), create_graph=True)
        (gx * gx).sum().backward()
        return [y.detach().numpy(), gx.detach().numpy(), x.grad.numpy()]

    for got, expected in zip(run(kiln), run(torch), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_in_place_forms_give_the_gradient_of_the_input_they_overwrite(torch):
    a = np.nan_to_num(_array((4, 5)), posinf=3.0, neginf=-3.0)

    def run(lib, how):
        x = lib.tensor(a, requires_grad=True)
        h = x * 2.0
        y = lib.nn.functional.relu(h, inplace=True) if how == "inplace" else h.relu_()
        (y * lib.tensor(a)).sum().backward()
        return [h.detach().numpy(), x.grad.numpy()]

    for how in ("inplace", "underscore"):
        for got, expected in zip(run(kiln, how), run(torch, how), strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_retain_graph_hooks_and_no_grad():
    x = kiln.tensor([[-2.0, 0.0, 3.0]], requires_grad=True)
    y = kiln.relu(x)
    seen = []
    y.register_hook(lambda g: seen.append(1) or g * 3)
    y.retain_grad()
    y.sum().backward(retain_graph=True)
    y.sum().backward()
    assert x.grad.tolist() == [[0.0, 0.0, 6.0]] and y.grad.tolist() == [[6.0, 6.0, 6.0]] and len(seen) == 2
    with pytest.raises(RuntimeError, match="second time"):
        y.sum().backward()
    with kiln.no_grad():
        assert kiln.relu(x).grad_fn is None and not kiln.relu(x).requires_grad
    assert kiln.relu(x.detach()).grad_fn is None


def test_the_ops_run_where_the_node_does_not_apply():
    x = kiln.tensor(_array((2, 3)))
    assert relu_eager(x) is not None
    assert relu_eager(x.to(kiln.float16)) is None  # another dtype: the ops
    assert relu_eager(x.to(kiln.int32)) is None
    np.testing.assert_array_equal(kiln.relu(x.to(kiln.float16)).numpy(), _ops(x.to(kiln.float16)).numpy())
    assert kiln.relu(kiln.tensor([-1, 2])).tolist() == [0, 2]
    with kiln.profiler.profile() as prof:
        kiln.relu(x)
    assert [e.name for e in prof.events()] == ["le", "where"]  # a profile sees the ops
    assert not dispatch.profiling_ops


def test_a_compiled_relu_traces_the_ops():
    a = np.nan_to_num(_array((4, 3)), posinf=3.0, neginf=-3.0)
    w = kiln.tensor(a, requires_grad=True)
    step = kiln.compile(lambda x: (kiln.relu(x * w) * 2.0).sum())
    for i in range(3):
        w.grad = None
        x = kiln.tensor(a + i)
        step(x).backward()
        xw = (a + i) * a
        np.testing.assert_allclose(w.grad.numpy(), np.where(xw > 0, 2.0, 0.0).astype(np.float32) * (a + i), rtol=1e-6)


def test_large_tensors_take_the_ops_where_eager_kernels_are_on(monkeypatch):
    """From ``COMPILED_FROM`` elements the where's compiled kernel (on the kernel threads) selects,
    when eager kernels are on; the values and gradients are the node's."""
    from kiln.frontend import eager_kernels

    monkeypatch.setattr(sys.modules[relu_eager.__module__], "COMPILED_FROM", 60)
    a = _array((3, 4, 5))
    small = kiln.tensor(a[:2], requires_grad=True)
    assert relu_eager(kiln.tensor(a)) is not None  # eager kernels off (the suite's default)
    eager_kernels.set_enabled(True)
    try:
        assert relu_eager(kiln.tensor(a)) is None
        x = kiln.tensor(a, requires_grad=True)
        y = kiln.relu(x)
        assert y.grad_fn.name() != "ReluBackward0"
        y.backward(kiln.tensor(_array(seed=1)))
        assert kiln.relu(small).grad_fn.name() == "ReluBackward0"  # 40 elements: the node
    finally:
        eager_kernels.set_enabled(False)
    expected = kiln.tensor(a, requires_grad=True)
    _ops(expected).backward(kiln.tensor(_array(seed=1)))
    np.testing.assert_array_equal(y.detach().numpy(), _ops(kiln.tensor(a)).numpy())
    np.testing.assert_array_equal(x.grad.numpy(), expected.grad.numpy())
