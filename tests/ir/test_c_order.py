"""``linalg.c_order``: an array in C order, a transposed matrix copied block by block (a weight's
``W.T`` as a product's B, at every eager step of an LSTM or a Linear)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.ir.primitives import linalg
from kiln.ir.primitives.linalg import c_order


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("shape", [(512, 128), (500, 129), (128, 500), (63, 300), (3, 7), (1, 20000), (20000, 1)])
def test_a_transposed_matrix_is_copied_in_c_order(shape, dtype):
    w = np.random.default_rng(sum(shape)).integers(-1000, 1000, size=shape).astype(dtype)
    got = c_order(w.T)
    assert got.flags.c_contiguous
    assert np.shares_memory(got, w) == w.T.flags.c_contiguous  # (a (n, 1) transpose is C order already)
    np.testing.assert_array_equal(got, w.T)


def test_blocks_split_a_matrix_whose_rows_are_not_a_multiple_of_the_block(monkeypatch):
    monkeypatch.setattr(linalg, "BLOCKED_TRANSPOSE_MIN", 1)
    w = np.arange(7 * 5, dtype=np.float32).reshape(7, 5)
    monkeypatch.setattr(linalg, "TRANSPOSE_BLOCK", 3)
    np.testing.assert_array_equal(c_order(w.T), w.T)


def test_other_layouts_are_copied_as_numpy_copies_them_and_c_order_is_kept():
    x = np.random.default_rng(1).standard_normal((6, 40, 300))
    assert c_order(x) is x
    for view in (x[:, ::2], x.transpose(2, 0, 1), x[0, :, ::3], x[0].T[::2]):
        got = c_order(view)
        assert got.flags.c_contiguous
        np.testing.assert_array_equal(got, view)
