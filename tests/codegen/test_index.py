"""The index algebra's division: linear where the variables' ranges allow it, checked by brute force
over the domain; in particular a reshape that merges dims into rows, read back from (row, column),
keeps the column a plain variable (``(10000*r + j) // 350000 == r // 35``), which is what lets such a
reduction kernel vectorize its row loop."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kiln.codegen import index as ix


def _value(e: ix.Lin, point) -> int:
    total = e.const
    for atom, c in e.terms:
        if isinstance(atom, int):
            total += c * point[atom]
        else:
            inner = _value(atom.expr, point)
            total += c * (inner // atom.divisor if isinstance(atom, ix.Div) else inner % atom.divisor)
    return total


def _variables(e: ix.Lin) -> set:
    out: set = set()
    for atom, _ in e.terms:
        out |= {atom} if isinstance(atom, int) else {("div-or-mod", v) for v in atom.expr.variables()}
    return out


@pytest.mark.parametrize(
    "sizes, coefs, const, d",
    [
        ((6, 10), (10, 1), 0, 30),  # merged rows: r // 3, and j stays linear
        ((6, 10), (10, 1), 0, 10),
        ((4, 3, 5), (15, 5, 1), 2, 15),
        ((5, 7), (14, 1), 1, 28),  # g = 14, B = j + 1 < 14
        ((5, 7), (3, 1), 0, 6),  # no split applies: Div/Mod atoms, still exact
        ((8,), (-4,), 31, 8),
    ],
)
def test_divmod_is_exact_over_the_domain(sizes, coefs, const, d):
    space = ix.Space(sizes)
    e = ix.Lin(const, tuple((j, c) for j, c in enumerate(coefs)))
    quotient, remainder = space.divmod(e, d)
    for point in itertools.product(*map(range, sizes)):
        value = const + sum(c * p for c, p in zip(coefs, point, strict=True))
        assert (_value(quotient, point), _value(remainder, point)) == divmod(value, d)


def test_merged_rows_keep_the_column_linear():
    space = ix.Space((1120, 10000))
    row_major = ix.Lin(0, ((0, 10000), (1, 1)))
    quotient, remainder = space.divmod(row_major, 350000)
    assert ("div-or-mod", 1) not in _variables(quotient) | _variables(remainder)
    middle, column = space.divmod(row_major, 10000)
    assert column == ix.Lin(0, ((1, 1),)) and np.all([("div-or-mod", 1) not in _variables(middle)])
