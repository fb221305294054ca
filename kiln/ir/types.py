"""Devices and the static type of a tensor value: ``TensorType(shape, dtype, device)``.

A dimension (``Dim``) is an int or a ``Sym``: a named size known only when the graph runs (a
batch size). A symbol stands for the same size wherever it appears in one graph; running the
graph binds each symbol to one size (``TensorType.bind``). Sizes that need every dimension's
value (``numel``, ``nbytes``) raise ``SymbolicShapeError`` on a symbolic type rather than
answering something an int-minded caller could misuse; ``is_static`` says which case holds.

>>> from kiln.ir.dtypes import float32
>>> B = Sym("B")
>>> t = TensorType((B, 128), float32)
>>> print(t, t.is_static, t.bind({B: 4}).numel)
f32[B,128] False 512
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .dtypes import BY_NAME, DType

#: What a symbol's name may be: an identifier, and none of the words that the text form reads as
#: something else (dtype names, None, True, False, inf, nan).
_SYM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
RESERVED_NAMES = frozenset(BY_NAME) | {"None", "True", "False", "inf", "nan"}


class SymbolicShapeError(TypeError):
    """An operation needs concrete sizes (an element count, a byte size, an op's shape rule that
    does not handle symbols yet) but was given a symbolic dimension."""


@dataclass(frozen=True)
class Sym:
    """A symbolic dimension: a size named ``name``, bound when the graph runs. Equal by name.

    >>> Sym("B") == Sym("B"), str(Sym("B"))
    (True, 'B')
    """

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SYM_NAME.match(self.name) or self.name in RESERVED_NAMES:
            raise ValueError(
                f"a symbolic dimension's name is an identifier ([A-Za-z_][A-Za-z0-9_]*) other than a dtype name, "
                f"None, True, False, inf or nan; got {self.name!r}"
            )

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Sym({self.name!r})"


@dataclass(frozen=True)
class SymProduct(Sym):
    """A size that is a product of symbols times a whole number (``3*T``, ``B*T``): what flattening a
    symbolic dimension with others makes (``x.view(-1, C)`` of a ``(3, T, C)`` tensor). It is a
    symbol of its own to everything that treats sizes as opaque (a kernel's size slot, a loop
    bound), and binds from its factors (``dim_size``). Make one with ``sym_product``.

    >>> p = sym_product(3, [Sym("T")])
    >>> str(p), dim_size(p, {Sym("T"): 5})
    ('3*T', 15)
    """

    factors: tuple[Sym, ...] = ()
    scale: int = 1

    def __post_init__(self) -> None:
        if len(self.factors) + (self.scale != 1) < 2 or self.scale < 1:
            raise ValueError(f"a symbolic product needs two factors or more, got {self.scale} and {self.factors}")
        if any(isinstance(f, SymProduct) for f in self.factors):
            raise ValueError(f"a symbolic product's factors are symbols or sums, got {self.factors}")

    def __str__(self) -> str:
        return "*".join([*([str(self.scale)] if self.scale != 1 else []), *map(str, self.factors)])

    def __repr__(self) -> str:
        return f"sym_product({self.scale}, {list(self.factors)!r})"


@dataclass(frozen=True)
class SymSum(Sym):
    """A size that is a sum of symbols (or products of them) and a whole number, floor-divided by a
    whole number: ``(terms + offset) // divisor``. What joining along a dynamic axis makes (``T+1``
    for a KV cache grown by one step) and what a window makes of a dynamic image size (a conv's
    ``(H-3)//1+1`` is ``(H-2)``, a stride-2 pool's ``(H-2)//2``). Like ``SymProduct`` it is a symbol
    of its own to everything that treats sizes as opaque and binds from its terms (``dim_size``). Make
    one with ``sym_sum``; ``str`` gives its text form, always parenthesized.

    >>> h = sym_sum([Sym("H")], -2)
    >>> str(h), dim_size(h, {Sym("H"): 10}), str(sym_sum([h], 1, 2))
    ('(H-2)', 8, '(H-1)//2')
    """

    terms: tuple[Sym, ...] = ()
    offset: int = 0
    divisor: int = 1

    def __post_init__(self) -> None:
        if not self.terms or self.divisor < 1 or any(isinstance(t, SymSum) for t in self.terms):
            raise ValueError(f"a symbolic sum needs terms that are symbols or products, got {self.terms}")
        if len(self.terms) == 1 and self.offset == 0 and self.divisor == 1:
            raise ValueError(f"a symbolic sum of one term and nothing else is that term ({self.terms[0]})")

    def __str__(self) -> str:
        inner = "+".join(map(str, self.terms)) + (f"{self.offset:+d}" if self.offset else "")
        return f"({inner})" + (f"//{self.divisor}" if self.divisor != 1 else "")

    def __repr__(self) -> str:
        return f"sym_sum({list(self.terms)!r}, {self.offset}, {self.divisor})"


Dim = int | Sym


def sym_sum(terms: Iterable[Dim], offset: int = 0, divisor: int = 1) -> Dim:
    """``(sum of terms + offset) // divisor`` as one dimension: an int when no term is symbolic, the
    term itself when it is one term plus nothing, else a ``SymSum`` (terms sorted by name). A term
    that is a sum itself is flattened into this one; a sum with a divisor may be a term only alone
    (``((H-1)//2 + c) // n`` is ``(H-1+c*2)//(2*n)``), else ``SymbolicShapeError``."""
    terms = list(terms)
    plain: list[Sym] = []
    for t in terms:
        if isinstance(t, SymSum) and t.divisor == 1:
            plain.extend(t.terms)
            offset += t.offset
        elif isinstance(t, SymSum):
            if len(terms) != 1:
                raise SymbolicShapeError(f"a sum of the floor-divided size {t} and other sizes is not supported")
            return sym_sum(t.terms, t.offset + offset * t.divisor, t.divisor * divisor)
        elif isinstance(t, Sym):
            plain.append(t)
        else:
            offset += int(t)
    if divisor < 1:
        raise ValueError(f"a symbolic sum's divisor is a whole number >= 1, got {divisor}")
    if divisor > 1 and plain and all(dim_factors(t)[0] % divisor == 0 for t in plain):
        # (d*m + c) // d is m + c // d: a stride-2 window over a size twice another is that size
        divided = [sym_product(dim_factors(t)[0] // divisor, dim_factors(t)[1]) for t in plain]
        return sym_sum(divided, offset // divisor)
    if not plain:
        return offset // divisor
    if len(plain) == 1 and offset == 0 and divisor == 1:
        return plain[0]
    ordered = tuple(sorted(plain, key=lambda t: t.name))
    sign = "m" if offset < 0 else ""
    name = "_".join(["a", *(t.name for t in ordered), f"{sign}{abs(offset)}", f"d{divisor}"])
    return SymSum(name, ordered, offset, divisor)


def parse_dim(text: str) -> Dim:
    """The dimension whose text form (``str``) is ``text``: a size, a symbol, a product (``3*T``), a
    sum (``(H-2)//2``, ``(B+T+1)``) or a product of these; ValueError when ``text`` is none of them."""
    factors: list[Dim] = []
    for part in _split_top(text, "*"):
        if part.isdigit():
            factors.append(int(part))
        elif part.startswith("("):
            inner, _, divisor = part[1:].rpartition(")")
            if divisor and not (divisor.startswith("//") and divisor[2:].isdigit()):
                raise ValueError(f"a symbolic sum is '(terms)' or '(terms)//n', got {part!r}")
            terms: list[Dim] = []
            for sign, term in _signed_terms(inner):
                if sign < 0 and not term.isdigit():
                    raise ValueError(f"a symbolic sum subtracts whole numbers only, got {inner!r}")
                terms.append(sign * int(term) if term.isdigit() else parse_dim(term))
            factors.append(sym_sum(terms, 0, int(divisor[2:]) if divisor else 1))
        else:
            factors.append(Sym(part))
    return factors[0] if len(factors) == 1 else sym_product(1, factors)


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside parentheses."""
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == sep and depth == 0:
            parts.append(text[start:k])
            start = k + 1
    return [*parts, text[start:]]


def _signed_terms(text: str) -> list[tuple[int, str]]:
    """``(sign, term)`` for each term of ``a+b-3``."""
    out, sign, start, depth = [], 1, 0, 0
    for k, ch in enumerate(text + "+"):
        depth += (ch == "(") - (ch == ")")
        if ch in "+-" and k > start and depth == 0:
            out.append((sign, text[start:k]))
            sign, start = (1 if ch == "+" else -1), k + 1
    return out


def sym_product(scale: int, factors) -> Dim:
    """``scale`` times the product of ``factors`` (symbols or products of them) as one dimension: an
    int when there is no symbol, the symbol itself when it is one symbol times 1, else a
    ``SymProduct`` (its factors sorted by name, so one product has one spelling)."""
    plain: list[Sym] = []
    for f in factors:
        if isinstance(f, SymProduct):
            scale *= f.scale
            plain.extend(f.factors)
        elif isinstance(f, Sym):
            plain.append(f)
        else:
            scale *= int(f)
    if not plain or scale == 0:
        return scale
    if scale == 1 and len(plain) == 1:
        return plain[0]
    ordered = tuple(sorted(plain, key=lambda f: f.name))
    return SymProduct("_".join(["p", str(scale), *(f.name for f in ordered)]), ordered, scale)


def dim_factors(d: Dim) -> tuple[int, tuple[Sym, ...]]:
    """``(scale, symbols)`` whose product is ``d`` (a plain symbol is ``(1, (d,))``)."""
    if isinstance(d, SymProduct):
        return d.scale, d.factors
    if isinstance(d, Sym):
        return 1, (d,)
    return d, ()


def plain_symbol(d: Dim) -> tuple[Sym, int] | None:
    """``(symbol, offset)`` when a dimension of size ``n`` binds ``symbol`` to ``n - offset``: a plain
    symbol (offset 0) or a symbol plus a whole number (``(s0+2)``, a padded image); else None."""
    if isinstance(d, SymSum):
        term = d.terms[0]
        if len(d.terms) == 1 and d.divisor == 1 and type(term) is Sym:
            return term, d.offset
        return None
    return (d, 0) if type(d) is Sym else None


def base_symbols(d: Dim) -> set[Sym]:
    """The plain symbols ``d`` binds from: itself, or the symbols of a product's factors or a sum's terms."""
    if isinstance(d, SymProduct):
        return set().union(*map(base_symbols, d.factors))
    if isinstance(d, SymSum):
        return set().union(*map(base_symbols, d.terms))
    return {d} if isinstance(d, Sym) else set()


def dim_size(d: Dim, sizes: Mapping[Sym, int]) -> int:
    """The size of dimension ``d`` when each symbol has its size in ``sizes`` (KeyError names a
    missing one)."""
    if isinstance(d, SymProduct):
        return d.scale * math.prod(dim_size(f, sizes) for f in d.factors)
    if isinstance(d, SymSum):
        return (sum(dim_size(t, sizes) for t in d.terms) + d.offset) // d.divisor
    if isinstance(d, Sym):
        if d not in sizes:
            raise KeyError(f"symbolic dimension {d} has no size (bound: {_bound_text(sizes)})")
        return int(sizes[d])
    return d


def is_static(shape: Iterable[Dim]) -> bool:
    """True when every dimension is an int."""
    return all(isinstance(d, int) for d in shape)


def shape_symbols(shape: Iterable[Dim]) -> tuple[Sym, ...]:
    """The symbols of ``shape``, each once, in order of appearance."""
    return tuple(dict.fromkeys(d for d in shape if isinstance(d, Sym)))


def bind_shape(shape: Iterable[Dim], sizes: Mapping[Sym, int]) -> tuple[int, ...]:
    """``shape`` with each symbol replaced by its size in ``sizes`` (KeyError names a missing one)."""
    return tuple(dim_size(d, sizes) for d in shape)


def _bound_text(sizes: Mapping[Sym, int]) -> str:
    return ", ".join(f"{s}={n}" for s, n in sizes.items()) or "none"


@dataclass(frozen=True, eq=False)
class Device:
    """A device: ``Device("cpu")`` or ``Device("cuda", 0)``. Interned by ``device()``, so equality
    and hashing are by identity (a C-level hash: devices are dictionary keys on the hot path)."""

    type: str
    index: int | None = None

    def __reduce__(self):  # unpickle to the interned instance
        return (device, (str(self),))

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        index = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{index})"


_DEVICES: dict[tuple[str, int | None], Device] = {}
DEVICE_TYPES = ("cpu", "cuda")


def device(spec: object = "cpu", index: int | None = None) -> Device:
    """Parse ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``Device`` into the interned ``Device``.

    >>> device("cuda:1")
    device(type='cuda', index=1)
    """
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"expected a device such as 'cpu' or 'cuda:0', got {spec!r}")
    kind, _, idx = spec.partition(":")
    if kind not in DEVICE_TYPES or (idx and not idx.isdigit()):
        raise ValueError(f"expected a device such as 'cpu', 'cuda' or 'cuda:0', got {spec!r}")
    if idx:
        index = int(idx)
    if kind == "cpu":
        index = None
    elif index is None:
        index = 0
    key = (kind, index)
    if key not in _DEVICES:
        _DEVICES[key] = Device(kind, index)
    return _DEVICES[key]


CPU = device("cpu")


@dataclass(frozen=True)
class TensorType:
    shape: tuple[Dim, ...]
    dtype: DType
    device: Device = CPU

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        """True when no dimension is symbolic."""
        return is_static(self.shape)

    @property
    def symbols(self) -> tuple[Sym, ...]:
        """The symbolic dimensions of the shape, each once, in order."""
        return shape_symbols(self.shape)

    @property
    def numel(self) -> int:
        """The number of elements; ``SymbolicShapeError`` for a symbolic shape (bind it first)."""
        try:
            return math.prod(self.shape)  # type: ignore[arg-type]
        except TypeError:  # a Sym: fail loudly, never a product an int-minded caller would misuse
            raise SymbolicShapeError(
                f"the number of elements of {self} depends on its symbolic dimensions; bind them first (TensorType.bind)"
            ) from None

    @property
    def nbytes(self) -> int:
        """The size in bytes; ``SymbolicShapeError`` for a symbolic shape (bind it first)."""
        return self.numel * self.dtype.itemsize

    def bind(self, sizes: Mapping[Sym, int]) -> TensorType:
        """The same type with each symbol replaced by its size in ``sizes``."""
        return self if self.is_static else TensorType(bind_shape(self.shape, sizes), self.dtype, self.device)

    def __str__(self) -> str:
        return f"{self.dtype.short}[{','.join(map(str, self.shape))}]"
