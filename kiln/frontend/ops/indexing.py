"""Indexing: ``x[key]``, ``x[key] = value``, gather/scatter, index_put, masks and one_hot.

``x[key]`` follows PyTorch: ints, slices (step > 0), ``None`` and ``...`` give a view (one
``slice`` and one ``reshape`` primitive); integer and bool tensors (or lists, numpy arrays) are
advanced indices and give a copy (the ``take`` primitive). Ints are applied before advanced
indices are placed: advanced indices that are adjacent after that keep their place in the
result, separated ones move to the front, as in numpy.

``x[key] = value`` writes through the view for basic keys (``commit_inplace`` rebases autograd
history onto the base); advanced keys become an ``index_put`` on ``x`` followed by
``commit_inplace``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...ir import dtypes as dt
from ...ir.primitives import P
from ...ir.shapes import broadcast_shapes, normalize_axis
from ..autograd import grad_mode
from ..dispatch import apply
from ..tensor import Tensor, make_tensor, method
from ._util import cast, scalar_tensor
from ._views import lean, wrap_view
from .checks import check_range
from .copies import constant
from .elementwise import eq, where
from .inplace import commit_inplace
from .shape import _reshaped, expand, movedim, reshape, strided_slice

__all__ = [
    "index", "index_put", "index_put_", "take", "take_flat", "gather", "scatter", "scatter_add", "index_select",
    "index_add", "masked_fill", "masked_select", "nonzero", "one_hot",
]  # fmt: skip

_slice, _reshape, _take, _index_put = P["slice"], P["reshape"], P["take"], P["index_put"]
_MASK_DTYPES = (dt.bool_, dt.uint8)


def _check_bounds(index: Tensor, size: int, dim: int, op: str = "index", wrap: bool = True,
                  error: type[Exception] = IndexError) -> None:  # fmt: skip
    """PyTorch's bounds error, naming the first index out of bounds; ``wrap``: negative indices
    count from the end (x[idx]), else they are out of bounds (gather, scatter, index_select).
    A check of the graph when traced: compiled calls raise it too."""
    message = f"{op} {{value}} is out of bounds for dimension {dim} with size {size}"
    check_range(index, -size if wrap else 0, size, error, message)


# ----------------------------------------------------------------------------- parsing a key
class _Key(NamedTuple):
    starts: tuple[int, ...]
    stops: tuple[int, ...]
    steps: tuple[int, ...]
    sliced: bool  # some dim is not taken whole
    shape: tuple[int, ...]  # after the basic part: ints dropped, None added
    advanced: tuple[tuple[int, Tensor], ...]  # (dim of `shape`, int64 index tensor)


_INVALID = "only integers, slices (`:`), ellipsis (`...`), None and long or byte or bool tensors are valid indices"


def _classify(item, device):
    """An int, slice, None, Ellipsis, or an index tensor (int64 or bool/uint8 mask)."""
    if item is None or item is Ellipsis or item.__class__ is int or item.__class__ is slice:
        return item
    if isinstance(item, bool | np.bool_):
        return constant(np.asarray(bool(item)), device)
    if isinstance(item, int | np.integer):
        return int(item)
    if isinstance(item, list | tuple | np.ndarray | range):  # a Python range indexes as its list, as in PyTorch
        array = np.asarray(item)
        if array.size == 0 and array.dtype.kind == "f":
            array = array.astype(np.int64)  # x[[]] selects nothing
        if array.dtype.kind not in "biu":
            raise IndexError(f"{_INVALID} (got an array of {array.dtype})")
        return constant(array if array.dtype == np.bool_ else array.astype(np.int64), device)
    if isinstance(item, Tensor):
        if item._dtype in _MASK_DTYPES:
            return cast(item, dt.bool_)
        if item._dtype.category != dt.INTEGER:
            raise IndexError(f"tensors used as indices must be long, int, byte or bool tensors, got {item._dtype.name}")
        if item._data.ndim == 0:
            return int(item.item())  # a 0-d integer tensor indexes like an int (a view), as in PyTorch
        return cast(item, dt.int64)
    raise IndexError(f"{_INVALID} (got {type(item).__name__})")


def _consumed(item) -> int:
    if item is None or item is Ellipsis:
        return 0
    if isinstance(item, Tensor) and item._dtype is dt.bool_:
        return item._data.ndim
    return 1


def _parse(x: Tensor, key) -> _Key:
    simple = _parse_slices(x._data.shape, key)
    if simple is not None:
        return simple
    items = [_classify(k, x._device) for k in (key if isinstance(key, tuple) else (key,))]
    shape = x._data.shape
    ndim = len(shape)
    used = sum(_consumed(k) for k in items)
    if used > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim} (got {used})")
    if sum(k is Ellipsis for k in items) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    starts, stops, steps = [0] * ndim, list(shape), [1] * ndim
    out: list[int] = []
    advanced: list[tuple[int, Tensor]] = []
    d = 0
    for k in items:
        if k is None:
            out.append(1)
        elif k is Ellipsis:
            out.extend(shape[d : d + ndim - used])
            d += ndim - used
        elif k.__class__ is int:
            n = shape[d]
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for dimension {d} with size {n}")
            starts[d], stops[d] = k % n, k % n + 1
            d += 1
        elif k.__class__ is slice:
            if k.step is not None and k.step <= 0:
                raise ValueError("step must be greater than zero")
            starts[d], stops[d], steps[d] = k.indices(shape[d])
            stops[d] = max(stops[d], starts[d])
            out.append(-(-(stops[d] - starts[d]) // steps[d]))
            d += 1
        elif k._dtype is dt.bool_:
            d = _parse_mask(k, shape, d, out, advanced)
        else:
            _check_bounds(k, shape[d], d)
            out.append(shape[d])
            advanced.append((len(out) - 1, k))
            d += 1
    out.extend(shape[d:])
    sliced = starts != [0] * ndim or stops != list(shape) or steps != [1] * ndim
    return _Key(tuple(starts), tuple(stops), tuple(steps), sliced, tuple(out), tuple(advanced))


def _parse_slices(shape: tuple[int, ...], key) -> _Key | None:
    """``_parse`` of a key of in-range ints and slices with positive steps only (``mask[:t, :t]``,
    ``x[:, -1]``), without classifying each item; None for any other key (``_parse`` takes it)."""
    items = key if key.__class__ is tuple else (key,)
    if len(items) > len(shape):
        return None
    starts, stops, steps, out = [], [], [], []
    for k, n in zip(items, shape):
        if k.__class__ is slice:
            if k.step is not None and k.step <= 0:
                return None
            start, stop, step = k.indices(n)
            stop = max(stop, start)
            out.append(-(-(stop - start) // step))
        elif k.__class__ is int and -n <= k < n:
            start, stop, step = k % n, k % n + 1, 1
        else:
            return None
        starts.append(start)
        stops.append(stop)
        steps.append(step)
    rest = shape[len(items) :]
    sliced = any([a != 0 or b != n or s != 1 for a, b, s, n in zip(starts, stops, steps, shape)])
    return _Key(
        tuple(starts) + (0,) * len(rest), tuple(stops) + rest, tuple(steps) + (1,) * len(rest), sliced,
        tuple(out) + rest, (),
    )  # fmt: skip


def _parse_mask(mask: Tensor, shape, d: int, out: list, advanced: list) -> int:
    """Append a bool mask's dims and its nonzero positions; return the next input dim."""
    k = mask._data.ndim
    if k == 0:  # x[True] adds a dim of size 1, x[False] one of size 0
        out.append(1)
        positions = np.zeros(1 if mask.item() else 0, dtype=np.int64)
        advanced.append((len(out) - 1, constant(positions, mask._device)))
        return d
    for j in range(k):
        if mask._data.shape[j] != shape[d + j]:
            raise IndexError(f"The shape of the mask {list(mask.shape)} at index {j} does not match the shape of "
                             f"the indexed tensor {list(shape)} at index {d + j}")  # fmt: skip
    for nz in nonzero(mask, as_tuple=True):
        out.append(shape[d])
        advanced.append((len(out) - 1, nz))
        d += 1
    return d


# ----------------------------------------------------------------------------- applying a key
def _basic(x: Tensor, key: _Key) -> Tensor:
    """The view for the basic part of ``key`` (always a new tensor sharing ``x``'s memory)."""
    if key.sliced and lean(x) and not (x._requires_grad and grad_mode.state.grad_enabled):
        # no node to record: one view of the slice reshaped (_parse checked the bounds)
        array = x._data[tuple(map(slice, key.starts, key.stops, key.steps))].reshape(key.shape)
        return wrap_view(x, array, _reshape, {})
    y = x
    if key.sliced:
        y = strided_slice(x, key.starts, key.stops, key.steps)
    if y is x or y._data.shape != key.shape:
        y = _reshaped(y, key.shape)
    return y


def _advanced(y: Tensor, advanced) -> Tensor:
    dims = [p for p, _ in advanced]
    indices = [i for _, i in advanced]
    first, count = dims[0], len(dims)
    if dims != list(range(count)):
        rest = [i for i in range(y._data.ndim) if i not in dims]
        y = apply(P["permute"], y, perm=tuple(dims + rest))
    out = apply(_take, y, *indices)
    if first and dims == list(range(first, first + count)):  # adjacent: the result dims stay in place
        lead = out._data.ndim - (y._data.ndim - count)
        perm = [*range(lead, lead + first), *range(lead), *range(lead + first, out._data.ndim)]
        out = apply(P["permute"], out, perm=tuple(perm))
    return out


@method("__getitem__")
def getitem(self: Tensor, key) -> Tensor:
    if key.__class__ is int and self._data.ndim:  # the hot path: iteration, x[i]
        n = self._data.shape[0]
        if not -n <= key < n:
            raise IndexError(f"index {key} is out of bounds for dimension 0 with size {n}")
        key %= n
        shape = self._data.shape
        if lean(self) and not (self._requires_grad and grad_mode.state.grad_enabled):
            return wrap_view(self, self._data[key, ...], _reshape, {})  # (no node to record: one view)
        y = strided_slice(self, (key,) + (0,) * (len(shape) - 1), (key + 1,) + shape[1:], (1,) * len(shape))
        return _reshaped(y, shape[1:])
    if key.__class__ is Tensor and key._dtype is dt.int64 and key._data.ndim and self._data.ndim:
        _check_bounds(key, self._data.shape[0], 0)  # x[idx], an embedding's lookup: what _parse makes of it
        return apply(_take, self, key)
    parsed = _parse(self, key)
    y = _basic(self, parsed)
    return _advanced(y, parsed.advanced) if parsed.advanced else y


def _value_for(target_dtype: dt.DType, value, like: Tensor, shape: tuple[int, ...]) -> Tensor:
    """``value`` as a tensor of ``target_dtype``, leading size-1 dims beyond ``shape``'s dropped."""
    if not isinstance(value, Tensor):
        return scalar_tensor(value, target_dtype, like._device)
    value = cast(value, target_dtype)
    extra = value._data.ndim - len(shape)
    if extra > 0 and all(n == 1 for n in value._data.shape[:extra]):
        value = apply(_reshape, value, shape=value._data.shape[extra:])
    return value


@method("__setitem__")
def setitem(self: Tensor, key, value) -> None:
    masked = _masked_where(self, key, value)
    if masked is not None:
        commit_inplace(self, masked, op="setitem")
        return
    parsed = _parse(self, key)
    if not parsed.advanced:
        view = _basic(self, parsed)
        commit_inplace(view, _value_for(self._dtype, value, self, parsed.shape), op="setitem")
        return
    new = _put(self, parsed, value, accumulate=False)
    commit_inplace(self, new, op="setitem")


def _masked_where(x: Tensor, key, value) -> Tensor | None:
    """``x`` after ``x[mask] = value`` as ``where(mask, value, x)``, where that is the same thing: ``mask``
    a bool tensor over ``x``'s leading dims, and ``value`` the same for every selected element (a number,
    or a tensor that broadcasts to ``x``'s remaining dims). Then the assignment needs no positions, so a
    trace keeps it (``grad[x < 0] = 0``) where ``nonzero``'s data-dependent shape would stop it. None
    for any other key or value."""
    if not (isinstance(key, Tensor) and key._dtype is dt.bool_ and 1 <= key._data.ndim <= x._data.ndim):
        return None
    rest = x._data.shape[key._data.ndim :]
    if key._data.shape != x._data.shape[: key._data.ndim]:
        return None  # _parse raises the shape error
    if isinstance(value, Tensor):
        shape = value._data.shape
        while len(shape) > len(rest) and shape[0] == 1:
            shape = shape[1:]
        if len(shape) > len(rest) or any(v not in (1, r) for v, r in zip(reversed(shape), reversed(rest))):
            return None  # a value per selected element: index_put at the mask's positions
        value = reshape(cast(value, x._dtype), shape)
    else:
        value = scalar_tensor(value, x._dtype, x._device)
    mask = reshape(key, key._data.shape + (1,) * len(rest))
    return where(mask, value, x)


def _put(x: Tensor, key: _Key, value, accumulate: bool) -> Tensor:
    """``x`` with ``value`` written (or added) at ``x[key]``: a functional index_put for any key."""
    dims = [p for p, _ in key.advanced]
    if not key.sliced and key.shape == x._data.shape and dims == list(range(len(dims))):
        indices = tuple(i for _, i in key.advanced)  # only leading advanced indices: one index_put
        shape = broadcast_shapes(*(i._data.shape for i in indices)) + key.shape[len(dims) :]
        values = _value_for(x._dtype, value, x, shape)  # type: ignore[arg-type]  # eager: int dims
        return apply(_index_put, x, values, *indices, accumulate=accumulate)
    # Any other key: find the flat positions it selects by indexing a table of positions.
    table = constant(np.arange(x._data.size, dtype=np.int64).reshape(x._data.shape), x._device)
    positions = _advanced(_basic(table, key), key.advanced) if key.advanced else _basic(table, key)
    values = _value_for(x._dtype, value, x, tuple(positions.shape))
    try:
        values = expand(values, tuple(positions.shape))
    except (RuntimeError, ValueError):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to "
                           f"indexing result of shape {list(positions.shape)}") from None  # fmt: skip
    flat = index_put(reshape(x, (-1,)), (reshape(positions, (-1,)),), reshape(values, (-1,)), accumulate)
    return reshape(flat, tuple(x._data.shape))


# ----------------------------------------------------------------------------- index, index_put, take
def _indices_key(indices) -> tuple:
    """torch.index_put's indices: a tuple of index tensors, ``None`` meaning a whole dim."""
    return tuple(slice(None) if i is None else i for i in indices)


def _leading_int64(indices) -> bool:
    return bool(indices) and all(isinstance(i, Tensor) and i._dtype is dt.int64 for i in indices)


def index(input: Tensor, indices) -> Tensor:
    """``input[indices]`` for a tuple of index tensors over the leading dims (PyTorch's ``aten::index``);
    the functional dual of ``index_put``."""
    indices = tuple(indices)
    if _leading_int64(indices) and len(indices) <= input._data.ndim:
        _check_leading(input, indices)
        return apply(_take, input, *indices)
    return getitem(input, _indices_key(indices))


def _check_leading(input: Tensor, indices: tuple) -> None:
    for d, i in enumerate(indices):
        _check_bounds(i, input._data.shape[d], d)


@method("index_put")
def index_put(input: Tensor, indices, values, accumulate: bool = False) -> Tensor:
    """A copy of ``input`` with ``values`` put at ``input[indices]`` (added when ``accumulate``).

    >>> import kiln
    >>> index_put(kiln.zeros(4), (kiln.tensor([0, 2, 0]),), kiln.tensor(1.0), accumulate=True).tolist()
    [2.0, 0.0, 1.0, 0.0]
    """
    indices = tuple(indices)
    if isinstance(values, Tensor) and values._dtype is not input._dtype:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                           f"{input._dtype.name} for the destination and {values._dtype.name} for the source.")  # fmt: skip
    if _leading_int64(indices) and len(indices) <= input._data.ndim:
        _check_leading(input, indices)
        values = _value_for(input._dtype, values, input, ())
        return apply(_index_put, input, values, *indices, accumulate=bool(accumulate))
    return _put(input, _parse(input, _indices_key(indices)), values, bool(accumulate))


@method("index_put_")
def index_put_(input: Tensor, indices, values, accumulate: bool = False) -> Tensor:
    return commit_inplace(input, index_put(input, indices, values, accumulate), op="index_put_")


def take_flat(base: Tensor, positions: Tensor) -> Tensor:
    """``base.reshape(-1)[positions]``: the result has ``positions``' shape (no bounds check)."""
    return apply(_take, reshape(base, (-1,)), positions)


@method("take")
def take(input: Tensor, index: Tensor) -> Tensor:
    """``torch.take``: elements of the flattened ``input`` at ``index`` (any shape; negatives wrap)."""
    if index._dtype is not dt.int64:
        raise RuntimeError(f"take(): Expected a long tensor for index, but got {index._dtype.name}")
    n = input._data.size
    check_range(index, -n, n, IndexError, f"out of range: tried to access index {{value}} on a tensor of {n} elements.")
    return take_flat(input, index)


@method("index_select")
def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    if index._dtype not in (dt.int64, dt.int32) or index._data.ndim > 1:
        raise IndexError(f"index_select(): index must be a 0-d or 1-d int64/int32 tensor, got "
                         f"{index._dtype.name} of shape {list(index.shape)}")  # fmt: skip
    dim = normalize_axis(dim, input._data.ndim)
    index = reshape(cast(index, dt.int64), (-1,))
    if input._data.ndim == 0:
        _check_bounds(index, 1, 0, "index_select(): index", wrap=False)
        return reshape(apply(_take, reshape(input, (1,)), index), ())
    _check_bounds(index, input._data.shape[dim], dim, "index_select(): index", wrap=False)
    return movedim(apply(_take, movedim(input, dim, 0), index), 0, dim)


@method("index_add")
def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:
    """A copy of ``input`` with ``alpha * source`` slices added at ``index`` along ``dim``."""
    dim = normalize_axis(dim, input._data.ndim)
    _check_bounds(index, input._data.shape[dim], dim, "index_add(): index", wrap=False, error=RuntimeError)
    if alpha != 1:
        source = source * alpha
    moved = index_put(movedim(input, dim, 0), (cast(index, dt.int64),), movedim(source, dim, 0), accumulate=True)
    return movedim(moved, 0, dim)


# ----------------------------------------------------------------------------- gather / scatter
def _axis_index(name: str, input: Tensor, dim: int, index: Tensor) -> int:
    if not isinstance(index, Tensor) or index._dtype is not dt.int64:
        got = index._dtype.name if isinstance(index, Tensor) else type(index).__name__
        raise RuntimeError(f"{name}(): Expected dtype int64 for index, got {got}")
    dim = normalize_axis(dim, input._data.ndim)
    if index._data.ndim == input._data.ndim:
        size = input._data.shape[dim] if input._data.ndim else 1
        _check_bounds(index, size, dim, f"{name}(): index", wrap=False, error=RuntimeError)  # PyTorch's type
    return dim


@method("gather")
def gather(input: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    """``out[i][j] = input[index[i][j]][j]`` for ``dim=0``, as ``torch.gather``."""
    dim = _axis_index("gather", input, dim, index)
    return apply(P["gather"], input, index, axis=dim)


def _src(name: str, input: Tensor, index: Tensor, src, value) -> Tensor:
    src = value if src is None else src
    if src is None:
        raise TypeError(f"{name}() missing the src tensor or value")
    if not isinstance(src, Tensor):
        return expand(scalar_tensor(src, input._dtype, input._device), tuple(index._data.shape))
    if src._data.ndim != index._data.ndim or any(i > n for i, n in zip(index._data.shape, src._data.shape)):
        raise RuntimeError(
            f"{name}(): index shape {list(index.shape)} must not exceed the src shape {list(src.shape)} at any dimension"
        )
    if src._dtype is not input._dtype:
        raise RuntimeError(f"{name}(): Expected self.dtype to be equal to src.dtype, got {input._dtype.name} "
                           f"and {src._dtype.name}")  # fmt: skip
    return src


@method("scatter")
def scatter(input: Tensor, dim: int, index: Tensor, src=None, *, value=None, reduce: str | None = None) -> Tensor:
    """A copy of ``input`` with ``src`` (a tensor or a number) written at ``index`` along ``dim``."""
    if reduce is not None:
        if reduce != "add":
            raise NotImplementedError(
                f"scatter(): reduce={reduce!r} is not supported; use scatter_add or scatter_reduce"
            )
        return scatter_add(input, dim, index, _src("scatter", input, index, src, value))
    dim = _axis_index("scatter", input, dim, index)
    src = _src("scatter", input, index, src, value)
    return apply(P["scatter"], input, index, src, axis=dim)


@method("scatter_add")
def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """A copy of ``input`` with ``src`` added at ``index`` along ``dim``; repeated positions add up."""
    dim = _axis_index("scatter_add", input, dim, index)
    src = _src("scatter_add", input, index, src, None)
    return apply(P["scatter_add"], input, index, src, axis=dim)


# ----------------------------------------------------------------------------- masks, one_hot
def _check_mask(mask: Tensor, op: str) -> None:
    if not isinstance(mask, Tensor) or mask._dtype is not dt.bool_:
        got = mask._dtype.name if isinstance(mask, Tensor) else type(mask).__name__
        raise RuntimeError(f"{op} only supports boolean masks, but got mask with dtype {got}")


@method("masked_fill")
def masked_fill(input: Tensor, mask: Tensor, value) -> Tensor:
    """``value`` (a number or a 0-d tensor) where ``mask`` holds, else ``input``; ``input``'s dtype."""
    _check_mask(mask, "masked_fill")
    if isinstance(value, Tensor):
        if value._data.ndim:
            raise RuntimeError(f"masked_fill only supports a 0-dimensional value tensor, but got tensor with "
                               f"{value._data.ndim} dimension(s).")  # fmt: skip
        value = cast(value, input._dtype)
    else:
        value = scalar_tensor(value, input._dtype, input._device)
    return where(mask, value, input)


@method("masked_select")
def masked_select(input: Tensor, mask: Tensor) -> Tensor:
    """The elements where ``mask`` (broadcast with ``input``) holds, as a 1-d tensor."""
    _check_mask(mask, "masked_select")
    shape = broadcast_shapes(input._data.shape, mask._data.shape)
    return getitem(expand(input, shape), expand(mask, shape))


@method("nonzero")
def nonzero(input: Tensor, *, as_tuple: bool = False):
    """Indices of the non-zero elements: an int64 ``(count, ndim)`` tensor, or one 1-d tensor per dim."""
    input._value_access("kiln.nonzero() (a data-dependent shape)")
    data = input._data if input._data.ndim else input._data.reshape(1)
    found = data.nonzero()
    if as_tuple:
        return tuple(make_tensor(i.astype(np.int64, copy=False), input._device) for i in found)
    xp = np if isinstance(data, np.ndarray) else __import__("cupy")
    stacked = xp.stack(found, axis=1).astype(np.int64) if found else xp.zeros((0, 0), dtype=np.int64)
    return make_tensor(stacked if input._data.ndim else stacked[:, :0], input._device)


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """``torch.nn.functional.one_hot``: int64, one more trailing dim of ``num_classes`` (-1: max + 1)."""
    if tensor._dtype is not dt.int64:
        raise RuntimeError(f"one_hot is only applicable to index tensor of type int64, got {tensor._dtype.name}")
    data = tensor._data
    check_range(tensor, 0, None, RuntimeError, "Class values must be non-negative.")
    if num_classes == -1:
        tensor._value_access("one_hot(num_classes=-1) (the class count is read from the values)")
        num_classes = int(data.max()) + 1 if data.size else 0
        if not data.size:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
    else:
        check_range(tensor, None, num_classes, RuntimeError,
                    f"Class values must be smaller than num_classes ({num_classes}), got {{value}}.")  # fmt: skip
    classes = constant(np.arange(num_classes, dtype=np.int64), tensor._device)
    return cast(eq(reshape(tensor, tuple(data.shape) + (1,)), classes), dt.int64)


# ----------------------------------------------------------------------------- in-place variants
@method("masked_fill_")
def masked_fill_(input: Tensor, mask: Tensor, value) -> Tensor:
    return commit_inplace(input, masked_fill(input, mask, value), op="masked_fill_")


@method("scatter_")
def scatter_(input: Tensor, dim: int, index: Tensor, src=None, *, value=None, reduce: str | None = None) -> Tensor:
    return commit_inplace(input, scatter(input, dim, index, src, value=value, reduce=reduce), op="scatter_")


@method("scatter_add_")
def scatter_add_(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    return commit_inplace(input, scatter_add(input, dim, index, src), op="scatter_add_")


@method("index_add_")
def index_add_(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:
    return commit_inplace(input, index_add(input, dim, index, source, alpha=alpha), op="index_add_")
