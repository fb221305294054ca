"""Compiled composite calls (``eager_composites``) on the layouts and call patterns of real training
steps: a conv's channel-major output, and a batch_norm module called twice before its backward."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend import eager_kernels


def _programs(name: str) -> list:
    return [e.program for key, e in eager_kernels.CACHE.entries.items() if key[0] == name]


def _channel_major(x: np.ndarray) -> np.ndarray:
    """``x`` (N, C, H, W) in memory ordered C, N, H, W: a transposed conv's output layout."""
    return np.ascontiguousarray(x.transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3)


def _two_calls_then_backward(arrays: list, calls: int = 3):
    """A BatchNorm2d module called on ``x`` and ``2 x`` before each backward (a GAN's discriminator
    on real and fake images): losses, the input's gradient, the running statistics and the weight's
    and bias's gradients."""
    kiln.manual_seed(0)
    bn = kiln.nn.BatchNorm2d(arrays[0].shape[1])
    found = []
    for array in arrays[:calls]:
        x = kiln.from_numpy(array.copy(order="K")).requires_grad_()
        assert x._data.strides == array.strides
        loss = (bn(x) * bn(x * 2.0)).sum()
        eager_kernels.wait(120)
        loss.backward()
        statistics = [bn.running_mean.numpy().copy(), bn.running_var.numpy().copy()]
        found.append([loss.item(), x.grad.numpy().copy(), *statistics, bn.weight.grad.numpy().copy(),
                      bn.bias.grad.numpy().copy()])  # fmt: skip
    return found


@pytest.mark.parametrize("layout", ["C order", "channel-major"])
def test_batch_norm_called_twice_before_its_backward_compiles_and_equals_eager(on, layout):
    """The running statistics a call updates are not saved for its backward (the second call updates
    them again): this raised an in-place error once the program was compiled. A conv's channel-major
    output compiles too (its key was refused, so the op ran eagerly)."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((4, 6, 5, 5)).astype(np.float32) for _ in range(3)]
    if layout == "channel-major":
        arrays = [_channel_major(a) for a in arrays]
    eager_kernels.set_enabled(False)
    expected = _two_calls_then_backward(arrays)
    eager_kernels.set_enabled(True)
    found = _two_calls_then_backward(arrays)
    programs = [p for p in _programs("batch_norm") if p is not None]
    assert programs and all(len(p.state.specializations) == 1 for p in programs)  # no compile in the caller
    for got, want in zip(found, expected, strict=True):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_batch_norm_twice_before_backward_matches_torch(on, torch):
    rng = np.random.default_rng(1)
    array = rng.standard_normal((4, 6, 5, 5)).astype(np.float32)
    (loss, grad, mean, var, *_) = _two_calls_then_backward([array, array, array])[-1]
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(6)
    for _ in range(3):
        x = torch.tensor(array, requires_grad=True)
        (bn(x) * bn(x * 2.0)).sum().backward()
    np.testing.assert_allclose(grad, x.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mean, bn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, bn.running_var.numpy(), rtol=1e-5, atol=1e-6)


def _changed_before_backward(op, arrays: list, change: int | None):
    """``op(*tensors)``'s backward after tensor ``change`` (None: none) was changed in place: the
    first input's gradient, or the error raised."""
    leaves = [kiln.tensor(a, requires_grad=True) for a in arrays]
    tensors = [leaf * 1.0 for leaf in leaves]
    y = op(*tensors)
    if change is not None:
        with kiln.no_grad():
            tensors[change].add_(1.0)
    try:
        y.sum().backward()
    except RuntimeError as error:
        return error
    return leaves[0].grad.numpy()


def _both_ways(op, arrays: list, change: int | None) -> list:
    """``_changed_before_backward`` on the numpy op, then on its compiled call (made ready first)."""
    eager_kernels.set_enabled(False)
    try:
        numpy_way = _changed_before_backward(op, arrays, change)
    finally:
        eager_kernels.set_enabled(True)
    op(*[kiln.tensor(a, requires_grad=True) for a in arrays]).sum().backward()
    eager_kernels.wait(120)
    return [numpy_way, _changed_before_backward(op, arrays, change)]


def test_an_input_its_backward_reads_changed_in_place_is_an_error_as_in_the_numpy_op(on):
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal((64, 40)).astype(np.float32), rng.standard_normal(40).astype(np.float32)]
    found = _both_ways(lambda x, w: kiln.nn.functional.layer_norm(x, (40,), w), arrays, change=1)
    assert _programs("layer_norm")
    for error in found:  # x's gradient reads the weight, as PyTorch's does
        assert isinstance(error, RuntimeError) and "modified by an inplace operation" in str(error)


def test_an_input_its_backward_does_not_read_may_change_in_place_as_in_the_numpy_op(on):
    # softmax's backward reads its output, not its input (as in PyTorch); an eval batch_norm's reads
    # the normalized input, not the running statistics the caller may then change (a fuzzer finding:
    # the compiled call raised where the numpy op and a compiled program did not)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 40)).astype(np.float32)
    expected = _changed_before_backward(lambda x: kiln.nn.functional.softmax(x, -1), [x], change=None)
    for found in _both_ways(lambda x: kiln.nn.functional.softmax(x, -1), [x], change=0):
        np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-7)
    images = rng.standard_normal((8, 32, 4, 8)).astype(np.float32)
    stats = [rng.standard_normal(32).astype(np.float32), rng.uniform(0.5, 2, 32).astype(np.float32)]

    def eval_batch_norm(x, mean):
        return kiln.nn.functional.batch_norm(x, mean, kiln.tensor(stats[1]), training=False)

    expected = _changed_before_backward(eval_batch_norm, [images, stats[0]], change=None)
    for found in _both_ways(eval_batch_norm, [images, stats[0]], change=1):
        np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-6)


def test_an_input_changed_in_place_is_an_error_where_the_backward_recomputes_the_op(on):
    # create_graph: the compiled call's backward runs the eager op again on its inputs, which must be
    # as they were
    rng = np.random.default_rng(5)
    x = kiln.tensor(rng.standard_normal((64, 40)).astype(np.float32), requires_grad=True)
    kiln.nn.functional.softmax(x * 1.0, -1).sum().backward()
    eager_kernels.wait(120)
    base = x * 1.0
    y = kiln.nn.functional.softmax(base, -1)
    assert _programs("softmax")
    with kiln.no_grad():
        base.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        kiln.autograd.grad((y * y).sum(), x, create_graph=True)


def _softmax_ready(x):
    kiln.nn.functional.softmax(x, -1).sum().backward()
    eager_kernels.wait(120)
    assert [p for p in _programs("softmax") if p is not None]


def test_a_compiled_composites_backward_runs_its_node_without_a_nested_engine_run(on, monkeypatch):
    from kiln.frontend.autograd import api

    rng = np.random.default_rng(4)
    x = kiln.tensor(rng.standard_normal((64, 40)).astype(np.float32), requires_grad=True)
    _softmax_ready(x)
    runs = []
    original = api.run_backward
    monkeypatch.setattr(api, "run_backward", lambda *a, **k: runs.append(1) or original(*a, **k))
    weights = kiln.tensor(rng.standard_normal((64, 40)).astype(np.float32))
    x.grad = None
    (kiln.nn.functional.softmax(x, -1) * weights).sum().backward()
    assert len(runs) == 1
    s = np.exp(x.detach().numpy()) / np.exp(x.detach().numpy()).sum(-1, keepdims=True)
    w = weights.numpy()
    np.testing.assert_allclose(x.grad.numpy(), s * (w - (s * w).sum(-1, keepdims=True)), rtol=1e-4, atol=1e-6)


def test_a_compiled_composites_backward_keeps_retain_graph_hooks_and_anomaly_mode(on):
    rng = np.random.default_rng(5)
    x = kiln.tensor(rng.standard_normal((64, 40)).astype(np.float32), requires_grad=True)
    _softmax_ready(x)
    x.grad = None
    y = kiln.nn.functional.softmax(x * 1.0, -1)
    seen = []
    y.register_hook(lambda g: seen.append(g.shape) or g * 2)
    loss = (y * kiln.tensor(rng.standard_normal((64, 40)).astype(np.float32))).sum()
    loss.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * first, rtol=1e-5, atol=1e-7)
    assert len(seen) == 2
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()
    with kiln.autograd.detect_anomaly():
        x.grad = None
        kiln.nn.functional.softmax(x, -1).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), np.zeros((64, 40)), atol=1e-5)


def _ready(name: str, call, *tensors) -> None:
    """Call ``call()`` until the composite ``name`` has a compiled program (the worker compiles it)."""
    call().sum().backward()
    eager_kernels.wait(120)
    assert [p for p in _programs(name) if p is not None]
    for t in tensors:
        t.grad = None


def test_a_compiled_composite_call_is_one_node_on_its_arguments_history(on):
    """The call runs the compiled program on the caller's tensors: one backward node whose edges are
    the arguments' own (no wrapper node around a call on detached copies), and a weight whose
    ``.grad`` is set runs the same program (no second specialization traced in the caller)."""
    from kiln.frontend.jit.backward import CompiledBackward

    rng = np.random.default_rng(6)
    x = kiln.tensor(rng.standard_normal((64, 40)).astype(np.float32), requires_grad=True)
    w = kiln.tensor(rng.standard_normal(40).astype(np.float32), requires_grad=True)
    b = kiln.tensor(rng.standard_normal(40).astype(np.float32), requires_grad=True)
    _ready("layer_norm", lambda: kiln.nn.functional.layer_norm(x * 1.0, (40,), w, b), x, w, b)
    w.grad = kiln.zeros(40)  # as after an optimizer step without zero_grad
    h = x * 2.0
    y = kiln.nn.functional.layer_norm(h, (40,), w, b)
    assert isinstance(y.grad_fn, CompiledBackward)
    assert y.grad_fn.next_edges[0][0] is h.grad_fn
    (y * y).sum().backward()
    [program] = [p for p in _programs("layer_norm") if p is not None]
    assert len(program.state.specializations) == 1
    eager_kernels.set_enabled(False)
    x2, w2, b2 = (kiln.tensor(t.detach().numpy(), requires_grad=True) for t in (x, w, b))
    y2 = kiln.nn.functional.layer_norm(x2 * 2.0, (40,), w2, b2)
    (y2 * y2).sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), y2.detach().numpy(), rtol=1e-5, atol=1e-5)
    for got, want in ((x, x2), (w, w2), (b, b2)):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-4, atol=1e-4)


def _second_derivative(x_array: np.ndarray, t_array: np.ndarray) -> list:
    x = kiln.tensor(x_array, requires_grad=True)
    loss = kiln.nn.functional.cross_entropy(x * 1.5, kiln.tensor(t_array))
    (g,) = kiln.autograd.grad(loss, [x], create_graph=True)
    (g * g).sum().backward()
    return [loss.item(), g.detach().numpy().copy(), x.grad.numpy().copy()]


def test_a_compiled_composites_gradient_differentiates_again_by_the_eager_op(on, torch):
    rng = np.random.default_rng(7)
    x_array, t_array = rng.standard_normal((64, 10)).astype(np.float32), rng.integers(0, 10, 64)
    x = kiln.tensor(x_array, requires_grad=True)
    _ready("cross_entropy", lambda: kiln.nn.functional.cross_entropy(x, kiln.tensor(t_array)))
    found = _second_derivative(x_array, t_array)
    tx = torch.tensor(x_array, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(tx * 1.5, torch.tensor(t_array))
    (g,) = torch.autograd.grad(loss, [tx], create_graph=True)
    (g * g).sum().backward()
    for got, want in zip(found, [loss.item(), g.detach().numpy(), tx.grad.numpy()], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_composite_calls_on_tensors_sharing_memory_or_under_autocast_run_eagerly(on):
    """Arguments sharing memory (the program was compiled for tensors apart) and autocast regions (the
    worker compiles outside them) run the eager op: values and gradients as with the kernels off."""
    rng = np.random.default_rng(8)
    array = rng.standard_normal((64, 40)).astype(np.float32)

    def run():
        x = kiln.tensor(array, requires_grad=True)
        h = x * 1.0
        y = kiln.nn.functional.layer_norm(h, (40,), h[0], h[1])
        with kiln.autocast("cpu"):
            z = kiln.nn.functional.softmax(h, -1)
        (y * z).sum().backward()
        return [y.detach().numpy(), z.detach().numpy(), x.grad.numpy()]

    x = kiln.tensor(array, requires_grad=True)
    w = kiln.tensor(array[0], requires_grad=True)
    _ready("layer_norm", lambda: kiln.nn.functional.layer_norm(x, (40,), w, w * 2.0))
    _ready("softmax", lambda: kiln.nn.functional.softmax(x * 1.0, -1))
    found = run()
    assert all(len(p.state.specializations) == 1 for p in _programs("layer_norm") + _programs("softmax") if p)
    eager_kernels.set_enabled(False)
    for got, want in zip(found, run(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
