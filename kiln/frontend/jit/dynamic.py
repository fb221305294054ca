"""Dynamic sizes: one specialization for every size of an argument's dimensions.

A trace runs the function for real, so it sees concrete sizes only. Which sizes of a program follow
an argument's sizes is learned by comparing two traces of the same call at two sizes (as kiln.onnx's
``dynamic_axes`` does): they must have the same nodes, wiring and attributes, and wherever a size
differs it must be one of the arguments' sizes that differ, or a product of them and a whole number,
in both traces (it becomes a ``Sym``, or a ``SymProduct`` such as ``3*T`` where a ``(3, T, C)``
tensor is flattened to rows). A constant whose shape follows the size and holds one value
(``zeros(batch, 10)``) becomes that value expanded; a range or a causal mask built from the size
becomes the ops that compute it (``symbolic_constants.py``); a scalar constant equal to a size or a
product of sizes (a mean's divisor, ``x.sum() / x.shape[0]``) becomes that size, counted in the
graph. A size a shape rule derives from the symbols (a conv's ``(H-2)``, a stride-2 window count
``(H-1)//2``, a cat's ``(T+1)``: ``kiln.ir.types.SymSum``) is taken from the rule where it gives
the traced sizes in both traces, and is then a size later ones are spelled with; where two numbers
could be spelled several ways (``s0`` and ``2*((s0+1)//2)`` agree at even sizes) the spelling the
graph already has wins, and a constant no such spelling settles keeps the call static. Running the
graph checks each derived size again (``bind_graph``): an image smaller than a kernel fails as
eagerly. Anything else (``x.shape[0] // 2`` in an attribute, a constant computed from the size, a
different program at the other size) keeps the call static, and ``kiln.explain`` says why.

Python code reading a dynamic size (``x.shape[1]``) gets the concrete int of the traced call: what
it computes lands in the graph as an attribute or a constant, where the comparison of the two
traces sees it follow the size (a symbol) or not (the call stays specialized on its sizes). A size
Python compares is watched (``watched_sizes.py``): a size as read compared with an int (``assert T
<= block_size``, ``if T > 8``) guards the dynamic program (a size that compares otherwise traces
again, under its own sizes); a size computed from one, or two sizes, compared keeps the call static.

Which dimensions are dynamic: any dimension of a tensor argument, once a second size >= 2 is seen
for it (PyTorch's "automatic dynamic": every dimension that differs between the two traces becomes
a symbol, several at once), marked up front by ``mark_dynamic(t, dim)`` or, for the leading ones,
by ``kiln.compile(dynamic=True)``. Sizes 0 and 1 specialize, as in PyTorch (broadcasting and empty
tensors behave differently there). Arguments whose sizes were equal in both traces share one symbol
(PyTorch's "duck sizing"): the call key holds, per dynamic dimension, which of the call's distinct
sizes it has, so a call where they differ misses and traces again. A tensor whose inner size is
dynamic shares the program only while it is in C order (its strides then follow its sizes).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...ir.dtypes import float32
from ...ir.graph import CONSTANT, Graph, GraphBuilder, Node, Value
from ...ir.types import (
    Sym,
    TensorType,
    bind_shape,
    dim_factors,
    sym_product,
)
from .size_spelling import (
    MOST_SPELLINGS,
    NotDynamic,
    Pairs,
    ambiguous,
    attr_choices,
    signature,
    size_expression,
    size_expressions,
)
from .symbolic_constants import pattern_constant

# ---------------------------------------------------------------------- marking
_MARKED: dict[int, tuple[weakref.ref, frozenset[int]]] = {}


def mark_dynamic(t, dim: int) -> None:
    """Mark dimension ``dim`` of tensor ``t`` dynamic for the ``kiln.compile`` calls it is passed to:
    such a call is traced once and compiled for every size of that dimension (see ``dynamic.py``)
    when the next call brings another size. Marking several dimensions (one call each) makes each
    of them a symbol of its own.

    >>> import kiln
    >>> x = kiln.ones(8, 3)
    >>> kiln.mark_dynamic(x, 0)
    >>> kiln.mark_dynamic(x, -1)
    >>> sorted(kiln.frontend.jit.dynamic.marked_dims(x))
    [0, 1]
    """
    from ..tensor import Tensor  # noqa: PLC0415

    if not isinstance(t, Tensor):
        raise TypeError(f"mark_dynamic expected a tensor, got {type(t).__name__}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -t.ndim <= dim < t.ndim:
        raise IndexError(f"mark_dynamic: dim {dim!r} is out of range for a tensor of {t.ndim} dims")
    key = id(t)

    def forget(_) -> None:
        _MARKED.pop(key, None)

    _MARKED[key] = (weakref.ref(t, forget), marked_dims(t) | {dim % t.ndim})


def marked_dims(t) -> frozenset[int]:
    """The dimensions of ``t`` that ``mark_dynamic`` marked (empty when none)."""
    entry = _MARKED.get(id(t))
    return entry[1] if entry is not None and entry[0]() is t else frozenset()


@dataclass(frozen=True)
class Pending:
    """A trace kept uncompiled (``dynamic=True``, ``mark_dynamic``) until a call brings another size:
    the two traces then make one dynamic specialization."""

    key: tuple
    sizes_source: Graph

    def __str__(self) -> str:
        return "traced with dynamic sizes; compiled once a call brings another size (or the same one again)"


# ---------------------------------------------------------------------- keys
class SizeClass(int):
    """In a call key, a dynamic dimension's size stands as which of the call's distinct dynamic sizes
    it has (0 for the first): calls that differ only in those sizes share a key."""

    def __repr__(self) -> str:
        return f"dynamic{int(self)}"


def sizes_differ(old: tuple, new: tuple) -> list[tuple[int, int]] | None:
    """``(argument part, dimension)`` for each size in which two call keys' tensor parts differ, both
    >= 2; None when anything else differs (a dtype, a rank, a plain argument) or nothing does. Strides
    may differ only where both tensors are in C order (a dynamic inner size changes the outer strides)."""
    if old[0] != new[0] or old[2:] != new[2:] or len(old[1]) != len(new[1]):
        return None
    positions = []
    for i, (a, b) in enumerate(zip(old[1], new[1], strict=True)):
        if a == b:
            continue
        if a[0] != "tensor" or b[0] != "tensor" or a[3:] != b[3:] or len(a[1]) != len(b[1]) or not a[1]:
            return None
        if a[2] != b[2] and not (_c_order(a[1], a[2], a[3]) and _c_order(b[1], b[2], b[3])):
            return None
        for dim, (x, y) in enumerate(zip(a[1], b[1], strict=True)):
            if x == y:
                continue
            if isinstance(x, SizeClass) or isinstance(y, SizeClass) or x < 2 or y < 2:
                return None
            positions.append((i, dim))
    return positions or None


def _c_order(shape: tuple, strides, dtype) -> bool:
    """Whether a key's ``strides`` (bytes, or ``C_ORDER``) lay ``shape`` out in C order."""
    if strides == C_ORDER:
        return True
    expected = dtype.itemsize
    for n, stride in zip(reversed(shape), reversed(strides), strict=True):
        if n != 1 and stride != expected:
            return False
        expected *= n
    return True


#: A call key's strides for a tensor with dynamic sizes laid out in C order: its byte strides
#: change with an inner dynamic size, its layout does not.
C_ORDER = "C order"


# ---------------------------------------------------------------------- two traces -> one symbolic graph
def size_symbols(pairs: Sequence[tuple[int, int]]) -> dict[Sym, tuple[int, int]]:
    """A symbol per distinct pair of sizes (the size in the first trace, in the second)."""
    return {Sym(f"s{k}"): pair for k, pair in enumerate(dict.fromkeys(pairs))}


def symbolize(graph_a: Graph, graph_b: Graph, sizes: Mapping[Sym, tuple[int, int]], known=None) -> Graph:
    """``graph_a`` with every size that follows a symbol written as the symbol (``sizes``: each
    symbol's size in ``graph_a`` and in ``graph_b``); ``NotDynamic`` says where they differ otherwise.
    ``known``: input index -> its symbolic type where another graph says it (a backward's saved
    values are the forward's), rather than spelled from the two sizes."""
    return symbolize_values(graph_a, graph_b, sizes, known)[0]


def symbolize_values(
    graph_a: Graph, graph_b: Graph, sizes: Mapping[Sym, tuple[int, int]], known=None
) -> tuple[Graph, dict[Value, Value]]:
    """``symbolize``, and each value of ``graph_a`` -> its symbolic counterpart (what carries the
    composite regions a trace recorded over to the symbolic graph)."""
    by_pair = Pairs()
    for sym, pair in sizes.items():  # the first spelling of two sizes wins: the plain symbols come first
        by_pair.setdefault(pair, sym)
        by_pair.learn(TensorType((sym,), float32))  # a size another graph derived (the forward's)
    bound = ({s: a for s, (a, _) in sizes.items()}, {s: b for s, (_, b) in sizes.items()})
    if len(graph_a.inputs) != len(graph_b.inputs):  # (a .grad that one call found set, another not)
        raise NotDynamic(f"the program reads {len(graph_a.inputs)} tensors at one size and {len(graph_b.inputs)} at "
                         "the other")  # fmt: skip
    if len(graph_a.nodes) != len(graph_b.nodes):
        raise NotDynamic(
            f"the program has {len(graph_a.nodes)} nodes at one size and {len(graph_b.nodes)} at the other"
        )
    graph_b = _aligned(graph_a, graph_b)
    values_a, values_b = list(graph_a.values()), list(graph_b.values())
    index_a = {v: i for i, v in enumerate(values_a)}
    index_b = {v: i for i, v in enumerate(values_b)}
    builder = GraphBuilder()
    new: dict[Value, Value] = {}
    for k, v in enumerate(graph_a.inputs):
        given = (known or {}).get(k)
        if given is not None:
            _check_rule_type("an input", given, v, values_b[index_a[v]], bound, by_pair, "")
        new[v] = builder.input(given or _type(v, values_b[index_a[v]], by_pair))
        by_pair.learn(new[v].type)
    size_values: dict[tuple[Sym, Any], Value] = {}
    for na, nb in zip(graph_a.nodes, graph_b.nodes, strict=True):
        where = f" (at {na.loc})" if na.loc else ""
        if na.op != nb.op or [index_a[v] for v in na.inputs] != [index_b[v] for v in nb.inputs]:
            raise NotDynamic(f"{na.op} at one size is {nb.op} at the other (or reads other values){where}")
        if na.op == CONSTANT:
            out_type = _type(na.output, values_b[index_a[na.output]], by_pair)
            a, b = graph_a.constants[na.attrs["name"]], graph_b.constants[nb.attrs["name"]]
            new[na.output] = _constant(builder, a, b, out_type, by_pair, size_values, na.loc, where)
            continue
        if set(na.attrs) != set(nb.attrs):
            raise NotDynamic(f"{na.op} has other attributes at the other size{where}")
        new[na.output] = _node(builder, na, [new[v] for v in na.inputs], nb, values_b[index_a[na.output]],
                               bound, by_pair, where)  # fmt: skip
        by_pair.learn(new[na.output].type)
    if [index_a[v] for v in graph_a.outputs] != [index_b[v] for v in graph_b.outputs]:
        raise NotDynamic("the outputs are other values at the other size")
    return builder.build([new[v] for v in graph_a.outputs]), new


def _aligned(graph_a: Graph, graph_b: Graph) -> Graph:
    """``graph_b`` with its nodes in the order of their counterparts in ``graph_a``: two traces of one
    program may record independent ops in another order (gradients accumulated in another order).
    Nodes are matched by structure (op, attributes with their ints left out, and the structure of
    their inputs); identical computations are interchangeable."""
    table: dict = {}
    keys_a, keys_b = _structure(graph_a, table), _structure(graph_b, table)
    waiting: dict[int, list] = {}
    for node in reversed(graph_b.nodes):
        waiting.setdefault(keys_b[node.outputs[0]], []).append(node)
    order = []
    for node in graph_a.nodes:
        matches = waiting.get(keys_a[node.outputs[0]])
        if not matches:
            where = f" (at {node.loc})" if node.loc else ""
            raise NotDynamic(f"{node.op} has no counterpart in the program traced at the other size{where}")
        order.append(matches.pop())
    defined = set(graph_b.inputs)
    for node in order:
        if not defined.issuperset(node.inputs):
            raise NotDynamic("the program traced at the other size computes the same values in another order")
        defined.update(node.outputs)
    return Graph(graph_b.inputs, tuple(order), graph_b.outputs, graph_b.constants)


def _structure(graph: Graph, table: dict) -> dict[Value, int]:
    """A number per value of ``graph`` that only values computed alike share (``table`` interns them)."""
    keys: dict[Value, int] = {v: table.setdefault(("input", i), len(table)) for i, v in enumerate(graph.inputs)}
    for node in graph.nodes:
        if node.op == CONSTANT:
            base: tuple = (CONSTANT, node.output.type.dtype.name, node.output.type.ndim)
        else:
            base = (node.op, _without_ints(tuple(sorted(node.attrs.items()))), *(keys[v] for v in node.inputs))
        for k, v in enumerate(node.outputs):
            keys[v] = table.setdefault((*base, k), len(table))
    return keys


def _without_ints(value):
    if isinstance(value, tuple):
        return tuple(_without_ints(v) for v in value)
    if type(value) is int:
        return "#"
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _node(builder: GraphBuilder, na: Node, inputs: list[Value], nb: Node, b: Value, bound, by_pair, where) -> Value:
    """The symbolic counterpart of node ``na`` (``nb`` in the other trace, ``b`` its output there): its
    attributes spelled over the symbols, the first spelling whose shape rule gives the traced types."""
    choices = {k: attr_choices(na.op, k, na.attrs[k], nb.attrs[k], by_pair, where) for k in na.attrs}
    spellings = itertools.islice(itertools.product(*choices.values()), MOST_SPELLINGS)
    why = ""
    for spelling in spellings:
        attrs = dict(zip(choices, spelling, strict=True))
        mark = len(builder.nodes)
        try:
            out = builder.node(na.op, inputs, attrs, loc=na.loc)
            if len(na.outputs) == 1:
                _check_rule_type(na.op, out.type, na.output, b, bound, by_pair, where)
            return out
        except (NotDynamic, TypeError, ValueError, IndexError, RuntimeError) as error:  # a rule takes no symbol
            del builder.nodes[mark:]
            why = str(error) if isinstance(error, NotDynamic) else f"{na.op} over a symbolic size: {error}{where}"
    raise NotDynamic(why)


def _check_rule_type(op: str, rule: TensorType, a: Value, b: Value, bound, by_pair, where: str) -> None:
    """Check that the type the shape rule gave a node over symbolic sizes is the type both traces
    recorded when bound to their sizes; a size the rule derives (``(H-2)``, ``(T+1)``) is learned
    (``by_pair``), so a later size that is a product of it (a flattened conv output) is found."""
    for types, sizes in ((a.type, bound[0]), (b.type, bound[1])):
        if rule.dtype is not types.dtype or rule.ndim != types.ndim or bind_shape(rule.shape, sizes) != types.shape:
            raise NotDynamic(f"{op}'s result is {rule} by its shape rule, {types} in a trace{where}")
    for d, x, y in zip(rule.shape, a.type.shape, b.type.shape, strict=True):
        if isinstance(d, Sym) and isinstance(x, int) and isinstance(y, int) and x != y and min(x, y) >= 2:
            by_pair.setdefault((x, y), d)


def _type(a: Value, b: Value, by_pair) -> TensorType:
    if a.type.dtype is not b.type.dtype or a.type.ndim != b.type.ndim or a.type.device is not b.type.device:
        raise NotDynamic(f"value %{a.id} is {a.type} at one size and {b.type} at the other")
    shape = []
    for x, y in zip(a.type.shape, b.type.shape, strict=True):
        d = x if x == y else size_expression(x, y, by_pair)
        if d is None:
            raise NotDynamic(f"value %{a.id} has a size that follows the dynamic sizes but is not a product of "
                             f"them ({x} at one size, {y} at the other: kiln's symbolic dimensions are whole "
                             "sizes, their products and the sums shape rules derive)")  # fmt: skip
        shape.append(d)
    return TensorType(tuple(shape), a.type.dtype, a.type.device)


def _constant(builder: GraphBuilder, a, b, out_type, by_pair, size_values: dict, loc, where: str) -> Value:
    """A constant of the symbolic graph: ``a`` itself when both traces hold the same array, the size
    (times a whole number: a mean's count of elements) when a scalar is that in both, one value
    expanded to a shape that follows the size."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
        return builder.constant(a, out_type, loc)
    multiple = _multiple_of_size(a, b, by_pair) if a.shape == b.shape == () else None
    if multiple is not None:
        sym, times = multiple
        key = (sym, out_type)
        if key not in size_values:
            size_values[key] = _size_of(builder, sym, out_type, loc)
        if times == 1:
            return size_values[key]
        factor = builder.constant(np.array(times, out_type.dtype.np), TensorType((), out_type.dtype, out_type.device))
        return builder.node("mul", [size_values[key], factor], loc=loc)
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    if a.ndim == b.ndim and flat_a.size and flat_b.size and (flat_a == flat_a[0]).all() and (flat_b == flat_a[0]).all():
        one = builder.constant(flat_a[:1].reshape((1,) * a.ndim).copy(), TensorType((1,) * a.ndim, out_type.dtype,
                                                                                   out_type.device), loc)  # fmt: skip
        return builder.node("expand", [one], {"shape": out_type.shape}, loc=loc)
    pattern = pattern_constant(builder, a, b, out_type, loc)  # a range, a causal mask
    if pattern is not None:
        return pattern
    raise NotDynamic(f"a constant of shape {list(a.shape)} holds other values at the other size ({list(b.shape)}): "
                     f"a number computed from the size{where}")  # fmt: skip


def _multiple_of_size(a: np.ndarray, b: np.ndarray, by_pair) -> tuple[Sym, int] | None:
    """``(symbol, k)`` when the scalars ``a`` and ``b`` are ``k`` times the symbol's size (or a product
    of symbols) in each trace: a mean's count of elements."""
    x, y = a.item(), b.item()
    if isinstance(x, bool) or not isinstance(x, int | float) or not isinstance(y, int | float):
        return None
    if x != int(x) or y != int(y):
        return None
    spellings = list(size_expressions(int(x), int(y), by_pair))
    if not spellings:
        return None
    size = spellings[0]
    if signature(size) not in by_pair.known and ambiguous(spellings):
        return None  # a number that several sizes make at both traced sizes: not taken for any
    scale, factors = dim_factors(size)
    return sym_product(1, factors), scale  # type: ignore[return-value]  # factors: at least one symbol


def _size_of(builder: GraphBuilder, sym: Sym, out_type: TensorType, loc) -> Value:
    """The size ``sym`` as a scalar of ``out_type``'s dtype: ones expanded to ``(sym,)`` and summed
    (exact: an int sums exactly, a float below 2**24 too)."""
    one = builder.constant(np.ones((1,), out_type.dtype.np), TensorType((1,), out_type.dtype, out_type.device), loc)
    ones = builder.node("expand", [one], {"shape": (sym,)}, loc=loc)
    return builder.node("reduce_sum", [ones], {"axes": (0,), "keepdim": False}, loc=loc)
