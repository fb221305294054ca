"""``as_strided`` and PyTorch's in-place view ops: ``unsqueeze_``, ``squeeze_``, ``transpose_``, ``t_``,
``swapaxes_``/``swapdims_``, ``as_strided_``; ``resize_`` and ``resize_as_``.

An in-place view op changes the tensor's own layout (shape, strides, offset), not its values:
``restride`` gives the tensor the layout of the functional view op's result, and that result's
history, as PyTorch does (``x = a * 2; x.t_()`` leaves ``x.grad_fn`` a ``TBackward`` over the
multiplication), after refusing what PyTorch refuses (a leaf that requires grad, or a view of one,
with grad mode on). It bumps the version counter, as PyTorch does, so a node that saved the tensor in
its old layout raises when its backward runs rather than reading the new layout. Views made before
stay views of the same memory: a view's positions in its base are read off the strides of both
(``inplace.view_positions``), so they follow the base's new layout.

``as_strided(input, size, stride, storage_offset)`` views the memory of ``input``'s base (kiln's
storage: the base's elements, which must be one dense block) with element strides, PyTorch's
offsets and bounds check included; its history is a gather of those positions from the base, so
overlapping elements (a stride smaller than a row) receive the sum of their gradients.

Under ``kiln.compile`` a tensor made inside the call may change its layout (the trace rebinds it
as an in-place write would); one from outside the call may not, since its caller would see the
new shape, which a compiled program cannot give: the call runs eagerly, the reason said.
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd import grad_mode
from ..autograd.graph import stamp_view
from ..jit import state as _jit
from ..tensor import Tensor, make_tensor, method
from .indexing import take_flat
from .inplace import _address, _check_leaf, view_positions
from .shape import squeeze, t, transpose, unsqueeze

__all__ = ["as_strided"]


def _tracks_grad(x: Tensor) -> bool:
    return x._requires_grad and grad_mode.is_grad_enabled()


def restride(self: Tensor, make_view, op: str) -> Tensor:
    """Give ``self`` the layout and history of ``make_view(self)``, a view of ``self``'s memory."""
    if not isinstance(self, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(self).__name__}")
    tracing = _jit.tracing and _jit.current.get() is not None
    if tracing and not _jit.born_in_trace(self):
        _jit.unsafe(
            f"{op} changes the shape of a tensor from outside the call in place; a compiled call cannot "
            "change its caller's tensor's shape"
        )
    track = _tracks_grad(self)
    if track:
        _check_leaf(self, op)
    view = make_view(self)
    trace = _jit.current.get() if tracing else None
    if trace is not None:
        trace.value_of(view)  # its value, taken from self's present layout (before self takes the view's)
    if self._base is None and _address(view._data) != _address(self._data):
        _keep_storage(self)  # ``as_strided_`` with an offset: the tensor becomes a view of its old memory
    self._data = view._data
    if trace is not None and _jit.born_in_trace(self):
        trace.on_inplace(self, view)  # the same values: rebinds self (and its base) at the next version
    self._version[0] += 1
    if track:
        self.grad_fn, self._output_nr = view.grad_fn, view._output_nr
        if self._base is not None and self.grad_fn is not None and hasattr(self.grad_fn, "view_version"):
            stamp_view(self)  # current at the bumped version: no rebuild from the base on next use
        # (``retain_grad`` stays on the old history, as in PyTorch: ``x.grad`` has the old layout's shape)
    return self


def _keep_storage(self: Tensor) -> None:
    """Make ``self`` (a base) a view of a new base over its present memory, which takes its history:
    after ``x.as_strided_(size, stride, 1)``, ``x.storage_offset()`` is 1 and a later ``as_strided``
    still measures from the start of that memory, as PyTorch's storage does."""
    holder = make_tensor(self._data, self._device, self._dtype)
    holder._version = self._version
    holder.grad_fn, holder._output_nr, holder._requires_grad = self.grad_fn, self._output_nr, self._requires_grad
    if self._trace is not None:
        holder._trace = self._trace
    self._base = holder


# ----------------------------------------------------------------------------- in-place view ops
@method("unsqueeze_")
def unsqueeze_(self: Tensor, dim: int) -> Tensor:
    return restride(self, lambda x: unsqueeze(x, dim), "unsqueeze_")


@method("squeeze_")
def squeeze_(self: Tensor, dim=None) -> Tensor:
    return restride(self, lambda x: squeeze(x, dim), "squeeze_")


@method("transpose_", "swapaxes_", "swapdims_")
def transpose_(self: Tensor, dim0: int, dim1: int) -> Tensor:
    return restride(self, lambda x: transpose(x, dim0, dim1), "transpose_")


@method("t_")
def t_(self: Tensor) -> Tensor:
    if self._data.ndim > 2:
        raise RuntimeError(f"t_() expects a tensor with <= 2 dimensions, but self is {self._data.ndim}D")
    return restride(self, t, "t_")


@method("as_strided_")
def as_strided_(self: Tensor, size, stride, storage_offset: int | None = None) -> Tensor:
    return restride(self, lambda x: as_strided(x, size, stride, storage_offset), "as_strided_")


# ----------------------------------------------------------------------------- resize_
@method("resize_")
def resize_(self: Tensor, *sizes, memory_format=None) -> Tensor:
    """``self`` made contiguous of shape ``sizes`` over its memory from its own offset, as PyTorch's:
    the elements in memory order, the first ones kept. Growing past the memory takes new memory with
    the old elements first and zeros after (PyTorch leaves them uninitialized); a view cannot grow
    past its base's memory in kiln (PyTorch grows the base's storage too), and views made before a
    growth keep the old memory."""
    size = tuple(int(n) for n in (sizes[0] if len(sizes) == 1 and isinstance(sizes[0], tuple | list) else sizes))
    if any(n < 0 for n in size):
        raise RuntimeError(f"resize_: sizes must be non-negative, got {list(size)}")
    if self._requires_grad:
        raise RuntimeError("cannot resize variables that require grad")
    if _jit.tracing and _jit.current.get() is not None:
        _jit.unsafe("resize_ changes a tensor's shape and memory in place, which a compiled call does not repeat")
    root = self._base if self._base is not None else self
    storage = _storage(root)
    if storage is None:
        raise RuntimeError("resize_: the tensor's base does not hold its elements in one dense block of memory")
    offset, count = self.storage_offset(), math.prod(size)
    if offset + count <= storage.size:
        self._data = storage[offset : offset + count].reshape(size)
    elif self._base is None:
        xp = np if isinstance(storage, np.ndarray) else __import__("cupy")
        grown = xp.zeros(count, dtype=storage.dtype)
        grown[: storage.size] = storage
        self._data = grown.reshape(size)
    else:
        raise RuntimeError(
            f"resize_: a view of {storage.size - offset} elements from offset {offset} cannot grow to {count} "
            "(kiln does not grow the memory it shares with its base): resize a clone"
        )
    self._version[0] += 1
    return self


@method("resize_as_")
def resize_as_(self: Tensor, other: Tensor, memory_format=None) -> Tensor:
    return resize_(self, tuple(other.shape))


# ----------------------------------------------------------------------------- as_strided
def _storage(root: Tensor):
    """``root``'s memory as a flat array in memory order, or None when its elements are no dense block."""
    data = root._data
    if data.flags.c_contiguous:
        return data.reshape(-1)
    order = sorted(range(data.ndim), key=lambda i: data.strides[i], reverse=True)
    dense = data.transpose(order)
    if min(data.strides, default=0) < 0 or not dense.flags.c_contiguous:
        return None
    return dense.reshape(-1)


@method("as_strided")
def as_strided(input: Tensor, size, stride, storage_offset: int | None = None) -> Tensor:
    """A view of the memory of ``input``'s base with ``size``, element ``stride`` and ``storage_offset``
    (``input``'s own offset by default), as ``torch.as_strided``.

    >>> import kiln
    >>> kiln.arange(6.0).as_strided((2, 2), (1, 2), 1).tolist()
    [[1.0, 3.0], [2.0, 4.0]]
    """
    size, stride = tuple(int(n) for n in size), tuple(int(s) for s in stride)
    if len(size) != len(stride):
        raise RuntimeError(f"mismatch in length of strides and shape: {len(stride)} strides, {len(size)} sizes")
    if any(s < 0 for s in stride):
        raise RuntimeError(f"as_strided: Negative strides are not supported at the moment, got strides: {list(stride)}")
    if any(n < 0 for n in size):
        raise RuntimeError(f"as_strided: sizes must be non-negative, got {list(size)}")
    root = input._base if input._base is not None else input
    offset = input.storage_offset() if storage_offset is None else int(storage_offset)
    if offset < 0:
        raise RuntimeError(f"Tensor: invalid storage offset {offset}")
    storage = _storage(root)
    if storage is None:
        raise RuntimeError(
            "as_strided: the tensor's base does not hold its elements in one dense block of memory (kiln measures "
            "storage offsets within it); call .contiguous() first"
        )
    item = root._dtype.itemsize
    needed = 0 if 0 in size else offset + 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if needed > storage.size:
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and itemsize {item} "
            f"requiring a storage size of {needed * item} are out of bounds for storage of size {storage.size * item}"
        )
    byte_strides = tuple(s * item for s in stride)
    if isinstance(storage, np.ndarray):  # (an empty view keeps its offset: as_strided of an empty slice would not)
        array = np.ndarray(size, storage.dtype, buffer=storage, offset=offset * item, strides=byte_strides)
    else:
        array = __import__("cupy").lib.stride_tricks.as_strided(storage[offset:], size, byte_strides)
    result = make_tensor(array, root._device, root._dtype)
    result._version = root._version
    result._base = root
    if _tracks_grad(root):
        positions = make_tensor(view_positions(root._data, array), root._device)
        with grad_mode.enable_grad():
            gathered = take_flat(root, positions)  # the history: these positions of the base
        result.grad_fn, result._output_nr, result._requires_grad = gathered.grad_fn, 0, True
        stamp_view(result)  # (a view's node: current at this version of the memory)
    return result
