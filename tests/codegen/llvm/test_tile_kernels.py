"""tile_transform and untile_transform compiled by the LLVM backend (``kernels_tiles``): equal to the
eager kernels (to rounding: the eager kernel sums in another order) for Winograd's three matrices
and a dense one, overlapping tiles and planes no tile covers to the edge, float32 and float64,
inputs of any strides, over several calls; and the Winograd convolution compiled against eager."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.nn._conv import WINOGRAD_FILTER, WINOGRAD_INPUT, WINOGRAD_OUTPUT

DENSE = ((1.5, -2.0, 0.25), (0.0, 1.0, 3.0))
CASES = [  # (matrix, stride, batch, plane)
    (WINOGRAD_INPUT, 2, (3, 2), (10, 12)),
    (WINOGRAD_INPUT, 2, (2,), (9, 7)),  # a last row and column no tile covers
    (WINOGRAD_INPUT, 2, (64, 4), (34, 34)),  # enough work for the thread pool
    (WINOGRAD_FILTER, 1, (5, 3), (3, 3)),  # one tile a plane
    (WINOGRAD_OUTPUT, 2, (2, 3), (8, 6)),
    (DENSE, 2, (2, 1), (7, 11)),  # 3x3 tiles overlapping by one
    (DENSE, 3, (3,), (8, 10)),  # stride above the tile: rows and columns between tiles
    (((1.0, 2.0), (3.0, -1.0)), 1, (2,), (5, 40)),  # rows of 39 tiles: vector loops and a remainder
    (DENSE, 2, (3,), (4, 4)),  # one tile a plane, with a row and a column it does not cover
]


def _tol(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}


def _compiled_and_eager(fn, x, dtype):
    compiled = kiln.compile(fn)
    expected = fn(x).numpy()
    for _ in range(3):  # the first call traces; the others run the compiled program
        out = compiled(x).numpy()
        assert out.dtype == expected.dtype and out.shape == expected.shape
        np.testing.assert_allclose(out, expected, **_tol(dtype))
    report = "\n".join(compiled.state.specializations[0].report.describe())
    assert "extern nodes" not in report, report  # run by the compiled function, not the eager kernel


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("matrix, stride, batch, plane", CASES)
def test_compiled_tile_and_untile_equal_the_eager_kernels(matrix, stride, batch, plane, dtype):
    rng = np.random.default_rng(0)
    x = kiln.from_numpy(rng.standard_normal((*batch, *plane)).astype(dtype))
    _compiled_and_eager(lambda t: kiln.tile_transform(t, matrix, stride), x, dtype)
    tiles = kiln.tile_transform(x, matrix, stride)
    v = kiln.from_numpy(rng.standard_normal(tuple(tiles.shape)).astype(dtype))
    _compiled_and_eager(lambda t: kiln.untile_transform(t, plane, matrix, stride), v, dtype)


def test_strided_inputs():
    x = kiln.randn(12, 3, 10, 2).permute(3, 1, 2, 0)  # (2, 3, 10, 12): no dim contiguous in order
    _compiled_and_eager(lambda t: kiln.tile_transform(t, WINOGRAD_INPUT, 2), x, np.float32)
    v = kiln.randn(6, 5, 16, 4).permute(2, 1, 3, 0)  # (16, 5, 4, 6)
    _compiled_and_eager(lambda t: kiln.untile_transform(t, (10, 14), WINOGRAD_INPUT, 2), v, np.float32)


def test_compiled_winograd_convolution_and_its_gradients_equal_eager():
    rng = np.random.default_rng(1)
    conv = kiln.nn.Conv2d(16, 24, 3, padding=1)
    x = kiln.from_numpy(rng.standard_normal((3, 16, 9, 10)).astype(np.float32))

    def step(x):
        x = x.requires_grad_()
        y = kiln.nn.functional.relu(conv(x))
        (y * y).sum().backward()
        return y.detach(), x.grad

    compiled = kiln.compile(step)
    for call in range(3):
        conv.zero_grad()
        y, dx = compiled(x.detach().clone())
        got = (y, dx, conv.weight.grad, conv.bias.grad)
        conv.zero_grad()
        want = (*step(x.detach().clone()), conv.weight.grad, conv.bias.grad)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4, err_msg=f"call {call}")
    graph = str(compiled.graph)
    assert "tile_transform" in graph and "untile_transform" in graph and "unfold" not in graph
