"""Layer norm on the arrays (``nn/_layer_norm_arrays.py``): the ops' values and gradients within
rounding, over normalized shapes, affine or not, float64 and strided inputs; PyTorch's; the ops
under create_graph and profiles; in-place changes of what it saved are errors."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.nn import _norm

F = kiln.nn.functional


def _run(array, normalized, affine: str, g):
    rng = np.random.default_rng(5)
    w = kiln.tensor(rng.standard_normal(normalized).astype(array.dtype), requires_grad=True) if "w" in affine else None
    b = kiln.tensor(rng.standard_normal(normalized).astype(array.dtype), requires_grad=True) if "b" in affine else None
    x = kiln.from_numpy(array.copy(order="K")).requires_grad_()
    y = F.layer_norm(x, normalized, w, b)
    y.backward(kiln.from_numpy(g))
    return [
        type(y.grad_fn).__name__,
        y.detach().numpy(),
        x.grad.numpy(),
        *[t.grad.numpy() for t in (w, b) if t is not None],
    ]


@pytest.mark.parametrize("shape, normalized", [((8, 16, 32), (32,)), ((4, 6, 5), (6, 5)), ((7, 3), (3,))])
@pytest.mark.parametrize("affine", ["wb", "w", ""])
@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 2e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("strided", [False, True])
def test_on_the_arrays_equals_the_ops(monkeypatch, shape, normalized, affine, dtype, tolerance, strided):
    rng = np.random.default_rng(0)
    array = (rng.standard_normal(shape) * 3 + 2).astype(dtype)
    if strided:
        array = np.asfortranarray(array)
    g = rng.standard_normal(shape).astype(dtype)
    found = _run(array, normalized, affine, g)
    monkeypatch.setattr(_norm, "layer_norm_on_arrays", lambda *args: None)
    expected = _run(array, normalized, affine, g)
    assert found[0] == "LayerNormBackward" and expected[0] != found[0]  # (the ops' result: a check node)
    for a, b in zip(found[1:], expected[1:], strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance)


def test_matches_pytorch(torch):
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((6, 10, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32),
              rng.standard_normal(16).astype(np.float32)]  # fmt: skip
    g = rng.standard_normal((6, 10, 16)).astype(np.float32)
    ours = [kiln.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = F.layer_norm(ours[0], (16,), ours[1], ours[2])
    ref = torch.nn.functional.layer_norm(theirs[0], (16,), theirs[1], theirs[2])
    y.backward(kiln.tensor(g))
    ref.backward(torch.tensor(g))
    np.testing.assert_allclose(y.detach().numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_gradcheck_and_second_order_through_the_ops():
    rng = np.random.default_rng(2)
    x = kiln.tensor(rng.standard_normal((3, 5)), requires_grad=True)
    w = kiln.tensor(rng.standard_normal(5), requires_grad=True)
    b = kiln.tensor(rng.standard_normal(5), requires_grad=True)
    assert F.layer_norm(x, (5,), w, b).grad_fn.name() == "NativeLayerNormBackward"
    assert kiln.autograd.gradcheck(lambda x, w, b: F.layer_norm(x, (5,), w, b), (x, w, b))
    assert kiln.autograd.gradgradcheck(lambda x, w, b: F.layer_norm(x, (5,), w, b), (x, w, b))


def test_an_in_place_change_is_an_error_and_profiles_see_the_ops():
    x = kiln.randn(4, 8, requires_grad=True)
    w = kiln.ones(8, requires_grad=True)
    y = F.layer_norm(x, (8,), w)
    with kiln.no_grad():
        w.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    with kiln.profiler.profile() as prof:
        F.layer_norm(x, (8,)).sum().backward()
    assert "rsqrt" in [e.name for e in prof.events()]


@pytest.mark.parametrize("op", ["layer_norm", "softmax", "gelu", "cross_entropy"])
def test_a_backward_through_the_ops_leaves_the_callers_graph_alone(op):
    """The ops' backward (here under a profile; also while another thread traces) recomputes the
    composite from detached inputs: a recomputation over the inputs' own history ran, and freed, the
    nodes behind them (here x * 1.0), which the caller's backward then reached a second time."""
    x = kiln.randn(6, 8, requires_grad=True)
    h = x * 1.0
    if op == "layer_norm":
        y = F.layer_norm(h, (8,), h[0], h[1])
    elif op == "softmax":
        y = F.softmax(h, dim=1) * h
    elif op == "gelu":
        y = F.gelu(h, approximate="tanh") * h
    else:
        y = F.cross_entropy(h, kiln.tensor([0, 1, 2, 3, 4, 5])) * h
    with kiln.profiler.profile():
        y.sum().backward()
    found = x.grad.numpy()
    x.grad = None
    h = x * 1.0  # the same again, without the profile: the arrays' backward
    y = {"layer_norm": lambda: F.layer_norm(h, (8,), h[0], h[1]), "softmax": lambda: F.softmax(h, dim=1) * h,
         "gelu": lambda: F.gelu(h, approximate="tanh") * h,
         "cross_entropy": lambda: F.cross_entropy(h, kiln.tensor([0, 1, 2, 3, 4, 5])) * h}[op]()  # fmt: skip
    y.sum().backward()
    np.testing.assert_allclose(found, x.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_a_trace_in_another_thread_leaves_this_ones_calls_on_the_arrays(monkeypatch):
    """Eager kernels trace composites in a background thread while a fresh process's first steps run:
    the count of traces running anywhere is then above 0, but none records this thread's ops."""
    from kiln.frontend.jit import state

    monkeypatch.setattr(state, "tracing", state.tracing + 1)  # (another thread's trace, as the count sees it)
    x = kiln.randn(4, 8, requires_grad=True)
    y = F.layer_norm(x, (8,))
    assert y.grad_fn.name() == "NativeLayerNormBackward"
    y.sum().backward()
    w = kiln.randn(3, requires_grad=True)
    w.grad = kiln.ones(3)
    assert kiln.optim._on_arrays.may_run([w])
    assert F.relu(x).grad_fn.name() == "ReluBackward0"  # (relu's and linear's own checks alike)
    assert F.linear(x, kiln.randn(2, 8, requires_grad=True)).grad_fn.name() == "LinearBackward"


def test_a_transposed_input_gives_a_contiguous_result_on_both_paths(torch):
    """PyTorch's layer norm returns C-order memory whatever its input's layout (``.view(-1)`` works);
    the composite's ops kept the input's layout, so a compiled call (which traces the composite)
    raised where eager (on the arrays) did not -- the fuzzer's seed 7373006105."""
    x = kiln.tensor(np.arange(36, dtype=np.float32).reshape(4, 3, 3)).transpose(1, 2)

    def f(x):
        return kiln.nn.functional.layer_norm(x, (3,)).view(36)

    expected = torch.nn.functional.layer_norm(torch.tensor(x.numpy()), (3,)).reshape(36).numpy()
    for fn in (f, kiln.compile(f)):
        for _ in range(2):
            np.testing.assert_allclose(fn(x).numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_changing_the_input_in_place_before_backward_raises_as_in_pytorch(compiled):
    """PyTorch's NativeLayerNormBackward keeps the input: ``y = layer_norm(x); x.mul_(y)`` then
    ``backward`` raises. The arrays node raised; the composite a compiled call traces did not (the
    gradient of the old input) -- the fuzzer's seed 7373009777."""

    def f(a):
        x = a * 1.0
        y = kiln.nn.functional.layer_norm(x, (3,))
        x.mul_(y)
        return y.sum() + x.sum()

    fn = kiln.compile(f) if compiled else f
    for _ in range(2):
        a = kiln.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), requires_grad=True)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            fn(a).backward()
