"""``affine_grid`` and ``grid_sample`` (4-d input): sampling an image at arbitrary normalized coordinates.

Samples are gathered from the flattened image, so the gradient reaches the input through
``gather`` and the grid through the interpolation weights, as in PyTorch.
"""

from __future__ import annotations

import kiln

__all__ = ["affine_grid", "grid_sample"]


def _base_coords(size: int, align_corners: bool, like) -> kiln.Tensor:
    """Normalized pixel-centre coordinates along one dim, in [-1, 1]."""
    coords = kiln.linspace(-1.0, 1.0, size, dtype=like.dtype, device=like.device) if size > 1 else \
        kiln.zeros(size, dtype=like.dtype, device=like.device)  # fmt: skip
    return coords if align_corners else coords * ((size - 1) / size)


def affine_grid(theta, size, align_corners=None) -> kiln.Tensor:
    """The sampling grid (N, H, W, 2) (or (N, D, H, W, 3)) of the affine maps ``theta`` (N, 2, 3) (or (N, 3, 4))."""
    align_corners = bool(align_corners)
    if not theta.dtype.is_floating_point:
        raise ValueError(f"Expected theta to have floating point type, but got {theta.dtype}")
    spatial = tuple(size[2:])
    d = len(spatial)
    if d not in (2, 3) or tuple(theta.shape[1:]) != (d, d + 1) or theta.shape[0] != size[0]:
        raise ValueError(f"Expected a batch of {d}D affine matrices of shape Nx{d}x{d + 1} for size {list(size)}. "
                         f"Got {list(theta.shape)}.")  # fmt: skip
    # One coordinate per spatial dim, broadcast over the others; stacked in PyTorch's order, x (last dim) first.
    grids = []
    for k, n in enumerate(spatial):
        shape = [1] * d
        shape[k] = n
        grids.append(_base_coords(n, align_corners, theta).reshape(shape).expand(*spatial))
    base = kiln.stack([*reversed(grids), kiln.ones_like(grids[0])], dim=-1)  # (*spatial, d + 1)
    flat = base.reshape(1, -1, d + 1)
    out = kiln.matmul(flat, theta.transpose(1, 2))  # (N, prod(spatial), d)
    return out.reshape(theta.shape[0], *spatial, d)


def _unnormalize(coord, size: int, align_corners: bool):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord, low2: float, high2: float):
    """Reflect ``coord`` into [low2 / 2, high2 / 2] (PyTorch's reflect_coordinates)."""
    if low2 == high2:
        return kiln.zeros_like(coord)
    low, span = low2 / 2, (high2 - low2) / 2
    distance = kiln.abs(coord - low)
    flips = kiln.floor(distance / span)
    extra = distance - flips * span
    even = (flips - 2 * kiln.floor(flips / 2)) == 0
    return kiln.where(even, extra + low, span - extra + low)


def _source(coord, size: int, padding_mode: str, align_corners: bool):
    x = _unnormalize(coord, size, align_corners)
    if padding_mode == "reflection":
        x = _reflect(x, 0.0, 2.0 * (size - 1)) if align_corners else _reflect(x, -1.0, 2.0 * size - 1)
    if padding_mode in ("border", "reflection"):
        x = kiln.clamp(x, 0.0, float(size - 1))
    return x


def grid_sample(input, grid, mode: str = "bilinear", padding_mode: str = "zeros", align_corners=None) -> kiln.Tensor:
    """Sample (N, C, H, W) ``input`` at ``grid`` (N, H_out, W_out, 2) of (x, y) in [-1, 1]."""
    if mode not in ("bilinear", "nearest", "bicubic"):
        raise ValueError(f"nn.functional.grid_sample(): expected mode to be 'bilinear', 'nearest' or 'bicubic', "
                         f"but got: '{mode}'")  # fmt: skip
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"nn.functional.grid_sample(): expected padding_mode to be 'zeros', 'border', or "
                         f"'reflection', but got: '{padding_mode}'")  # fmt: skip
    if mode == "bicubic" or input.ndim != 4:
        raise NotImplementedError("grid_sample: kiln supports 4-d input with bilinear or nearest mode")
    if grid.ndim != 4 or grid.shape[-1] != 2 or grid.shape[0] != input.shape[0]:
        raise RuntimeError(f"grid_sample(): expected grid of shape (N, H_out, W_out, 2) with N={input.shape[0]}, "
                           f"got {list(grid.shape)}")  # fmt: skip
    align_corners = bool(align_corners)
    n, c, h, w = input.shape
    hout, wout = grid.shape[1], grid.shape[2]
    x = _source(grid[..., 0], w, padding_mode, align_corners)
    y = _source(grid[..., 1], h, padding_mode, align_corners)
    flat = input.reshape(n, c, h * w)

    def tap(yi, xi):
        """input[n, :, yi, xi] (zero outside the image) as (N, C, H_out, W_out)."""
        inside = (xi >= 0) & (xi <= w - 1) & (yi >= 0) & (yi <= h - 1)
        index = (kiln.clamp(yi, 0, h - 1) * w + kiln.clamp(xi, 0, w - 1)).to(kiln.int64)
        index = index.reshape(n, 1, hout * wout).expand(n, c, hout * wout)
        values = kiln.gather(flat, 2, index).reshape(n, c, hout, wout)
        return kiln.where(inside.unsqueeze(1), values, 0.0)

    if mode == "nearest":
        return tap(kiln.round(y).detach(), kiln.round(x).detach())
    x0, y0 = kiln.floor(x).detach(), kiln.floor(y).detach()
    fx, fy = (x - x0).unsqueeze(1), (y - y0).unsqueeze(1)
    return (tap(y0, x0) * (1 - fx) * (1 - fy) + tap(y0, x0 + 1) * fx * (1 - fy)
            + tap(y0 + 1, x0) * (1 - fx) * fy + tap(y0 + 1, x0 + 1) * fx * fy)  # fmt: skip
