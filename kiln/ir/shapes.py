"""Shape arithmetic shared by the shape rules, with errors that say what was expected."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy/PyTorch broadcasting of shapes; a ValueError names every shape when they clash.

    >>> broadcast_shapes((3, 1), (4,))
    (3, 4)
    """
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        offset = ndim - len(shape)
        for i, d in enumerate(shape):
            o = out[offset + i]
            if o == 1:
                out[offset + i] = d
            elif d != 1 and d != o:
                given = " and ".join(str(tuple(s)) for s in shapes)
                raise ValueError(
                    f"shapes {given} cannot be broadcast together: dimension {i - len(shape)} "
                    f"is {o} in one and {d} in another (sizes must match or be 1)"
                )
    return tuple(out)


def normalize_axis(axis: int, ndim: int) -> int:
    """A dimension index in ``[-ndim, ndim)`` made non-negative; IndexError otherwise.

    A 0-d tensor accepts dims -1 and 0, as in PyTorch.
    """
    if not isinstance(axis, int):
        raise TypeError(f"dim must be an int, got {type(axis).__name__}")
    bound = max(ndim, 1)
    if not -bound <= axis < bound:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], but got {axis})")
    return axis % bound if ndim else 0


def normalize_axes(axes: int | Iterable[int] | None, ndim: int) -> tuple[int, ...]:
    """``None`` means every axis; duplicates are an error, as in PyTorch."""
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, int):
        axes = (axes,)
    out = tuple(normalize_axis(a, ndim) for a in axes)
    if len(set(out)) != len(out):
        raise ValueError(f"dim {tuple(axes)} appears multiple times in the list of dims")
    return tuple(sorted(out)) if ndim else ()


def numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def reduced_shape(shape: Sequence[int], axes: Sequence[int], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)
