"""ONNX rules for the index and window primitives (see ``_primitives``): gather/scatter, advanced
indexing (``take``, ``index_put``) and the sliding windows under convolution and pooling."""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..ir import dtypes as dt
from ..ir.primitives.tiles import transform_coefficients
from ._builder import OnnxExportError, onnx_dtype


def _np(value) -> np.dtype:
    return np.dtype(value.type.dtype.np)


# ----------------------------------------------------------------------------- indexing
def _cut(b, x, x_shape, shape, skip_axis=None):
    """``x`` sliced to ``shape`` in every dim but ``skip_axis`` (torch.gather's smaller index)."""
    axes = [d for d, (n, m) in enumerate(zip(x_shape, shape, strict=True)) if d != skip_axis and n != m]
    if not axes:
        return x
    ends = b.shape_tensor([shape[d] for d in axes])  # a dynamic size read at run time
    return b.op("Slice", [x, b.ints([0] * len(axes)), ends, b.ints(axes)])


def gather(b, node, x, index):
    axis = node.attrs["axis"]
    xv, iv = node.inputs
    if xv.type.ndim == 0:
        flat = b.op("Reshape", [x, b.ints([1])])
        got = b.op("GatherElements", [flat, b.op("Reshape", [index, b.ints([1])])], axis=0)
        return b.op("Reshape", [got, b.ints([])])
    return b.op("GatherElements", [_cut(b, x, b.shape(xv), b.shape(iv), axis), index], axis=axis)


def scatter(reduction):
    def rule(b, node, x, index, src):
        xv, iv, sv = node.inputs
        if xv.type.ndim == 0:  # onnxruntime refuses 0-d operands: as 1-element tensors
            one = b.ints([1])
            flat = [b.op("Reshape", [t, one]) for t in (x, index, src)]
            return b.op("Reshape", [b.op("ScatterElements", flat, axis=0, reduction=reduction), b.ints([])])
        updates = _cut(b, src, b.shape(sv), b.shape(iv))
        return b.op("ScatterElements", [x, index, updates], axis=node.attrs["axis"], reduction=reduction)

    return rule


def _stacked_indices(b, node, x_value, index_values, names):
    """The index tensors broadcast together, negative ones wrapped, stacked on a last axis (GatherND)."""
    from ..ir.shapes import broadcast_shapes  # noqa: PLC0415

    shape = broadcast_shapes(*(b.shape(v) for v in index_values))
    x_shape = b.shape(x_value)
    parts = []
    for k, (v, name) in enumerate(zip(index_values, names, strict=True)):
        if v.type.dtype is not dt.int64:
            name = b.op("Cast", [name], to=onnx_dtype(dt.int64))
        size = b.op("Reshape", [b.dim(x_shape[k]), b.ints([])]) if not isinstance(x_shape[k], int) else (
            b.scalar(x_shape[k], np.int64))  # fmt: skip
        wrapped = b.op("Where", [b.op("Less", [name, b.scalar(0, np.int64)]), b.op("Add", [name, size]), name])
        if tuple(b.shape(v)) != tuple(shape):
            wrapped = b.op("Expand", [wrapped, b.shape_tensor(shape)])
        parts.append(b.op("Unsqueeze", [wrapped, b.ints([-1])]))
    return (parts[0] if len(parts) == 1 else b.op("Concat", parts, axis=-1)), tuple(shape)


def take(b, node, x, *indices):
    stacked, _ = _stacked_indices(b, node, node.inputs[0], node.inputs[1:], indices)
    return b.op("GatherND", [x, stacked])


def index_put(b, node, x, values, *indices):
    xv = node.inputs[0]
    stacked, shape = _stacked_indices(b, node, xv, node.inputs[2:], indices)
    update_shape = shape + tuple(b.shape(xv)[len(indices) :])
    if tuple(b.shape(node.inputs[1])) != update_shape:
        values = b.op("Expand", [values, b.shape_tensor(update_shape)])
    reduction = "add" if node.attrs["accumulate"] else None
    return b.op("ScatterND", [x, stacked, values], reduction=reduction)


# ----------------------------------------------------------------------------- windows
def _window_positions(spatial, kernel, stride, dilation) -> np.ndarray:
    """For each (kernel offset, output position), the flat index into the spatial dims it reads."""
    from ..ir.primitives.windows import window_output_size  # noqa: PLC0415

    out = tuple(map(window_output_size, spatial, kernel, stride, dilation))
    flat_strides = [math.prod(spatial[d + 1 :]) for d in range(len(spatial))]
    index = np.zeros(tuple(kernel) + out, dtype=np.int64)
    for k in itertools.product(*map(range, kernel)):
        for o in itertools.product(*map(range, out)):
            index[k + o] = sum((o[d] * stride[d] + k[d] * dilation[d]) * flat_strides[d] for d in range(len(spatial)))
    return index


def batch_inner_order(d: int) -> tuple[int, ...]:
    """The permutation of (N, C, *K, *O) windows into the ``batch_inner`` layout (C, *K, N, *O)."""
    return (1, *range(2, 2 + d), 0, *range(2 + d, 2 + 2 * d))


def batch_outer_order(d: int) -> tuple[int, ...]:
    """Its inverse."""
    return tuple(sorted(range(2 + 2 * d), key=batch_inner_order(d).__getitem__))


def unfold(b, node, x):
    a = node.attrs
    spatial = tuple(b.shape(node.inputs[0])[2:])
    if not all(isinstance(s, int) for s in spatial):
        raise OnnxExportError(b.context("sliding windows over a dynamic spatial axis"))
    index = _window_positions(spatial, a["kernel_size"], a["stride"], a["dilation"])
    flat = b.op("Reshape", [x, b.ints([0, 0, math.prod(spatial)])])  # 0: the input's own N and C
    windows = b.op("Gather", [flat, b.const(index, "windows")], axis=2)
    if a.get("batch_inner", False):  # (N, C, *K, *O) -> (C, *K, N, *O)
        return b.op("Transpose", [windows], perm=list(batch_inner_order(len(a["kernel_size"]))))
    return windows


def fold(b, node, x):
    a = node.attrs
    if a.get("batch_inner", False):  # (C, *K, N, *O) -> (N, C, *K, *O)
        x = b.op("Transpose", [x], perm=list(batch_outer_order(len(a["kernel_size"]))))
    return _fold(b, x, tuple(a["size"]), a["kernel_size"], a["stride"], a["dilation"], _np(node.output))


def _fold(b, x, size, kernel, stride, dilation, dtype):
    """Windows (N, C, *K, *O) added back into (N, C, *size)."""
    index = _window_positions(size, kernel, stride, dilation).reshape(1, 1, -1)
    updates = b.op("Reshape", [x, b.ints([0, 0, -1])])
    indices = b.op("Expand", [b.const(index, "windows"), b.op("Shape", [updates])])
    lead = b.op("Shape", [x], start=0, end=2)
    zeros = b.op("Expand", [b.scalar(0, dtype), b.op("Concat", [lead, b.ints([math.prod(size)])], axis=0)])
    summed = b.op("ScatterElements", [zeros, indices, updates], axis=2, reduction="add")
    return b.op("Reshape", [summed, b.op("Concat", [lead, b.ints(size)], axis=0)])


# ----------------------------------------------------------------------------- direct convolution
def conv(b, node, x, w):
    a = node.attrs
    kernel = list(b.shape(node.inputs[1])[2:])
    return b.op("Conv", [x, w], kernel_shape=kernel, strides=list(a["stride"]), dilations=list(a["dilation"]))


def conv_weight(b, node, g, x):
    """The filter's gradient as a Conv with batch and channels swapped: the input (C, N, *S) by the
    output gradient (O, N, *out) as filters, their roles of stride and dilation swapped, gives
    (C, O, *K') with K' >= kernel_size; cropped to the kernel and transposed to (O, C, *K)."""
    a = node.attrs
    d = len(a["kernel_size"])
    swap = [1, 0, *range(2, 2 + d)]
    inputs = b.op("Transpose", [x], perm=swap)
    filters = b.op("Transpose", [g], perm=swap)
    out_spatial = list(b.shape(node.inputs[0])[2:])
    grads = b.op("Conv", [inputs, filters], kernel_shape=out_spatial, strides=list(a["dilation"]),
                 dilations=list(a["stride"]))  # fmt: skip
    axes = list(range(2, 2 + d))
    grads = b.op("Slice", [grads, b.ints([0] * d), b.ints(list(a["kernel_size"])), b.ints(axes)])
    return b.op("Transpose", [grads], perm=swap)


# ----------------------------------------------------------------------------- tile transforms
def tile_transform(b, node, x):
    """A convolution of every plane with the alpha**2 filters L[i] (outer) L[j]."""
    a = node.attrs
    t = len(a["matrix"][0])
    shape = b.shape(node.inputs[0])
    filters = transform_coefficients(a["matrix"]).reshape(-1, 1, t, t).astype(_np(node.output))
    planes = b.op("Reshape", [x, b.ints([-1, 1, *shape[-2:]])])
    tiles = b.op("Conv", [planes, b.const(filters, "tile_filters")], kernel_shape=[t, t], strides=[a["stride"]] * 2)
    tiles = b.op("Transpose", [tiles], perm=[1, 0, 2, 3])  # (alpha**2, planes, th, tw)
    return b.op("Reshape", [tiles, b.shape_tensor(b.shape(node.output))])


def untile_transform(b, node, v):
    """Each tile's L^T v L as one matmul over all tiles, then added into the planes as ``fold`` adds
    windows."""
    a = node.attrs
    t = len(a["matrix"][0])
    shape = b.shape(node.inputs[0])
    coefficients = transform_coefficients(a["matrix"]).T.astype(_np(node.output))  # (t*t, alpha**2)
    flat = b.op("Reshape", [v, b.ints([shape[0], -1])])
    windows = b.op("MatMul", [b.const(coefficients, "untile_coefficients"), flat])  # (t*t, planes * th * tw)
    windows = b.op("Reshape", [windows, b.ints([t, t, -1, *shape[-2:]])])
    windows = b.op("Transpose", [windows], perm=[2, 0, 1, 3, 4])
    windows = b.op("Reshape", [windows, b.ints([-1, 1, t, t, *shape[-2:]])])  # (planes, 1, t, t, th, tw)
    planes = _fold(b, windows, tuple(a["size"]), (t, t), (a["stride"],) * 2, (1, 1), _np(node.output))
    return b.op("Reshape", [planes, b.shape_tensor(b.shape(node.output))])
