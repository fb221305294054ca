"""How two traces' sizes are spelled over the dynamic symbols (``dynamic.symbolize``).

Two traces of one call at two sizes give each size as two numbers. A number pair is a symbol
(``s0``), a product of symbols and a whole number (``3*s0``), a symbol plus a whole number
(``(s0+1)``, where a padded image's inside ends), or a size a shape rule derived earlier in the
graph (a conv's ``(s0-2)``), which ``Pairs`` learns as the graph is built. Derived sizes make one
pair spellable several ways (``s0`` and ``2*((s0+1)//2)`` agree at even sizes): the spellings are
tried in turn where a shape rule can check them (attributes), and the graph's own sizes come first.
"""

from __future__ import annotations

import itertools
import math
import zlib

from ...ir.types import (
    Dim,
    Sym,
    SymProduct,
    SymSum,
    TensorType,
    base_symbols,
    dim_size,
    is_static,
    sym_product,
    sym_sum,
)


class NotDynamic(Exception):
    """The two traces differ in a way a symbolic size cannot express: the call stays static."""


#: The most symbols one size is searched as a product of (``B*T*T``: 3).
_MOST_FACTORS = 3


class Pairs(dict):
    """``(size in one trace, in the other)`` -> the symbol (or derived size) it is, and the sizes the
    symbolic graph has so far (``known``: every dim and element count of its values, as
    ``signature``s). Derived sizes make two numbers spellable several ways (``s0`` and
    ``2*((s0+1)//2)`` agree at even sizes); a spelling the graph already has is the likeliest."""

    def __init__(self) -> None:
        super().__init__()
        self.known: set[tuple[int, ...]] = set()
        self.floors: set[tuple] = set()  # the floor divisions of its sizes, up to a whole number added

    def learn(self, t: TensorType) -> None:
        """Know the sizes of a value of type ``t``: each run of its dims flattened (a dim alone, the
        rows a reshape makes of several, all of them: its element count)."""
        if not t.is_static:
            self.floors.update(_floor_key(f) for d in t.shape for f in floors(d))
            n = t.ndim
            runs = (t.shape[i:j] for i in range(n) for j in range(i + 1, n + 1))
            self.known.update(signature(sym_product(1, run)) for run in runs if not is_static(run))


#: Sizes each symbol takes in the probes that tell two spellings of a size apart (``signature``).
_PROBES = 3


def signature(d: Dim) -> tuple[int, ...]:
    """``d`` evaluated where each symbol has a few arbitrary large sizes: two spellings of one size
    agree there, two that only coincide at the traced sizes almost never do."""
    out = []
    for k in range(_PROBES):
        sizes = {s: 61 + zlib.crc32(s.name.encode()) % 1009 * (k + 2) + k for s in base_symbols(d)}
        out.append(dim_size(d, sizes))
    return tuple(out)


def size_expression(x: Dim, y: Dim, by_pair) -> Sym | None:
    """The symbol, or the product of a whole number >= 1 and the fewest symbols, that is ``x`` in the
    first trace and ``y`` in the second (``3*T`` for a ``(3, T)`` tensor flattened); None if none is."""
    return next(size_expressions(x, y, by_pair), None)


def size_expressions(x: Dim, y: Dim, by_pair):
    """Every size ``size_expression`` could answer, the likeliest first: sizes derived from the
    dynamic ones (a conv's ``(s0-2)``) may make the same two numbers in several ways; those the
    graph already has come first."""
    known: set = getattr(by_pair, "known", set())
    # A floor division (a stride's window count) is taken only where the graph has it (plus a whole
    # number): Python that rounds up makes a floor's numbers at two sizes of one remainder only.
    have: set = getattr(by_pair, "floors", set())
    found = [d for d in itertools.islice(_spellings(x, y, by_pair), MOST_SIZES)
             if all(_floor_key(f) in have for f in floors(d))]  # fmt: skip
    # the graph's own sizes first, then those with the fewest floor divisions (a padded (W+2) before
    # 2*((W+1)//2)+1, which is the same at odd sizes only)
    return iter(sorted(found, key=lambda d: (signature(d) not in known, len(floors(d)))))


def _floor_key(f) -> tuple:
    """What ``(H+1)//2`` and ``(H+3)//2`` (that plus 1) share."""
    return (f.terms, f.divisor, f.offset % f.divisor)


def floors(d: Dim) -> list[SymSum]:
    """The floor divisions in size ``d`` (``(H-1)//2`` in ``2*((H-1)//2)+1``), outermost first."""
    if isinstance(d, SymSum) and d.divisor > 1:
        return [d]
    if isinstance(d, SymSum):
        return [f for t in d.terms for f in floors(t)]
    if isinstance(d, SymProduct):
        return [f for t in d.factors for f in floors(t)]
    return []


def ambiguous(spellings: list) -> bool:
    """Whether the first of ``spellings`` is one of several different sizes none of which the graph has."""
    return len({signature(d) for d in spellings}) > 1


def _spellings(x: Dim, y: Dim, by_pair):
    if (x, y) in by_pair:
        yield by_pair[(x, y)]
    if isinstance(x, bool) or not isinstance(x, int) or not isinstance(y, int) or x < 2 or y < 2:
        return
    symbols = list(by_pair.items())
    for count in range(1, _MOST_FACTORS + 1):
        for chosen in itertools.combinations_with_replacement(symbols, count):
            in_a = math.prod(size_a for (size_a, _), _ in chosen)
            in_b = math.prod(size_b for (_, size_b), _ in chosen)
            if x % in_a == 0 and y == x // in_a * in_b and (count > 1 or x != in_a):
                yield sym_product(x // in_a, [sym for _, sym in chosen])
    # a size plus a whole number: where a padded image's inside ends (``(s0+1)``), the fewest added
    offsets = sorted(((x - a, sym) for (a, b), sym in symbols if x - a == y - b), key=lambda o: abs(o[0]))
    for offset, sym in offsets:
        yield sym_sum([sym], offset)


#: The most ways of spelling one size, and a node's attributes, tried before the call stays static.
MOST_SIZES, MOST_SPELLINGS = 8, 64


def attr_choices(op: str, key: str, a, b, by_pair, where: str) -> list:
    """The spellings of attribute ``key`` (``a`` in one trace, ``b`` in the other) over the symbols,
    the likeliest first; ``NotDynamic`` when a number in it has none."""
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        parts = [attr_choices(op, key, x, y, by_pair, where) for x, y in zip(a, b, strict=True)]
        return list(itertools.islice(itertools.product(*parts), MOST_SPELLINGS))
    if type(a) is type(b) and (a == b or (a != a and b != b)):
        return [a]
    sizes = list(itertools.islice(size_expressions(a, b, by_pair), MOST_SIZES)) if type(a) is type(b) is int else []
    if sizes:
        return sizes
    raise NotDynamic(f"{op}'s attribute {key} is {a!r} at one size and {b!r} at the other{where}: a size computed "
                     "from a dynamic one that is no symbol, product, or symbol plus a whole number (a floor "
                     "division: max_pool2d(x, 2) splits H into H // 2 windows of 2)")  # fmt: skip
