"""Sizes Python reads during a trace that may make them dynamic (``dynamic.py``): ``WatchedSize``.

A trace learns which sizes are dynamic by comparing two traces at two sizes; a branch Python takes
on a size (``if x.shape[0] > 8``) is invisible there when both sizes take it alike. So while such a
trace runs, ``Tensor.shape`` and ``Tensor.size()`` hand out the sizes that may become dynamic as
``WatchedSize`` ints. A comparison of a size as read with a plain int (``assert T <= block_size``,
``if T > 8``) becomes a guard of the dynamic program (it serves the sizes for which the comparison
comes out as traced; another size traces again); any other comparison or truth test of a watched
size (of a size computed from it, of two sizes) keeps the call static. ``len(t)`` gives a plain int
(Python converts what ``__len__`` returns), so it is not watched.

A watched size also carries its *shadow*, the size it had in the other trace, and Python's integer
arithmetic on it computes the shadow alongside. The two traces would otherwise miss a number that
folds the two sizes into one (``T // 4`` is 1 at both T=5 and T=7; ``T % 2``, ``T >> 1``, ``T & ~3``
alike): it lands in the graph as the same constant in both, and the dynamic program would then use
1 at T=9 too. Such a number keeps the call static, with the line that computed it. (``int(T / 4)``
goes through a float and is not followed.)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from ..tensor import Tensor
from .dynamic import marked_dims
from .locations import KILN_DIR


def watched_shape(shape: tuple, trace) -> tuple:
    """``shape`` with each size the trace watches (``trace.watched_sizes``: a set, or a dict from each
    size to its shadow) as a ``WatchedSize``."""
    watched = trace.watched_sizes
    shadows = watched if isinstance(watched, dict) else {}
    return tuple(WatchedSize(d, trace, read=True, shadow=shadows.get(d)) if d in watched else d for d in shape)


def with_shadows(pairs) -> dict[int, int | None]:
    """Each size of this trace (``(this, other)`` pairs) and the size it had in the other trace: None
    where two dimensions of one size here had different sizes there."""
    shadows: dict[int, int | None] = {}
    for this, other in pairs:
        shadows[this] = other if shadows.get(this, other) == other else None
    return shadows


class WatchedSize(int):
    """A size Python read from a tensor during a trace that learns dynamic sizes. It is the int it
    says; what Python computes from it stays watched, and a comparison or truth test in the user's
    code (``if x.shape[0] > 8``) is told to the trace, which then keeps the call static: a branch
    taken alike at the two traced sizes could go the other way at a third."""

    trace: Any  # the trace told of a comparison
    read: bool  # the size as read from a tensor (not computed from one)
    shadow: int | None  # the same number computed at the other trace's sizes (None: not known)

    def __new__(cls, value: int, trace, read: bool = False, shadow: int | None = None) -> WatchedSize:
        self = super().__new__(cls, value)
        self.trace = trace
        self.read = read
        self.shadow = shadow
        return self

    def _told(self, what: str, guard: tuple | None = None) -> None:
        """Tell the trace of a comparison in the user's code: a guard ``(size, op, other, result)``
        where it can be one, else a reason to keep the call static."""
        frame = sys._getframe(2)
        if frame.f_code.co_filename.startswith(KILN_DIR):  # kiln's own checks of shapes are no branch
            return
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        if guard is not None and self.read:
            self.trace.on_size_guard(*guard, where)
        else:
            self.trace.on_size_compared(f"{what} at {where}")

    def _same(self, value, shadow: int | None = None):
        return WatchedSize(value, self.trace, shadow=shadow) if type(value) is int else value

    __hash__ = int.__hash__


def _comparison(name: str):
    method = getattr(int, name)

    def compare(self, other):
        result = method(self, other)
        guard = (int(self), name, other, result) if type(other) is int else None  # a plain int, not a size
        self._told(f"a comparison of the dynamic size {int(self)}", guard)
        return result

    return compare


def _arithmetic(name: str):
    method = getattr(int, name)
    folds = name in _FOLDING

    def compute(self, *other):
        value = method(self, *other)
        shadow = _shadow(method, self, other)
        if folds and shadow is not None and shadow == value and _differs(self, other):
            sign = _FOLDING[name]
            rhs = other[0] if other else ""
            what = f"{int(self)} {sign} {int(rhs)}" if not name.startswith("__r") else f"{int(rhs)} {sign} {int(self)}"
            self._told(f"a number computed from a dynamic size that is the same at both sizes ({what} = {value})")
        return self._same(value, shadow)

    return compute


def _shadow(method, size: WatchedSize, other: tuple) -> int | None:
    """What ``method(size, *other)`` gives at the other trace's sizes (None where a shadow is unknown)."""
    shadows = [o.shadow if isinstance(o, WatchedSize) else o if type(o) is int else None for o in other]
    if size.shadow is None or None in shadows:
        return None
    try:
        result = method(size.shadow, *shadows)
    except (ZeroDivisionError, ValueError, OverflowError):
        return None
    return result if type(result) is int else None


def _differs(size: WatchedSize, other: tuple) -> bool:
    """Whether an operand differs between the two traces (the result then folded them together)."""
    return any(isinstance(o, WatchedSize) and o.shadow is not None and o.shadow != int(o) for o in (size, *other))


#: Integer operations that can give one number at two sizes, by the sign the user wrote.
_FOLDING = {"__floordiv__": "//", "__rfloordiv__": "//", "__mod__": "%", "__rmod__": "%", "__rshift__": ">>",
            "__rrshift__": ">>", "__and__": "&", "__rand__": "&", "__or__": "|", "__ror__": "|", "__xor__": "^",
            "__rxor__": "^"}  # fmt: skip


def _truth(self) -> bool:
    self._told(f"a truth test of the dynamic size {int(self)}")
    return int(self) != 0


for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
    setattr(WatchedSize, _name, _comparison(_name))
for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__neg__", "__pow__", "__lshift__",
              "__rlshift__", "__abs__", *_FOLDING):  # fmt: skip
    setattr(WatchedSize, _name, _arithmetic(_name))
WatchedSize.__bool__ = _truth  # type: ignore[method-assign]


def plain_ints(value):
    """``value`` (an op's attributes) with every ``WatchedSize`` an int again."""
    if isinstance(value, WatchedSize):
        return int(value)
    if isinstance(value, tuple):
        return tuple(plain_ints(v) for v in value)
    if isinstance(value, list):
        return [plain_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: plain_ints(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------- guards of a dynamic program
_SIGNS = {"__eq__": "==", "__ne__": "!=", "__lt__": "<", "__le__": "<=", "__gt__": ">", "__ge__": ">="}
GUARD_COMPARISONS = frozenset(_SIGNS)  # the int methods a size guard may call


@dataclass(frozen=True)
class SizeGuard:
    """A comparison Python made of a dynamic size during the trace (``T <= 16``, True): the dynamic
    program serves only calls whose size compares alike; another call traces again."""

    argument: int  # the leaf position of the tensor whose size it is
    dim: int
    comparison: str  # an int method: "__le__"
    other: int
    result: bool
    where: str  # the user's line

    def miss(self, leaves: list) -> str | None:
        """Why this call's size does not keep the guard (None when it does)."""
        size = leaves[self.argument].shape[self.dim]
        if getattr(int, self.comparison)(int(size), self.other) == self.result:
            return None
        return f"argument {self.argument} dim {self.dim}: {self} is not {self.result} at size {size} ({self.where})"

    def __str__(self) -> str:
        return f"size {_SIGNS[self.comparison]} {self.other}"


def guards_of(compared: list[tuple], dynamic: tuple) -> tuple[list[SizeGuard], str | None]:
    """The guards of a dynamic program from a trace's comparisons ``(size, comparison, int, result,
    where)`` (``Trace.size_guards``) and the trace's partner ``("compare", graph, pairs, positions)``:
    each size is the size of the dynamic dimension it equals (None and why, when it equals two)."""
    if not compared:
        return [], None
    _, _, pairs, positions = dynamic
    guards = []
    for size, comparison, other, result, where in compared:
        found = {pair: position for pair, position in zip(pairs, positions, strict=True) if pair[1] == size}
        if len(found) != 1:  # two dynamic sizes of this value (sizes of other values were not watched)
            return [], f"Python compares a size that two dynamic sizes have ({size}, at {where})"
        ((argument, dim),) = found.values()
        guards.append(SizeGuard(argument, dim, comparison, other, bool(result), where))
    return list(dict.fromkeys(guards)), None


def sizes_to_watch(leaves: list, partner: tuple, up_front: bool) -> list[int]:
    """The call's sizes that may become dynamic: those that differ from the earlier trace's, or (a
    trace kept to be compared later) each size >= 2 of a dimension ``mark_dynamic`` marked, and of
    the leading one under ``dynamic=True`` (``up_front``; the trace at the next size watches
    whichever sizes then differ)."""
    if partner[0] == "compare":
        return [new for _, new in partner[2]]
    sizes: list[int] = []
    for leaf in leaves:
        if isinstance(leaf, Tensor) and leaf.ndim:
            shape = leaf.shape
            dims = marked_dims(leaf) | {0} if up_front else marked_dims(leaf)
            sizes.extend(shape[d] for d in dims if shape[d] >= 2)
    return sizes
