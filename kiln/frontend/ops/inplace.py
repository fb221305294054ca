"""In-place semantics: every in-place op is its functional op plus ``commit_inplace``.

``commit_inplace(target, value)`` writes ``value`` into ``target``'s memory, bumps the version
counter shared by the target and its views, and rebases autograd history:

- on a tensor that owns its memory, the target takes over ``value``'s history, where that
  history already leads to the target's own (``x.mul_(2)``); otherwise (``x.copy_(s)``) the old
  history is kept as an edge that receives zeros (``autograd.inplace_history``), as in PyTorch;
- on a view, the base's new history is "base with the view's elements replaced by value",
  expressed as a scatter at the view's positions in the base, and the view's history becomes a
  gather from that. Any view op works the same way, because the positions are read off the
  view's strides rather than replayed from the op that made it. (The tracer's
  functionalization of mutations uses the same idea.)
"""

from __future__ import annotations

import numpy as np

from ..autograd.grad_mode import state
from ..autograd.graph import PrimBackward, refresh_view_history, stamp_view
from ..autograd.inplace_history import OverwriteBackward, move_retained_grad, reaches_directly
from ..jit import state as _jit
from ..jit.layouts import as_permutation, is_identity, writable
from ..tensor import Tensor, make_tensor


def commit_inplace(target: Tensor, value: Tensor, op: str = "in-place op", uniform: bool = False) -> Tensor:
    """Write ``value`` into ``target`` (see the module docstring); ``uniform``: every element gets
    the same value (``fill_``), so an expanded target, whose elements share memory, may take it."""
    if not isinstance(target, Tensor):
        raise TypeError(f"{op}: expected a Tensor to modify, got {type(target).__name__}")
    if value._dtype is not target._dtype:
        if value._dtype.category > target._dtype.category:
            raise RuntimeError(
                f"{op}: result type {value._dtype.name} can't be cast to the desired output type "
                f"{target._dtype.name} of the tensor modified in place"
            )
        from ._util import cast  # noqa: PLC0415

        value = cast(value, target._dtype)
    track = state.grad_enabled and (value._requires_grad or target._requires_grad)
    if value._data.shape != target._data.shape:
        if track or _jit.tracing:  # the history and the trace record the broadcast value
            value = _broadcast_value(value, target, op)
        elif not _broadcasts(value._data.shape, target._data.shape):  # else numpy's write broadcasts
            _broadcast_value(value, target, op)  # (its error)
    if not track and _same_memory(value._data, target._data):
        return target  # ``x.t().copy_(x.t())``: nothing to write (PyTorch returns at once too)
    if not uniform:
        _check_no_internal_overlap(target, op)
    if track:
        if value._base is not None and value.grad_fn is not None:  # copy_(v): v's history must be current
            refresh_view_history(value)
        _check_leaf(target, op)
        if value.grad_fn is None and value._requires_grad:  # ``t.copy_(leaf)``: the leaf's gradient
            from .shape import reshape  # noqa: PLC0415  flows back through an identity node

            value = reshape(value, tuple(value.shape))
        _snapshot_saved_inputs(value, target)
    if _jit.tracing:
        if not getattr(target._data.flags, "writeable", True):
            # An expanded tensor or a view of one: a write reaches every position sharing its
            # memory, which the functional form of the write (a scatter) does not say.
            _jit.unsafe(f"{op} writes into an expanded tensor, whose elements share memory")
        trace = _jit.current.get()
        if trace is not None:
            trace.on_inplace(target, value)
    if value._data is not target._data:
        writable(target._data)[...] = value._data
    target._version[0] += 1
    if track:
        _rebase_history(target, value, op)
    return target


def _broadcast_value(value: Tensor, target: Tensor, op: str) -> Tensor:
    from .shape import broadcast_to  # noqa: PLC0415

    try:
        return broadcast_to(value, target.shape)
    except (ValueError, RuntimeError):
        raise RuntimeError(
            f"{op}: output with shape {tuple(target.shape)} doesn't match the broadcast shape {tuple(value.shape)}"
        ) from None


def _broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    """Whether ``broadcast_to`` takes ``shape`` to ``to`` (a scalar's ``()`` always does)."""
    return len(shape) <= len(to) and all(n == 1 or n == m for n, m in zip(reversed(shape), reversed(to)))


def _rebase_history(target: Tensor, value: Tensor, op: str) -> None:
    """``target``'s history after ``value`` was written into it (see the module docstring)."""
    base = target._base
    old, old_nr = target.grad_fn, target._output_nr
    if base is not None:
        old_base, old_base_nr = base.grad_fn, base._output_nr
        _rebase_view(target, value)
        move_retained_grad(base, old_base, old_base_nr)
    elif old is not None and not reaches_directly(value.grad_fn, old, old_nr):
        OverwriteBackward.attach(target, value, op)  # the old history gets zeros, as in PyTorch
    else:
        _take_history(target, value)
    move_retained_grad(target, old, old_nr)


def _same_memory(a, b) -> bool:
    """Whether arrays ``a`` and ``b`` are the same elements of the same memory, in the same layout."""
    if a is b:
        return True
    if a.shape != b.shape or a.strides != b.strides or a.dtype != b.dtype or _owner(a) is not _owner(b):
        return False  # (a fresh result owns its memory: the common case ends here, cheaply)
    return _address(a) == _address(b)


def _owner(a):
    base = a.base
    while base is not None:  # an array over foreign memory (bytes, mmap) ends the chain
        a, base = base, getattr(base, "base", None)
    return a


def _check_no_internal_overlap(target: Tensor, op: str) -> None:
    """An expanded tensor (a stride of 0 along a dim of size > 1) holds each element once for many
    positions: writing it is refused, with PyTorch's error."""
    data = target._data
    if 0 in data.strides and data.size and any(s == 0 and n > 1 for n, s in zip(data.shape, data.strides, strict=True)):
        raise RuntimeError(
            f"{op}: unsupported operation: more than one element of the written-to tensor refers to a single "
            f"memory location (shape {tuple(data.shape)}, strides {tuple(s // data.itemsize for s in data.strides)}). "
            "Please clone() the tensor before performing the operation."
        )


def _snapshot_saved_inputs(value: Tensor, target: Tensor) -> None:
    """The node that computed ``value`` may have saved ``target`` (or a view of its memory) as an
    input: ``x.mul_(w)`` needs the old ``x`` to differentiate by ``w``. Save a copy of the old
    values instead, as PyTorch does for in-place ops, since the write is about to replace them."""
    node = value.grad_fn
    if not isinstance(node, PrimBackward) or not node.saved_inputs:
        return
    counter = target._version
    if any([t._version is counter for t in node.saved_inputs]):
        from .creation import clone  # noqa: PLC0415

        saved = [clone(t) if t._version is counter else t for t in node.saved_inputs]
        node.saved_versions = tuple(
            [
                t._version[0] if t is not old else v
                for t, old, v in zip(saved, node.saved_inputs, node.saved_versions, strict=True)
            ]
        )
        node.saved_inputs = tuple(saved)


def _check_leaf(target: Tensor, op: str) -> None:
    if target.grad_fn is None and target._requires_grad:
        raise RuntimeError(
            f"{op}: a leaf Variable that requires grad is being used in an in-place operation. "
            "Wrap the update in `with kiln.no_grad():` (as optimizers do) or clone the tensor first."
        )
    base = target._base
    if base is not None and base.grad_fn is None and base._requires_grad:
        raise RuntimeError(
            f"{op}: a view of a leaf Variable that requires grad is being used in an in-place "
            "operation. Wrap the update in `with kiln.no_grad():` or clone the base first."
        )


def _take_history(target: Tensor, value: Tensor) -> None:
    node = value.grad_fn
    target.grad_fn, target._output_nr, target._requires_grad = node, value._output_nr, value._requires_grad
    if isinstance(node, PrimBackward) and node.saved_output:
        # The node saved `value` as its output; the saved copy is now `target`, so a later
        # in-place change of `target` is caught by the version check, as in PyTorch.
        node.keep_output(target)


def gather_positions(base: Tensor, positions: np.ndarray) -> Tensor:
    """``base``'s elements at ``positions`` (``view_positions``), as ops: a reshape and a permute where they
    are all of ``base``, in order or permuted (a conv's result viewed (N, C, H, W) over (C, N, H, W)
    memory), else a gather through an index tensor of their number."""
    from . import permute, reshape, take_flat  # noqa: PLC0415

    if is_identity(positions, base._data.size):
        return reshape(base, tuple(positions.shape))
    found = as_permutation(positions) if positions.size == base._data.size else None
    if found is not None:
        return permute(reshape(base, found[0]), found[1])
    return take_flat(base, make_tensor(positions, base._device))


def scatter_positions(base: Tensor, positions: np.ndarray, value: Tensor, linked: bool = False) -> Tensor:
    """``base``'s value with the elements at ``positions`` replaced by ``value``'s (as ops; see
    ``gather_positions``). ``linked``: the result's history reaches ``base``'s even where ``value``
    replaces all of it (its gradient there zeros, as PyTorch's, not None)."""
    from . import index_put, permute, reshape, where  # noqa: PLC0415

    shape = tuple(base._data.shape)
    if is_identity(positions, base._data.size):
        new = reshape(value, shape)
    else:
        found = as_permutation(positions) if positions.size == base._data.size else None
        if found is None:
            index = make_tensor(positions.reshape(-1), base._device)
            return reshape(index_put(reshape(base, (-1,)), (index,), reshape(value, (-1,))), shape)
        order = found[1]
        new = reshape(permute(value, tuple(sorted(range(len(order)), key=order.__getitem__))), shape)
    return where(make_tensor(np.ones((), dtype=bool), base._device), new, base) if linked else new


def _rebase_view(view: Tensor, value: Tensor) -> None:
    base = view._base
    assert base is not None, "only a view is rebased"
    positions = view_positions(base._data, view._data)
    _take_history(base, scatter_positions(base, positions, value, linked=True))
    new_view = gather_positions(base, positions)
    view.grad_fn, view._output_nr, view._requires_grad = new_view.grad_fn, 0, True
    stamp_view(view)  # current at the bumped version; other views of base are rebuilt when next used


def view_positions(base: np.ndarray, view: np.ndarray) -> np.ndarray:
    """For each element of ``view``, the flat (row-major) index of the same memory in ``base``.

    >>> b = np.arange(6).reshape(2, 3)
    >>> view_positions(b, b.T[1:]).tolist()
    [[1, 4], [2, 5]]
    """
    xp = np if isinstance(base, np.ndarray) else __import__("cupy")
    item = base.itemsize
    base_offsets = _memory_offsets(xp, base, 0, item)
    start = (_address(view) - _address(base)) // item
    view_offsets = _memory_offsets(xp, view, start, item)
    low = int(base_offsets.min()) if base.size else 0  # negative strides put memory before the start
    lookup = xp.full(int(base_offsets.max()) - low + 1 if base.size else 1, -1, dtype=np.int64)
    lookup[(base_offsets - low).ravel()] = xp.arange(base.size, dtype=np.int64)
    positions = lookup[view_offsets - low]
    assert base.size == 0 or int(positions.min(initial=0)) >= 0, "view elements must lie inside the base"
    return positions


def _address(a) -> int:
    return a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else a.data.ptr


def _memory_offsets(xp, a, start: int, item: int):
    offsets = xp.full(a.shape, start, dtype=np.int64)
    for axis, (n, stride) in enumerate(zip(a.shape, a.strides, strict=True)):
        shape = [1] * a.ndim
        shape[axis] = n
        offsets = offsets + (xp.arange(n, dtype=np.int64) * (stride // item)).reshape(shape)
    return offsets
