"""``split``, ``chunk`` and ``unbind``: views of consecutive pieces, with one autograd node for all.

Composed of ops, each piece is a ``slice`` whose VJP pads the piece's gradient to the input's full
size, and the pads' sum is the input's gradient: for a qkv split, three full-size pads and two adds
where PyTorch's SplitBackward does one cat. On eager tensors the pieces here are the arrays' views,
and one ``SplitBackward`` (a node with one output per piece) writes the incoming gradients side by
side into one array, zeros only where a piece got none -- the same values as the pads' sum. A trace
or a profile records the ops (``narrow`` and ``select``) instead, as does every non-CPU device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir import dtypes as dt
from ...ir.primitives import P
from ...ir.shapes import normalize_axis
from ...ir.types import CPU
from .. import dispatch
from ..autograd import grad_mode
from ..autograd.graph import Node, _edge_of
from ..jit import state as _jit
from ..tensor import Tensor, make_tensor, method
from .shape import narrow, select

__all__ = ["unbind", "split", "chunk"]

_concatenate, _reshape = P["concatenate"], P["reshape"]
_new_tensor = object.__new__


@method("unbind")
def unbind(input: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    dim = normalize_axis(dim, input._data.ndim)
    n = input._data.shape[dim]
    pieces = _eager_pieces(input, dim, (1,) * n, squeeze=True)
    return pieces if pieces is not None else tuple(select(input, dim, i) for i in range(n))


@method("split")
def split(tensor: Tensor, split_size_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """Views of consecutive pieces: of ``split_size`` each (the last may be smaller) or of the listed sizes."""
    dim = normalize_axis(dim, tensor._data.ndim)
    n = tensor._data.shape[dim]
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        if size < 0 or (size == 0 and n):
            raise RuntimeError(f"split expects split_size be non-negative (and positive for a non-empty dim), "
                               f"but got split_size={size}")  # fmt: skip
        sizes = tuple([min(size, n - i) for i in range(0, n, size)] if size and n else [0])
    else:
        sizes = tuple([int(s) for s in split_size_or_sections])
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size at "
                               f"dimension {dim}), but got split_sizes={list(sizes)}")  # fmt: skip
    pieces = _eager_pieces(tensor, dim, sizes, squeeze=False)
    if pieces is not None:
        return pieces
    out, offset = [], 0
    for size in sizes:
        out.append(narrow(tensor, dim, offset, size))
        offset += size
    return tuple(out)


@method("chunk")
def chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    dim = normalize_axis(dim, input._data.ndim)
    n = input._data.shape[dim]
    if n == 0:  # PyTorch gives `chunks` empty pieces
        return split(input, [0] * chunks, dim)
    return split(input, -(-n // chunks), dim)


def _eager_pieces(x: Tensor, dim: int, sizes: tuple[int, ...], squeeze: bool) -> tuple[Tensor, ...] | None:
    """The pieces as views of ``x``'s array with one ``SplitBackward``, or None where the ops must run
    (a trace or a profile records them; another device or kind of tensor takes their paths)."""
    if (
        (_jit.tracing and _jit.current.get() is not None)
        or dispatch.profiling_ops
        or type(x) is not Tensor
        or x._device is not CPU
    ):
        return None
    data = x._data
    base = x._base if x._base is not None else x
    version = x._version
    inference = grad_mode.inference_used and grad_mode.state.inference
    pieces, offset = [], 0
    for size in sizes:
        piece = _new_tensor(Tensor)  # make_tensor's fields, as a view of x (see dispatch.apply)
        piece._data = data[_piece_key(dim, offset, size, squeeze)]
        piece._device, piece._dtype, piece._requires_grad = CPU, x._dtype, False
        piece.grad_fn, piece._output_nr, piece._grad = None, 0, None
        piece._version, piece._base = version, base
        piece._hooks, piece._retains_grad, piece._grad_acc = None, False, None
        piece._inference, piece._trace, piece._post_accumulate_hooks = inference, None, None
        pieces.append(piece)
        offset += size
    if x._requires_grad and grad_mode.state.grad_enabled and x._dtype.category == dt.FLOATING:
        SplitBackward.attach(x, dim, sizes, squeeze, pieces)
    return tuple(pieces)


def _piece_key(dim: int, offset: int, size: int, squeeze: bool) -> tuple[Any, ...]:
    """The index of a piece: ``size`` elements from ``offset`` along ``dim``, or the one at ``offset``
    with the dim dropped (an int with an Ellipsis: a 0-d array, where a bare int gives a numpy scalar)."""
    return (slice(None),) * dim + ((offset, Ellipsis) if squeeze else (slice(offset, offset + size),))


class SplitBackward(Node):
    """The backward of a split (or an unbind, ``squeeze``: its pieces lost the split dim): the pieces'
    gradients side by side along ``dim``, zeros for a piece that got none."""

    kiln_only = True

    __slots__ = ("dim", "sizes", "squeeze", "shape", "dtype", "num_outputs", "view_version")
    dim: int
    sizes: tuple[int, ...]
    squeeze: bool
    shape: tuple[int, ...]  # the input's
    dtype: dt.DType
    num_outputs: int  # type: ignore[misc]  # Node's class attribute, a slot here
    view_version: int  # the pieces' memory version when this became their history (see refresh_view_history)

    @classmethod
    def attach(cls, x: Tensor, dim: int, sizes: tuple[int, ...], squeeze: bool, pieces: list) -> None:
        node = cls((_edge_of(x),))
        node.dim, node.sizes, node.squeeze = dim, sizes, squeeze
        node.shape, node.dtype = x._data.shape, x._dtype
        node.num_outputs = len(pieces)
        node.view_version = x._version[0]
        for i, piece in enumerate(pieces):
            piece.grad_fn, piece._output_nr, piece._requires_grad = node, i, True

    def name(self) -> str:
        return "UnbindBackward0" if self.squeeze else "SplitBackward0"

    def apply(self, grads: list) -> tuple:
        plain = all(g is None or (g._device is CPU and g._dtype is self.dtype) for g in grads)
        if (
            grad_mode.state.grad_enabled
            or (_jit.tracing and _jit.current.get() is not None)
            or dispatch.profiling_ops
            or not plain
        ):
            return (self._cat_ops(grads),)
        out = np.empty(self.shape, self.dtype.np)
        offset = 0
        for g, size in zip(grads, self.sizes, strict=True):
            out[_piece_key(self.dim, offset, size, self.squeeze)] = 0 if g is None else g._data
            offset += size
        return (make_tensor(out, CPU, self.dtype),)

    def _cat_ops(self, grads: list) -> Tensor:
        """The gradient as the ops compute it (a graph of it for create_graph, a trace's ops)."""
        from .creation import zeros  # noqa: PLC0415 - creation imports shape's module

        pieces = []
        device = next(g._device for g in grads if g is not None)
        for g, size in zip(grads, self.sizes, strict=True):
            shape = self.shape[: self.dim] + (size,) + self.shape[self.dim + 1 :]
            if g is None:
                g = zeros(shape, dtype=self.dtype, device=device)
            elif self.squeeze:
                g = dispatch.apply(_reshape, g, shape=shape)
            pieces.append(g)
        return dispatch.apply(_concatenate, *pieces, axis=self.dim)
