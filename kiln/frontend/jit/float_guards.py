"""Comparisons of dynamic floats kept as guards: a branch on a float need not key it by value.

A watched trace (``scalar_args.py``, ``state_floats.py``) that met a comparison of a watched float --
``if lam > 0.5``, ``min(lr, 1.0)``, ``beta = max(0.0, beta)``, kiln's own ``0 <= p <= 1`` of dropout's
``p`` -- kept the float keyed by value: at a third value the branch might go the other way. When the
comparison comes out the same at both traced values, and Python can compute both of its sides again
from the floats' values at a later call -- a float itself, or a number computed from them by sums,
products, quotients and powers (``WatchedScalar.expression``) -- the trace keeps it instead
(``Trace.scalar_guards``): the program that serves every value serves the calls whose floats compare
alike (``FloatGuard.miss``), and another call traces again. A comparison that comes out otherwise at
the two values keeps this trace keyed by value (``Trace.scalar_split``), and a later pair of values on
one side may still agree. PyTorch guards its unspecialized floats' comparisons the same way.

Expressions are trees of tuples: ``("arg", position)`` (a float argument, ``leaves[position]``),
``("entry", table, key)`` (a float of Python state, ``table[key]``), ``("number", value)``, or
``(method, *operands)`` (a ``float`` method: ``("__rsub__", ("arg", 1), ("number", 1))`` is ``1 - lam``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SIGNS = {"__eq__": "==", "__ne__": "!=", "__lt__": "<", "__le__": "<=", "__gt__": ">", "__ge__": ">=",
         "__bool__": "!= 0"}  # fmt: skip


def expression(number, roots: dict[int, tuple]) -> tuple | None:
    """``number`` as an expression over ``roots`` (the watched floats by id, each as its source), or None
    where Python computed it in a way a guard cannot repeat (a floor division, C code)."""
    found = roots.get(id(number))
    if found is not None:
        return found
    if type(number) in (int, float, bool):
        return ("number", number)
    steps = getattr(number, "expression", None)
    if steps is None:
        return None
    name, *operands = steps
    parts = [expression(operand, roots) for operand in operands]
    return None if any(part is None for part in parts) else (name, *parts)


def evaluate(tree: tuple, leaves: list):
    """The value of an expression at a call with these flattened arguments."""
    kind = tree[0]
    if kind == "arg":
        return leaves[tree[1]]
    if kind == "entry":
        return tree[1][tree[2]]
    if kind == "number":
        return tree[1]
    first, *others = (evaluate(part, leaves) for part in tree[1:])
    return getattr(float, kind)(float(first), *others)


def text(tree: tuple) -> str:
    """An expression in words, for ``kiln.explain`` and a miss's reason."""
    kind = tree[0]
    if kind == "arg":
        return f"argument {tree[1]}"
    if kind == "entry":
        return str(tree[3]) if len(tree) > 3 else f"[{tree[2]!r}]"
    if kind == "number":
        return repr(tree[1])
    parts = [text(part) for part in tree[1:]]
    return f"{kind.strip('_')}({', '.join(parts)})"


@dataclass(frozen=True, eq=False)
class FloatGuard:
    """A comparison Python made of dynamic floats during the trace (``lam > 0.5`` was False): the program
    serves only calls at which it comes out the same."""

    left: tuple
    comparison: str  # a float method: "__gt__", "__bool__"
    right: tuple | None  # (None for a truth test)
    result: Any
    where: str  # the line that compared

    def miss(self, leaves: list) -> str | None:
        """Why this call's floats do not keep the guard (None when they do)."""
        try:
            left = evaluate(self.left, leaves)
            args = () if self.right is None else (evaluate(self.right, leaves),)
            result = getattr(float, self.comparison)(float(left), *args)
        except (ArithmeticError, ValueError, TypeError, KeyError, IndexError) as error:
            return f"{self} could not be computed again ({type(error).__name__}: {error})"
        if result == self.result:
            return None
        return f"{self} is {result} now, not {self.result} as traced ({self.where})"

    def __str__(self) -> str:
        right = "" if self.right is None else f" {text(self.right)}"
        return f"{text(self.left)} {SIGNS.get(self.comparison, self.comparison)}{right}"


def guards(recorded: list[tuple], roots: dict[int, tuple]) -> list[FloatGuard] | None:
    """The guards of a watched trace's comparisons ``(number, comparison, other, result, where)``
    (``Trace.scalar_guards``), its watched floats ``roots`` (by id, each as its source); None when one
    side of one cannot be computed again (then the floats stay keyed by value)."""
    out: dict[tuple, FloatGuard] = {}
    for number, comparison, other, result, where in recorded:
        left = expression(number, roots)
        right = None if comparison == "__bool__" else expression(other, roots)
        if left is None or (right is None and comparison != "__bool__"):
            return None
        guard = FloatGuard(left, comparison, right, result, where)
        out.setdefault((_key(left), comparison, _key(right), result), guard)  # (a loop compares alike again)
    return list(out.values())


def _key(tree: tuple | None):
    """An expression as a hashable key (a table by its id)."""
    if tree is None:
        return None
    if tree[0] == "entry":
        return ("entry", id(tree[1]), tree[2])
    if tree[0] in ("arg", "number"):
        return (tree[0], type(tree[1]), tree[1])
    return (tree[0], *(_key(part) for part in tree[1:]))
