"""``interpolate`` (and the ``upsample`` aliases): resampling separably, one spatial dim at a time.

Each dim is resampled by gathering source rows with ``index_select`` and mixing them with fixed
weights, so gradients come from ``index_select``'s rule. Source coordinates follow PyTorch's
(``align_corners``, a given ``scale_factor`` used as is unless ``recompute_scale_factor``), computed
in the input's floating dtype as PyTorch does, so nearest-neighbour picks the same rows.
"""

from __future__ import annotations

import math

import numpy as np

import kiln

__all__ = ["interpolate", "upsample", "upsample_nearest", "upsample_bilinear"]

_DIMS = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}
_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear", "area")
_CUBIC_A = -0.75


def _as_list(value, d: int, name: str) -> list:
    if isinstance(value, list | tuple):
        if len(value) != d:
            raise ValueError(f"Input and {name} must have the same number of spatial dimensions, but got input with "
                             f"spatial dimensions of {d} and {name} of length {len(value)}.")  # fmt: skip
        return list(value)
    return [value] * d


def _output_sizes(spatial, size, scale_factor, recompute_scale_factor):
    """Output sizes and the per-dim scales used to map coordinates (None: in / out)."""
    d = len(spatial)
    if (size is None) == (scale_factor is None):
        raise ValueError("only one of size or scale_factor should be defined" if size is not None else
                         "either size or scale_factor should be defined")  # fmt: skip
    if size is not None:
        return [int(s) for s in _as_list(size, d, "size")], [None] * d
    factors = [float(f) for f in _as_list(scale_factor, d, "scale_factor")]
    sizes = [math.floor(n * f) for n, f in zip(spatial, factors, strict=True)]
    return sizes, ([None] * d if recompute_scale_factor else factors)


def _scale(n_in: int, n_out: int, factor, align_corners: bool, dtype):
    if align_corners:
        return dtype((n_in - 1) / (n_out - 1)) if n_out > 1 else dtype(0)
    return dtype(1.0 / factor) if factor is not None and factor > 0 else dtype(n_in) / dtype(n_out)


def _nearest_rows(n_in, n_out, factor, exact: bool, dtype):
    scale = dtype(1.0 / factor) if factor is not None and factor > 0 else dtype(n_in) / dtype(n_out)
    dst = np.arange(n_out, dtype=dtype)
    src = np.floor(((dst + dtype(0.5)) if exact else dst) * scale).astype(np.int64)
    return [(np.minimum(src, n_in - 1), None)]


def _linear_rows(n_in, n_out, factor, align_corners, dtype):
    scale = _scale(n_in, n_out, factor, align_corners, dtype)
    dst = np.arange(n_out, dtype=dtype)
    src = dst * scale if align_corners else np.maximum(scale * (dst + dtype(0.5)) - dtype(0.5), dtype(0))
    low = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    high = np.minimum(low + 1, n_in - 1)
    frac = (src - low).astype(dtype)
    return [(low, dtype(1) - frac), (high, frac)]


def _cubic_rows(n_in, n_out, factor, align_corners, dtype):
    scale = _scale(n_in, n_out, factor, align_corners, dtype)
    dst = np.arange(n_out, dtype=dtype)
    src = dst * scale if align_corners else scale * (dst + dtype(0.5)) - dtype(0.5)
    floor = np.floor(src)
    t = (src - floor).astype(dtype)
    a = dtype(_CUBIC_A)

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = (far(t + 1), near(t), near(1 - t), far(2 - t))
    base = floor.astype(np.int64)
    return [(np.clip(base + k - 1, 0, n_in - 1), w.astype(dtype)) for k, w in enumerate(weights)]


def _resample_dim(x, dim: int, rows):
    """Sum over taps of ``index_select(x, dim, index) * weight`` (weight broadcast along ``dim``)."""
    out = None
    for index, weight in rows:
        picked = kiln.index_select(x, dim, kiln.tensor(index, device=x.device))
        if weight is not None:
            shape = [1] * x.ndim
            shape[dim] = len(weight)
            picked = picked * kiln.tensor(weight, device=x.device).reshape(shape)
        out = picked if out is None else out + picked
    return out


def interpolate(input, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                recompute_scale_factor=None, antialias: bool = False) -> kiln.Tensor:  # fmt: skip
    """Resize the spatial dims of an (N, C, *spatial) input to ``size`` or by ``scale_factor``.

    >>> import kiln
    >>> interpolate(kiln.tensor([[[1.0, 2.0]]]), scale_factor=2).tolist()
    [[[1.0, 1.0, 2.0, 2.0]]]
    """
    if mode not in _MODES:
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.ndim}D) for "
                                  f"the modes: {' | '.join(_MODES)} (got {mode})")  # fmt: skip
    if align_corners is not None and mode in ("nearest", "nearest-exact", "area"):
        raise ValueError("align_corners option can only be set with the interpolating modes: "
                         "linear | bilinear | bicubic | trilinear")  # fmt: skip
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not supported by kiln")
    d = input.ndim - 2
    if d not in (1, 2, 3):
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.ndim}D) "
                                  f"for the modes: {' | '.join(_MODES)} (got {mode})")  # fmt: skip
    if mode in _DIMS and _DIMS[mode] != d:
        raise NotImplementedError(f"Got {input.ndim}D input, but {mode} mode needs {_DIMS[mode] + 2}D input")
    spatial = list(input.shape[2:])
    sizes, factors = _output_sizes(spatial, size, scale_factor, recompute_scale_factor)
    if mode == "area":
        from ._pooling_adaptive import adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d  # noqa: PLC0415

        return (adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d)[d - 1](input, sizes)
    if not input.dtype.is_floating_point and mode != "nearest":
        raise RuntimeError(f"interpolate: mode {mode!r} needs a floating-point input, got {input.dtype}")
    dtype = np.float64 if input.dtype == kiln.float64 else np.float32
    corners = bool(align_corners)
    out = input
    for k, (n_in, n_out, factor) in enumerate(zip(spatial, sizes, factors, strict=True)):
        if n_in == n_out and factor in (None, 1.0) and mode in ("nearest", "nearest-exact"):
            continue
        if mode in ("nearest", "nearest-exact"):
            rows = _nearest_rows(n_in, n_out, factor, mode == "nearest-exact", dtype)
        elif mode == "bicubic":
            rows = _cubic_rows(n_in, n_out, factor, corners, dtype)
        else:
            rows = _linear_rows(n_in, n_out, factor, corners, dtype)
        out = _resample_dim(out, 2 + k, rows)
    return out.clone() if out is input else out  # nothing resampled: new memory all the same, as PyTorch


def upsample(input, size=None, scale_factor=None, mode: str = "nearest", align_corners=None) -> kiln.Tensor:
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input, size=None, scale_factor=None) -> kiln.Tensor:
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input, size=None, scale_factor=None) -> kiln.Tensor:
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)
