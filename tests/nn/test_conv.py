"""conv1d / conv2d / conv3d and F.unfold / F.fold against torch.nn.functional, gradients, errors."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from tests.conftest import assert_close
from tests.nn.helpers import check_parity, leaves

rng = np.random.default_rng(1)

CONV2D_CASES = [
    {},
    {"stride": 2, "padding": 1},
    {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2)},
    {"padding": "same", "dilation": 2},
    {"padding": "valid"},
    {"groups": 2, "padding": 1},
    {"groups": 4, "stride": 2},  # depthwise
]


@pytest.mark.parametrize("kwargs", CONV2D_CASES, ids=str)
def test_conv2d_matches_torch_values_and_gradients(torch, kwargs):
    groups = kwargs.get("groups", 1)
    x = rng.normal(size=(2, 4, 7, 6))
    w = rng.normal(size=(8, 4 // groups, 3, 2))
    b = rng.normal(size=8)
    check_parity(torch, lambda *a: F.conv2d(*a, **kwargs), lambda *a: torch.nn.functional.conv2d(*a, **kwargs),
                 [x, w, b], grad=(0, 1, 2), rtol=1e-10, atol=1e-10)  # fmt: skip


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"stride": 3, "padding": 2}, {"dilation": 2, "padding": "same"}, {"groups": 3, "padding": 1}],
    ids=str,
)
def test_conv1d_matches_torch_values_and_gradients(torch, kwargs):
    groups = kwargs.get("groups", 1)
    x, w, b = rng.normal(size=(3, 6, 11)), rng.normal(size=(9, 6 // groups, 3)), rng.normal(size=9)
    check_parity(torch, lambda *a: F.conv1d(*a, **kwargs), lambda *a: torch.nn.functional.conv1d(*a, **kwargs),
                 [x, w, b], grad=(0, 1, 2), rtol=1e-10, atol=1e-10)  # fmt: skip


def test_conv3d_and_unbatched_conv2d_match_torch(torch):
    x, w = rng.normal(size=(1, 2, 4, 5, 3)), rng.normal(size=(3, 2, 2, 3, 2))
    check_parity(torch, lambda *a: F.conv3d(*a, padding=1), lambda *a: torch.nn.functional.conv3d(*a, padding=1),
                 [x, w], grad=(0, 1), rtol=1e-10, atol=1e-10)  # fmt: skip
    x, w = rng.normal(size=(2, 5, 5)), rng.normal(size=(4, 2, 3, 3))
    out = check_parity(torch, F.conv2d, torch.nn.functional.conv2d, [x, w, None], grad=(0, 1))
    assert tuple(out.shape) == (4, 3, 3)


def test_conv2d_float32_and_non_contiguous_input(torch):
    base = rng.normal(size=(2, 3, 6, 5)).astype(np.float32)
    w = rng.normal(size=(4, 3, 2, 2)).astype(np.float32)
    x = kiln.from_numpy(base).transpose(2, 3)  # (2, 3, 5, 6), not contiguous
    out = F.conv2d(x, kiln.from_numpy(w), stride=2)
    expected = torch.nn.functional.conv2d(torch.from_numpy(base).transpose(2, 3), torch.from_numpy(w), stride=2)
    assert out.dtype is kiln.float32
    assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_conv2d_hand_computed():
    x = kiln.arange(9.0).reshape(1, 1, 3, 3)
    w = kiln.tensor([[[[1.0, 0.0], [0.0, -1.0]]]])  # x[i, j] - x[i + 1, j + 1]
    assert F.conv2d(x, w).tolist() == [[[[-4.0, -4.0], [-4.0, -4.0]]]]
    padded = F.conv2d(x, w, padding=1).tolist()[0][0]  # zero padding: corners see one element
    assert (padded[0][1], padded[1][0], padded[3][3], padded[1][1]) == (-1.0, -3.0, 8.0, -4.0)


def test_conv_gradcheck_and_second_order():
    x, w, b = leaves(rng.normal(size=(1, 4, 4, 3)), rng.normal(size=(2, 2, 2, 2)), rng.normal(size=2))
    fn = lambda *a: F.conv2d(*a, stride=(1, 2), padding=1, dilation=(2, 1), groups=2)  # noqa: E731
    assert kiln.autograd.gradcheck(fn, (x, w, b))
    assert kiln.autograd.gradgradcheck(fn, (x, w, b))
    x1, w1 = leaves(rng.normal(size=(2, 2, 6)), rng.normal(size=(3, 2, 3)))
    assert kiln.autograd.gradcheck(lambda a, c: F.conv1d(a, c, stride=2, padding="valid"), (x1, w1))


def test_conv_errors_name_expected_and_given():
    x, w = kiln.zeros(1, 4, 5, 5), kiln.zeros(2, 3, 3, 3)
    with pytest.raises(RuntimeError, match=r"expected input\[1, 4, 5, 5\] to have 3 channels, but got 4 channels"):
        F.conv2d(x, w)
    with pytest.raises(RuntimeError, match="to have 6 channels, but got 4"):
        F.conv2d(x, w, groups=2)
    with pytest.raises(RuntimeError, match=r"divisible by 3 at dimension 0, but got weight of size \[2, 3, 3, 3\]"):
        F.conv2d(kiln.zeros(1, 9, 5, 5), w, groups=3)
    with pytest.raises(RuntimeError, match=r"Kernel size can't be greater than actual input size"):
        F.conv2d(kiln.zeros(1, 3, 2, 2), w)
    with pytest.raises(ValueError, match="padding='same' is not supported for strided convolutions"):
        F.conv2d(kiln.zeros(1, 3, 5, 5), w, stride=2, padding="same")
    with pytest.raises(RuntimeError, match=r"expected a 3-d \(unbatched\) or 4-d \(batched\) input"):
        F.conv2d(kiln.zeros(5, 5), w)
    with pytest.raises(RuntimeError, match="input kiln.float32, weight kiln.float64"):
        F.conv2d(kiln.zeros(1, 3, 5, 5), kiln.zeros(2, 3, 3, 3, dtype=kiln.float64))


def test_functional_unfold_and_fold_match_torch(torch):
    x = rng.normal(size=(2, 3, 6, 5))
    kw = {"kernel_size": (2, 3), "dilation": (2, 1), "padding": 1, "stride": (1, 2)}
    cols = check_parity(
        torch, lambda a: F.unfold(a, **kw), lambda a: torch.nn.functional.unfold(a, **kw), [x], grad=(0,)
    )
    back = rng.normal(size=tuple(cols.shape))
    check_parity(torch, lambda a: F.fold(a, (6, 5), **kw), lambda a: torch.nn.functional.fold(a, (6, 5), **kw),
                 [back], grad=(0,))  # fmt: skip


@pytest.mark.parametrize("stride", [1, 2])  # (stride 2: the im2col columns' reshape met a 0 beside a -1)
def test_conv_and_pooling_on_an_empty_batch(torch, stride):
    x = np.zeros((0, 3, 5, 5))
    kw = {"padding": 1, "stride": stride}
    out = check_parity(torch, lambda a, b: F.conv2d(a, b, **kw), lambda a, b: torch.nn.functional.conv2d(a, b, **kw),
                       [x, rng.normal(size=(2, 3, 3, 3))], grad=(0, 1))  # fmt: skip
    assert tuple(out.shape) == ((0, 2, 5, 5) if stride == 1 else (0, 2, 3, 3))
    assert tuple(F.max_pool2d(kiln.from_numpy(x), 2).shape) == (0, 3, 2, 2)
