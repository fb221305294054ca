"""The fold primitive's numpy kernel: its channels-last sum (rows of windows up to
``FOLD_CHANNELS_LAST_WIDTH`` wide) equals the offset-by-offset strided sum bit for bit (the same
adds in the same order: nan, -0.0, overlaps), in both layouts, over strides and dilations, and
PyTorch's col2im."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kiln.ir.primitives import PRIMITIVES, windows

FOLD = PRIMITIVES["fold"].eager
CASES = [  # (n, c, size, kernel, stride, dilation)
    (3, 5, (10, 10), (4, 4), (2, 2), (1, 1)),  # DCGAN's transposed convolution
    (2, 3, (4, 4), (4, 4), (1, 1), (1, 1)),  # one window
    (2, 2, (9, 8), (3, 2), (2, 3), (2, 1)),
    (1, 4, (11,), (3,), (2,), (1,)),
    (2, 1, (5, 6, 4), (2, 3, 2), (1, 2, 1), (1, 1, 2)),
]


def _strided_sum(cols, size, kernel, stride, dilation):
    """The reference: one strided add per offset into (N, C, *size), row-major offsets."""
    d = len(kernel)
    out = np.zeros((*cols.shape[:2], *size), cols.dtype)
    out_spatial = cols.shape[2 + d :]
    for k in itertools.product(*map(range, kernel)):
        key = tuple(slice(i * dl, i * dl + s * (o - 1) + 1, s) for o, i, s, dl in zip(out_spatial, k, stride, dilation))
        out[(Ellipsis, *key)] += cols[(slice(None), slice(None), *k)]
    return out


@pytest.mark.parametrize("n, c, size, kernel, stride, dilation", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch_inner", [False, True])
def test_the_channels_last_sum_equals_the_strided_one_bit_for_bit(n, c, size, kernel, stride, dilation, dtype,
                                                                  batch_inner):  # fmt: skip
    out_spatial = windows._out_spatial("fold", size, kernel, stride, dilation)
    assert out_spatial[-1] <= windows.FOLD_CHANNELS_LAST_WIDTH  # (the path under test)
    rng = np.random.default_rng(0)
    cols = rng.standard_normal((n, c, *kernel, *out_spatial)).astype(dtype)
    flat = cols.reshape(-1)
    flat[::17], flat[3::19], flat[5::23] = np.nan, -0.0, np.inf
    attrs = {"size": size, "kernel_size": kernel, "stride": stride, "dilation": dilation}
    given = np.ascontiguousarray(cols.transpose(windows._batch_inner(len(kernel)))) if batch_inner else cols
    found = FOLD(np, given, **attrs, batch_inner=batch_inner)
    expected = _strided_sum(cols, size, kernel, stride, dilation)
    width = np.uint32 if dtype == np.float32 else np.uint64
    assert found.flags.c_contiguous and found.dtype == dtype
    np.testing.assert_array_equal(found.view(width), expected.view(width))


def test_matches_pytorchs_col2im(torch):
    rng = np.random.default_rng(1)
    cols = rng.standard_normal((3, 5, 4, 4, 4, 4)).astype(np.float32)
    found = FOLD(np, cols, size=(10, 10), kernel_size=(4, 4), stride=(2, 2), dilation=(1, 1))
    expected = torch.nn.functional.fold(torch.tensor(cols.reshape(3, 80, 16)), (10, 10), (4, 4), stride=2)
    np.testing.assert_allclose(found, expected.reshape(3, 5, 10, 10).numpy(), rtol=1e-6, atol=1e-6)
