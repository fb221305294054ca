"""``nn.functional.leaky_relu`` on eager CPU tensors is one autograd node (``LeakyReluBackward``): the same
values and gradients as the ``where`` composite it replaces and as PyTorch's, with every autograd rule
(create_graph, retain_graph, hooks, no_grad, in place) and the composite where it must run."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend import dispatch
from kiln.frontend.ops.leaky_relu import leaky_relu_eager

F = kiln.nn.functional


def _array(shape=(3, 4, 5), dtype=np.float32, seed=0):
    """Normal values with the awkward ones among them: both zeros, nan and both infinities."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    x.reshape(-1)[:5] = [0.0, -0.0, np.nan, np.inf, -np.inf]
    return x


def _composite(x, slope):
    """The ops leaky_relu ran before."""
    return kiln.where(x > 0, x, x * slope)


@pytest.mark.parametrize("slope", [0.2, 0.01, 0.0, 1.0, 0, -0.5, 1.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_leaky_relu_equals_its_composite_forward_and_backward(slope, dtype):
    a = _array(dtype=dtype)
    seed = np.random.default_rng(1).standard_normal(a.shape).astype(dtype)
    found = []
    for fn in (F.leaky_relu, _composite):
        x = kiln.tensor(a, requires_grad=True)
        y = fn(x, slope)
        y.backward(kiln.tensor(seed))
        found.append((y.detach().numpy(), x.grad.numpy()))
        assert y.dtype == x.dtype
    assert type(F.leaky_relu(kiln.tensor(a, requires_grad=True), slope).grad_fn).__name__ == "LeakyReluBackward"
    for got, expected in zip(*found, strict=True):
        np.testing.assert_array_equal(got, expected)  # the same arithmetic: equal to the bit (nan where nan)


def test_leaky_relu_gradcheck_in_float64():
    x = kiln.tensor(np.random.default_rng(2).standard_normal((4, 6)) + 0.05, requires_grad=True)  # away from 0
    for slope in (0.2, -0.3, 2.0):
        assert kiln.autograd.gradcheck(lambda t, s=slope: F.leaky_relu(t, s), (x,))


def test_leaky_relu_matches_torch_with_double_backward(torch):
    a = _array((5, 6), np.float64)[:, :].copy()
    a[0, 2:5] = [0.5, -0.7, 1.2]  # finite values: torch's and kiln's double backward through them
    a = np.nan_to_num(a)

    def run(lib):
        x = lib.tensor(a, requires_grad=True)
        y = lib.nn.functional.leaky_relu(x * 1.5, 0.2)
        (gx,) = lib.autograd.grad((y * y).sum(), (x,), create_graph=True)
        (gx * gx).sum().backward()
        return [y.detach().numpy(), gx.detach().numpy(), x.grad.numpy()]

    for got, expected in zip(run(kiln), run(torch), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_in_place_forms_give_the_gradient_of_the_input_they_overwrite(torch):
    a = _array((4, 5))
    a = np.nan_to_num(a, posinf=3.0, neginf=-3.0)

    def run(lib, how):
        x = lib.tensor(a, requires_grad=True)
        h = x * 2.0
        y = (
            lib.nn.functional.leaky_relu(h, 0.1, inplace=True)
            if how == "inplace"
            else (lib.nn.functional.leaky_relu_(h, 0.1))
        )
        (y * lib.tensor(a)).sum().backward()
        return [h.detach().numpy(), x.grad.numpy()]

    for how in ("inplace", "underscore"):
        for got, expected in zip(run(kiln, how), run(torch, how), strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_retain_graph_hooks_and_no_grad():
    x = kiln.tensor([[-2.0, 0.0, 3.0]], requires_grad=True)
    y = F.leaky_relu(x, 0.5)
    seen = []
    y.register_hook(lambda g: seen.append(1) or g * 3)
    y.retain_grad()
    y.sum().backward(retain_graph=True)
    y.sum().backward()
    assert x.grad.tolist() == [[3.0, 3.0, 6.0]] and y.grad.tolist() == [[6.0, 6.0, 6.0]] and len(seen) == 2
    with pytest.raises(RuntimeError, match="second time"):
        y.sum().backward()
    with kiln.no_grad():
        assert F.leaky_relu(x, 0.5).grad_fn is None and not F.leaky_relu(x, 0.5).requires_grad
    assert F.leaky_relu(x.detach(), 0.5).grad_fn is None


def test_the_composite_runs_where_the_node_does_not_apply():
    x = kiln.tensor(_array((2, 3)))
    assert leaky_relu_eager(x, 0.2) is not None
    assert leaky_relu_eager(x.to(kiln.float16), 0.2) is None  # another dtype: the ops
    assert leaky_relu_eager(x, kiln.tensor(0.2)) is None  # a tensor slope: the ops
    np.testing.assert_array_equal(F.leaky_relu(x.to(kiln.float16), 0.2).numpy(), _composite(x.to(kiln.float16), 0.2))
    with kiln.profiler.profile() as prof:
        F.leaky_relu(x, 0.2)
    assert [e.name for e in prof.events()] == ["gt", "mul", "where"]  # a profile sees the ops
    assert not dispatch.profiling_ops


def test_a_compiled_leaky_relu_traces_the_ops():
    a = np.nan_to_num(_array((4, 3)), posinf=3.0, neginf=-3.0)
    w = kiln.tensor(a, requires_grad=True)
    step = kiln.compile(lambda x: (F.leaky_relu(x * w, 0.2) * 2.0).sum())
    for i in range(3):
        w.grad = None
        x = kiln.tensor(a + i)
        step(x).backward()
        xw = (a + i) * a
        np.testing.assert_allclose(w.grad.numpy(), np.where(xw > 0, 2.0, 0.4).astype(np.float32) * (a + i), rtol=1e-6)


# ----------------------------------------------------------------------------- relu
def test_relu_gradcheck_double_backward_and_torch(torch):
    x = kiln.tensor(np.random.default_rng(2).standard_normal((4, 6)) + 0.05, requires_grad=True)
    assert kiln.autograd.gradcheck(F.relu, (x,))
    a = np.nan_to_num(_array((5, 6), np.float64))

    def run(lib):
        x = lib.tensor(a, requires_grad=True)
        y = lib.nn.functional.relu(x * 1.5)
        (gx,) = lib.autograd.grad((y * y).sum(), (x,), create_graph=True)
        (gx * gx).sum().backward()
        return [y.detach().numpy(), gx.detach().numpy(), x.grad.numpy()]

    for got, expected in zip(run(kiln), run(torch), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_relu_runs_the_ops_in_profiles_and_traces_and_retains_graphs():
    x = kiln.tensor([[-2.0, 0.0, 3.0]], requires_grad=True)
    with kiln.profiler.profile() as prof:
        F.relu(x)
    assert [e.name for e in prof.events()] == ["le", "where"] and not dispatch.profiling_ops
    assert type(F.relu(x).grad_fn).__name__ == type(kiln.nn.ReLU()(x).grad_fn).__name__ == "ReluBackward"
    y = F.relu(x)
    y.sum().backward(retain_graph=True)
    y.sum().backward()
    assert x.grad.tolist() == [[0.0, 0.0, 2.0]]
    with pytest.raises(RuntimeError, match="second time"):
        y.sum().backward()
    step = kiln.compile(lambda x: (F.relu(x) * 2.0).sum())
    for i in range(3):
        np.testing.assert_allclose(step(kiln.tensor([[-2.0, i, 3.0]])).item(), 2.0 * (3 + i), rtol=1e-6)
