"""Average pooling over sliding windows, and power-average (LP) pooling built on it, 1-D to 3-D.

Each sums ``kiln.unfold_windows`` of the padded input over its kernel dims and divides by the
window's size, or by how many elements it covers where PyTorch leaves padding out of the count.
"""

from __future__ import annotations

import math

import kiln
from kiln.frontend.eager_composites import compiled_composite

from ._pooling import _pool_args, _pool_geometry
from ._utils import batched, pad_spec

__all__ = ["avg_pool1d", "avg_pool2d", "avg_pool3d", "lp_pool1d", "lp_pool2d", "lp_pool3d"]


def _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, d: int, op: str):
    kernel, stride, padding, dilation = _pool_args(input, kernel_size, stride, padding, 1, d, op)
    x, unbatched = batched(input, d, op)
    spatial = tuple(x.shape[2:])
    out_size, extra = _pool_geometry(spatial, kernel, stride, padding, dilation, ceil_mode, op)
    pads = tuple((p, p + e) for p, e in zip(padding, extra, strict=True))
    if any(p for pair in pads for p in pair):
        x = kiln.pad(x, pad_spec(pads))
    total = kiln.unfold_windows(x, kernel, stride, dilation).sum(dim=tuple(range(2, 2 + d)))
    if divisor_override is not None:
        if divisor_override == 0:
            raise RuntimeError(f"{op}: divisor must be not zero")
        out = total / divisor_override
    elif (count_include_pad or not any(padding)) and not any(extra):
        out = total / math.prod(kernel)
    else:
        out = total / _window_counts(x, spatial, padding, extra, kernel, stride, count_include_pad)
    return out.squeeze(0) if unbatched else out


def _window_counts(x, spatial, padding, extra, kernel, stride, count_include_pad: bool):
    """How many elements each window averages: PyTorch counts the symmetric padding when asked,
    never the extra right padding of ceil_mode."""
    d = len(spatial)
    if count_include_pad:
        region, pads = tuple(s + 2 * p for s, p in zip(spatial, padding, strict=True)), tuple((0, e) for e in extra)
    else:
        region, pads = spatial, tuple((p, p + e) for p, e in zip(padding, extra, strict=True))
    ones = kiln.pad(kiln.ones(1, 1, *region, dtype=x.dtype, device=x.device), pad_spec(pads))
    return kiln.unfold_windows(ones, kernel, stride, (1,) * d).sum(dim=tuple(range(2, 2 + d)))


@kiln.jit.composite("avg_pool1d")
def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1, "avg_pool1d")


@compiled_composite("avg_pool2d")
@kiln.jit.composite("avg_pool2d")
def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):  # fmt: skip
    """Mean over windows of (N, C, H, W), as ``torch.nn.functional.avg_pool2d``."""
    return _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2,
                     "avg_pool2d")  # fmt: skip


@kiln.jit.composite("avg_pool3d")
def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):  # fmt: skip
    return _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3,
                     "avg_pool3d")  # fmt: skip


_AVG_POOLS = {1: avg_pool1d, 2: avg_pool2d, 3: avg_pool3d}


def _lp_pool(input, norm_type: float, kernel_size, stride, ceil_mode: bool, d: int):
    kernel = (kernel_size,) * d if isinstance(kernel_size, int) else tuple(kernel_size)
    out = _AVG_POOLS[d](input.pow(norm_type), kernel, stride, 0, ceil_mode)
    # PyTorch keeps the sign and clamps the magnitude (an odd power of negatives averages below zero).
    return (kiln.sign(out) * kiln.relu(kiln.abs(out))).mul(math.prod(kernel)).pow(1.0 / norm_type)


def lp_pool1d(input, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False):
    """(sum over each window of x^p)^(1/p)."""
    return _lp_pool(input, norm_type, kernel_size, stride, ceil_mode, 1)


def lp_pool2d(input, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False):
    return _lp_pool(input, norm_type, kernel_size, stride, ceil_mode, 2)


def lp_pool3d(input, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False):
    return _lp_pool(input, norm_type, kernel_size, stride, ceil_mode, 3)
