"""Python float arguments read as per-call inputs: one program for every value (PyTorch's unspecialized floats).

A compiled call is keyed by its plain arguments' values, so a float argument that changes at every
call (a learning rate passed in, mixup's ``lam``, a loss weight being annealed, a temperature) made
a new trace and compile per value, up to the recompile limit, and eager calls after it. PyTorch's
``torch.compile`` makes such a float a graph input once a second value is seen; kiln does too:

- **Every trace reads its float arguments as inputs** (the arguments themselves, and floats in a dict
  or list the caller passes: ``float_places``). Where a trace's op takes the
  argument's float object itself as an operand (``x * lr``: ``ops._util.scalar_tensor`` meets the
  very object the caller passed, ``tagged``), it reads a 0-d float64 input of the program, cast to
  the op's dtype as the number would have been, instead of a constant. Per call, the argument's
  value is that input (``Specialization.run``, ``as_inputs``). The key still holds the value, so a
  program traced once serves that value only, and whatever else the call computed from it (``1 -
  lam``, ``math.exp(t)``: new float objects, constants) is right for it.
- **A second value makes the argument dynamic when the two traces agree.** When a call misses only
  because float arguments hold other values (``partner``), it is traced with those arguments as
  ``WatchedScalar``: a float whose conversions (to whole numbers, text, a hash), and those of numbers Python computes
  from it, tell the trace (``Trace.scalar_compared``), and whose comparisons become guards of the
  program (``float_guards.py``: ``if lr > 0.1`` serves the values on its side). If nothing told, and the new trace's
  program is the earlier one's exactly -- the same graph, constants and Python results -- then no
  constant and no branch followed the value: the argument's value reaches the program only through
  its input, and one program serves every value (the key then holds ``ANY`` there). Otherwise the
  argument stays keyed by value (``kiln.explain`` says why).

Numbers Python computes from a watched float are watched too, with their *shadow* (the same number at
the earlier trace's value): one that comes out the same at both values (``abs(lam)`` at -0.5 and 0.5,
``lam // 0.25``) would reach both programs as one constant, so it keeps the argument keyed by value.
Sums, products, quotients and powers become ops of the program (``operand``: ``1 - lam`` is computed
from the input, as Python computed it); a first trace, unwatched, read them as constants, so such a
function settles on its third trace.

What this cannot see, as for watched sizes (``watched_sizes.py``): a number C code computes from the
float (``math.fabs(lam)``, ``numpy.floor(lam)``, ``math.isfinite(scale)``): C reads a float's value
without calling Python, so the number is plain. Where it reaches the program and differs between the
two traces, the comparison of their programs keeps the argument keyed by value; where it is the same
at both (``math.fabs`` at -0.5 and 0.5), or where Python only compares it (``if math.exp(lam) < 3``,
both traced values below), a third value may go the other way, unseen. Nor what tells a watched float
from the caller's own besides its value: its type (``type(lam) is float`` is false for it) and its
identity (``lam is DEFAULT``) -- code that branches on them runs otherwise in a watched call.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Container
from typing import Any

import numpy as np

from ...ir import dtypes as dt
from ...ir.types import CPU
from ..tensor import Tensor, make_tensor
from .float_guards import SIGNS
from .locations import KILN_DIR
from .pytree import LEAF, flatten, unflatten

#: A dynamic float argument's part of the call key: every value alike.
ANY = "any value"


#: A float argument's place in ``float_places``: an argument itself (``f(x, 0.1, lr=0.2)``), which a
#: watched trace passes as a ``WatchedScalar`` in its place.
ARGUMENT = "argument"


def float_places(args: tuple, kwargs: dict) -> dict[int, Any]:
    """The leaf positions of a call's float arguments that a trace reads as inputs, each with its place:
    ``ARGUMENT``, or ``(container, key)`` for one held in a dict or list the caller passed
    (``f(x, {"lr": 0.1})``), where a watched trace stores its ``WatchedScalar`` for the call. A float in
    a tuple (which no trace can store into, and would have to rebuild) stays a constant."""
    places: dict[int, Any] = {}
    count = 0

    def walk(obj, place) -> None:
        nonlocal count
        kind = type(obj)
        if kind is list or kind is dict:
            for key in range(len(obj)) if kind is list else tuple(obj):
                walk(obj[key], (obj, key))
            return
        if isinstance(obj, tuple):
            for item in obj:
                walk(item, None)
            return
        if kind is float and place is not None:
            places[count] = place
        count += 1

    for arg in args:
        walk(arg, ARGUMENT)
    for name in kwargs:
        walk(kwargs[name], ARGUMENT)
    return places


def _count(tree) -> int:
    if tree is LEAF:
        return 1
    subs = tree[2] if tree[0] is dict else tree[1]
    return sum(_count(s) for s in subs)


def partner(earlier: list, key: tuple, tried: Container) -> tuple[Any, tuple[int, ...]] | None:
    """``(spec, positions)``: an earlier specialization whose key differs from ``key`` only in the values
    of float arguments it read as inputs (``spec.scalar_arguments``), at ``positions``; None when none
    does, or this argument structure stopped trying (``tried``: the trees that did)."""
    if key[0] in tried:
        return None
    for other in earlier:
        inputs = getattr(other, "scalar_arguments", ())
        if not inputs or other.key[0] != key[0] or other.key[2:] != key[2:]:
            continue
        positions = []
        for p, (old, new) in enumerate(zip(other.key[1], key[1], strict=True)):
            if old == new:
                continue
            if old[0] is not float or new[0] is not float or p not in inputs or ANY in (old[1], new[1]):
                break
            positions.append(p)
        else:
            if positions:
                return other, tuple(positions)
    return None


def by_value(key: tuple, leaves: list) -> tuple:
    """``key`` with the floats it reads at any value keyed by their values: what a miss under a key that
    has them (a guard that failed: the state it read changed) is traced under. Such a trace reads
    numbers computed from them as constants (unwatched), so it serves its values only; a later value
    compares with it and makes the floats dynamic again (``partner``)."""
    parts = key[1]
    if not any(part[0] is float and part[1] is ANY for part in parts):
        return key
    return (key[0], tuple((float, leaves[p].hex()) if part[0] is float and part[1] is ANY else part
                          for p, part in enumerate(parts)), *key[2:])  # fmt: skip


def number_input(value: float) -> Tensor:
    """The 0-d float64 tensor a program reads for a float argument: the float, exactly."""
    return make_tensor(np.array(value, dtype=np.float64), CPU, dt.float64)


def as_inputs(leaves: list, positions: tuple[int, ...]) -> list:
    """The call's leaves with the floats at ``positions`` as the tensors the program reads."""
    leaves = list(leaves)
    for p in positions:
        leaves[p] = number_input(leaves[p])
    return leaves


def same_program(a, b) -> str | None:
    """None when the traced programs ``a`` and ``b`` (``(graph, python results)``) are the same but
    for source lines; else what differs, in words."""
    from ...ir.printer import print_graph  # noqa: PLC0415

    (graph_a, results_a), (graph_b, results_b) = a, b
    if print_graph(graph_a, locations=False) != print_graph(graph_b, locations=False):
        return "the program differs at the other value"
    for name, array in graph_a.constants.items():
        other = graph_b.constants.get(name)
        if other is None or other.dtype != array.dtype or not np.array_equal(other, array, equal_nan=True):
            return "a constant of the program follows its value (a number computed from it)"
    if results_a != results_b:
        return "a Python number the call returns follows its value"
    return None


def unwatched(result):
    """A traced call's result with every ``WatchedScalar`` in it a plain float (a number the call computed
    from a watched argument is returned as the float it is; its containers are rebuilt only then)."""
    leaves, tree = flatten(result)
    if not any(type(leaf) is WatchedScalar for leaf in leaves):
        return result
    return unflatten(tree, [float(leaf) if type(leaf) is WatchedScalar else leaf for leaf in leaves])


def python_results(out_leaves: list) -> list:
    """The call's results that are not tensors, comparable between two traces (floats by their bits)."""
    return [(type(r), r.hex() if type(r) is float else repr(r)) for r in out_leaves if not isinstance(r, Tensor)]


def operand(trace, value) -> Tensor | None:
    """The float64 tensor of the program that ``value`` is while ``trace`` runs: a float argument's input
    (``tagged``), or the ops computing a number Python computed from watched ones (``WatchedScalar``'s
    ``expression``: ``1 - lam``, ``lr * 0.1``); None for any other number (a constant)."""
    tagged = trace.scalar_args.get(id(value))
    if tagged is not None and tagged[0] is value:
        return tagged[1]
    if type(value) is not WatchedScalar or value.expression is None or value.trace is not trace:
        return None
    name, *operands = value.expression
    tensors = [operand(trace, x) if type(x) is WatchedScalar else x for x in operands]
    if any(t is None for t in tensors):
        return None
    first, *others = tensors
    return getattr(first, name)(*others)  # (float64, as Python's float arithmetic)


class WatchedScalar(float):
    """A float argument while a trace learns whether it may be dynamic (see the module docstring): the
    float it says, whose comparisons, truth test and conversions (to whole numbers, to text, to a hash:
    a set of it, a dict looked up by it) tell ``trace`` while that trace runs. Its arithmetic gives watched floats too, each with its ``expression`` (the
    operator's name and operands) where the program can compute it as Python did (``operand``).

    Each carries its *shadow*, the number it was in the earlier trace (the argument's other value),
    computed alongside: a number that is its shadow though what it came from was not (``abs`` of
    -0.5 and 0.5, ``lam // 0.25`` at 0.5 and 0.625, ``lam * 0``) would reach the two programs as one
    constant, which a third value may not be -- the trace is told, as of a comparison."""

    trace: Any
    shadow: float
    expression: tuple | None = None

    def __new__(cls, value: float, trace, shadow: float, expression: tuple | None = None) -> WatchedScalar:
        self = super().__new__(cls, value)
        self.trace, self.shadow, self.expression = trace, shadow, expression
        return self

    def __reduce__(self):  # pickled (a checkpoint of state it was stored in) as the plain float it is
        return (float, (float(self),))

    def _told(self, what: str) -> None:
        from . import state  # noqa: PLC0415

        trace = self.trace
        if trace.scalar_compared is not None or state.current.get() is not trace:
            return
        where = _where()
        if where is not None:
            trace.scalar_compared = f"{what} {where}"


def _where() -> str | None:
    """Where the user's code (``at file:line``) or kiln's (``in kiln's name``) used a watched float."""
    frame: Any = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:
        return None
    if not frame.f_code.co_filename.startswith(KILN_DIR):
        return f"at {frame.f_code.co_filename}:{frame.f_lineno}"
    return f"in kiln's {frame.f_code.co_name}"


def _telling(name: str, what: str):
    method = getattr(float, name)

    def told(self, *args):
        self._told(what)
        return method(self, *args)

    told.__name__ = name
    return told


def recomputable(number) -> bool:
    """Whether a guard can compute ``number`` again from the watched floats' values at a later call: a
    plain number, a watched float itself, or one computed from those by the operators a program
    computes as Python does (``WatchedScalar.expression``)."""
    if type(number) in (int, float, bool):
        return True
    if type(number) is not WatchedScalar:
        return False
    tagged = number.trace.scalar_args.get(id(number))
    if tagged is not None and tagged[0] is number:
        return True
    steps = number.expression
    return steps is not None and all(recomputable(operand) for operand in steps[1:])


def _comparing(name: str):
    """A comparison (or truth test) of a watched float: a guard of the program when it comes out the same
    at both traced values and both of its sides can be computed again (``float_guards.py``); a split of
    this trace when it comes out otherwise; else told (the float stays keyed by value)."""
    method = getattr(float, name)

    def compared(self, *args):
        from . import state  # noqa: PLC0415

        result = method(self, *args)
        trace = self.trace
        if result is NotImplemented or trace.scalar_compared is not None or state.current.get() is not trace:
            return result
        try:
            shadow = method(self.shadow, *[a.shadow if type(a) is WatchedScalar else a for a in args])
        except (ArithmeticError, ValueError, TypeError):
            shadow = None
        other = args[0] if args else None
        if shadow != result:
            if trace.scalar_split is None:
                trace.scalar_split = f"{SIGNS[name]} {_where()}"
        elif recomputable(self) and (not args or recomputable(other)):
            trace.scalar_guards.append((self, name, other, result, _where()))
        else:
            self._told(f"a comparison of it ({SIGNS[name]}) that kiln cannot compute again")
        return result

    compared.__name__ = name
    return compared


#: Operators whose result a program computes as Python does (IEEE float64 arithmetic, C's ``pow``); a
#: floor division or remainder is watched, but a constant of the program.
_IN_PROGRAM = frozenset({"__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
                         "__rtruediv__", "__pow__", "__rpow__", "__neg__", "__pos__", "__abs__"})  # fmt: skip


def _watching(name: str):
    method = getattr(float, name)
    follows = name in _IN_PROGRAM

    def watched(self, *args):
        result = method(self, *args)
        if type(result) is not float:  # (NotImplemented, or a complex power)
            return result
        plain = all(type(a) in (int, float, WatchedScalar) for a in args) and len(args) <= 1
        try:
            shadow = method(self.shadow, *[a.shadow if type(a) is WatchedScalar else a for a in args])
        except (ArithmeticError, ValueError):  # (0 ** -1 at the other value)
            shadow = math.nan
        if shadow == result or (shadow != shadow and result != result):
            self._told(f"a number computed from it that is the same at both values ({name}: {result!r})")
        return WatchedScalar(result, self.trace, shadow, (name, self, *args) if follows and plain else None)

    watched.__name__ = name
    return watched


for _name in SIGNS:
    setattr(WatchedScalar, _name, _comparing(_name))
for _name, _what in (("__int__", "int()"), ("__trunc__", "int()"), ("__floor__", "math.floor"),
                     ("__ceil__", "math.ceil"), ("__round__", "round()"), ("is_integer", "is_integer()"),
                     ("as_integer_ratio", "as_integer_ratio()"), ("__hash__", "hash(), as a set or a dict's key"),
                     ("__repr__", "repr()"), ("__str__", "str()"), ("__format__", "format(), an f-string"),
                     ("__float__", "float(), a plain copy"), ("hex", "hex()"), ("conjugate", "conjugate()")):  # fmt: skip
    setattr(WatchedScalar, _name, _telling(_name, f"a conversion of it ({_what})"))
WatchedScalar.real = property(_telling("__float__", "a conversion of it (.real, a plain copy)"))  # type: ignore[method-assign,assignment]
for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__neg__", "__pos__",
              "__abs__"):  # fmt: skip
    setattr(WatchedScalar, _name, _watching(_name))
# Python's divmod as its two operators, each watched (float's own gives plain floats)
WatchedScalar.__divmod__ = lambda self, other: (self // other, self % other)  # type: ignore[method-assign,assignment]
WatchedScalar.__rdivmod__ = lambda self, other: (other // self, other % self)  # type: ignore[method-assign,assignment]


def watched_call(args: tuple, kwargs: dict, tree, shadows: dict[int, float], trace,
                 places: dict[int, Any]) -> tuple[tuple, dict, dict, list]:  # fmt: skip
    """``(args, kwargs, watched, stored)``: the call's arguments with the floats at leaf positions
    ``shadows`` (each with its value in the earlier trace) as ``WatchedScalar``s of ``trace``: those that
    are arguments passed so (``places``), those held in a dict or list stored there, for ``restore``
    (``stored``); and each of them by its position (``watched``)."""
    given, kwargs, watched, stored = list(args), dict(kwargs), {}, []
    (_, arg_subs), (_, names, kwarg_subs) = tree[1]
    n = 0
    for j, sub in enumerate([*arg_subs, *kwarg_subs]):
        if sub is LEAF and n in shadows:
            if j < len(given):
                given[j] = watched[n] = WatchedScalar(given[j], trace, shadows[n])
            else:
                name = names[j - len(given)]
                kwargs[name] = watched[n] = WatchedScalar(kwargs[name], trace, shadows[n])
        n += _count(sub)
    for n, shadow in shadows.items():
        place = places.get(n)
        if n not in watched and place is not None and place is not ARGUMENT:
            container, key = place
            watched[n] = WatchedScalar(container[key], trace, shadow)
            stored.append((container, key, watched[n], container[key]))
            container[key] = watched[n]
    return tuple(given), kwargs, watched, stored


def restore(stored: list) -> None:
    """The caller's own floats back where ``watched_call`` stored ``WatchedScalar``s, where they still are."""
    for container, key, number, own in stored:
        try:
            if container[key] is number:
                container[key] = own
        except (KeyError, IndexError):
            pass
