"""Direct convolution primitives: ``conv`` and the gradient of its filter, ``conv_weight``.

``kiln.nn.functional.conv2d`` emits these (instead of im2col windows and a matmul) where the
filter is small: C * prod(kernel) at most ``DIRECT_MAX_INNER`` (LeNet's two convolutions, a
network's stem). BLAS runs such products slowly -- a (6, 25) @ (25, 50176) product at a fifth of
its peak -- and the windows it needs are written out first (5 MB for LeNet's first convolution).
A compiled program runs each as a loop nest that reads the input where it lies
(``kiln/codegen/llvm/conv.py``); the eager kernels here are im2col and BLAS, as before.

- ``conv(x, w)``: ``x`` (N, C, *S), already padded, ``w`` (O, C, *K) -> (N, O, *OS) with
  ``out[n, o, *p] = sum over c, k of w[o, c, *k] * x[n, c, *(p * stride + k * dilation)]``;
- ``conv_weight(g, x)``: ``g`` (N, O, *OS), ``x`` (N, C, *S) -> (O, C, *kernel_size): the
  gradient of ``conv`` with respect to its filter, for ``g`` the gradient of its output.

There are no groups (the frontend emits these for groups=1 only). Gradients are each other's,
and the input's is ``_input_gradient``: for unit strides a ``conv`` of the output's gradient
padded by the dilated kernel's span, with the filter flipped and its channel dims swapped
(so a compiled backward runs the same loop nest), else the adjoint of im2col (a product and
``fold``).
"""

from __future__ import annotations

import math

from ..types import TensorType
from . import Kind, Primitive, Sample, register
from .linalg import _matmul_eager
from .windows import _check_window_attrs, _out_spatial, _unfold_eager

#: The longest filter, C * prod(kernel), that ``conv2d`` computes directly (longer ones go to im2col
#: and BLAS, which then runs near its peak).
DIRECT_MAX_INNER = 256


def _check_channels(op: str, x: TensorType, channels, what: str) -> None:
    if x.shape[1] != channels:
        raise RuntimeError(f"{op}: expected an input with {channels} channels ({what}), got shape {list(x.shape)}")


def _check_dtypes(op: str, a: TensorType, b: TensorType) -> None:
    if a.dtype is not b.dtype:
        raise RuntimeError(f"{op}: expected inputs of one dtype, got {a.dtype.name} and {b.dtype.name}")


# ----------------------------------------------------------------------------- conv
def _conv_infer(x: TensorType, w: TensorType, *, stride, dilation) -> TensorType:
    kernel = tuple(w.shape[2:])
    _check_window_attrs("conv", x, kernel, stride, dilation, 2)
    if w.ndim != x.ndim:
        raise RuntimeError(f"conv: expected a {x.ndim}-d filter for input {list(x.shape)}, got {list(w.shape)}")
    _check_dtypes("conv", x, w)
    _check_channels("conv", x, w.shape[1], f"the filter's dim 1, filter {list(w.shape)}")
    out = _out_spatial("conv", x.shape[2:], kernel, stride, dilation)
    return TensorType((x.shape[0], w.shape[0], *out), x.dtype, x.device)


def _conv_eager(xp, x, w, *, stride, dilation):
    d = w.ndim - 2
    cols = _unfold_eager(xp, x, kernel_size=w.shape[2:], stride=stride, dilation=dilation)  # (N, C, *K, *OS)
    n, o, out_spatial = x.shape[0], w.shape[0], cols.shape[2 + d :]
    filters = w.reshape(o, math.prod(w.shape[1:]))
    out = xp.matmul(filters, cols.reshape(n, filters.shape[1], math.prod(out_spatial)))  # one product per sample
    return out.reshape(n, o, *out_spatial)


def _input_gradient(ops, g, w, spatial, stride, dilation):
    """The gradient of ``conv(x, w)`` with respect to ``x`` (spatial dims ``spatial``) for ``g``,
    the gradient of its output."""
    d = len(stride)
    kernel = tuple(w.shape[2:])
    o, c = w.shape[0], w.shape[1]
    if all(s == 1 for s in stride) and o * math.prod(kernel) <= DIRECT_MAX_INNER:
        span = tuple(dl * (k - 1) for k, dl in zip(kernel, dilation, strict=True))
        padded = ops.strided_pad(g, (0, 0, *span), (0, 0, *span), (0,) * (d + 2))
        flipped = ops.transpose(ops.flip(w, tuple(range(2, 2 + d))), 0, 1)  # (C, O, *K)
        return ops.apply(conv, padded, flipped, stride=tuple(stride), dilation=tuple(dilation))
    # im2col's adjoint as one product over the whole batch, (C * K, O) @ (O, N * P), as conv2d's
    # im2col path has it: a product per sample is 64 small ones for LeNet-5's second convolution
    n, out_spatial = g.shape[0], tuple(g.shape[2:])
    filters = ops.transpose(ops.reshape(w, (o, c * math.prod(kernel))), 0, 1)
    grads = ops.reshape(ops.transpose(g, 0, 1), (o, n * math.prod(out_spatial)))
    windows = ops.reshape(ops.matmul(filters, grads), (c, *kernel, n, *out_spatial))
    return ops.fold_windows(windows, tuple(spatial), kernel, stride, dilation, batch_inner=True)


def _conv_vjp(ops, c, g):
    x, w = c.inputs
    tx, tw = c.input_types
    stride, dilation = c.attrs["stride"], c.attrs["dilation"]
    gx = gw = None
    if c.needs_input_grad[0]:
        gx = _input_gradient(ops, g, w, tx.shape[2:], stride, dilation)
    if c.needs_input_grad[1]:
        gw = ops.apply(conv_weight, g, x, kernel_size=tuple(tw.shape[2:]), stride=stride, dilation=dilation)
    return gx, gw


def _conv_reference(torch, x, w, *, stride, dilation):
    return getattr(torch.nn.functional, f"conv{w.ndim - 2}d")(x, w, stride=stride, dilation=dilation)


def _conv_samples(rng):
    n = rng.normal
    return [
        Sample((n(size=(2, 3, 6, 7)), n(size=(4, 3, 3, 2))), {"stride": (1, 1), "dilation": (1, 1)}),
        Sample((n(size=(2, 2, 7, 8)), n(size=(3, 2, 2, 3))), {"stride": (1, 1), "dilation": (2, 1)}),
        Sample((n(size=(1, 2, 9, 8)), n(size=(2, 2, 3, 3))), {"stride": (2, 3), "dilation": (1, 1)}),
        Sample((n(size=(2, 1, 8)), n(size=(3, 1, 3))), {"stride": (1,), "dilation": (1,)}),
        Sample((n(size=(1, 2, 4, 4, 3)), n(size=(2, 2, 2, 2, 2))), {"stride": (1, 1, 1), "dilation": (1, 1, 1)}),
        Sample((n(size=(0, 2, 4, 4)), n(size=(3, 2, 2, 2))), {"stride": (1, 1), "dilation": (1, 1)}),
    ]


conv = register(Primitive(
    "conv", Kind.WINDOW, _conv_infer, _conv_eager, _conv_vjp, save_inputs=True,
    reference=_conv_reference, samples=_conv_samples,
    doc="Convolution (cross-correlation) of a padded (N, C, *S) by a filter (O, C, *K) -> (N, O, *out).",
))  # fmt: skip


# ----------------------------------------------------------------------------- conv_weight
def _conv_weight_infer(g: TensorType, x: TensorType, *, kernel_size, stride, dilation) -> TensorType:
    _check_window_attrs("conv_weight", x, kernel_size, stride, dilation, 2)
    _check_dtypes("conv_weight", g, x)
    out = _out_spatial("conv_weight", x.shape[2:], kernel_size, stride, dilation)
    expected = (x.shape[0], g.shape[1] if g.ndim == x.ndim else "O", *out)
    if g.ndim != x.ndim or g.shape[0] != x.shape[0] or tuple(g.shape[2:]) != out:
        raise RuntimeError(
            f"conv_weight: expected an output gradient of shape {list(expected)} for input {list(x.shape)}, "
            f"kernel_size {tuple(kernel_size)}, stride {tuple(stride)}, dilation {tuple(dilation)}; got {list(g.shape)}"
        )
    return TensorType((g.shape[1], x.shape[1], *kernel_size), x.dtype, x.device)


def _conv_weight_eager(xp, g, x, *, kernel_size, stride, dilation):
    cols = _unfold_eager(xp, x, kernel_size=kernel_size, stride=stride, dilation=dilation, batch_inner=True)
    inner = x.shape[1] * math.prod(kernel_size)
    rows = cols.reshape(inner, cols.size // inner if inner else 0)  # (C * K, N * P)
    o = g.shape[1]
    grads = xp.ascontiguousarray(xp.moveaxis(g, 1, 0)).reshape(o, rows.shape[1])  # (O, N * P)
    return _matmul_eager(xp, grads, rows.T).reshape(o, x.shape[1], *kernel_size)


def _conv_weight_vjp(ops, c, h):
    g, x = c.inputs
    tx = c.input_types[1]
    stride, dilation = c.attrs["stride"], c.attrs["dilation"]
    gg = gx = None
    if c.needs_input_grad[0]:
        gg = ops.apply(conv, x, h, stride=stride, dilation=dilation)
    if c.needs_input_grad[1]:
        gx = _input_gradient(ops, g, h, tx.shape[2:], stride, dilation)
    return gg, gx


def _conv_weight_reference(torch, g, x, *, kernel_size, stride, dilation):
    d = len(kernel_size)
    shape = (g.shape[1], x.shape[1], *kernel_size)
    weight = getattr(torch.nn.grad, f"conv{d}d_weight")
    return weight(x, shape, g, stride=stride, padding=0, dilation=dilation)


def _conv_weight_samples(rng):
    n = rng.normal
    return [
        Sample((n(size=(2, 4, 4, 6)), n(size=(2, 3, 6, 7))), {"kernel_size": (3, 2), "stride": (1, 1), "dilation": (1, 1)}),
        Sample((n(size=(2, 3, 5, 6)), n(size=(2, 2, 7, 8))), {"kernel_size": (2, 3), "stride": (1, 1), "dilation": (2, 1)}),
        Sample((n(size=(1, 2, 4, 2)), n(size=(1, 2, 9, 8))), {"kernel_size": (3, 3), "stride": (2, 3), "dilation": (1, 1)}),
        Sample((n(size=(2, 3, 6)), n(size=(2, 1, 8))), {"kernel_size": (3,), "stride": (1,), "dilation": (1,)}),
        Sample((n(size=(0, 3, 3, 3)), n(size=(0, 2, 4, 4))), {"kernel_size": (2, 2), "stride": (1, 1), "dilation": (1, 1)}),
    ]  # fmt: skip


conv_weight = register(Primitive(
    "conv_weight", Kind.WINDOW, _conv_weight_infer, _conv_weight_eager, _conv_weight_vjp, save_inputs=True,
    reference=_conv_weight_reference, samples=_conv_weight_samples,
    doc="The gradient of conv's filter: output gradient (N, O, *out) and padded input (N, C, *S) -> (O, C, *kernel).",
))  # fmt: skip
