"""Window primitives: ``unfold`` gathers sliding windows, ``fold`` scatter-adds them back.

Convolution and pooling are composites over these two (``kiln.nn.functional``), so their
gradients, and gradients of gradients, come from here: ``fold`` is the adjoint of ``unfold``
and each is the other's VJP.

Layout, for ``d`` spatial dims with kernel ``K = (k_1..k_d)`` and output ``O = (o_1..o_d)``:

- ``unfold``: input ``(N, C, *S)`` (already padded) -> ``(N, C, *K, *O)``, where
  ``out[n, c, *k, *o] = x[n, c, *(o * stride + k * dilation)]``;
- ``fold``: ``(N, C, *K, *O)`` -> ``(N, C, *S)`` with ``S = size`` given as an attribute; every
  window element is added back to the position it came from.

The kernel offsets come before the output positions so that a contiguous ``unfold`` result
reshapes to ``(N, C*prod(K), prod(O))`` for free. ``unfold`` copies (as PyTorch's ``unfold`` does):
windows overlap, so a view would let one in-place write change several elements.

With ``batch_inner=True`` the windows are laid out ``(C, *K, N, *O)`` instead (``fold`` takes
them so): that reshapes for free to ``(C*prod(K), N*prod(O))``, so convolution is ONE matmul over
the whole batch, and its weight gradient is one matmul contracting over every sample's positions
(``N*prod(O)`` long) rather than a matmul per sample summed afterwards.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..types import Dim, Sym, SymbolicShapeError, TensorType, is_static, sym_sum
from . import Kind, Primitive, Sample, register


def window_output_size(size: int, kernel: int, stride: int, dilation: int) -> int:
    """How many windows of span ``dilation * (kernel - 1) + 1`` fit in ``size`` with ``stride``."""
    return (size - dilation * (kernel - 1) - 1) // stride + 1


def _window_count(size: Dim, kernel: int, stride: int, dilation: int) -> Dim:
    if isinstance(size, Sym):
        return sym_sum([size], stride - dilation * (kernel - 1) - 1, stride)
    return window_output_size(size, kernel, stride, dilation)


def _check_window_attrs(name: str, x: TensorType, kernel_size, stride, dilation, lead: int) -> int:
    """The number of spatial dims; errors name what was expected and what was given."""
    d = len(kernel_size)
    if len(stride) != d or len(dilation) != d:
        raise ValueError(
            f"{name}: kernel_size {tuple(kernel_size)}, stride {tuple(stride)} and dilation {tuple(dilation)} "
            "must have one entry per spatial dimension"
        )
    if x.ndim != lead + d:
        raise RuntimeError(
            f"{name}: expected a {lead + d}-d input for {d} spatial dim(s) with kernel_size {tuple(kernel_size)}, "
            f"got shape {list(x.shape)}"
        )
    for what, values in (("kernel_size", kernel_size), ("stride", stride), ("dilation", dilation)):
        if not is_static(values):
            raise SymbolicShapeError(
                f"{name}: a {what} that follows a dynamic size ({tuple(map(str, values))}: a window the size of "
                "the input, as adaptive pooling makes) is not supported over dynamic sizes"
            )
        if any(v <= 0 for v in values):
            raise ValueError(f"{name}: {what} must be positive, got {tuple(values)}")
    return d


def _out_spatial(name: str, spatial, kernel_size, stride, dilation) -> tuple[Dim, ...]:
    """The number of windows along each spatial dim. A symbolic size (an image's height) gives the
    symbolic ``(H - span)//stride + 1``; that it is at least 1 is checked when the graph is bound."""
    out = tuple(map(_window_count, spatial, kernel_size, stride, dilation))
    if any(isinstance(o, int) and o < 1 for o in out):
        raise RuntimeError(
            f"{name}: the (padded) input size {tuple(spatial)} is smaller than the dilated kernel size "
            f"{tuple(dilation[i] * (k - 1) + 1 for i, k in enumerate(kernel_size))}"
        )
    return out


# ----------------------------------------------------------------------------- unfold
def _batch_inner(d: int) -> tuple[int, ...]:
    """The permutation taking (N, C, *K, *O) to the ``batch_inner`` layout (C, *K, N, *O)."""
    return (1, *range(2, 2 + d), 0, *range(2 + d, 2 + 2 * d))


def _from_batch_inner(d: int) -> tuple[int, ...]:
    """The inverse of ``_batch_inner(d)``."""
    return tuple(sorted(range(2 + 2 * d), key=_batch_inner(d).__getitem__))


def _windows_shape(n, c, kernel_size, out, batch_inner: bool) -> tuple:
    return (c, *kernel_size, n, *out) if batch_inner else (n, c, *kernel_size, *out)


def _unfold_infer(x: TensorType, *, kernel_size, stride, dilation, batch_inner=False) -> TensorType:
    _check_window_attrs("unfold", x, kernel_size, stride, dilation, 2)
    out = _out_spatial("unfold", x.shape[2:], kernel_size, stride, dilation)
    return TensorType(_windows_shape(x.shape[0], x.shape[1], kernel_size, out, batch_inner), x.dtype, x.device)


def strided_windows(xp, x, shape, strides):
    """A view of ``x`` with ``shape`` and ``strides`` (bytes), read-only where the library can say so
    (numpy; cupy's ``as_strided`` has no ``writeable``)."""
    if isinstance(x, np.ndarray):
        return np.lib.stride_tricks.as_strided(x, shape, strides, writeable=False)
    return xp.lib.stride_tricks.as_strided(x, shape, strides)


def _unfold_eager(xp, x, *, kernel_size, stride, dilation, batch_inner=False):
    spatial = x.shape[2:]
    if len(spatial) != len(kernel_size):
        raise ValueError("unfold: one kernel entry per spatial dim is required")  # infer() says more
    out = _out_spatial("unfold", spatial, kernel_size, stride, dilation)
    st = x.strides[2:]
    strides = (*x.strides[:2], *(s * d for s, d in zip(st, dilation)), *(s * t for s, t in zip(st, stride)))
    windows = strided_windows(xp, x, (*x.shape[:2], *kernel_size, *out), strides)
    if batch_inner:
        windows = windows.transpose(_batch_inner(len(kernel_size)))
    # A copy always: when the windows tile the input exactly (a 2x2 kernel over a 2x2 image), the
    # strided view is already contiguous and ascontiguousarray would hand back the input's memory.
    return xp.array(windows, order="C")


def _unfold_vjp(ops, ctx, g):
    spatial = ctx.input_types[0].shape[2:]
    return (ops.fold_windows(g, spatial, **ctx.attrs),)


def _torch_window_slices(spatial_out, offsets, stride, dilation):
    return tuple(slice(k * d, k * d + s * (o - 1) + 1, s) for o, k, s, d in zip(spatial_out, offsets, stride, dilation))


def _unfold_reference(torch, x, *, kernel_size, stride, dilation, batch_inner=False):
    n, c = x.shape[:2]
    out = _out_spatial("unfold", x.shape[2:], kernel_size, stride, dilation)
    if len(kernel_size) == 2:  # PyTorch's own im2col
        cols = torch.nn.functional.unfold(x, kernel_size, dilation=dilation, stride=stride)
        windows = cols.reshape(n, c, *kernel_size, *out)
    else:
        pieces = [x[(Ellipsis,) + tuple(_torch_window_slices(out, k, stride, dilation))]
                  for k in itertools.product(*map(range, kernel_size))]  # fmt: skip
        windows = torch.stack(pieces, dim=2).reshape(n, c, *kernel_size, *out)
    return windows.permute(_batch_inner(len(kernel_size))).contiguous() if batch_inner else windows


def _unfold_samples(rng):
    return [
        Sample((rng.normal(size=(2, 3, 5, 6)),), {"kernel_size": (2, 3), "stride": (1, 2), "dilation": (2, 1)}),
        Sample((rng.normal(size=(1, 2, 7)),), {"kernel_size": (3,), "stride": (2,), "dilation": (1,)}),
        Sample(
            (rng.normal(size=(1, 1, 4, 3, 3)),), {"kernel_size": (2, 1, 2), "stride": (1, 1, 1), "dilation": (1, 1, 1)}
        ),
        Sample((rng.normal(size=(0, 2, 3, 3)),), {"kernel_size": (2, 2), "stride": (1, 1), "dilation": (1, 1)}),
        Sample(
            (rng.normal(size=(3, 2, 5, 4)),),
            {"kernel_size": (2, 3), "stride": (2, 1), "dilation": (1, 1), "batch_inner": True},
        ),
        Sample(
            (rng.normal(size=(2, 3, 6)),), {"kernel_size": (3,), "stride": (1,), "dilation": (2,), "batch_inner": True}
        ),
    ]


unfold = register(Primitive(
    "unfold", Kind.WINDOW, _unfold_infer, _unfold_eager, _unfold_vjp,
    reference=_unfold_reference, samples=_unfold_samples,
    doc="Sliding windows (N, C, *S) -> (N, C, *kernel, *out), a copy: the basis of conv and pooling.",
))  # fmt: skip


def _static_spatial(name: str, spatial) -> None:
    # The batch and channel dims may be symbolic (they are carried through); window arithmetic needs ints.
    if not is_static(spatial):
        raise SymbolicShapeError(
            f"{name} does not take a symbolic spatial dimension yet (spatial size {tuple(map(str, spatial))})"
        )


# ----------------------------------------------------------------------------- fold
def _batch_channels(cols_shape, d: int, batch_inner: bool) -> tuple:
    """(N, C) of windows in either layout."""
    return (cols_shape[1 + d], cols_shape[0]) if batch_inner else tuple(cols_shape[:2])


def _fold_infer(cols: TensorType, *, size, kernel_size, stride, dilation, batch_inner=False) -> TensorType:
    d = _check_window_attrs("fold", cols, kernel_size, stride, dilation, 2 + len(kernel_size))
    if len(size) != d:
        raise ValueError(f"fold: size {tuple(size)} must have one entry per spatial dim ({d})")
    out = _out_spatial("fold", size, kernel_size, stride, dilation)
    n, c = _batch_channels(cols.shape, d, batch_inner)
    expected = _windows_shape(n, c, kernel_size, out, batch_inner)
    if tuple(cols.shape) != expected:
        raise RuntimeError(
            f"fold: expected windows of shape {list(expected)} for size {tuple(size)}, kernel_size "
            f"{tuple(kernel_size)}, stride {tuple(stride)}, dilation {tuple(dilation)}; got {list(cols.shape)}"
        )
    return TensorType((n, c, *size), cols.dtype, cols.device)


def _fold_eager(xp, cols, *, size, kernel_size, stride, dilation, batch_inner=False):
    d = len(kernel_size)
    if batch_inner:  # index (N, C, *K, *O) as a strided view of the (C, *K, N, *O) windows
        cols = cols.transpose(_from_batch_inner(d))
    out_spatial = cols.shape[2 + d :]
    if tuple(cols.shape[2 : 2 + d]) != tuple(kernel_size) or out_spatial != _out_spatial(
        "fold", size, kernel_size, stride, dilation
    ):
        raise ValueError("fold: the windows do not match the attributes")
    if xp is np and out_spatial and out_spatial[-1] <= FOLD_CHANNELS_LAST_WIDTH:
        return _fold_channels_last(cols, size, kernel_size, stride, dilation)
    out = xp.zeros((*cols.shape[:2], *size), dtype=cols.dtype)
    # One strided add per kernel offset: prod(kernel) vectorized adds, no scatter (np.add.at is slow).
    # (``xp.add(..., out=)``: ``out[target] += ...`` would also assign the view to itself, a copy)
    for offsets, target in _fold_targets(kernel_size, out_spatial, stride, dilation):
        view = out[(Ellipsis, *target)]
        xp.add(view, cols[(slice(None), slice(None), *offsets)], out=view)
    return out


#: The widest rows of windows (the last output dim) that ``fold`` sums channels-last on numpy: each
#: strided add's inner loop is then the N * C values of one position, not a row of a few. DCGAN's
#: col2im, (16, 16, 4, 4, 4, 4) windows into (16, 16, 10, 10), 198 -> 86 us (one thread); at width 28
#: the transposes cost more than they save (LeNet-sized, 1.1 -> 3.0 ms).
FOLD_CHANNELS_LAST_WIDTH = 8


def _fold_targets(kernel_size, out_spatial, stride, dilation):
    """(offset, the output's slices it adds to) per kernel offset, row-major."""
    per_dim = [
        [slice(k * dl, k * dl + s * (o - 1) + 1, s) for k in range(kk)]
        for kk, o, s, dl in zip(kernel_size, out_spatial, stride, dilation, strict=True)
    ]
    return zip(itertools.product(*map(range, kernel_size)), itertools.product(*per_dim), strict=True)


def _fold_channels_last(cols, size, kernel_size, stride, dilation):
    """``fold`` of (N, C, *K, *O) windows (any strides) on numpy through a (*size, N, C) sum: the same
    adds in the same order, so the same bits."""
    d = len(kernel_size)
    n, c, out_spatial = cols.shape[0], cols.shape[1], cols.shape[2 + d :]
    windows = np.ascontiguousarray(cols.transpose(*range(2, 2 + 2 * d), 0, 1))  # (*K, *O, N, C)
    out = np.zeros((*size, n, c), cols.dtype)
    for offsets, target in _fold_targets(kernel_size, out_spatial, stride, dilation):
        view = out[target]
        np.add(view, windows[offsets], out=view)
    return np.ascontiguousarray(out.transpose(d, d + 1, *range(d)))


def _fold_vjp(ops, ctx, g):
    attrs = {k: v for k, v in ctx.attrs.items() if k != "size"}
    return (ops.unfold_windows(g, **attrs),)


def _fold_reference(torch, cols, *, size, kernel_size, stride, dilation, batch_inner=False):
    d = len(kernel_size)
    if batch_inner:
        cols = cols.permute(_from_batch_inner(d))
    n, c = cols.shape[:2]
    if d == 2:  # PyTorch's own col2im
        flat = cols.reshape(n, c * kernel_size[0] * kernel_size[1], -1)
        return torch.nn.functional.fold(flat, size, kernel_size, dilation=dilation, stride=stride).reshape(n, c, *size)
    out_spatial = cols.shape[2 + d :]
    out = torch.zeros((n, c, *size), dtype=cols.dtype)
    for k in itertools.product(*map(range, kernel_size)):
        out[(Ellipsis,) + tuple(_torch_window_slices(out_spatial, k, stride, dilation))] += cols[
            (slice(None), slice(None)) + tuple(k)
        ]
    return out


def _fold_samples(rng):
    return [
        Sample((rng.normal(size=(2, 3, 2, 3, 3, 2)),),
               {"size": (5, 6), "kernel_size": (2, 3), "stride": (1, 2), "dilation": (2, 1)}),
        Sample((rng.normal(size=(1, 2, 3, 3)),), {"size": (8,), "kernel_size": (3,), "stride": (2,), "dilation": (1,)}),
        Sample((rng.normal(size=(1, 1, 2, 1, 2, 3, 3, 2)),),
               {"size": (4, 3, 3), "kernel_size": (2, 1, 2), "stride": (1, 1, 1), "dilation": (1, 1, 1)}),
        Sample((rng.normal(size=(3, 2, 3, 2, 2, 2)),),
               {"size": (4, 4), "kernel_size": (2, 3), "stride": (2, 1), "dilation": (1, 1), "batch_inner": True}),
        # a transposed convolution's (conv_transpose2d, stride 2, output_padding 1): overlapping
        # windows, and a last row no window reaches
        Sample((rng.normal(size=(2, 4, 4, 2, 3, 3)),),
               {"size": (9, 8), "kernel_size": (4, 4), "stride": (2, 2), "dilation": (1, 1), "batch_inner": True}),
    ]  # fmt: skip


fold = register(Primitive(
    "fold", Kind.WINDOW, _fold_infer, _fold_eager, _fold_vjp,
    reference=_fold_reference, samples=_fold_samples,
    doc="The adjoint of unfold: scatter-add windows (N, C, *kernel, *out) back to (N, C, *size).",
))  # fmt: skip
