"""Shape arithmetic shared by the shape rules, with errors that say what was expected.

Dimensions may be symbolic (``kiln.ir.types.Sym``): a symbol equals itself and broadcasts with 1;
against any other size or symbol it is an error, since the sizes could differ when the graph runs.
Rules that need a symbol's value (``numel``) raise ``SymbolicShapeError``; ``require_static``
gives an op's rule that does not handle symbols yet one clear message.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from .types import Dim, Sym, SymbolicShapeError, TensorType


class BroadcastError(RuntimeError, ValueError):
    """Shapes that do not broadcast together. A ``RuntimeError``, as PyTorch raises for them (code
    ported from PyTorch catches that), and a ``ValueError``, as kiln raised before, so that handlers
    written for either keep working."""


def _text(shape: Sequence[Dim]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """NumPy/PyTorch broadcasting of shapes; a ``BroadcastError`` names every shape when they clash.

    >>> broadcast_shapes((3, 1), (4,))
    (3, 4)
    >>> broadcast_shapes((Sym("B"), 1), (1, 4))
    (Sym('B'), 4)
    """
    ndim = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * ndim
    for shape in shapes:
        offset = ndim - len(shape)
        for i, d in enumerate(shape):
            o = out[offset + i]
            if o == 1:
                out[offset + i] = d
            elif d != 1 and d != o:
                given = " and ".join(_text(s) for s in shapes)
                symbolic = isinstance(d, Sym) or isinstance(o, Sym)
                why = "a symbolic size broadcasts only with 1 or itself" if symbolic else "sizes must match or be 1"
                raise BroadcastError(
                    f"shapes {given} cannot be broadcast together: dimension {i - len(shape)} "
                    f"is {o} in one and {d} in another ({why})"
                )
    return tuple(out)


def require_static(op: str, *types: TensorType) -> None:
    """``SymbolicShapeError`` unless every shape of ``types`` is made of ints."""
    for t in types:
        if not t.is_static:
            shapes = ", ".join(str(list(map(str, x.shape))).replace("'", "") for x in types)
            raise SymbolicShapeError(f"{op} does not take a symbolic dimension yet (input shapes {shapes})")


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


def numel(shape: Sequence[Dim]) -> int:
    """The number of elements of ``shape``; ``SymbolicShapeError`` when a dimension is symbolic."""
    try:
        return math.prod(shape)  # type: ignore[arg-type]
    except TypeError:  # a Sym: fail loudly, never a product an int-minded caller would misuse
        raise SymbolicShapeError(f"the number of elements of shape {_text(shape)} depends on a symbolic size") from None


def reduced_shape(shape: Sequence[Dim], axes: Sequence[int], keepdim: bool) -> tuple[Dim, ...]:
    if keepdim:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)
