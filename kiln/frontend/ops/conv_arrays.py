"""Convolutions on eager CPU tensors as one autograd node each, as PyTorch's convolution ops.

Composed of ops, an im2col convolution is a pad, an unfold, reshapes, a matmul and a transpose
forward, and a backward node for each: (16, 16, 8, 8) by (32, 16, 4, 4) at stride 2, forward and
backward, took 370 us where PyTorch takes 331 and the three products 120 (one thread). The
transposed convolution computed as im2col's adjoint (a product and a fold) is the same story.
``conv_eager`` and ``conv_transpose_eager`` run the same kernels on the arrays -- the matmul
primitive's, and the unfold and fold primitives' kernels as dispatch runs them (compiled where
``eager_kernels`` routes them) -- and attach one ``ConvBackward`` / ``ConvTransposeBackward``.

Their backward runs on the arrays when nothing records. Under ``create_graph``, a trace or a
profile it recomputes the forward with the ops (the composite the caller passes) and
differentiates that, so the gradients are differentiable again and traces see ops. Both decline
(return None) wherever the composite must run: a trace or a profile records the ops, and every
other device, dtype, grouping or kind of tensor takes the ops' own checks and errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ...ir.primitives import P
from ...ir.types import CPU
from ...runtime.threads import blas_product
from .. import dispatch
from ..autograd import grad_mode
from ..autograd.graph import LazyEdgesNode, pending_edge, save_tensors, unpack_tensors
from ..jit import state as _jit
from ..tensor import Tensor, make_tensor
from ._util import plain_arrays, recomputed_gradients

__all__ = ["conv_eager", "conv_transpose_eager"]

_MATMUL, _UNFOLD, _FOLD = P["matmul"], P["unfold"], P["fold"]
#: ``composite(x, weight, bias)``: the op computed with kiln's ops (the backward's recompute).
Composite = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]


def _kernel(prim):
    """The kernel dispatch runs for ``prim`` (its compiled route where ``eager_kernels`` has one)."""
    return dispatch._compiled_routes.get(prim) or prim.eager


def _product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` by the matmul primitive's kernel, on the BLAS threads dispatch's product would use."""
    return blas_product(_kernel(_MATMUL), a.shape, b.shape, np, a, b)


def _windows(x: np.ndarray, kernel, stride, dilation) -> np.ndarray:
    """The unfold primitive's windows of ``x`` (N, C, *S), laid out (C, *K, N, *O)."""
    return _kernel(_UNFOLD)(np, x, kernel_size=kernel, stride=stride, dilation=dilation, batch_inner=True)


def _fold(windows: np.ndarray, size, kernel, stride, dilation) -> np.ndarray:
    """The fold primitive: windows (C, *K, N, *O) summed into (N, C, *size)."""
    return _kernel(_FOLD)(np, windows, size=size, kernel_size=kernel, stride=stride, dilation=dilation,
                          batch_inner=True)  # fmt: skip


def _pad(x: np.ndarray, pads) -> np.ndarray:
    """(N, C, *S) with ``pads`` ((low, high) per spatial dim) of zeros around; ``x`` itself if none."""
    if not any(p for pair in pads for p in pair):
        return x
    out = np.zeros((*x.shape[:2], *(s + lo + hi for s, (lo, hi) in zip(x.shape[2:], pads, strict=True))), x.dtype)
    out[_interior(out.shape[2:], pads)] = x
    return out


def _interior(spatial, pads) -> tuple[slice, ...]:
    """The index of (N, C, *spatial) less ``pads`` ((low, high) per spatial dim) around."""
    return (slice(None), slice(None), *(slice(lo, s - hi) for s, (lo, hi) in zip(spatial, pads, strict=True)))


def _crop(x: np.ndarray, pads) -> np.ndarray:
    """``_pad``'s adjoint: (N, C, *S) less ``pads`` around, in new C-order memory."""
    if not any(p for pair in pads for p in pair):
        return x
    return np.ascontiguousarray(x[_interior(x.shape[2:], pads)])


def _channels_first(g: np.ndarray) -> np.ndarray:
    """(N, C, *S) as (C, N * prod(S)), in new memory (the layout the products take)."""
    return np.ascontiguousarray(np.swapaxes(g, 0, 1)).reshape(g.shape[1], -1)


def _needs_node(x, weight, bias) -> bool:
    return grad_mode.state.grad_enabled and (
        x._requires_grad or weight._requires_grad or (bias is not None and bias._requires_grad)
    )


def _with_bias(out: np.ndarray, bias, channel_axis: int) -> np.ndarray:
    if bias is not None:
        out += bias._data.reshape((-1,) + (1,) * (out.ndim - 1 - channel_axis))
    return out


def conv_eager(x, weight, bias, kernel, stride, dilation, pads, composite: Composite) -> Tensor | None:
    """The im2col convolution (one group) of ``x`` (N, C, *S) by ``weight`` (O, C, *K), padded by
    ``pads`` first, as one node: (N, O, *out) in (O, N, *out) memory, as the ops lay it out. None
    where ``composite`` (the same convolution with ops) must run."""
    if not plain_arrays(x, weight, bias):
        return None
    padded = _pad(x._data, pads)
    windows = _windows(padded, kernel, stride, dilation)  # (C, *K, N, *O)
    d = len(kernel)
    # (C prod(K), N prod(O)), a view; both sizes given: -1 cannot be inferred beside an empty batch's 0
    cols = windows.reshape(math.prod(windows.shape[: 1 + d]), math.prod(windows.shape[1 + d :]))
    w = weight._data
    out = _with_bias(_product(w.reshape(w.shape[0], -1), cols), bias, 0)  # (O, N prod(O))
    out = np.swapaxes(out.reshape(w.shape[0], *windows.shape[1 + d :]), 0, 1)
    result = make_tensor(out, CPU, x._dtype)
    if _needs_node(x, weight, bias):
        node = ConvBackward.attach(result, x, weight, bias, composite)
        node.cols = cols if weight._requires_grad else None
        node.geometry = (padded.shape[2:], kernel, stride, dilation, pads)
    return result


def conv_transpose_eager(x, weight, bias, size, kernel, stride, dilation, pads, composite: Composite) -> Tensor | None:
    """The transposed convolution (one group) of ``x`` (N, C_in, *S) by ``weight`` (C_in, C_out, *K)
    as im2col's adjoint, as one node: each pixel times the filter, folded into (N, C_out, *size),
    less ``pads`` around. None where ``composite`` (the same with ops) must run."""
    if not plain_arrays(x, weight, bias):
        return None
    pixels = _channels_first(x._data)  # (C_in, N prod(S))
    w = weight._data
    windows = _product(w.reshape(w.shape[0], -1).T, pixels)  # (C_out prod(K), N prod(S))
    windows = windows.reshape(w.shape[1], *kernel, x._data.shape[0], *x._data.shape[2:])
    out = _with_bias(_crop(_fold(windows, size, kernel, stride, dilation), pads), bias, 1)
    result = make_tensor(out, CPU, x._dtype)
    if _needs_node(x, weight, bias):
        node = ConvTransposeBackward.attach(result, x, weight, bias, composite)
        node.cols = pixels if weight._requires_grad else None
        node.geometry = (size, kernel, stride, dilation, pads)
    return result


class _ArraysBackward(LazyEdgesNode):
    """The backward of one convolution node: gradients of (input, weight, bias) from the arrays it
    kept (``cols``: what the weight's gradient multiplies by), or from the ops (``_through_ops``)."""

    __slots__ = ("saved", "versions", "composite", "cols", "geometry")
    saved: tuple | None  # input, weight, bias (or None); None once released
    versions: tuple  # theirs when saved (checked when read; None: the bias, unchecked)
    composite: Composite
    cols: np.ndarray | None
    geometry: tuple

    @classmethod
    def attach(cls, result: Tensor, x: Tensor, weight: Tensor, bias, composite: Composite):
        node = cls((pending_edge(x), pending_edge(weight), None if bias is None else pending_edge(bias)))
        # saved (and checked for in-place changes when read) as the ops' nodes saved them: the
        # arrays' backward reads the weight, and the input for its version only (``cols`` is a copy);
        # the bias only for a recomputation through ops, unchecked: no gradient reads its value
        node.saved = (x, weight, bias)
        node.versions = save_tensors(node.saved, unchecked=(2,))
        node.composite = composite
        result.grad_fn, result._output_nr, result._requires_grad = node, 0, True
        return node

    def apply(self, grads: list) -> tuple:
        g = grads[0]
        x, weight, bias = unpack_tensors(self, self.saved, self.versions)
        assert x is not None and weight is not None  # (saved by attach; only the bias may be None)
        if (
            grad_mode.state.grad_enabled or (_jit.tracing and _jit.current.get() is not None) or dispatch.profiling_ops
            or g._device is not CPU or g._dtype is not weight._dtype
        ):  # fmt: skip
            return self._through_ops((x, weight, bias), g)  # a graph (create_graph), a trace or a profile
        edge_x, edge_w, edge_b = self.next_edges
        ga = g._data
        gx, gw = self._on_arrays(ga, weight._data, edge_x is not None, edge_w is not None)
        gb = None if edge_b is None else np.asarray(ga.sum(axis=(0, *range(2, ga.ndim))))
        return (
            None if gx is None else make_tensor(gx, CPU, g._dtype),
            None if gw is None else make_tensor(gw.reshape(weight._data.shape), CPU, g._dtype),
            None if gb is None else make_tensor(gb, CPU, g._dtype),
        )

    def _on_arrays(self, g: np.ndarray, w: np.ndarray, want_x: bool, want_w: bool) -> tuple:
        raise NotImplementedError

    def _through_ops(self, inputs: tuple, g: Tensor) -> tuple:
        """The gradients of the composite recomputed with ops: differentiable again under create_graph."""
        return recomputed_gradients(self.composite, inputs, tuple(edge is not None for edge in self.next_edges), g)

    def release(self) -> None:
        self.saved = self.cols = None


class ConvBackward(_ArraysBackward):
    """The backward of ``conv_eager``: (O, C prod(K)) weight gradient ``g cols^T`` and the input's,
    ``w^T g`` folded back into the padded input, less the padding."""

    __slots__ = ()

    def name(self) -> str:
        return "ConvolutionBackward"

    def _on_arrays(self, g: np.ndarray, w: np.ndarray, want_x: bool, want_w: bool) -> tuple:
        size, kernel, stride, dilation, pads = self.geometry
        rows = _channels_first(g)  # (O, N prod(out))
        gw = _product(rows, self.cols.T) if want_w and self.cols is not None else None
        gx = None
        if want_x:
            windows = _product(w.reshape(w.shape[0], -1).T, rows)  # (C prod(K), N prod(out))
            windows = windows.reshape(w.shape[1], *kernel, g.shape[0], *g.shape[2:])
            gx = _crop(_fold(windows, size, kernel, stride, dilation), pads)
        return gx, gw


class ConvTransposeBackward(_ArraysBackward):
    """The backward of ``conv_transpose_eager``: the output gradient padded back and unfolded into
    windows (C_out prod(K), N prod(S)); the input's gradient ``w windows``, the weight's
    ``pixels windows^T``."""

    __slots__ = ()

    def name(self) -> str:
        return "ConvolutionBackward"

    def _on_arrays(self, g: np.ndarray, w: np.ndarray, want_x: bool, want_w: bool) -> tuple:
        _, kernel, stride, dilation, pads = self.geometry
        windows = _windows(_pad(g, pads), kernel, stride, dilation)  # (C_out, *K, N, *S)
        spatial = windows.shape[2 + len(kernel) :]
        cols = windows.reshape(-1, g.shape[0] * math.prod(spatial))
        gw = _product(self.cols, cols.T) if want_w and self.cols is not None else None
        gx = None
        if want_x:
            pixels = _product(w.reshape(w.shape[0], -1), cols)  # (C_in, N prod(S))
            gx = np.swapaxes(pixels.reshape(w.shape[0], g.shape[0], *spatial), 0, 1)
        return gx, gw
