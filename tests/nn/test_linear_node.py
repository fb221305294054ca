"""``nn.functional.linear`` on eager CPU tensors is one autograd node (``LinearBackward``): the same
values and gradients as PyTorch's and as the composite of ops it replaces, with every autograd rule
(create_graph, in-place checks, retain_graph, hooks, no_grad) and the composite where it must run."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend import dispatch
from kiln.frontend.ops.linear import linear_eager

F = kiln.nn.functional


def _arrays(shape_x, out_features, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape_x).astype(dtype)
    w = rng.standard_normal((out_features, shape_x[-1])).astype(dtype)
    b = rng.standard_normal(out_features).astype(dtype)
    return x, w, b


def _composite(x, w, b):
    """The ops linear ran before: transpose, matmul, add."""
    out = kiln.matmul(x, w.transpose(0, 1))
    return out if b is None else out + b


@pytest.mark.parametrize("shape_x", [(5, 3), (2, 4, 3), (0, 3)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_equals_its_composite_forward_and_backward(shape_x, with_bias, dtype):
    arrays = _arrays(shape_x, 4, dtype)
    seed = np.random.default_rng(9).standard_normal((*shape_x[:-1], 4)).astype(dtype)
    found = []
    for fn in (F.linear, _composite):
        x, w, b = (kiln.tensor(a, requires_grad=True) for a in arrays)
        y = fn(x, w, b if with_bias else None)
        y.backward(kiln.tensor(seed))
        found.append([y.detach().numpy(), x.grad.numpy(), w.grad.numpy(), b.grad.numpy() if with_bias else None])
    assert found[0] and type(F.linear(*(kiln.tensor(a, requires_grad=True) for a in arrays)).grad_fn).__name__ == (
        "LinearBackward"
    )
    tolerance = 1e-6 if dtype == np.float32 else 1e-14  # (g^T x here, (x^T g)^T there: another BLAS order)
    for a, e in zip(*found, strict=True):
        if e is not None:
            np.testing.assert_allclose(a, e, rtol=tolerance, atol=tolerance)


def test_linear_matches_torch_with_double_backward(torch):
    arrays = _arrays((6, 5), 3, np.float64)

    def run(lib):
        x, w, b = (lib.tensor(a, requires_grad=True) for a in arrays)
        y = lib.nn.functional.linear(x, w, b)
        (gx, gw) = lib.autograd.grad((y * y).sum(), (x, w), create_graph=True)
        ((gx * gx).sum() + (gw * gw).sum()).backward()
        return [y.detach().numpy(), x.grad.numpy(), w.grad.numpy(), b.grad.numpy()]

    for a, e in zip(run(kiln), run(torch), strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-12)


def test_an_input_or_weight_changed_in_place_before_the_backward_is_an_error():
    x, w, b = (kiln.tensor(a, requires_grad=True) for a in _arrays((4, 3), 2))
    for changed in ("weight", "input"):
        x_in = x * 1.0
        y = F.linear(x_in, w, b)
        with kiln.no_grad():
            (w if changed == "weight" else x_in).mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
        with kiln.no_grad():
            w.div_(2.0) if changed == "weight" else None


def test_retain_graph_hooks_and_no_grad():
    x, w, b = (kiln.tensor(a, requires_grad=True) for a in _arrays((4, 3), 2))
    y = F.linear(x, w, b)
    seen = []
    y.register_hook(lambda g: seen.append(1) or g * 3)
    y.retain_grad()
    y.sum().backward(retain_graph=True)
    y.sum().backward()
    np.testing.assert_allclose(b.grad.numpy(), np.full(2, 2 * 3 * 4.0))
    assert len(seen) == 2 and y.grad.tolist() == [[6.0, 6.0]] * 4
    with pytest.raises(RuntimeError, match="second time"):
        y.sum().backward()
    with kiln.no_grad():
        assert F.linear(x, w, b).grad_fn is None and not F.linear(x, w, b).requires_grad
    frozen = F.linear(x.detach(), w.detach(), b.detach())
    assert frozen.grad_fn is None


def test_the_composite_runs_where_the_node_does_not_apply():
    x, w, b = (kiln.tensor(a) for a in _arrays((4, 3), 2))
    assert linear_eager(x, w, b) is not None
    assert linear_eager(x[0], w, b) is None  # a 1-d input
    assert linear_eager(x.to(kiln.float64), w, b) is None  # mixed dtypes: the ops' error
    with pytest.raises(RuntimeError, match="same dtype"):
        F.linear(x.to(kiln.float64), w, b)
    with pytest.raises(RuntimeError, match="in_features"):
        F.linear(kiln.ones(4, 5), w, b)
    np.testing.assert_allclose(F.linear(x[0], w, b).numpy(), x.numpy()[0] @ w.numpy().T + b.numpy(), rtol=1e-6)
    with kiln.profiler.profile() as prof:
        F.linear(x, w, b)
    assert [e.name for e in prof.events()] == ["permute", "matmul", "add"]  # a profile sees the ops
    assert not dispatch.profiling_ops


def test_a_compiled_linear_traces_the_ops():
    x, w, b = (kiln.tensor(a, requires_grad=True) for a in _arrays((4, 3), 2))
    step = kiln.compile(lambda x: F.linear(x, w, b).sum())
    for _ in range(3):
        w.grad = None
        step(x.detach()).backward()
        np.testing.assert_allclose(w.grad.numpy(), np.tile(x.detach().numpy().sum(0), (2, 1)), rtol=1e-5)
