"""Tile transforms: ``tile_transform`` maps each 2-d tile of a plane through a small matrix on both
sides, ``untile_transform`` (its adjoint) maps them back and adds the tiles into the plane.

They are the three transforms of Winograd's minimal filtering algorithm, with which
``kiln.nn.functional.conv2d`` computes 3x3 stride-1 convolutions in 16 small matmuls of 2.25x
fewer multiplications than im2col's (Lavin and Gray, "Fast Algorithms for Convolutional Neural
Networks", 2015): ``V = tile(x, B^T)`` (the input's overlapping 4x4 tiles), ``U = tile(g, G)``
(the 3x3 filters), then ``y = untile(U @ V, A)`` (the 2x2 output tiles). Each is the other's VJP,
as ``unfold`` and ``fold`` are, so a convolution's gradients (and theirs) are the same three
transforms and two more batched matmuls.

With ``L = matrix`` (``alpha`` rows of ``t`` entries), stride ``s`` and the last two dims the plane:

- ``tile_transform``: ``(*B, H, W) -> (alpha**2, *B, th, tw)`` with ``th = (H - t) // s + 1`` (and
  ``tw`` likewise): ``out[i*alpha + j, *b, p, q] = sum_{a,c < t} L[i][a] L[j][c] x[*b, s*p + a, s*q + c]``;
- ``untile_transform``: ``(alpha**2, *B, th, tw) -> (*B, *size)``, every tile's ``L^T v L`` added at
  ``(s*p, s*q)``; positions no tile covers are zero.

The element ``i*alpha + j`` of the transform leads, so that ``(alpha**2, C, N*th*tw)`` is one
contiguous matrix per element for the batched matmul.
"""

from __future__ import annotations

import numpy as np

from ..types import TensorType
from . import Kind, Primitive, Sample, register
from .windows import _static_spatial, strided_windows, window_output_size


def _check_floating(name: str, x: TensorType) -> None:
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name}: expected a floating-point tensor, got {x.dtype.name}")


def _check(name: str, matrix, stride) -> tuple[int, int]:
    """(alpha, t) of a valid matrix; errors say what was expected and what was given."""
    rows = tuple(matrix)
    if not rows or any(len(row) != len(rows[0]) for row in rows) or not rows[0]:
        raise ValueError(f"{name}: matrix must be a non-empty tuple of equal-length rows, got {matrix!r:.80}")
    if not isinstance(stride, int) or stride < 1:
        raise ValueError(f"{name}: stride must be a positive int, got {stride!r}")
    return len(rows), len(rows[0])


def _tiles(name: str, spatial, t: int, stride: int) -> tuple[int, int]:
    # Not over symbolic sizes: conv2d pads a plane to whole tiles by a number Python computes from
    # its size, so two traces at sizes of one remainder mod the tile make one program that is wrong
    # at the others. A Winograd conv keeps its call static (an image of another size traces again).
    _static_spatial(name, spatial)
    tiles = tuple(window_output_size(s, t, stride, 1) for s in spatial)
    if any(n < 1 for n in tiles):
        raise RuntimeError(f"{name}: a plane of {tuple(spatial)} holds no tile of {t}x{t}")
    return tiles  # type: ignore[return-value]


def transform_coefficients(matrix) -> np.ndarray:
    """The transform of one flattened tile as a matrix, (alpha**2, t*t) in float64: row i*alpha + j
    holds L[i][a] L[j][c] at a*t + c (the Kronecker product of L with itself)."""
    m = np.asarray(matrix, dtype=np.float64)
    return np.einsum("ia,jc->ijac", m, m).reshape(m.shape[0] ** 2, m.shape[1] ** 2)


def _coefficients(xp, matrix, dtype):
    return xp.asarray(transform_coefficients(matrix).astype(dtype))


# ----------------------------------------------------------------------------- tile
def _tile_infer(x: TensorType, *, matrix, stride) -> TensorType:
    alpha, t = _check("tile_transform", matrix, stride)
    if x.ndim < 2:
        raise RuntimeError(
            f"tile_transform: expected at least 2 dims (the last two a plane), got shape {list(x.shape)}"
        )
    _check_floating("tile_transform", x)
    th, tw = _tiles("tile_transform", x.shape[-2:], t, stride)
    return TensorType((alpha * alpha, *x.shape[:-2], th, tw), x.dtype, x.device)


def _tile_eager(xp, x, *, matrix, stride):
    alpha, t = _check("tile_transform", matrix, stride)
    th, tw = _tiles("tile_transform", x.shape[-2:], t, stride)
    lead = x.shape[:-2]
    coefficients = _coefficients(xp, matrix, x.dtype)
    if one_tile_a_plane(x.shape[-2:], t):  # a filter transform: each plane is its tile
        return (coefficients @ x.reshape(-1, t * t).T).reshape(alpha * alpha, *lead, 1, 1)
    # the tiles gathered (one copy, (tiles, t*t)), then all transformed by one matmul whose result
    # is already (alpha**2, tiles): far fewer passes over memory than a numpy op per term
    row, col = x.strides[-2:]
    windows = strided_windows(xp, x, (*lead, th, tw, t, t), (*x.strides[:-2], stride * row, stride * col, row, col))
    flat = xp.ascontiguousarray(windows).reshape(-1, t * t)
    return (coefficients @ flat.T).reshape(alpha * alpha, *lead, th, tw)


def _tile_into(xp, x, *, out, matrix, stride):
    alpha, t = _check("tile_transform", matrix, stride)
    if one_tile_a_plane(x.shape[-2:], t) and out.flags.c_contiguous:  # one matmul, straight into place
        xp.matmul(_coefficients(xp, matrix, x.dtype), x.reshape(-1, t * t).T, out=out.reshape(alpha * alpha, -1))
    else:
        xp.copyto(out, _tile_eager(xp, x, matrix=matrix, stride=stride))
    return out


def one_tile_a_plane(plane, t: int) -> bool:
    """Whether a plane of ``plane``'s size is exactly one ``t x t`` tile (a 3x3 filter's transform;
    the stride then does not matter), which makes the transform and its adjoint a single matmul
    with the Kronecker matrix, in and out of place: BLAS writes the one of a ResNet's 512 x 512
    filters in 1.96 ms, where compiled loops vectorized across planes (strided loads and stores)
    took 3.25 ms in a ResNet step (2 threads)."""
    return tuple(plane) == (t, t)


def _tile_vjp(ops, ctx, g):
    size = tuple(ctx.input_types[0].shape[-2:])
    return (ops.untile_transform(g, size, **ctx.attrs),)


def _filters(torch, matrix, dtype):
    """The transform as alpha**2 convolution filters of t x t: filter i*alpha + j is L[i] (outer) L[j]."""
    m = torch.tensor(matrix, dtype=dtype)
    return torch.einsum("ia,jc->ijac", m, m).reshape(m.shape[0] ** 2, 1, m.shape[1], m.shape[1])


def _tile_reference(torch, x, *, matrix, stride):
    lead, (h, w) = tuple(x.shape[:-2]), tuple(x.shape[-2:])
    out = torch.nn.functional.conv2d(x.reshape(-1, 1, h, w), _filters(torch, matrix, x.dtype), stride=stride)
    return out.transpose(0, 1).reshape(out.shape[1], *lead, *out.shape[2:])


def _samples(rng, tile: bool):
    winograd = {  # F(2, 3): the input's B^T, the filter's G and the output's A
        "input": ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
        "filter": ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1)),
        "output": ((1, 0), (1, 1), (1, -1), (0, -1)),
    }
    cases = [  # (matrix, stride, plane, lead)
        (winograd["input"], 2, (6, 8), (2, 3)),
        (winograd["input"], 2, (7, 5), (3,)),  # a row and a column no tile covers
        (winograd["filter"], 1, (3, 3), (4, 2)),
        (winograd["output"], 2, (4, 6), (2,)),
        (((1.5, -2.0, 0.25), (0.0, 1.0, 3.0)), 2, (7, 9), (2, 1)),  # a dense matrix, 3x3 tiles overlapping by 1
    ]
    samples = []
    for matrix, stride, plane, lead in cases:
        alpha, t = len(matrix), len(matrix[0])
        tiles = tuple(window_output_size(s, t, stride, 1) for s in plane)
        if tile:
            samples.append(Sample((rng.normal(size=(*lead, *plane)),), {"matrix": matrix, "stride": stride}))
        else:
            attrs = {"size": plane, "matrix": matrix, "stride": stride}
            samples.append(Sample((rng.normal(size=(alpha * alpha, *lead, *tiles)),), attrs))
    return samples


tile_transform = register(Primitive(
    "tile_transform", Kind.WINDOW, _tile_infer, _tile_eager, _tile_vjp,
    reference=_tile_reference, samples=lambda rng: _samples(rng, tile=True), eager_into=_tile_into,
    doc="Each t x t tile at stride s of the last two dims mapped through L on both sides (Winograd's transforms).",
))  # fmt: skip


# ----------------------------------------------------------------------------- untile
def _untile_infer(v: TensorType, *, size, matrix, stride) -> TensorType:
    alpha, t = _check("untile_transform", matrix, stride)
    size = tuple(size)
    if len(size) != 2:
        raise ValueError(f"untile_transform: size must be a plane's (height, width), got {size}")
    _check_floating("untile_transform", v)
    tiles = _tiles("untile_transform", size, t, stride)
    if v.ndim < 3 or tuple(v.shape[-2:]) != tiles or v.shape[0] != alpha * alpha:
        raise RuntimeError(
            f"untile_transform: expected ({alpha * alpha}, *batch, {tiles[0]}, {tiles[1]}) for size {size}, "
            f"a {alpha}x{t} matrix and stride {stride}; got {list(v.shape)}"
        )
    return TensorType((*v.shape[1:-2], *size), v.dtype, v.device)


def _untile_eager(xp, v, *, size, matrix, stride):
    alpha, t = _check("untile_transform", matrix, stride)
    th, tw = v.shape[-2:]
    if v.shape[0] != alpha * alpha or (th, tw) != _tiles("untile_transform", size, t, stride):
        raise ValueError("untile_transform: the tiles do not match the attributes")  # infer() says more
    lead = v.shape[1:-2]
    if one_tile_a_plane(size, t):
        return (v.reshape(alpha * alpha, -1).T @ _coefficients(xp, matrix, v.dtype)).reshape(*lead, t, t)
    # every tile's t x t result by one matmul, (t*t, tiles), then each offset added where it lands
    tiles = (_coefficients(xp, matrix, v.dtype).T @ v.reshape(alpha * alpha, -1)).reshape(t, t, *lead, th, tw)
    out = xp.zeros((*lead, *size), dtype=v.dtype)
    for a in range(t):
        for c in range(t):
            out[..., a : a + stride * (th - 1) + 1 : stride, c : c + stride * (tw - 1) + 1 : stride] += tiles[a, c]
    return out


def _untile_into(xp, v, *, out, size, matrix, stride):
    alpha, t = _check("untile_transform", matrix, stride)
    if one_tile_a_plane(size, t) and out.flags.c_contiguous:
        xp.matmul(v.reshape(alpha * alpha, -1).T, _coefficients(xp, matrix, v.dtype), out=out.reshape(-1, t * t))
    else:
        xp.copyto(out, _untile_eager(xp, v, size=size, matrix=matrix, stride=stride))
    return out


def _untile_vjp(ops, ctx, g):
    attrs = {k: v for k, v in ctx.attrs.items() if k != "size"}
    return (ops.tile_transform(g, **attrs),)


def _untile_reference(torch, v, *, size, matrix, stride):
    alpha, t = len(matrix), len(matrix[0])
    lead, tiles = tuple(v.shape[1:-2]), tuple(v.shape[-2:])
    planes = v.reshape(alpha * alpha, -1, *tiles).transpose(0, 1)
    extra = [s - ((n - 1) * stride + t) for s, n in zip(size, tiles, strict=True)]
    out = torch.nn.functional.conv_transpose2d(
        planes, _filters(torch, matrix, v.dtype), stride=stride, output_padding=extra
    )
    return out.reshape(*lead, *size)


untile_transform = register(Primitive(
    "untile_transform", Kind.WINDOW, _untile_infer, _untile_eager, _untile_vjp,
    reference=_untile_reference, samples=lambda rng: _samples(rng, tile=False), eager_into=_untile_into,
    doc="The adjoint of tile_transform: each tile's L^T v L added back into planes of the given size.",
))  # fmt: skip
