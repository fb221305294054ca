"""Index algebra for fused kernels: which element of each value an element of the domain reads.

A kernel loops over its *domain* (a shape); domain dimension ``j`` has the loop variable ``j``.
The index of a body value that one domain element needs is a tuple of ``Lin`` expressions, one
per dimension of the value: integer linear combinations of *atoms*, where an atom is a domain
variable or, rarely, ``Div``/``Mod`` of another expression by a constant (a reshape that splits
a dimension the domain iterates as one). View nodes transform index tuples (never copy):
``permute`` reorders, ``slice`` scales and shifts, ``expand`` and broadcasting pin size-1
dimensions to 0, ``reshape`` flattens and unflattens. The algebra knows each variable's range,
so ``(8*i + j) // 8`` with ``0 <= j < 8`` simplifies to ``i`` and the usual reshapes stay linear.
A body input's element is then a load at ``sum(index[k] * stride[k])``: a ``Lin`` offset.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod as product

from ..ir.primitives import PRIMITIVES
from ..ir.types import Dim


@dataclass(frozen=True)
class Div:
    """``floor(expr / divisor)`` as an atom."""

    expr: Lin
    divisor: int


@dataclass(frozen=True)
class Mod:
    """``expr mod divisor`` (in ``[0, divisor)``) as an atom."""

    expr: Lin
    divisor: int


Atom = int | Div | Mod  # an int atom is a domain variable's number


def _atom_key(atom: Atom) -> tuple:
    return (0, atom, "") if isinstance(atom, int) else (1, 0, repr(atom))


@dataclass(frozen=True)
class Lin:
    """``const + sum(coef * atom)``; terms sorted, no zero coefficients (so equal means same)."""

    const: int
    terms: tuple[tuple[Atom, int], ...] = ()

    @property
    def is_affine(self) -> bool:
        """True when every atom is a domain variable (no Div/Mod)."""
        return all(isinstance(atom, int) for atom, _ in self.terms)

    def coef(self, var: int) -> int:
        """The coefficient of domain variable ``var`` (0 when absent)."""
        for atom, c in self.terms:
            if atom == var:
                return c
        return 0

    def variables(self) -> set[int]:
        """Every domain variable the expression reads, also inside Div/Mod atoms."""
        out: set[int] = set()
        for atom, _ in self.terms:
            out |= {atom} if isinstance(atom, int) else atom.expr.variables()
        return out


ZERO = Lin(0)


def _make(const: int, coefs: dict[Atom, int]) -> Lin:
    const += _recombine(coefs)
    terms = tuple(sorted(((a, c) for a, c in coefs.items() if c), key=lambda t: _atom_key(t[0])))
    return Lin(const, terms)


def _recombine(coefs: dict[Atom, int]) -> int:
    """Fold ``c*d*(e // d) + c*(e % d)`` back into ``c*e`` (what reshape-then-flatten leaves);
    returns the constant that folding adds."""
    const = 0
    for atom in [a for a in coefs if isinstance(a, Mod)]:
        c = coefs.get(atom, 0)
        div = Div(atom.expr, atom.divisor)
        if c and coefs.get(div, 0) == c * atom.divisor:
            del coefs[atom], coefs[div]
            for inner, k in atom.expr.terms:
                coefs[inner] = coefs.get(inner, 0) + c * k
            const += c * atom.expr.const
    return const


def add(a: Lin, b: Lin) -> Lin:
    coefs = dict(a.terms)
    for atom, c in b.terms:
        coefs[atom] = coefs.get(atom, 0) + c
    return _make(a.const + b.const, coefs)


def scale(a: Lin, k: int) -> Lin:
    if k == 0:
        return ZERO
    return Lin(a.const * k, tuple((atom, c * k) for atom, c in a.terms))


#: The upper bound the algebra assumes for a symbolic dimension's variable (its size is not known).
_UNBOUNDED = 1 << 62


class Space:
    """The domain's variable ranges: variable ``j`` runs over ``range(sizes[j])``; a symbolic size
    (``Sym``, the leading dimension only) is unbounded above."""

    def __init__(self, sizes: Sequence[Dim]) -> None:
        self.sizes = tuple(sizes)

    def var(self, j: int) -> Lin:
        """Domain variable ``j`` (a size-1 dimension's variable is the constant 0)."""
        n = self.sizes[j]
        return Lin(0, ((j, 1),)) if not isinstance(n, int) or n > 1 else ZERO

    def identity(self) -> tuple[Lin, ...]:
        return tuple(self.var(j) for j in range(len(self.sizes)))

    def bounds(self, e: Lin) -> tuple[int, int]:
        """Inclusive lower and upper bounds of ``e`` over the domain."""
        lo = hi = e.const
        for atom, c in e.terms:
            a_lo, a_hi = self._atom_bounds(atom)
            lo += min(c * a_lo, c * a_hi)
            hi += max(c * a_lo, c * a_hi)
        return lo, hi

    def _atom_bounds(self, atom: Atom) -> tuple[int, int]:
        if isinstance(atom, int):
            n = self.sizes[atom]
            return 0, max(n - 1, 0) if isinstance(n, int) else _UNBOUNDED
        lo, hi = self.bounds(atom.expr)
        if isinstance(atom, Div):
            return lo // atom.divisor, hi // atom.divisor
        return 0, atom.divisor - 1

    def divmod(self, e: Lin, d: int) -> tuple[Lin, Lin]:
        """``(e // d, e % d)``, linear where the ranges allow it, else with Div/Mod atoms."""
        if d == 1:
            return e, ZERO
        # e = q*d + r where q collects the terms divisible by d; then e // d = q + r // d.
        q_const, r_const = divmod(e.const, d)
        q: dict[Atom, int] = {}
        r: dict[Atom, int] = {}
        for atom, c in e.terms:
            if c % d == 0:
                q[atom] = c // d
            else:
                r[atom] = c
        rest = _make(r_const, r)
        lo, hi = self.bounds(rest)
        if lo // d == hi // d:  # the rest's quotient is one constant t: rest // d == t, rest % d == rest - t*d
            t = lo // d
            return _make(q_const + t, q), add(rest, Lin(-d * t))
        split = self._split(r_const, r, d)
        if split is not None:
            quotient, remainder = split
            return add(_make(q_const, q), quotient), remainder
        return add(_make(q_const, q), Lin(0, ((Div(rest, d), 1),))), Lin(0, ((Mod(rest, d), 1),))

    def _split(self, const: int, terms: dict[Atom, int], d: int) -> tuple[Lin, Lin] | None:
        """``rest = g*A + B`` with ``g`` dividing ``d`` and ``0 <= B < g``: then ``rest // d == A // (d/g)``
        and ``rest % d == g*(A % (d/g)) + B``. A reshape that merges dims into rows, read back from a
        row index and a column: ``(10000*r + j) // 350000`` is ``r // 35`` (j < 10000), so the column
        stays a plain loop variable that vectorizes, and only the row needs a division."""
        for g in sorted({math.gcd(c, d) for c in terms.values()} - {1, d}, reverse=True):
            big = {atom: c // g for atom, c in terms.items() if c % g == 0}
            small = _make(const, {atom: c for atom, c in terms.items() if c % g})
            lo, hi = self.bounds(small)
            if big and 0 <= lo and hi < g:
                quotient, remainder = self.divmod(_make(0, big), d // g)
                return quotient, add(scale(remainder, g), small)
        return None


# ----------------------------------------------------------------------------- index maps through views


def broadcast(index: tuple[Lin, ...], shape: Sequence[Dim]) -> tuple[Lin, ...]:
    """The index into an operand of ``shape`` broadcast (numpy's right-aligned rule) to ``index``."""
    lead = len(index) - len(shape)
    return tuple(ZERO if n == 1 else index[lead + k] for k, n in enumerate(shape))


class Algebra:
    """The index-algebra namespace the registry's view index maps are written against
    (``kiln.ir.primitives``: ``index_map(ix, index, in_shape, out_shape, **attrs)``), over ``space``."""

    zero = ZERO

    def __init__(self, space: Space) -> None:
        self.space = space

    @staticmethod
    def const(c: int) -> Lin:
        return Lin(c)

    add = staticmethod(add)
    scale = staticmethod(scale)

    def divmod(self, e: Lin, d: int) -> tuple[Lin, Lin]:
        return self.space.divmod(e, d)


def view(space: Space, op: str, index: tuple[Lin, ...], in_shape, out_shape, attrs) -> tuple[Lin, ...]:
    """The index into view ``op``'s input that ``index`` into its output reads (the registry's map)."""
    index_map = PRIMITIVES[op].index_map
    assert index_map is not None, f"{op} is not a view"
    return index_map(Algebra(space), index, tuple(in_shape), tuple(out_shape), **attrs)


def reshape(space: Space, index: tuple[Lin, ...], out_shape: Sequence[Dim], in_shape: Sequence[Dim]) -> tuple[Lin, ...]:
    """Row-major: flatten the output index, unflatten it in the input's shape (``reshape``'s map)."""
    return view(space, "reshape", index, in_shape, out_shape, {"shape": tuple(out_shape)})


def contiguous_strides(shape: Sequence[Dim]) -> tuple[int, ...]:
    """C-order strides in elements (static when only the leading size is symbolic)."""
    return tuple(product(shape[k + 1 :]) for k in range(len(shape)))  # type: ignore[arg-type]  # a Sym leads, never multiplied


def offset(index: tuple[Lin, ...], strides: Sequence[int]) -> Lin:
    """The element offset ``sum(index[k] * strides[k])``."""
    out = ZERO
    for e, s in zip(index, strides, strict=True):
        out = add(out, scale(e, s))
    return out


# ----------------------------------------------------------------------------- collapsing loop dimensions


def static(n: Dim) -> int:
    """``n``, which must be a concrete size here."""
    if not isinstance(n, int):  # the symbolic leading dim has a loop of its own, never collapsed
        raise AssertionError(f"a symbolic size {n} among the loops to collapse")
    return n


def collapse(sizes: Sequence[Dim], dims: Sequence[int], leaves: Sequence[Lin]) -> list[list[int]]:
    """Group consecutive loop dimensions that every leaf addresses as one (``coef[j] == coef[k] * n[k]``).

    ``dims`` are the domain variables to loop over, outermost first; size-1 ones are dropped (their
    variable is the constant 0). Variables read inside Div/Mod atoms stay alone. Each group is then
    one loop whose variable ``m`` stands for ``sum(var[j] * (n[j+1] * ... * n[last]))`` over the group.
    """
    if any(sizes[d] == 0 for d in dims):  # nothing to do: one loop per dim, the empty one runs 0 times
        return [[d] for d in dims]
    blocked: set[int] = set()
    for leaf in leaves:
        for atom, _ in leaf.terms:
            if not isinstance(atom, int):
                blocked |= atom.expr.variables()
    groups: list[list[int]] = []
    for k in (d for d in dims if static(sizes[d]) > 1):
        if groups and k not in blocked and groups[-1][-1] not in blocked:
            j = groups[-1][-1]
            if all(leaf.coef(j) == leaf.coef(k) * static(sizes[k]) for leaf in leaves):
                groups[-1].append(k)
                continue
        groups.append([k])
    return groups
