"""The window primitives unfold/fold: values, adjointness, copy semantics, gradients, errors."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from tests.conftest import assert_close
from tests.nn.helpers import leaves

rng = np.random.default_rng(0)


def test_unfold_windows_hand_computed():
    x = kiln.arange(6.0).reshape(1, 1, 6)
    out = kiln.unfold_windows(x, 3, stride=2, dilation=1)  # windows start at 0 and 2
    assert tuple(out.shape) == (1, 1, 3, 2)
    assert out.tolist() == [[[[0.0, 2.0], [1.0, 3.0], [2.0, 4.0]]]]
    dilated = kiln.unfold_windows(x, 2, stride=1, dilation=3)  # pairs (i, i + 3)
    assert dilated.tolist() == [[[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]]]


def test_fold_windows_hand_computed():
    cols = kiln.ones(1, 1, 3, 2)  # kernel 3, two windows with stride 2 over 5 elements
    out = kiln.fold_windows(cols, (5,), 3, stride=2)
    assert out.tolist() == [[[1.0, 1.0, 2.0, 1.0, 1.0]]]  # element 2 is in both windows


def test_unfold_matches_torch_im2col(torch):
    x = rng.normal(size=(2, 3, 7, 6))
    out = kiln.unfold_windows(kiln.from_numpy(x), (3, 2), stride=(2, 1), dilation=(1, 2))
    expected = torch.nn.functional.unfold(torch.from_numpy(x), (3, 2), dilation=(1, 2), stride=(2, 1))
    assert_close(out.reshape(2, 3 * 6, -1), expected, rtol=0, atol=0)


def test_fold_matches_torch_col2im(torch):
    cols = rng.normal(size=(2, 3, 3, 2, 3, 4))
    out = kiln.fold_windows(kiln.from_numpy(cols), (7, 6), (3, 2), stride=(2, 1), dilation=(1, 2))
    expected = torch.nn.functional.fold(torch.from_numpy(cols).reshape(2, 18, 12), (7, 6), (3, 2), dilation=(1, 2),
                                        stride=(2, 1))  # fmt: skip
    assert_close(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("shape", "kernel", "stride", "dilation"),
    [
        ((2, 2, 9), (3,), (2,), (2,)),
        ((1, 2, 5, 6), (2, 3), (1, 2), (2, 1)),
        ((1, 1, 4, 5, 3), (2, 2, 1), (2, 1, 1), (1, 2, 1)),
    ],
)
def test_fold_is_the_adjoint_of_unfold(shape, kernel, stride, dilation):
    x = kiln.from_numpy(rng.normal(size=shape))
    cols = kiln.unfold_windows(x, kernel, stride, dilation)
    y = kiln.from_numpy(rng.normal(size=tuple(cols.shape)))
    back = kiln.fold_windows(y, shape[2:], kernel, stride, dilation)
    assert float((cols * y).sum()) == pytest.approx(float((x * back).sum()), rel=1e-12)


def test_unfold_copies_like_pytorch():
    x = kiln.arange(8.0).reshape(1, 1, 8)
    out = kiln.unfold_windows(x, 3)
    assert out.is_contiguous()
    out.mul_(0.0)  # overlapping windows: a view would zero x too
    assert x.tolist() == [[[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]]]


def test_unfold_of_a_transposed_input():
    base = rng.normal(size=(1, 2, 6, 5))
    x = kiln.from_numpy(base).transpose(2, 3)  # non-contiguous (1, 2, 5, 6)
    out = kiln.unfold_windows(x, (2, 2))
    expected = kiln.unfold_windows(kiln.from_numpy(np.ascontiguousarray(base.transpose(0, 1, 3, 2))), (2, 2))
    assert_close(out, expected, rtol=0, atol=0)


def test_unfold_and_fold_gradients_and_second_order():
    (x,) = leaves(rng.normal(size=(1, 2, 5, 4)))
    (cols,) = leaves(rng.normal(size=(1, 2, 2, 2, 2, 3)))
    assert kiln.autograd.gradcheck(lambda t: kiln.unfold_windows(t, (2, 2), (2, 1), (1, 1)), (x,))
    assert kiln.autograd.gradcheck(lambda t: kiln.fold_windows(t, (5, 4), (2, 2), (2, 1), (1, 1)), (cols,))
    # unfold -> square: the second derivative flows back through fold and unfold again.
    assert kiln.autograd.gradgradcheck(lambda t: kiln.unfold_windows(t, (2, 2), (2, 1), (1, 1)) ** 2, (x,))


def test_window_errors_name_expected_and_given():
    x = kiln.zeros(1, 1, 3, 3)
    with pytest.raises(RuntimeError, match=r"smaller than the dilated kernel size \(4, 1\)"):
        kiln.unfold_windows(x, (2, 1), dilation=(3, 1))
    with pytest.raises(RuntimeError, match=r"expected a 4-d input .* got shape \[1, 3, 3\]"):
        kiln.unfold_windows(kiln.zeros(1, 3, 3), (2, 2))
    with pytest.raises(ValueError, match="stride must be positive"):
        kiln.unfold_windows(x, (2, 2), stride=(0, 1))
    with pytest.raises(
        RuntimeError, match=r"expected windows of shape \[1, 1, 2, 2, 2, 2\] .* got \[1, 1, 2, 2, 2, 3\]"
    ):
        kiln.fold_windows(kiln.zeros(1, 1, 2, 2, 2, 3), (3, 3), (2, 2))
