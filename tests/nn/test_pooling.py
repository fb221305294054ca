"""max / avg / adaptive-avg pooling against torch.nn.functional, gradients (incl. ties), errors."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from tests.conftest import assert_close
from tests.nn.helpers import check_parity, leaves, pair

rng = np.random.default_rng(2)

MAX_CASES = [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": (3, 2), "stride": (1, 2), "dilation": (2, 1)},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    {"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True},
]


@pytest.mark.parametrize("kwargs", MAX_CASES, ids=str)
def test_max_pool2d_matches_torch(torch, kwargs):
    x = rng.normal(size=(2, 3, 7, 6))
    check_parity(torch, lambda a: F.max_pool2d(a, **kwargs), lambda a: torch.nn.functional.max_pool2d(a, **kwargs),
                 [x], grad=(0,))  # fmt: skip


@pytest.mark.parametrize("kwargs", MAX_CASES[:4], ids=str)
def test_max_pool2d_return_indices_match_torch(torch, kwargs):
    k, t = pair(torch, rng.normal(size=(2, 2, 7, 6)))
    out, idx = F.max_pool2d(k, return_indices=True, **kwargs)
    t_out, t_idx = torch.nn.functional.max_pool2d(t, return_indices=True, **kwargs)
    assert_close(out, t_out, rtol=0, atol=0)
    assert idx.dtype is kiln.int64
    assert_close(idx, t_idx, rtol=0, atol=0)


def test_max_pool_ties_send_the_gradient_to_one_element(torch):
    x = np.zeros((1, 1, 4, 4))  # every window is a tie, as after a relu
    check_parity(torch, lambda a: F.max_pool2d(a, 2), lambda a: torch.nn.functional.max_pool2d(a, 2), [x], grad=(0,))
    k = kiln.zeros(1, 1, 4, 4, requires_grad=True)
    F.max_pool2d(k, 2).sum().backward()
    assert k.grad.sum().item() == 4.0  # one element per window, not a split


def test_max_pool_of_a_nan_is_nan_and_its_gradient_goes_to_the_first_nan(torch):
    x = rng.normal(size=(1, 2, 4, 6))
    x[0, 0, 0, 1] = x[0, 0, 1, 0] = np.nan  # two in one window (torch's CPU kernel picks the last of those)
    x[0, 1, 2, 3] = np.nan
    k = kiln.from_numpy(x.copy()).requires_grad_()
    out, idx = F.max_pool2d(k, 2, return_indices=True)
    t_out, t_idx = torch.nn.functional.max_pool2d(torch.from_numpy(x.copy()), 2, return_indices=True)
    assert_close(out, t_out, rtol=0, atol=0)  # NaN where torch has NaN
    assert idx.numpy()[0, 0, 0, 0] == 1 and idx.numpy()[0, 1, 1, 1] == t_idx.numpy()[0, 1, 1, 1] == 15
    out.backward(kiln.ones_like(out))
    assert k.grad.numpy()[0, 0, 0, 1] == 1 and k.grad.numpy()[0, 0, 1, 0] == 0


@pytest.mark.parametrize("kwargs", MAX_CASES + [{"kernel_size": (1, 3)}], ids=str)
def test_max_pool_compiled_equals_eager(kwargs):
    """Values, indices and the gradient of a compiled max pool (a tiling view or unfolded windows,
    fused into elementwise kernels), after a relu (ties), over several calls."""

    def fn(x):
        out, idx = F.max_pool2d(F.relu(x), return_indices=True, **kwargs)
        (out * out).sum().backward()
        return out.detach(), idx, x.grad

    compiled = kiln.compile(fn)
    for seed in range(3):
        data = np.random.default_rng(seed).normal(size=(2, 3, 8, 9)).astype(np.float32)
        results = []
        for f in (fn, compiled):
            x = kiln.from_numpy(data.copy()).requires_grad_()
            results.append([t.numpy() for t in f(x)])
        for ours, theirs in zip(*results, strict=True):
            np.testing.assert_array_equal(ours, theirs)


def test_max_pool1d_and_unbatched_match_torch(torch):
    x = rng.normal(size=(2, 3, 10))
    kw = {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2}
    check_parity(
        torch, lambda a: F.max_pool1d(a, **kw), lambda a: torch.nn.functional.max_pool1d(a, **kw), [x], grad=(0,)
    )
    x = rng.normal(size=(3, 5, 5))
    out = check_parity(
        torch, lambda a: F.max_pool2d(a, 2), lambda a: torch.nn.functional.max_pool2d(a, 2), [x], grad=(0,)
    )
    assert tuple(out.shape) == (3, 2, 2)


def test_max_pool_propagates_nan_and_inf(torch):
    x = np.array([[[[1.0, np.nan], [0.0, 2.0]], [[-np.inf, -np.inf], [-np.inf, -np.inf]]]])
    check_parity(torch, lambda a: F.max_pool2d(a, 2), lambda a: torch.nn.functional.max_pool2d(a, 2), [x])


AVG_CASES = [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
    {"kernel_size": (2, 3), "stride": 1, "divisor_override": 5},
]


@pytest.mark.parametrize("kwargs", AVG_CASES, ids=str)
def test_avg_pool2d_matches_torch(torch, kwargs):
    x = rng.normal(size=(2, 3, 8, 7))
    check_parity(torch, lambda a: F.avg_pool2d(a, **kwargs), lambda a: torch.nn.functional.avg_pool2d(a, **kwargs),
                 [x], grad=(0,))  # fmt: skip


def test_avg_pool1d_matches_torch(torch):
    kw = {"kernel_size": 4, "stride": 3, "padding": 2, "ceil_mode": True, "count_include_pad": False}
    check_parity(torch, lambda a: F.avg_pool1d(a, **kw), lambda a: torch.nn.functional.avg_pool1d(a, **kw),
                 [rng.normal(size=(2, 2, 11))], grad=(0,))  # fmt: skip


def test_avg_pool2d_hand_computed():
    x = kiln.arange(16.0).reshape(1, 1, 4, 4)
    assert F.avg_pool2d(x, 2).tolist() == [[[[2.5, 4.5], [10.5, 12.5]]]]
    corner = F.avg_pool2d(x, 2, padding=1, count_include_pad=False).tolist()[0][0][0][0]
    assert corner == 0.0  # only x[0, 0] = 0 is counted
    assert F.avg_pool2d(x + 4, 2, padding=1).tolist()[0][0][0][0] == 1.0  # (0 + 0 + 0 + 4) / 4


@pytest.mark.parametrize(("size", "out"), [((6, 8), (3, 4)), ((7, 5), (3, 2)), ((5, 7), (5, 3)), ((4, 6), (None, 4))])
def test_adaptive_avg_pool2d_matches_torch(torch, size, out):
    x = rng.normal(size=(2, 3, *size))
    check_parity(torch, lambda a: F.adaptive_avg_pool2d(a, out), lambda a: torch.nn.functional.adaptive_avg_pool2d(a, out),
                 [x], grad=(0,))  # fmt: skip


def test_adaptive_avg_pool1d_bins_hand_computed(torch):
    x = kiln.tensor([[[0.0, 1.0, 2.0, 3.0, 4.0]]])
    # bins [floor(i*5/3), ceil((i+1)*5/3)): [0, 2), [1, 4), [3, 5)
    assert_close(F.adaptive_avg_pool1d(x, 3), np.array([[[0.5, 2.0, 3.5]]], dtype=np.float32), rtol=1e-6, atol=1e-6)
    check_parity(torch, lambda a: F.adaptive_avg_pool1d(a, 4), lambda a: torch.nn.functional.adaptive_avg_pool1d(a, 4),
                 [rng.normal(size=(2, 3, 7))], grad=(0,))  # fmt: skip


def test_pooling_gradcheck():
    (x,) = leaves(rng.normal(size=(1, 2, 5, 5)))
    assert kiln.autograd.gradcheck(lambda a: F.max_pool2d(a, 3, stride=2, padding=1), (x,))
    assert kiln.autograd.gradcheck(lambda a: F.avg_pool2d(a, 3, 2, 1, ceil_mode=True, count_include_pad=False), (x,))
    assert kiln.autograd.gradcheck(lambda a: F.adaptive_avg_pool2d(a, (3, 2)), (x,))
    assert kiln.autograd.gradgradcheck(lambda a: F.avg_pool2d(a, 2) ** 2, (x,))


def test_pooling_errors():
    x = kiln.zeros(1, 1, 4, 4)
    with pytest.raises(RuntimeError, match="pad should be at most half of effective kernel size"):
        F.max_pool2d(x, 2, padding=2)
    with pytest.raises(RuntimeError, match="output size would be 0"):
        F.max_pool2d(kiln.zeros(1, 1, 2, 2), 3)
    with pytest.raises(RuntimeError, match="expected a 3-d .* or 4-d .* got shape \\[4\\]"):
        F.avg_pool2d(kiln.zeros(4), 2)
    with pytest.raises(ValueError, match="kernel_size must be an int or a tuple of 2 ints"):
        F.max_pool2d(x, (2, 2, 2))
    with pytest.raises(RuntimeError, match="divisor must be not zero"):
        F.avg_pool2d(x, 2, divisor_override=0)
