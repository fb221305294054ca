"""unfold and fold compiled by the LLVM backend as functions of their own (``kiln.codegen.llvm.window``): bit
for bit the eager kernels' results, in both window layouts, 1-3 spatial dims, strides, dilations,
float32 and float64, inputs of any strides, over several calls; and declined to the eager kernel
where the code generator does not go (integers)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln

CASES = [
    ((2, 3, 7, 6), (3, 2), (1, 2), (1, 1)),
    ((4, 2, 9), (3,), (2,), (2,)),
    ((2, 2, 5, 6, 4), (2, 3, 2), (1, 1, 2), (1, 2, 1)),
    ((3, 4, 8, 8), (1, 1), (2, 2), (1, 1)),
    ((64, 3, 12, 12), (3, 3), (1, 1), (1, 1)),  # enough work for the thread pool
    ((40, 2, 30, 30), (3, 3), (1, 1), (1, 1)),  # fold: blocks of 18 samples and a last one of 4
    ((2, 2, 131, 131), (3, 3), (1, 1), (1, 1)),  # fold: a plane bigger than a block; rows of 64 and more
    ((3, 2, 9, 36), (2, 5), (1, 1), (1, 1)),  # rows of 32 = 16 + 16 (float32) / 8 x 4 (float64)
    ((3, 2, 9, 37), (2, 7), (1, 1), (2, 1)),  # rows of 31 = 16 + 8 + 4 + 2 + 1 / 8 + 8 + 8 + 4 + 2 + 1
]


def _compiled_and_eager(fn, x):
    compiled = kiln.compile(fn)
    expected = fn(x).numpy()
    for _ in range(3):  # the first call traces; the others run the compiled program
        out = compiled(x).numpy()
        assert out.dtype == expected.dtype and np.array_equal(out, expected)
    report = "\n".join(compiled.state.specializations[0].report.describe())
    assert "extern nodes" not in report, report  # run by the compiled function, not the eager kernel
    return compiled


@pytest.mark.parametrize("batch_inner", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, kernel, stride, dilation", CASES)
def test_compiled_unfold_and_fold_equal_the_eager_kernels(shape, kernel, stride, dilation, dtype, batch_inner):
    rng = np.random.default_rng(0)
    geometry = {"kernel_size": kernel, "stride": stride, "dilation": dilation, "batch_inner": batch_inner}
    x = kiln.from_numpy(rng.standard_normal(shape).astype(dtype))
    _compiled_and_eager(lambda t: kiln.unfold_windows(t, **geometry), x)
    cols = kiln.from_numpy(rng.standard_normal(kiln.unfold_windows(x, **geometry).shape).astype(dtype))
    _compiled_and_eager(lambda c: kiln.fold_windows(c, shape[2:], **geometry), cols)


def test_unfold_of_a_strided_input():
    x = kiln.randn(3, 8, 9, 10).permute(1, 0, 3, 2)  # (8, 3, 10, 9), no dim contiguous in order
    _compiled_and_eager(lambda t: kiln.unfold_windows(t, (2, 3), (1, 2), batch_inner=True), x)


def test_integer_windows_run_on_the_eager_kernel():
    x = kiln.arange(2 * 3 * 5 * 5).reshape(2, 3, 5, 5)
    compiled = kiln.compile(lambda t: kiln.unfold_windows(t, (2, 2)))
    for _ in range(3):
        np.testing.assert_array_equal(compiled(x).numpy(), kiln.unfold_windows(x, (2, 2)).numpy())
    assert "unfold x1" in "\n".join(compiled.state.specializations[0].report.describe())


def test_conv_net_training_step_compiled_equals_eager():
    """A conv + pool step against eager, per call: the strided convolution's windows through the
    compiled unfold, its input's gradient through fold (the first convolution is direct)."""
    nn = kiln.nn

    def run(compiled: bool) -> list[float]:
        kiln.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 3, 3, stride=2),
                              nn.Flatten(), nn.Linear(3, 2)).double()  # fmt: skip
        optimizer = kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, y = kiln.randn(5, 2, 8, 8, dtype=kiln.float64), kiln.randint(0, 2, (5,))

        def step():
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss.detach()

        fn = kiln.compile(step) if compiled else step
        return [float(fn()) for _ in range(4)]

    np.testing.assert_allclose(run(True), run(False), rtol=1e-12, atol=1e-14)
