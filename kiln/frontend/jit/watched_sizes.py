"""Sizes Python reads during a trace that may make them dynamic (``dynamic.py``): ``WatchedSize``.

A trace learns which sizes are dynamic by comparing two traces at two sizes; a branch Python takes
on a size (``if x.shape[0] > 8``) is invisible there when both sizes take it alike. So while such a
trace runs, ``Tensor.shape`` and ``Tensor.size()`` hand out the sizes that may become dynamic as
``WatchedSize`` ints. A comparison of a size as read with a plain int (``assert T <= block_size``,
``if T > 8``) becomes a guard of the dynamic program (it serves the sizes for which the comparison
comes out as traced; another size traces again); any other comparison or truth test of a watched
size (of a size computed from it, of two sizes), and its hash (a set of it) or text (``str``, an
f-string) in the user's code, keeps the call static. ``len(t)`` gives a plain int
(Python converts what ``__len__`` returns), so it is not watched.

A watched size also carries its *shadow*, the size it had in the other trace, and Python's integer
arithmetic on it computes the shadow alongside. The two traces would otherwise miss a number that
folds the two sizes into one (``T // 4`` is 1 at both T=5 and T=7; ``T % 2``, ``T >> 1``, ``T & ~3``,
``abs(T - 6)`` alike, and through a float, ``int(T * 0.15)`` or ``math.floor(T / 4)``: a
``WatchedFloat``): it lands in the graph as the same constant in both, and the dynamic program would
then use 1 at T=9 too. Such a number keeps the call static, with the line that computed it. What
leaves Python's number types (``numpy.int64(T) // 4``, ``math.sqrt``) is not followed.
"""

from __future__ import annotations

import math
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


class _Watched:
    """What a watched size and a number computed from one share: the trace, the *shadow* (the same
    number at the other trace's sizes; None where not known), telling the trace of what Python did."""

    trace: Any  # the trace told of a comparison
    read: bool = False  # a size as read from a tensor (not computed from one)
    shadow: Any = None

    def _told(self, what: str, guard: tuple | None = None) -> None:
        """Tell the trace of a comparison in the user's code: a guard ``(size, op, other, result)``
        where it can be one, else a reason to keep the call static."""
        frame: Any = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename == __file__:  # the code that compared or computed
            frame = frame.f_back
        if frame is None or frame.f_code.co_filename.startswith(KILN_DIR):  # kiln's own checks of shapes: no branch
            return
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        if guard is not None and self.read:
            self.trace.on_size_guard(*guard, where)
        else:
            self.trace.on_size_compared(f"{what} at {where}")

    def _folded(self, what: str, value, shadow) -> None:
        """``value`` (``what`` computed) is its shadow though a number it came from was not: the two
        traces would see one constant where the sizes differ."""
        if shadow is not None and shadow == value:
            self._told(f"a number computed from a dynamic size that is the same at both sizes ({what} = {value})")


class WatchedSize(_Watched, int):
    """A size Python read from a tensor during a trace that learns dynamic sizes. It is the int it
    says; what Python computes from it stays watched, and a comparison or truth test in the user's
    code (``if x.shape[0] > 8``) is told to the trace, which then keeps the call static: a branch
    taken alike at the two traced sizes could go the other way at a third."""

    def __new__(cls, value: int, trace, read: bool = False, shadow: int | None = None) -> WatchedSize:
        self = super().__new__(cls, value)
        self.trace, self.read, self.shadow = trace, read, shadow
        return self


class WatchedFloat(_Watched, float):
    """A float Python computed from a watched size (``T / 4``, ``T * 0.15``): converting it back to a
    whole number (``int``, ``round``, ``math.floor``) may fold the two sizes together, and comparing it
    is a branch on the size."""

    def __new__(cls, value: float, trace, shadow: float | None = None) -> WatchedFloat:
        self = super().__new__(cls, value)
        self.trace, self.shadow = trace, shadow
        return self

    def _whole(self, name: str, convert):
        value = convert(_plain(self))
        shadow = None if self.shadow is None else convert(self.shadow)
        if self.shadow != _plain(self):
            self._folded(f"{name}({_plain(self)!r})", value, shadow)
        return value, shadow

    def __int__(self) -> int:
        return self._whole("int", int)[0]  # (a plain int: int() may return nothing else)

    __trunc__ = __int__

    def __floor__(self):
        return _wrap(*self._whole("math.floor", math.floor), self.trace)

    def __ceil__(self):
        return _wrap(*self._whole("math.ceil", math.ceil), self.trace)

    def __round__(self, ndigits=None):
        if ndigits is not None:
            shadow = None if self.shadow is None else round(self.shadow, ndigits)
            return _wrap(round(_plain(self), ndigits), shadow, self.trace)
        return _wrap(*self._whole("round", round), self.trace)


def _wrap(value, shadow, trace):
    """``value`` watched (with its shadow) when it is a number, else as it is (NotImplemented...)."""
    if type(value) is int:
        return WatchedSize(value, trace, shadow=shadow if type(shadow) is int else None)
    if type(value) is float:
        return WatchedFloat(value, trace, shadow=float(shadow) if type(shadow) in (int, float) else None)
    return value


def _comparison(name: str):
    method = getattr(int, name)

    def compare(self, other):
        if isinstance(other, float):  # a size against a float: no guard, a branch on the size
            self._told(f"a comparison of the dynamic size {_plain(self)} with a float")
            return getattr(float, name)(float(_plain(self)), _plain(other) if isinstance(other, _Watched) else other)
        result = method(self, other)
        guard = (_plain(self), name, other, result) if type(other) is int else None  # a plain int, not a size
        self._told(f"a comparison of the dynamic size {_plain(self)}", guard)
        return result

    return compare


def _float_comparison(name: str):
    method = getattr(float, name)

    def compare(self, other):
        self._told(f"a comparison of a number computed from a dynamic size ({_plain(self)!r})")
        return method(_plain(self), _plain(other) if isinstance(other, _Watched) else other)

    return compare


def _arithmetic(base: type, name: str):
    method = getattr(base, name)
    sign = _FOLDING.get(name)

    def compute(self, *other):
        if base is int and any(isinstance(o, float) for o in other):  # T * 0.15: a float computed from T
            as_float = WatchedFloat(
                float(_plain(self)), self.trace, None if self.shadow is None else float(self.shadow)
            )
            return getattr(as_float, name)(*other)
        value = method(self, *other)
        shadow = _shadow(base, method, self, other)
        if sign is not None and _differs(self, other):
            if not other:
                what = f"{sign}({_plain(self)!r})"
            else:
                a, b = (other[0], self) if name.startswith("__r") else (self, other[0])
                what = f"{_plain(a)!r} {sign} {_plain(b)!r}"
            self._folded(what, value, shadow)
        return _wrap(value, shadow, self.trace)

    return compute


def _shadow(base: type, method, number: _Watched, other: tuple):
    """What ``method(number, *other)`` gives at the other trace's sizes (None where a shadow is unknown)."""
    shadows = [o.shadow if isinstance(o, _Watched) else o if type(o) in (int, float) else None for o in other]
    if number.shadow is None or None in shadows:
        return None
    try:
        return method(base(number.shadow), *shadows)
    except (ZeroDivisionError, ValueError, OverflowError, TypeError):
        return None


def _differs(number: _Watched, other: tuple) -> bool:
    """Whether an operand differs between the two traces (so a result equal to its shadow folded them)."""
    return any(isinstance(o, _Watched) and o.shadow is not None and o.shadow != _plain(o) for o in (number, *other))


#: Operations that can give one number at two sizes, by the sign the user wrote.
_FOLDING = {"__floordiv__": "//", "__rfloordiv__": "//", "__mod__": "%", "__rmod__": "%", "__rshift__": ">>",
            "__rrshift__": ">>", "__and__": "&", "__rand__": "&", "__or__": "|", "__ror__": "|", "__xor__": "^",
            "__rxor__": "^", "__abs__": "abs", "bit_length": "bit_length", "bit_count": "bit_count",
            "__round__": "round"}  # fmt: skip


def _truth(self) -> bool:
    self._told(f"a truth test of the dynamic size {_plain(self)!r}")
    return _plain(self) != 0


def _plain(number):
    """A watched number as the plain int or float it is (comparing it would tell the trace)."""
    return int.__int__(number) if isinstance(number, int) else float.__float__(number)


for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
    setattr(WatchedSize, _name, _comparison(_name))
    setattr(WatchedFloat, _name, _float_comparison(_name))
_SHARED = ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__neg__", "__pow__", "__abs__",
           "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__")  # fmt: skip
for _name in (*_SHARED, "__lshift__", "__rlshift__", "__rshift__", "__rrshift__", "__and__", "__rand__", "__or__",
              "__ror__", "__xor__", "__rxor__"):  # fmt: skip
    setattr(WatchedSize, _name, _arithmetic(int, _name))
for _name in (*_SHARED, "__rpow__"):
    setattr(WatchedFloat, _name, _arithmetic(float, _name))


def _reading(base: type, name: str, what: str):
    """A read of a watched number by something else than a comparison -- its hash (a set of it, a dict
    looked up by it), its text -- that the user's code may branch on: told, as a comparison is."""
    method = getattr(base, name)

    def read(self, *args):
        self._told(f"{what} of the dynamic size {_plain(self)!r}")
        return method(self, *args)

    read.__name__ = name
    return read


for _name, _what in (("__hash__", "a hash (a set of it, a dict looked up by it)"), ("__str__", "str()"),
                     ("__repr__", "repr()"), ("__format__", "format(), an f-string")):  # fmt: skip
    setattr(WatchedSize, _name, _reading(int, _name, _what))
    setattr(WatchedFloat, _name, _reading(float, _name, _what))
# Conversions to a plain number: Python hands back an exact int or float (never a subclass), whose
# arithmetic the trace cannot follow (``int(n) // 4``, ``math.floor(float(n) / 4)``)
for _name, _what in (("__int__", "int()"), ("__index__", "__index__()"), ("__float__", "float()"),
                     ("to_bytes", "to_bytes()")):  # fmt: skip
    setattr(WatchedSize, _name, _reading(int, _name, _what))
for _name, _what in (("__float__", "float()"), ("hex", "hex()"), ("as_integer_ratio", "as_integer_ratio()"),
                     ("is_integer", "is_integer()")):  # fmt: skip
    setattr(WatchedFloat, _name, _reading(float, _name, _what))
for _name in ("bit_length", "bit_count"):
    setattr(WatchedSize, _name, _arithmetic(int, _name))
_round_size = _arithmetic(int, "__round__")


def _itself(self, *args):
    """``math.floor``, ``math.ceil``, ``math.trunc`` of an int, ``.real``, ``.numerator``, ``.conjugate()``:
    the number itself, still watched (int's own give a plain int)."""
    return self


def _round(self, ndigits=None):
    return self if ndigits is None else _round_size(self, ndigits)


def _divmod(self, other):
    return self // other, self % other  # (Python's divmod, as its two operators: each watched)


def _rdivmod(self, other):
    return other // self, other % self


for _name, _method in (("__floor__", _itself), ("__ceil__", _itself), ("__trunc__", _itself),
                       ("conjugate", _itself), ("__round__", _round)):  # fmt: skip
    setattr(WatchedSize, _name, _method)
for _cls in (WatchedSize, WatchedFloat):
    _cls.__divmod__ = _divmod  # type: ignore[method-assign,assignment]
    _cls.__rdivmod__ = _rdivmod  # type: ignore[method-assign,assignment]
    _cls.real = property(_itself)  # type: ignore[method-assign,assignment]
WatchedSize.numerator = property(_itself)  # type: ignore[method-assign,assignment]
WatchedFloat.conjugate = _itself  # type: ignore[method-assign]
WatchedSize.__bool__ = _truth  # type: ignore[method-assign]
WatchedFloat.__bool__ = _truth  # type: ignore[method-assign]


def plain_ints(value):
    """``value`` (an op's attributes) with every ``WatchedSize`` an int again (a ``WatchedFloat`` a float)."""
    if isinstance(value, WatchedSize):
        return int.__int__(value)
    if isinstance(value, WatchedFloat):
        return float.__float__(value)
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
