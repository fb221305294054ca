"""Training batch norm on the arrays (``nn._batch_norm``, wherever the compiled composite does not run): the same
values, running statistics and gradients as the same Function run as ops, as PyTorch's, with the
autograd rules (create_graph, in-place checks, retain_graph, no_grad) and the ops where it must not run."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import kiln
from kiln.nn import _batch_norm

F = kiln.nn.functional


def _channel_major(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3)


def _run(array, affine: bool, seed_grad, calls: int = 2):
    """(y, running_mean, running_var, x.grad, weight.grad, bias.grad) after ``calls`` calls and backwards."""
    rng = np.random.default_rng(3)
    c = array.shape[1]
    w = kiln.tensor(rng.standard_normal(c).astype(array.dtype), requires_grad=True) if affine else None
    b = kiln.tensor(rng.standard_normal(c).astype(array.dtype), requires_grad=True) if affine else None
    rm, rv = kiln.zeros(c, dtype=kiln.tensor(array).dtype), kiln.ones(c, dtype=kiln.tensor(array).dtype)
    x = kiln.from_numpy(array.copy(order="K")).requires_grad_()
    for _ in range(calls):
        y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3)
        y.backward(kiln.tensor(seed_grad))
    grads = [t.grad.numpy() for t in (w, b) if t is not None]
    return [y.detach().numpy(), rm.numpy(), rv.numpy(), x.grad.numpy(), *grads]


@pytest.mark.parametrize(
    "shape, layout", [((6, 4, 3, 5), "C"), ((6, 4, 3, 5), "channel-major"), ((8, 5), "C"), ((3, 4, 7), "C")]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("affine", [True, False])
def test_on_the_arrays_equals_the_ops(monkeypatch, shape, layout, dtype, affine):
    rng = np.random.default_rng(0)
    array = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    if layout == "channel-major":
        array = _channel_major(array)
    seed_grad = rng.standard_normal(shape).astype(dtype)
    found = _run(array, affine, seed_grad)
    monkeypatch.setattr(_batch_norm, "_on_arrays", lambda *tensors: False)  # every call as ops
    expected = _run(array, affine, seed_grad)
    tolerance = 2e-5 if dtype == np.float32 else 1e-12
    for got, want in zip(found, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


def test_on_the_arrays_is_the_path_taken_large_inputs_too():
    small = kiln.randn(4, 3, 2, 2, requires_grad=True)
    assert _batch_norm._on_arrays(small, None, None)
    large = kiln.randn(_batch_norm.ARRAYS_BELOW // 4, 2, requires_grad=True)  # (the compiled composite's size)
    y = F.batch_norm(large, None, None, training=True)  # (eager kernels off, as the tests run: never compiled)
    assert type(y.grad_fn).__name__ == "BatchNormBackward"
    assert not _batch_norm._on_arrays(small.to(kiln.float64), kiln.ones(3), None)  # mixed dtypes: the ops
    with kiln.profiler.profile() as prof:
        F.batch_norm(small, None, None, training=True).sum().backward()
    assert [e.name for e in prof.events()].count("rsqrt") == 1  # a profile sees the ops


def test_gradcheck_in_float64():
    rng = np.random.default_rng(1)
    x = kiln.tensor(rng.standard_normal((5, 3, 4)), requires_grad=True)
    w = kiln.tensor(rng.standard_normal(3), requires_grad=True)
    b = kiln.tensor(rng.standard_normal(3), requires_grad=True)
    assert kiln.autograd.gradcheck(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), (x, w, b))


def test_matches_torch_with_double_backward_and_running_statistics(torch):
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal((6, 4, 3, 3)), rng.standard_normal(4), rng.standard_normal(4)]

    def run(lib):
        x, w, b = (lib.tensor(a, requires_grad=True) for a in arrays)
        rm, rv = lib.zeros(4, dtype=lib.float64), lib.ones(4, dtype=lib.float64)
        y = lib.nn.functional.batch_norm(x, rm, rv, w, b, training=True)
        gx, gw = lib.autograd.grad((y * y * y).sum(), (x, w), create_graph=True)
        ((gx * gx).sum() + (gw * gw).sum()).backward()
        return [y.detach().numpy(), rm.numpy(), rv.numpy(), x.grad.numpy(), w.grad.numpy(), b.grad.numpy()]

    for got, want in zip(run(kiln), run(torch), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-10)


def test_in_place_change_retain_graph_and_no_grad():
    x = kiln.randn(4, 3, 2, 2, requires_grad=True)
    h = x * 1.0
    y = F.batch_norm(h, None, None, training=True)
    with kiln.no_grad():
        h.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    y = F.batch_norm(x, None, None, training=True)
    (y * y).sum().backward(retain_graph=True)
    first = x.grad.numpy().copy()
    (y * y).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * first, rtol=1e-6, atol=1e-6)
    with kiln.no_grad():
        assert F.batch_norm(x, None, None, training=True).grad_fn is None


def test_a_bias_changed_in_place_before_the_backward_is_no_error_as_in_pytorch():
    # PyTorch's batch norm node saves the weight, not the bias: no gradient reads its value
    grads = []
    for change in (False, True):
        kiln.manual_seed(0)
        x = kiln.randn(4, 3, 2, 2, requires_grad=True)
        w, b = kiln.randn(3, requires_grad=True), kiln.randn(3, requires_grad=True)
        y = F.batch_norm(x, None, None, w, b, training=True)
        if change:
            with kiln.no_grad():
                b.add_(1.0)
        (y * y.detach()).sum().backward()
        grads.append([t.grad.numpy().copy() for t in (x, w, b)])
    for got, want in zip(*grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("path", ["function", "create_graph", "compiled"])
def test_a_bias_changed_in_place_before_the_backward_is_no_error_on_any_path(path):
    # the composite's autograd.Function (a profile, a large input), its create_graph gradients, and
    # a compiled call (fuzz seed 9191000809: the trace's Function raised, so the call fell back
    # eagerly and raised again) keep only the bias's shape, as the node on the arrays does
    def step(x, w, b):
        y = F.batch_norm(x, None, None, w, b, training=True)
        with kiln.no_grad():
            b.add_(1.0)
        return y

    run = kiln.compile(step, wait=True) if path == "compiled" else step
    grads = []
    for calls in range(3 if path == "compiled" else 1):
        for fn in (step, run):
            kiln.manual_seed(calls)
            x = kiln.randn(4, 3, 2, 2, dtype=kiln.float64, requires_grad=True)
            w, b = (
                kiln.randn(3, dtype=kiln.float64, requires_grad=True),
                kiln.randn(3, dtype=kiln.float64, requires_grad=True),
            )
            with kiln.profiler.profile() if path == "function" else contextlib.nullcontext():
                y = fn(x, w, b)
            loss = (y * y.detach()).sum()
            found = kiln.autograd.grad(loss, [x, w, b], create_graph=path == "create_graph")
            grads.append([g.detach().numpy().copy() for g in found])
    expected = []
    kiln.manual_seed(0)
    x = kiln.randn(4, 3, 2, 2, dtype=kiln.float64, requires_grad=True)
    w, b = kiln.randn(3, dtype=kiln.float64, requires_grad=True), kiln.randn(3, dtype=kiln.float64, requires_grad=True)
    y = F.batch_norm(x, None, None, w, b, training=True)  # the bias unchanged
    expected = [g.numpy() for g in kiln.autograd.grad((y * y.detach()).sum(), [x, w, b])]
    for got, want in zip(grads[0], expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    for pair in zip(grads[::2], grads[1::2], strict=True):
        for got, want in zip(*pair, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_a_compiled_batch_norm_equals_eager_over_calls():
    bn_eager, bn_compiled = kiln.nn.BatchNorm2d(3), kiln.nn.BatchNorm2d(3)
    step = kiln.compile(lambda x: (bn_compiled(x) ** 3).sum())
    rng = np.random.default_rng(4)
    for _ in range(3):
        array = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
        xe, xc = kiln.tensor(array, requires_grad=True), kiln.tensor(array, requires_grad=True)
        (bn_eager(xe) ** 3).sum().backward()
        step(xc).backward()
        np.testing.assert_allclose(xc.grad.numpy(), xe.grad.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(bn_compiled.running_var.numpy(), bn_eager.running_var.numpy(), rtol=1e-6)


def test_running_statistics_updated_on_the_arrays_count_as_in_place_changes():
    bn = kiln.nn.BatchNorm2d(3)
    w = kiln.ones(3, requires_grad=True)
    saved = w * bn.running_mean  # the product saves running_mean for its backward
    before = bn.running_mean._version[0]
    bn(kiln.randn(4, 3, 2, 2))
    assert bn.running_mean._version[0] == before + 1 and bn.running_var._version[0] == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()


def test_one_node_without_zero_gradients_for_the_statistics():
    """On the arrays, batch norm is one ``BatchNormBackward`` whose only output is y (a Function with
    the statistics as outputs made the engine fill their zero gradients); up to 256 KiB of input
    (DCGAN's (16, 16, 8, 8) float32 is 64 KiB), where it measured faster than the compiled composite."""
    x = kiln.randn(16, 16, 8, 8, requires_grad=True)
    assert _batch_norm.ARRAYS_BELOW == 1 << 18 and _batch_norm._on_arrays(x, None, None)
    bn = kiln.nn.BatchNorm2d(16)
    y = bn(x)
    assert type(y.grad_fn).__name__ == "BatchNormBackward" and y.grad_fn.num_outputs == 1
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.zeros(x.shape), atol=1e-5)  # sum(y) is the sum of the bias


def test_num_batches_tracked_counts_on_the_array_and_as_an_op(torch):
    bn, reference = kiln.nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    x = np.random.default_rng(5).standard_normal((4, 3, 2, 2)).astype(np.float32)
    counter = bn.num_batches_tracked
    for calls in (1, 2):
        bn(kiln.tensor(x))
        reference(torch.tensor(x))
        assert bn.num_batches_tracked.item() == reference.num_batches_tracked.item() == calls
        assert bn.num_batches_tracked is counter and counter._version[0] == calls  # in place, counted
    np.testing.assert_allclose(bn.running_var.numpy(), reference.running_var.numpy(), rtol=1e-6)
    with kiln.profiler.profile() as prof:
        bn(kiln.tensor(x))
    assert "add" in [e.name for e in prof.events()] and bn.num_batches_tracked.item() == 3  # a profile sees the op
    base = kiln.full((2,), 3, dtype=kiln.int64)
    bn.num_batches_tracked = base[0]  # a view: counted by the op, through to its base
    bn(kiln.tensor(x))
    assert bn.num_batches_tracked.item() == 4 and base.tolist() == [4, 3]
