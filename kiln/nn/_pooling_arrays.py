"""Max pooling on the arrays of eager CPU tensors, as one autograd node.

Max pooling's ops (``_pooling._MaxOfWindows``) are an elementwise chain over the window's offsets
written to fuse when compiled; on numpy each link is a pass of its own over broadcast shapes: the
running maximum, then per offset an equality, an isnan, an or and a ``where`` for the position of
the first maximum, and a backward ``where`` of (N, C, O1, K1, O2, K2) shapes whose comparison
broadcasts (1, 1, 1, K1, 1, K2) against (N, C, O1, 1, O2, 1). On a small CNN's (32, 8, 28, 28)
2x2 pooling, forward and backward took ~1.3 ms on numpy alone. Here the windows are copied once,
offset first, into (K, M) (one contiguous row of M windows per offset); the maximum is the same
running ``numpy.maximum`` (the ops' own kernel, in their order: the same values, NaN and -0.0
included); the first maximum's offset is read from one byte (or two) per window whose bit ``k``
says that offset ``k`` equals the maximum (or is NaN), by a table of each byte's lowest set bit;
and the backward writes the gradient into the offset views of the input's gradient, each selected
on its bits (an element or +0.0, exactly what the ops' ``where`` gives).

It runs where the composite's body runs (the compiled composite, where it runs, has taken the call
before) on plain float32/float64 CPU tensors, outside traces and profiles, for windows of at most
``MAX_OFFSETS`` elements. Under ``create_graph``, a trace or a profile the backward is the ops'
``where`` of the saved offsets folded back (differentiable again).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

import kiln
from kiln.frontend import dispatch
from kiln.frontend.autograd import grad_mode
from kiln.frontend.autograd.graph import LazyEdgesNode, pending_edge, unpack_tensors
from kiln.frontend.jit import state as _jit
from kiln.frontend.ops._util import plain_arrays
from kiln.frontend.tensor import make_tensor

#: The most elements a window may have here: a window's offsets are the bits of one uint16.
MAX_OFFSETS = 16
_BITS = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


def _lowest_set_bit(bits: int) -> np.ndarray:
    """The table of each ``bits``-bit number's lowest set bit (``bits`` for 0, no bit set)."""
    m = np.arange(1 << bits, dtype=np.int64)
    low = m & -m
    table = np.full(1 << bits, bits, dtype=np.uint8)
    table[1:] = np.log2(low[1:]).astype(np.uint8)  # (powers of two: exact)
    return table


_FIRST: dict[int, np.ndarray] = {}


def _first_offsets(hits: list[np.ndarray]) -> np.ndarray:
    """The first ``k`` with ``hits[k]`` true, per element (uint8), from one bit per offset."""
    bits = 8 if len(hits) <= 8 else 16
    packed = np.zeros(hits[0].shape, np.uint8 if bits == 8 else np.uint16)
    for k, hit in enumerate(hits):
        packed |= np.left_shift(hit.view(np.uint8), k, dtype=packed.dtype)
    table = _FIRST.get(bits)
    if table is None:
        table = _FIRST[bits] = _lowest_set_bit(bits)
    return table.take(packed)


def _window_view(a: np.ndarray, kernel, stride, dilation, out_size, writeable: bool = False) -> np.ndarray:
    """(N, C, *K, *O) windows of ``a`` (N, C, *S): a strided view."""
    spatial = a.strides[2:]
    strides = (*a.strides[:2], *(s * dl for s, dl in zip(spatial, dilation, strict=True)),
               *(s * st for s, st in zip(spatial, stride, strict=True)))  # fmt: skip
    return np.lib.stride_tricks.as_strided(a, (*a.shape[:2], *kernel, *out_size), strides, writeable=writeable)


def max_pool_on_arrays(x, kernel, stride, dilation, pads, out_size):
    """(max, first-max offset) of the windows of ``x`` (N, C, *S) padded by ``pads`` ((low, high)
    per spatial dim, of -inf): the max (N, C, *out_size) a tensor with one backward node, the
    offsets (row-major in the kernel) a uint8 array; None where the ops must run."""
    offsets = math.prod(kernel)
    if offsets > MAX_OFFSETS or not plain_arrays(x) or x._data.size == 0:
        return None
    a = x._data
    if any(p for pair in pads for p in pair):
        padded = np.full((*a.shape[:2], *(s + lo + hi for s, (lo, hi) in zip(a.shape[2:], pads, strict=True))),
                         -np.inf, a.dtype)  # fmt: skip
        padded[_interior(padded.shape[2:], pads)] = a
        a = padded
    d = len(kernel)
    windows = _window_view(a, kernel, stride, dilation, out_size)
    # offset first, one copy: each offset's row then lies in contiguous memory
    rows = np.ascontiguousarray(windows.transpose(*range(2, 2 + d), 0, 1, *range(2 + d, 2 + 2 * d)))
    rows = rows.reshape(offsets, -1)
    top = rows[0].copy() if offsets == 1 else np.maximum(rows[0], rows[1])
    for k in range(2, offsets):
        np.maximum(top, rows[k], out=top)
    with_nan = bool(np.isnan(top).any())  # (a window with a NaN has a NaN maximum)
    hits = []
    for k in range(offsets):
        hit = np.equal(rows[k], top)
        if with_nan:
            hit |= np.isnan(rows[k])
        hits.append(hit)
    first = _first_offsets(hits).reshape(*windows.shape[:2], *out_size)
    result = make_tensor(top.reshape(first.shape), x._device, x._dtype)
    if grad_mode.state.grad_enabled and x._requires_grad:
        MaxPoolBackward.attach(result, x, first, (a.shape[2:], kernel, stride, dilation, pads))
    return result, first


def _interior(spatial, pads) -> tuple[slice, ...]:
    """The index of (N, C, *spatial) less ``pads`` ((low, high) per spatial dim) around."""
    return (slice(None), slice(None), *(slice(lo, s - hi) for s, (lo, hi) in zip(spatial, pads, strict=True)))


class MaxPoolBackward(LazyEdgesNode):
    """The gradient of ``max_pool_on_arrays``' max: each window's gradient to its first maximum."""

    __slots__ = ("first", "geometry")
    first: np.ndarray | None  # the first maximum's offset per window (N, C, *O); None once released
    geometry: tuple  # the padded input's spatial size, kernel, stride, dilation, pads

    @classmethod
    def attach(cls, result, x, first: np.ndarray, geometry: tuple) -> None:
        node = cls((pending_edge(x),))
        node.first, node.geometry = first, geometry
        result.grad_fn, result._output_nr, result._requires_grad = node, 0, True

    def name(self) -> str:
        return "MaxPoolBackward"

    def apply(self, grads: list) -> tuple:
        g = grads[0]
        unpack_tensors(self, None if self.first is None else (), ())  # (released: the second backward's error)
        if (
            grad_mode.state.grad_enabled
            or (_jit.tracing and _jit.current.get() is not None)
            or dispatch.profiling_ops
            or not plain_arrays(g)
        ):
            return (self._through_ops(g),)  # a graph (create_graph), a trace or a profile: ops
        return (make_tensor(self._on_arrays(np.asarray(g._data)), g._device, g._dtype),)

    def _on_arrays(self, g: np.ndarray) -> np.ndarray:
        size, kernel, stride, dilation, pads = self.geometry
        first, out_size = self.first, g.shape[2:]
        out = np.zeros((*g.shape[:2], *size), g.dtype)
        windows = _window_view(out, kernel, stride, dilation, out_size, writeable=True)
        # each element of the gradient where its window's first maximum is at this offset, else
        # +0.0: a select on the bits (a product by the mask would make NaN of 0 * inf)
        bits = _BITS[g.dtype]
        g_bits = g.view(bits) if g.flags.c_contiguous else np.ascontiguousarray(g).view(bits)
        tiled = all(st >= dl * (k - 1) + 1 for k, st, dl in zip(kernel, stride, dilation, strict=True))
        for k, offset in enumerate(itertools.product(*map(range, kernel))):
            chosen = np.multiply(g_bits, first == k, dtype=bits)
            key: tuple = (slice(None), slice(None), *offset)
            target = windows[key]
            if tiled:  # no two windows share an element: each written once
                np.copyto(target, chosen.view(g.dtype))
            else:  # overlapping windows add up, offset after offset (as fold_windows adds them)
                np.add(target, chosen.view(g.dtype), out=target)
        return np.ascontiguousarray(out[_interior(size, pads)])

    def _through_ops(self, g):
        """The same gradient with ops, differentiable in ``g``: the ``where`` of each window's first
        maximum, folded back into the padded input, less the padding."""
        size, kernel, stride, dilation, pads = self.geometry
        d = len(kernel)
        first = kiln.from_numpy(self.first.astype(np.int32)).to(g.device)
        position = kiln.arange(math.prod(kernel), dtype=kiln.int32, device=g.device)
        position = position.reshape(1, 1, *kernel, *(1,) * d)
        keep = (*g.shape[:2], *(1,) * d, *g.shape[2:])
        zero = kiln.zeros((), dtype=g.dtype, device=g.device)
        windows = kiln.where(position == first.reshape(keep), g.reshape(keep), zero)  # (N, C, *K, *O)
        out = kiln.fold_windows(windows, size, kernel, stride, dilation)
        return out[_interior(size, pads)]

    def release(self) -> None:
        self.first = None
