"""tile_transform and untile_transform compiled by the LLVM backend (``kiln.codegen.llvm.tiles``): equal to the
eager kernels (to rounding: the eager kernel sums in another order) for Winograd's three matrices
and a dense one, overlapping tiles and planes no tile covers to the edge, float32 and float64,
inputs of any strides, over several calls. (The convolution compiled: ``tests/nn/test_winograd.py``.)"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.primitives.tiles import one_tile_a_plane
from kiln.nn._conv import F2, F4

DENSE = ((1.5, -2.0, 0.25), (0.0, 1.0, 3.0))
CASES = [  # (matrix, stride, batch, plane)
    (F2.input, 2, (3, 2), (10, 12)),
    (F2.input, 2, (2,), (9, 7)),  # a last row and column no tile covers
    (F2.input, 2, (64, 4), (34, 34)),  # enough work for the thread pool
    (F2.filter, 1, (5, 3), (3, 3)),  # one tile a plane
    (F2.output, 2, (2, 3), (8, 6)),
    (F4.input, 4, (2, 3), (14, 18)),
    (F4.input, 4, (3,), (17, 11)),  # rows and columns no tile covers
    (F4.input, 4, (3, 2), (10, 34)),  # rows of 8 tiles: explicit vectors, a line's last 2 columns loaded apart
    (F4.input, 4, (2,), (6, 34 + 4 * 5)),  # 13 tiles: a last group overlapping the one before
    (F4.filter, 1, (4, 2), (3, 3)),
    (F4.output, 4, (2, 2), (16, 12)),
    (DENSE, 2, (2, 1), (7, 11)),  # 3x3 tiles overlapping by one
    (DENSE, 3, (3,), (8, 10)),  # stride above the tile: rows and columns between tiles
    (((1.0, 2.0), (3.0, -1.0)), 1, (2,), (5, 40)),  # rows of 39 tiles: vector loops and a remainder
    (DENSE, 2, (3,), (4, 4)),  # one tile a plane, with a row and a column it does not cover
]


def _tol(dtype, expected):
    # both sum the same terms in other orders: errors scale with the largest value (F4's
    # coefficients reach 25), not with each element's
    scale = 1e-6 if dtype == np.float32 else 1e-14
    return {"rtol": 1e-5 if dtype == np.float32 else 1e-12, "atol": scale * max(1.0, float(np.abs(expected).max()))}


def _compiled_and_eager(fn, x, dtype, kernel: bool = True):
    """``fn`` compiled equals ``fn`` eager over several calls; ``kernel``: the compiled function
    runs it (else its eager kernel: a filter's transform is one matmul in BLAS)."""
    compiled = kiln.compile(fn)
    expected = fn(x).numpy()
    for _ in range(3):  # the first call traces; the others run the compiled program
        out = compiled(x).numpy()
        assert out.dtype == expected.dtype and out.shape == expected.shape
        np.testing.assert_allclose(out, expected, **_tol(dtype, expected))
    report = "\n".join(compiled.state.specializations[0].report.describe())
    assert ("extern nodes" not in report) == kernel, report  # the compiled function, or the eager kernel


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("matrix, stride, batch, plane", CASES)
def test_compiled_tile_and_untile_equal_the_eager_kernels(matrix, stride, batch, plane, dtype):
    rng = np.random.default_rng(0)
    x = kiln.from_numpy(rng.standard_normal((*batch, *plane)).astype(dtype))
    kernel = not one_tile_a_plane(plane, len(matrix[0]))
    _compiled_and_eager(lambda t: kiln.tile_transform(t, matrix, stride), x, dtype, kernel)
    tiles = kiln.tile_transform(x, matrix, stride)
    v = kiln.from_numpy(rng.standard_normal(tuple(tiles.shape)).astype(dtype))
    _compiled_and_eager(lambda t: kiln.untile_transform(t, plane, matrix, stride), v, dtype, kernel)


def test_strided_inputs():
    x = kiln.randn(12, 3, 10, 2).permute(3, 1, 2, 0)  # (2, 3, 10, 12): no dim contiguous in order
    _compiled_and_eager(lambda t: kiln.tile_transform(t, F2.input, 2), x, np.float32)
    v = kiln.randn(6, 5, 16, 4).permute(2, 1, 3, 0)  # (16, 5, 4, 6)
    _compiled_and_eager(lambda t: kiln.untile_transform(t, (10, 14), F2.input, 2), v, np.float32)


def test_an_untile_too_wide_for_its_stack_buffer_runs_on_the_eager_kernel():
    v = kiln.randn(36, 1, 1, 500)  # F4 tiles of a plane 2002 wide: a ring of tile rows over 64 KB
    compiled = kiln.compile(lambda t: kiln.untile_transform(t, (6, 2002), F4.input, 4))
    for _ in range(3):
        np.testing.assert_allclose(
            compiled(v).numpy(), kiln.untile_transform(v, (6, 2002), F4.input, 4).numpy(), rtol=1e-6, atol=1e-4
        )
    report = "\n".join(compiled.state.specializations[0].report.describe())
    assert "untile_transform x1" in report and "stack" in report, report
