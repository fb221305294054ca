"""Memory layouts of the arrays a trace and its specializations reason about: whether one array's
memory lies inside another's, whether an array is dense (C order or a permutation of it), and
copies laid out as eager's arrays were."""

from __future__ import annotations

import numpy as np


def dense_order(array: np.ndarray) -> list[int] | None:
    """The axes of ``array`` from the largest stride to the smallest when its elements fill its
    memory with no gaps (C order, or a permutation of it, as numpy's results keep their inputs'
    layouts), else None."""
    order = sorted(range(array.ndim), key=lambda d: -array.strides[d])
    step = array.itemsize
    for d in reversed(order):
        if array.shape[d] != 1 and array.strides[d] != step:
            return None
        step *= array.shape[d]
    return order


def in_layout(array: np.ndarray, strides: tuple) -> np.ndarray:
    """``array``, or a copy of it laid out with ``strides`` (those of a dense array of its shape)."""
    if array.strides == strides:
        return array
    order = sorted(range(array.ndim), key=lambda d: -strides[d])
    out = np.empty([array.shape[d] for d in order], array.dtype).transpose(np.argsort(order))
    out[...] = array
    return out


def is_identity(positions: np.ndarray, size: int) -> bool:
    """Whether ``positions`` (flat indices into an array of ``size`` elements) is every element in order."""
    return positions.size == size and bool((positions.reshape(-1) == np.arange(size)).all())


def as_permutation(positions: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``(shape, p)`` where ``positions`` (flat indices into an array, in a view's shape, every element
    once) is the array reshaped to ``shape`` and its dims permuted by ``p`` (maybe none) -- a view
    ``a.reshape(shape).permute(p)``: conv's (N, C, H, W) result over (C, N, H, W) memory --, else None.
    Checked element by element."""
    size = positions.size
    if size == 0 or positions.flat[0] != 0:
        return None
    ndim = positions.ndim
    steps = []
    for d, n in enumerate(positions.shape):  # each dim's step in the array's flat order (size-1 dims: none)
        steps.append(int(positions[(0,) * d + (1,) + (0,) * (ndim - d - 1)]) if n > 1 else 0)
    order = sorted(range(ndim), key=lambda d: -steps[d])  # the view's dims in the array's order
    shape = tuple(positions.shape[d] for d in order)
    p = tuple(order.index(d) for d in range(ndim))
    if not np.array_equal(positions, np.arange(size).reshape(shape).transpose(p)):
        return None
    return shape, p


def contains(outer, inner) -> bool:
    """Whether array ``inner``'s memory lies within array ``outer``'s."""
    lo, hi = np.lib.array_utils.byte_bounds(outer)
    ilo, ihi = np.lib.array_utils.byte_bounds(inner)
    return lo <= ilo and ihi <= hi


def memory_owner(array):
    """What holds ``array``'s memory: the end of its chain of bases (a numpy or cupy view keeps
    the array it views as ``base``; an array over foreign memory keeps that object)."""
    base = array.base
    while base is not None:
        array, base = base, getattr(base, "base", None)
    return array


def overlaps(a, b) -> bool:
    """Whether the memory of arrays ``a`` and ``b`` may overlap (their byte ranges meet)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.may_share_memory(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return False  # host and device memory
    import cupy  # noqa: PLC0415  device arrays: cupy is loaded

    return bool(cupy.may_share_memory(a, b))


class MemoryIndex:
    """Arrays by the object that holds their memory, to find the earlier ones a new array
    overlaps (only arrays with one owner are compared, so unrelated arrays cost one dict look-up).

    >>> m, base = MemoryIndex(), np.zeros((4, 4))
    >>> m.share(base[:2], 0), m.share(base[2:], 1), m.share(np.zeros(3), 2), m.share(base.T[1], 3)
    ((), (), (), (0, 1))
    """

    def __init__(self) -> None:
        self._by_owner: dict[int, list[tuple[object, int]]] = {}

    def share(self, array, tag: int) -> tuple[int, ...]:
        """Add ``array`` as ``tag``; the other tags, in order, of the arrays added before whose
        memory overlaps ``array``'s."""
        owner = id(memory_owner(array))
        earlier = self._by_owner.get(owner)
        if earlier is None:
            self._by_owner[owner] = [(array, tag)]
            return ()
        found = tuple(sorted({t for other, t in earlier if t != tag and overlaps(other, array)}))
        earlier.append((array, tag))
        return found


class SharedMemory:
    """A trace's externals grouped by the memory they share: the tensors viewing one root tensor
    (``_base``), joined with the group of any other external whose memory overlaps theirs (two
    tensors made by ``from_numpy`` over one array have no root in common)."""

    def __init__(self) -> None:
        self._groups: dict[int, list[int]] = {}  # id(root tensor) -> externals, for groups' keys
        self._joined: dict[int, int] = {}  # id(root) -> id(root) of the group it was joined to
        self._memory = MemoryIndex()

    def _key(self, root_id: int) -> int:
        while root_id in self._joined:
            root_id = self._joined[root_id]
        return root_id

    def add(self, root, array, external: int) -> None:
        """External number ``external`` views ``root``'s memory through ``array``."""
        key = self._key(id(root))
        self._groups.setdefault(key, []).append(external)
        for other in map(self._key, self._memory.share(array, id(root))):
            if other != key:
                self._groups[key] += self._groups.pop(other)
                self._joined[other] = key

    def held_pairs(self) -> set[int]:
        """The ids of the (array, external) pairs the index holds: references to arrays that are the
        trace's own, not the user's (``numpy_inputs``)."""
        return {id(pair) for pairs in self._memory._by_owner.values() for pair in pairs}

    def members(self, root) -> list[int]:
        """The externals that share memory with ``root`` (a root tensor)."""
        return self._groups.get(self._key(id(root)), [])


class _Writable:
    """An ``__array_interface__`` over the same memory as a read-only view, marked writeable; it
    holds the array that owns the memory alive."""

    def __init__(self, owner, interface: dict) -> None:
        self.owner = owner
        self.__array_interface__ = interface


def writable(array):
    """``array``, or a writeable alias of it where it is a read-only view (a broadcast, as
    ``expand`` makes) of memory its owner may write: a write through an expanded tensor reaches
    the memory, as in PyTorch. Any other read-only array is returned as it is (numpy refuses
    the write)."""
    if not isinstance(array, np.ndarray) or array.flags.writeable:
        return array
    owner = memory_owner(array)
    if not isinstance(owner, np.ndarray) or not owner.flags.writeable:
        return array
    interface = dict(array.__array_interface__)
    interface["data"] = (interface["data"][0], False)
    return np.asarray(_Writable(owner, interface))
