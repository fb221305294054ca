"""Direct convolution compiled by the LLVM backend (``kiln.codegen.llvm.conv``): ``conv`` and ``conv_weight``
against their eager kernels (im2col and BLAS) over several calls, float32 and float64, rows
shorter and longer than a vector (masked tails), dilations, inputs with padded rows and filters of
any strides; the same bits on one thread as on two; declined to the eager kernel, with the reason,
where the code generator does not go; and a training step compiled against eager."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from benchmarks.models import train_step
from kiln.frontend.dispatch import apply
from kiln.ir.primitives import P

# (input shape, filter shape, dilation): rows of 28 (16 + a masked 12), 10 (one masked vector),
# 16 (one whole vector), 37 (two and a tail), 1; 1x1 and 1-wide filters
CASES = [
    ((3, 1, 32, 32), (6, 1, 5, 5), (1, 1)),
    ((2, 6, 14, 14), (16, 6, 5, 5), (1, 1)),
    ((2, 3, 18, 18), (5, 3, 3, 3), (1, 1)),
    ((2, 2, 9, 41), (3, 2, 3, 5), (2, 1)),
    ((3, 4, 6, 6), (2, 4, 2, 3), (1, 2)),
    ((2, 3, 5, 1), (4, 3, 3, 1), (1, 1)),
    ((2, 5, 4, 7), (7, 5, 1, 1), (1, 1)),
]
TOLERANCE = {np.float32: (2e-5, 2e-5), np.float64: (1e-12, 1e-12)}


def _conv(x, w, dilation=(1, 1)):
    return apply(P["conv"], x, w, stride=(1, 1), dilation=tuple(dilation))


def _conv_weight(g, x, kernel, dilation=(1, 1)):
    return apply(P["conv_weight"], g, x, kernel_size=tuple(kernel), stride=(1, 1), dilation=tuple(dilation))


def _check_compiled(fn, *args, dtype):
    compiled = kiln.compile(fn)
    expected = fn(*args).numpy()
    rtol, atol = TOLERANCE[dtype]
    for _ in range(3):  # the first call traces; the others run the compiled program
        out = compiled(*args).numpy()
        assert out.dtype == expected.dtype and out.shape == expected.shape
        np.testing.assert_allclose(out, expected, rtol=rtol, atol=atol * max(1.0, np.abs(expected).max(initial=0.0)))
    report = "\n".join(compiled.state.specializations[0].report.describe())
    externs = [line for line in report.splitlines() if "extern nodes" in line]
    assert not any("conv" in line for line in externs), report  # run by the compiled function, not the eager kernel
    return compiled


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("x_shape, w_shape, dilation", CASES)
def test_compiled_conv_and_its_weight_gradient_equal_the_eager_kernels(x_shape, w_shape, dilation, dtype):
    rng = np.random.default_rng(0)
    x = kiln.from_numpy(rng.standard_normal(x_shape).astype(dtype))
    w = kiln.from_numpy(rng.standard_normal(w_shape).astype(dtype))
    out = _check_compiled(lambda a, b: _conv(a, b, dilation), x, w, dtype=dtype)(x, w)
    g = kiln.from_numpy(rng.standard_normal(tuple(out.shape)).astype(dtype))
    _check_compiled(lambda a, b: _conv_weight(a, b, w_shape[2:], dilation), g, x, dtype=dtype)


def test_inputs_of_any_strides():
    """An input whose rows are further apart than their length (a slice), a transposed filter and
    a sliced output gradient: the kernels read them in place."""
    rng = np.random.default_rng(1)
    base = kiln.from_numpy(rng.standard_normal((3, 2, 12, 20)))
    w = kiln.from_numpy(rng.standard_normal((2, 4, 3, 3))).transpose(0, 1)  # (4, 2, 3, 3), strided
    _check_compiled(lambda b, f: _conv(b[:, :, 1:11, 2:17], f), base, w, dtype=np.float64)
    g = kiln.from_numpy(rng.standard_normal((3, 4, 10, 16)))
    _check_compiled(lambda a, b: _conv_weight(a[:, :, :8, 1:14], b[:, :, :10, :15], (3, 3)), g, base, dtype=np.float64)


def test_empty_batches_and_channels():
    """No output channels: nothing to compute; no samples: the filter's gradient is zeros."""
    rng = np.random.default_rng(4)
    x = kiln.from_numpy(rng.standard_normal((2, 3, 6, 6)))
    _check_compiled(_conv, x, kiln.zeros(0, 3, 3, 3, dtype=kiln.float64), dtype=np.float64)
    empty = kiln.zeros(0, 3, 6, 6, dtype=kiln.float64)
    out = _check_compiled(lambda a, b: _conv_weight(a, b, (3, 3)), kiln.zeros(0, 4, 4, 4, dtype=kiln.float64), empty,
                          dtype=np.float64)(kiln.zeros(0, 4, 4, 4, dtype=kiln.float64), empty)  # fmt: skip
    assert out.shape == (4, 3, 3, 3) and not out.numpy().any()


def test_results_do_not_depend_on_the_thread_count():
    rng = np.random.default_rng(2)
    x = kiln.from_numpy(rng.standard_normal((16, 3, 20, 20)).astype(np.float32))
    w = kiln.from_numpy(rng.standard_normal((8, 3, 5, 5)).astype(np.float32))
    g = kiln.from_numpy(rng.standard_normal((16, 8, 16, 16)).astype(np.float32))
    compiled = kiln.compile(lambda a, b, c: (_conv(a, b), _conv_weight(c, a, (5, 5))))
    compiled(x, w, g)  # traces (the results of this call are eager's)
    before = kiln.get_num_threads()
    try:
        results = []
        for n in (1, 2, 1, 2):
            kiln.set_num_threads(n)
            results.append([t.numpy() for t in compiled(x, w, g)])
    finally:
        kiln.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "fn, why",
    [
        (lambda x, w: apply(P["conv"], x, w, stride=(2, 1), dilation=(1, 1)), "unit strides only"),
        (lambda x, w: _conv(x.transpose(2, 3), w), "rows are not contiguous"),
        (lambda x, w: apply(P["conv"], x[:, :, 0], w[:, :, 0], stride=(1,), dilation=(1,)), "2-d only"),
    ],
)
def test_what_the_kernels_do_not_take_runs_eagerly_and_says_why(fn, why):
    rng = np.random.default_rng(3)
    x = kiln.from_numpy(rng.standard_normal((2, 3, 8, 8)))
    w = kiln.from_numpy(rng.standard_normal((4, 3, 3, 3)))
    compiled = kiln.compile(fn)
    for _ in range(3):
        np.testing.assert_allclose(compiled(x, w).numpy(), fn(x, w).numpy(), rtol=1e-12, atol=1e-12)
    report = "\n".join(compiled.state.specializations[0].report.describe())
    assert why in report, report


def _ops(x, w) -> set[str]:
    """The primitives of conv2d(x, w)'s compiled graph."""
    compiled = kiln.compile(lambda a, b: kiln.nn.functional.conv2d(a, b))
    for _ in range(2):
        compiled(x, w)
    graph = compiled.state.specializations[0].graph
    return {node.op for node in graph.nodes}


def test_conv2d_takes_the_direct_primitive_for_small_filters_only():
    small = _ops(kiln.randn(2, 3, 10, 10), kiln.randn(4, 3, 5, 5))  # 3 * 25 = 75
    large = _ops(kiln.randn(2, 16, 10, 10), kiln.randn(4, 16, 5, 5))  # 400: im2col and BLAS
    assert "conv" in small and "unfold" not in small
    assert "conv" not in large and "unfold" in large
    kiln.backends.cpu.direct_conv = False
    try:
        assert "conv" not in _ops(kiln.randn(2, 3, 10, 10), kiln.randn(4, 3, 5, 5))
    finally:
        kiln.backends.cpu.direct_conv = True


def test_lenet_like_training_step_compiled_equals_eager():
    """Both convolutions direct (their input gradients too: the second's by a flipped conv),
    pooling between them; losses and parameters after each step against eager."""
    nn = kiln.nn

    def run(compiled: bool):
        kiln.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(1, 4, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 6, 3, dilation=2),
                              nn.ReLU(), nn.Flatten(), nn.Linear(6 * 3 * 3, 3)).double()  # fmt: skip
        optimizer = kiln.optim.Adam(model.parameters(), lr=1e-2)
        x, y = kiln.randn(6, 1, 14, 14, dtype=kiln.float64), kiln.randint(0, 3, (6,))
        step = train_step(kiln, model, optimizer, x, y)
        fn = kiln.compile(step) if compiled else step
        losses = [float(fn()) for _ in range(4)]
        return losses, [p.detach().numpy().copy() for p in model.parameters()]

    (compiled_losses, compiled_params), (eager_losses, eager_params) = run(True), run(False)
    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=1e-12, atol=1e-14)
    for a, b in zip(compiled_params, eager_params, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
