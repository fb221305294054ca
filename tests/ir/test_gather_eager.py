"""The gather primitive's eager kernel: its 2-D path (cross_entropy's pick of each row's class)
equals numpy's take_along_axis on the cut input, index by index, negative indices included, and
raises numpy's IndexError out of range."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.ir.primitives import P

gather = P["gather"].eager


@pytest.mark.parametrize(("x_shape", "index_shape", "axis"),
                         [((64, 10), (64, 1), 1), ((6, 5), (4, 3), 1), ((6, 5), (4, 3), 0), ((6, 5), (6, 5), -1),
                          ((6, 5), (0, 5), 0), ((6, 5), (6, 0), 1), ((3, 4, 5), (2, 4, 3), 2)])  # fmt: skip
def test_gather_equals_take_along_axis_on_the_cut_input(x_shape, index_shape, axis):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    size = x_shape[axis]
    index = rng.integers(-size, size, index_shape)
    cut = x[tuple(slice(None) if d == axis % x.ndim else slice(0, n) for d, n in enumerate(index_shape))]
    expected = np.take_along_axis(cut, index, axis=axis)
    found = gather(np, x, index, axis=axis)
    assert found.shape == expected.shape and found.dtype == x.dtype
    np.testing.assert_array_equal(found, expected)
    for i in np.ndindex(*index_shape):  # out[i][j] = x[i][index[i][j]] (axis 1), by hand
        position = list(i)
        position[axis % x.ndim] = index[i]
        assert found[i] == x[tuple(position)]


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_out_of_range_raises_index_error(axis):
    x = np.zeros((4, 3), np.float32)
    index = np.zeros((2, 2), np.int64)
    index[1, 1] = x.shape[axis]
    with pytest.raises(IndexError):
        gather(np, x, index, axis=axis)
