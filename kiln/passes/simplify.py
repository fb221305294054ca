"""Algebraic simplification: rewrite identities that hold exactly, bit for bit, in IEEE arithmetic.

Every rule must give the same result for every input, inf, nan and -0.0 included, so some
textbook identities are not here: ``x + 0 -> x`` is wrong for ``x = -0.0`` (``-0.0 + 0.0`` is
``+0.0``), ``x * 0 -> 0`` is wrong for inf and nan, ``x - x -> 0`` is wrong for inf. What is here:

- ``x * 1``, ``1 * x``, ``x / 1``, ``x + (-0.0)``, ``(-0.0) + x``, ``x - (+0.0)`` -> ``x``
  (integer zeros have no sign: ``x + 0`` and ``x - 0`` for integers); where the constant's shape
  broadcasts ``x`` to a bigger shape the result is ``expand(x)``, not ``x``;
- ``neg(neg(x))``, ``logical_not(logical_not(x))`` for bool ``x``, ``maximum(x, x)``,
  ``minimum(x, x)``, ``where(c, x, x)`` -> ``x``;
- ``cast`` to ``x``'s own dtype, ``reshape`` to ``x``'s shape, ``expand`` to ``x``'s shape,
  ``permute`` by the identity, ``slice`` of the whole range -> ``x``;
- ``reshape(reshape(x))``, ``expand(expand(x))``, ``permute(permute(x))`` -> one op, and
  ``cast(cast(x, a), b)`` -> ``cast(x, b)`` when ``a`` holds every value of ``x``'s dtype exactly;
- ``permute(matmul(a, b))`` swapping the last two dims -> ``matmul(b^T, a^T)`` (the transposes are
  views BLAS reads for free, and the product lands in the permuted layout, C order) when the
  product has no other use. Each element is the same dot product of the same terms; whether BLAS
  sums it in the same order with the other operand transposed depends on its kernel (OpenBLAS's
  SkylakeX kernels: bit for bit; its Haswell kernels: the last bits of some elements differ), so
  the results are equal to within float32 rounding (tests check it on the shapes of the models);
- ``copy(x)`` -> ``x``, when the copy is ``x``'s only use and ``x`` is the result of a node that
  makes fresh memory (any primitive but a view or a constant: a compiled program hands out every
  such result in C order, memory of its own), or a reshape of one used only there, so the copy
  would only duplicate it. (A weight gradient ``x^T g`` of a linear layer became
  ``copy(permute(matmul(permute(x), g)))``; with these two rules it is ``matmul(g^T, x)``. An
  embedding's gradient was ``copy(index_put(zeros, ...))``.)
- ``copy(permute(take(x, idx)))`` permuting only the index dims -> ``take(x, permute(idx))``, when the
  take and the permute have no other use: the rows gathered in the permuted order (an embedding read
  time-major by a recurrence).
- ``pad(a) + pad(b)`` -> ``pad(concatenate(a + 0, b + 0))`` when ``a`` and ``b`` sit side by side
  along one axis of zeros (``+ 0`` turns -0.0 into +0.0 as the sum with the pads' zeros did), and a
  pad of nothing -> its input: the gradient of ``chunk`` (an LSTM's gates) was a pad and an add per
  chunk, four full-size arrays written to assemble one.
- ``slice(pad(x))`` of a zero pad -> ``x`` where the slice is exactly ``x``'s region, a slice of ``x``
  within it, a broadcast zero where it lies in the padding only (a recurrence's VJP reads its
  cotangent per part); ``slice(concatenate(...))`` of exactly one piece -> that piece.

- ``scatter_add(full(z), index, src, axis)`` with one index per line along ``axis`` (index of
  extent 1 there, the base's extent elsewhere) -> ``where(arange == index, src + z, z)``, with
  ``arange`` a small constant along ``axis``: a gather's gradient (cross-entropy's one-hot) is then
  elementwise and fuses into what reads it, where it was a base-sized array written by a scatter
  and read back (a language model's (1120, 10000) logits: 45 MB each way a step). Each element is
  ``z + src`` where the index hits it and ``z`` elsewhere, as the scatter made it; indices are in
  range (the primitive's contract: the frontend checks them).

- ``matmul(a, b)`` over an inner dim of size 1 (an outer product: the input gradient of a layer
  with one output) -> ``a * b + 0.0``, which fuses, where BLAS ran one call for it; and
  ``reduce_sum`` over axes of size 1 only -> ``reshape(x) + 0.0``.

``copy`` of an input, a constant or a view stays: it is how a program says its output must not
share memory with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from ..ir import dtypes as dt
from ..ir.graph import CONSTANT, Graph, Node, Value
from ..ir.primitives import PRIMITIVES
from ..ir.types import TensorType
from .eliminate_common_subexpressions import substitute, used_constants


def simplify(graph: Graph) -> Graph:
    """Apply the exact identities of this module until none applies (one pass in graph order:
    each rewritten node is simplified again, and uses read the simplified values).

    Needs: a graph in topological order. Establishes: no node matches a rule. Nodes made unused
    stay for ``eliminate_dead_code``.
    """
    context = _Context(graph, {}, {}, _use_counts(graph), _last_id(graph), [])
    nodes: list[Node] = []
    for node in graph.nodes:
        simplified = _simplify_node(substitute(node, context.replace), context)
        nodes += context.emitted  # nodes a rule made for the operands of its rewrite
        context.emitted = []
        if simplified is not None:
            if len(simplified.outputs) == 1:  # (a loop node has many: no rule reads those)
                context.producers[simplified.output] = simplified
            nodes.append(simplified)
    if not context.replace and len(nodes) == len(graph.nodes) and all(a is b for a, b in zip(nodes, graph.nodes)):
        return graph
    outputs = tuple(context.replace.get(v, v) for v in graph.outputs)
    return Graph(graph.inputs, tuple(nodes), outputs, used_constants(nodes, {**graph.constants, **context.constants}))


def _simplify_node(node: Node, context: _Context) -> Node | None:
    """``node`` rewritten until no rule applies, or None when its output became another value."""
    while (rule := _RULES.get(node.op)) is not None:
        result = rule(node, context)
        if result is None:
            return node
        if isinstance(result, Value):
            assert result.type == node.output.type, f"simplify: {node.op} rewritten to a value of another type"
            context.replace[node.output] = result
            context.count_uses([result], context.uses.get(node.output, 0))
            context.count_uses(node.inputs, -1)  # the node is gone, and its uses with it
            return None
        node = result  # a new node defining the same output value: simplify it again
        context.count_uses(node.inputs)
    return node


@dataclass
class _Context:
    graph: Graph
    producers: dict[Value, Node]  # the (simplified) node defining each value seen so far
    replace: dict[Value, Value]  # values simplified away -> what replaces them
    # Uses of each value as an operand or a graph output, never undercounted: counted in the input
    # graph, raised for every use a rewrite makes, lowered for the uses of a node rewritten to a
    # value (a node rewritten to another node keeps its old uses counted).
    uses: dict[Value, int]
    last_id: int  # the largest value id so far (new values number on from it)
    emitted: list[Node]  # new nodes to place before the node being simplified
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # constants the rules made
    # concatenations of pieces that hold no -0.0 (made by ``_add_of_pads``): pieces to splice
    signed_zero_free: dict[Value, tuple[Value, ...]] = field(default_factory=dict)

    def producer(self, value: Value, op: str) -> Node | None:
        node = self.producers.get(value)
        return node if node is not None and node.op == op else None

    def constant(self, value: Value) -> np.ndarray | None:
        node = self.producer(value, CONSTANT)
        if node is None:
            return None
        name = node.attrs["name"]
        return np.asarray(self.constants[name] if name in self.constants else self.graph.constants[name])

    def count_uses(self, values, times: int = 1) -> None:
        for v in values:
            self.uses[v] = self.uses.get(v, 0) + times

    def emit_constant(self, array: np.ndarray, loc) -> Value:
        """A new scalar or array constant, placed before the node being rewritten; its value."""
        self.last_id += 1
        value = Value(self.last_id, TensorType(array.shape, dt.from_numpy_dtype(array.dtype)))
        name = f"simplify{self.last_id}"
        self.constants[name] = array
        node = Node(CONSTANT, (), {"name": name}, (value,), loc)
        self.producers[value] = node
        self.emitted.append(node)
        return value

    def emit(self, op: str, inputs: tuple[Value, ...], attrs: dict, type: TensorType, loc) -> Value:
        """A new node ``op(*inputs)``, simplified, placed before the node being rewritten; its value."""
        self.last_id += 1
        value = Value(self.last_id, type)
        self.count_uses(inputs)
        node = _simplify_node(Node(op, inputs, attrs, (value,), loc), self)
        if node is None:  # it simplified to an existing value
            return self.replace[value]
        self.producers[node.output] = node
        self.emitted.append(node)
        return node.output


Rule = Callable[[Node, _Context], "Value | Node | None"]


def _use_counts(graph: Graph) -> dict[Value, int]:
    uses: dict[Value, int] = {}
    for v in [v for node in graph.nodes for v in node.inputs] + list(graph.outputs):
        uses[v] = uses.get(v, 0) + 1
    return uses


def _last_id(graph: Graph) -> int:
    return max([v.id for v in graph.inputs] + [v.id for node in graph.nodes for v in node.outputs], default=-1)


def _same_or_expanded(x: Value, node: Node) -> Value | Node:
    """``x`` itself when it has the node's type, else ``x`` broadcast to the node's shape."""
    out = node.output.type
    if x.type == out:
        return x
    return Node("expand", (x,), {"shape": out.shape}, node.outputs, node.loc)


# ----------------------------------------------------------------------------- arithmetic identities
def _is_one(c: np.ndarray) -> bool:
    return bool(np.all(c == 1))


def _is_negative_zero(c: np.ndarray) -> bool:
    """The identity of addition: -0.0 for floats (-0.0 + x is x for every x), 0 otherwise."""
    if c.dtype.kind == "f":
        return bool(np.all((c == 0) & np.signbit(c)))
    return bool(np.all(c == 0))


def _is_positive_zero(c: np.ndarray) -> bool:
    """The right identity of subtraction: +0.0 for floats (x - 0.0 is x, also for x = -0.0)."""
    if c.dtype.kind == "f":
        return bool(np.all((c == 0) & ~np.signbit(c)))
    return bool(np.all(c == 0))


def _identity_operand(test: Callable[[np.ndarray], bool], left: bool) -> Rule:
    """``op(x, c) -> x`` where the constant ``c`` passes ``test`` (and ``op(c, x)`` if ``left``)."""

    def rule(node: Node, context: _Context) -> Value | Node | None:
        a, b = node.inputs
        c = context.constant(b)
        if c is not None and test(c):
            return _same_or_expanded(a, node)
        c = context.constant(a) if left else None
        if c is not None and test(c):
            return _same_or_expanded(b, node)
        return None

    return rule


def _first_of(*rules: Rule) -> Rule:
    """The first of ``rules`` that rewrites the node."""

    def rule(node: Node, context: _Context) -> Value | Node | None:
        for candidate in rules:
            result = candidate(node, context)
            if result is not None:
                return result
        return None

    return rule


def _padded_region(pad: Node | None) -> tuple[int, int, int] | None:
    """(axis, start, stop) of the data in a zero ``pad`` along its one padded axis, of a static size
    (None: not such a pad)."""
    if pad is None:
        return None
    a = pad.attrs
    if a["value"] != 0 or any(a["interior"]):
        return None
    axes = [k for k, (lo, hi) in enumerate(zip(a["low"], a["high"])) if lo or hi]
    size = pad.inputs[0].type.shape[axes[0]] if len(axes) == 1 else None
    if not isinstance(size, int) or not isinstance(pad.output.type.shape[axes[0]], int):
        return None
    start = a["low"][axes[0]]
    return axes[0], start, start + size


def _add_of_pads(node: Node, context: _Context) -> Node | None:
    """``pad(a) + pad(b)`` -> ``pad(concatenate(a + 0, b + 0))`` when ``a`` and ``b`` lie side by side
    along one axis (the gradient of ``chunk``: one pad and one add per chunk became one concat).
    ``+ 0`` keeps the sum's value bit for bit (-0.0 + 0.0 is +0.0); a piece that already went
    through it (a nested sum's concat) is spliced in as it is."""
    out = node.output.type
    a, b = node.inputs
    if a.type != out or b.type != out or out.dtype is dt.bool_:
        return None
    if any(context.uses.get(v) != 1 for v in (a, b)):
        return None
    pads = [context.producer(a, "pad"), context.producer(b, "pad")]
    regions = [_padded_region(p) for p in pads]
    found = [(r, p) for r, p in zip(regions, pads, strict=True) if r is not None and p is not None]
    if len(found) != 2 or found[0][0][0] != found[1][0][0]:
        return None
    (first, first_pad), (second, second_pad) = sorted(found, key=lambda rp: rp[0][1])
    axis, total = first[0], cast(int, out.shape[first[0]])  # static: ``_padded_region`` checked it
    if first[2] != second[1]:  # not side by side
        return None
    pieces: list[Value] = []
    for p in (first_pad, second_pad):
        x = p.inputs[0]
        if x in context.signed_zero_free:
            pieces += context.signed_zero_free[x]
        elif out.dtype.is_floating_point:
            zero = context.emit_constant(np.zeros((), out.dtype.np), node.loc)
            pieces.append(context.emit("add", (x, zero), {}, x.type, node.loc))
        else:
            pieces.append(x)
    shape = list(out.shape)
    shape[axis] = second[2] - first[1]
    joined = context.emit("concatenate", tuple(pieces), {"axis": axis}, TensorType(tuple(shape), out.dtype, out.device),
                          node.loc)  # fmt: skip
    context.signed_zero_free[joined] = tuple(pieces)
    low = tuple(first[1] if k == axis else 0 for k in range(len(shape)))
    high = tuple(total - second[2] if k == axis else 0 for k in range(len(shape)))
    attrs = {"low": low, "high": high, "interior": (0,) * len(shape), "value": first_pad.attrs["value"]}
    return Node("pad", (joined,), attrs, node.outputs, node.loc)


def _pad(node: Node, context: _Context) -> Value | None:
    """A pad of nothing -> its input."""
    a = node.attrs
    return node.inputs[0] if not any((*a["low"], *a["high"], *a["interior"])) else None


def _involution(node: Node, context: _Context) -> Value | None:
    """``f(f(x)) -> x`` for ``f`` its own inverse (``neg``; ``logical_not`` on bools only)."""
    inner = context.producer(node.inputs[0], node.op)
    if inner is None or inner.inputs[0].type != node.output.type:
        return None
    return inner.inputs[0]


def _idempotent_pair(node: Node, context: _Context) -> Value | Node | None:
    """``maximum(x, x)``, ``minimum(x, x)`` -> ``x``."""
    a, b = node.inputs
    return _same_or_expanded(a, node) if a is b else None


def _where_same_branches(node: Node, context: _Context) -> Value | Node | None:
    _, a, b = node.inputs
    return _same_or_expanded(a, node) if a is b else None


# ----------------------------------------------------------------------------- casts
def _widens_exactly(source: dt.DType, middle: dt.DType) -> bool:
    """Whether ``middle`` represents every value of ``source`` exactly (so a cast through it is
    lossless and a following cast sees the original value)."""
    if source is middle:
        return True
    if not np.can_cast(source.np, middle.np, "safe"):
        return False
    if source.category == dt.INTEGER and middle.is_floating_point:
        # numpy calls int64 -> float64 "safe", but 2**53 + 1 has no float64: check the mantissa.
        info, mantissa = np.iinfo(source.np), np.finfo(middle.np).nmant + 1
        return -(2**mantissa) <= info.min and info.max <= 2**mantissa
    return True


def _cast(node: Node, context: _Context) -> Value | Node | None:
    (x,) = node.inputs
    if x.type.dtype is node.attrs["dtype"]:
        return x
    inner = context.producer(x, "cast")
    if inner is not None and _widens_exactly(inner.inputs[0].type.dtype, x.type.dtype):
        return Node("cast", inner.inputs, dict(node.attrs), node.outputs, node.loc)
    return None


# ----------------------------------------------------------------------------- movement
def _merge_or_drop(node: Node, context: _Context) -> Value | Node | None:
    """Same-shape reshape/expand -> x; reshape(reshape(x)) and expand(expand(x)) -> one op."""
    x = node.inputs[0]
    if x.type == node.output.type:
        return x
    inner = context.producer(x, node.op)
    if inner is None:
        return None
    return Node(node.op, inner.inputs, dict(node.attrs), node.outputs, node.loc)


def _permute(node: Node, context: _Context) -> Value | Node | None:
    perm = tuple(node.attrs["perm"])
    if perm == tuple(range(len(perm))):
        return node.inputs[0]
    inner = context.producer(node.inputs[0], "permute")
    if inner is None:
        return _transposed_product(node, perm, context)
    # Output dim i is the inner result's dim perm[i], which is the input's dim inner_perm[perm[i]].
    inner_perm = inner.attrs["perm"]
    return Node("permute", inner.inputs, {"perm": tuple(inner_perm[p] for p in perm)}, node.outputs, node.loc)


def _swap_last_two(ndim: int) -> tuple[int, ...]:
    return (*range(ndim - 2), ndim - 1, ndim - 2)


def _transposed_product(node: Node, perm: tuple[int, ...], context: _Context) -> Node | None:
    """``permute(matmul(a, b))`` over the last two dims -> ``matmul(b^T, a^T)``: the product is
    then made in the layout its user reads. Only when the permute is the product's one use, or
    the product would be computed twice."""
    x = node.inputs[0]
    product = context.producer(x, "matmul")
    if product is None or perm != _swap_last_two(len(perm)) or context.uses.get(x) != 1:
        return None
    operands = []
    for v in reversed(product.inputs):
        swap = _swap_last_two(v.type.ndim)
        swapped = TensorType(tuple(v.type.shape[d] for d in swap), v.type.dtype, v.type.device)
        operands.append(context.emit("permute", (v,), {"perm": swap}, swapped, node.loc))
    return Node("matmul", tuple(operands), {}, node.outputs, node.loc)


def _copy(node: Node, context: _Context) -> Value | None:
    """``copy(x)`` -> ``x`` when the copy is the one use of a fresh result (see the module's doc)."""
    x = node.inputs[0]
    if x.type != node.output.type:
        return None
    value = x
    while True:  # through reshapes (a C-order result stays C order) to what made the memory
        producer = context.producers.get(value)
        if producer is None or context.uses.get(value) != 1:
            return None
        if producer.op != "reshape":
            break
        value = producer.inputs[0]
    prim = PRIMITIVES.get(producer.op)
    return x if prim is not None and not prim.is_view and producer.op != CONSTANT else None


def _copy_of_permuted_take(node: Node, context: _Context) -> Node | None:
    """``copy(permute(take(x, idx)))`` permuting only the index dims -> ``take(x, permute(idx))``: the
    take gathers the rows in the permuted order, into C order at once, where the gathered rows were
    copied again in that order (an embedding's (B, T, H) output read time-major by a recurrence: 286 KB
    a step in an LSTM LM). Each element is the same row's, moved: exact. Only where the take and the
    permute have no other use."""
    permute = context.producer(node.inputs[0], "permute")
    if permute is None or context.uses.get(permute.output) != 1:
        return None
    take = context.producer(permute.inputs[0], "take")
    if take is None or len(take.inputs) != 2 or context.uses.get(take.output) != 1:
        return None
    perm, d = tuple(permute.attrs["perm"]), take.inputs[1].type.ndim
    if sorted(perm[:d]) != list(range(d)) or perm[d:] != tuple(range(d, len(perm))):
        return None
    idx = take.inputs[1]
    shape = tuple(idx.type.shape[p] for p in perm[:d])
    moved = context.emit("permute", (idx,), {"perm": perm[:d]}, TensorType(shape, idx.type.dtype, idx.type.device),
                         permute.loc)  # fmt: skip
    return Node("take", (take.inputs[0], moved), {}, node.outputs, node.loc)


def _slice(node: Node, context: _Context) -> Value | None:
    # Same shape and every start 0: each dim is all of 0..n-1 in order (a step > 1 keeps n
    # elements only when n <= 1).
    x = node.inputs[0]
    if x.type == node.output.type and all(start == 0 for start in node.attrs["starts"]):
        return x
    return None


def _sliced_along(node: Node) -> tuple[int, int, int] | None:
    """(axis, first, last) of a ``slice`` with unit steps that takes all of every axis but one
    (None: not such a slice)."""
    a, shape = node.attrs, node.inputs[0].type.shape
    if any(step != 1 for step in a["steps"]):
        return None
    cut = [k for k in range(len(shape)) if not (a["starts"][k] == 0 and a["stops"][k] == shape[k])]
    if len(cut) != 1:
        return None
    return cut[0], a["starts"][cut[0]], a["stops"][cut[0]]


def _slice_of_pad(node: Node, context: _Context) -> Value | Node | None:
    """``slice(pad(x))`` of a zero pad along the one axis both act on -> ``x`` where the slice is
    exactly the data, a slice of ``x`` where it lies within it, a zero broadcast (``expand`` of a
    scalar 0) where it lies in the padding only. (A recurrence's VJP reads its packed cotangent a part
    at a time: the parts the loss gave are then themselves and the others zeros no one writes, where
    each was a slice of a full-width pad that an LSTM LM step wrote per layer.)"""
    pad = context.producer(node.inputs[0], "pad")
    region, sliced = _padded_region(pad), _sliced_along(node)
    if pad is None or region is None or sliced is None or sliced[0] != region[0]:
        return None
    axis, start, stop = region
    _, first, last = sliced
    if (first, last) == (start, stop):
        return pad.inputs[0]
    if start <= first and last <= stop:
        a = node.attrs
        starts = tuple(b - start if k == axis else b for k, b in enumerate(a["starts"]))
        stops = tuple(b - start if k == axis else b for k, b in enumerate(a["stops"]))
        return Node("slice", pad.inputs, {**a, "starts": starts, "stops": stops}, node.outputs, node.loc)
    if last <= start or first >= stop:
        out = node.output.type
        zero = context.emit_constant(np.zeros((), out.dtype.np), node.loc)
        return Node("expand", (zero,), {"shape": out.shape}, node.outputs, node.loc)
    return None


def _slice_of_concatenate(node: Node, context: _Context) -> Value | None:
    """``slice(concatenate(..., p, ...))`` that takes exactly the piece ``p`` -> ``p``."""
    joined, sliced = context.producer(node.inputs[0], "concatenate"), _sliced_along(node)
    if joined is None or sliced is None:
        return None
    axis, first, last = sliced
    if axis != joined.attrs["axis"] % node.output.type.ndim:
        return None
    offset = 0
    for piece in joined.inputs:
        size = piece.type.shape[axis]
        if not isinstance(size, int):
            return None
        if (offset, offset + size) == (first, last):
            return piece
        offset += size
    return None


def _one_value(c: np.ndarray) -> np.ndarray | None:
    """The one value every element of ``c`` holds, bit for bit (nan with nan, -0.0 apart from 0.0)."""
    if c.size == 0:
        return None
    first = c.reshape(-1)[:1].reshape(())
    same = c == first
    if c.dtype.kind == "f":
        same = (np.isnan(c) if np.isnan(first) else same) & (np.signbit(c) == np.signbit(first))
    return first.copy() if bool(np.all(same)) else None


def _one_hot_scatter(node: Node, context: _Context) -> Node | None:
    """``scatter_add`` of one index per line into a constant fill as ``where`` (see the module's doc)."""
    base, index, src = node.inputs
    axis = node.attrs["axis"]
    out = node.output.type
    spread = context.producer(base, "expand")  # a fill over a symbolic size is a constant expanded
    constant = context.constant(base if spread is None else spread.inputs[0])
    if constant is None or out.ndim == 0 or out.dtype is dt.bool_ or not isinstance(out.shape[axis], int):
        return None
    expected = tuple(1 if d == axis else n for d, n in enumerate(out.shape))
    fill = _one_value(constant)
    if index.type.shape != expected or fill is None:
        return None
    loc = node.loc
    if src.type.shape != expected:  # the scatter reads only the part of src the index covers
        part = TensorType(expected, src.type.dtype, src.type.device)
        starts, steps = (0,) * out.ndim, (1,) * out.ndim
        src = context.emit("slice", (src,), {"starts": starts, "stops": expected, "steps": steps}, part, loc)
    line = tuple(n if d == axis else 1 for d, n in enumerate(out.shape))
    positions = context.emit_constant(np.arange(out.shape[axis], dtype=np.int64).reshape(line), loc)  # type: ignore[arg-type]  # static along axis
    hit = context.emit("eq", (positions, index), {}, TensorType(out.shape, dt.bool_, out.device), loc)
    z = context.emit_constant(fill, loc)
    added = context.emit("add", (src, z), {}, TensorType(expected, out.dtype, out.device), loc)
    return Node("where", (hit, added, z), {}, node.outputs, loc)


def _outer_product(node: Node, context: _Context) -> Node | None:
    """``matmul(a, b)`` summing one term (``a``'s last dim and ``b``'s second-to-last of size 1)
    -> ``a * b + 0`` (``a * b`` for integers): the (..., M, 1) and (..., 1, N) operands broadcast
    to the product's shape, batch dims by the same rules as the product's. BLAS starts each dot
    product from zero, so a product of -0.0 comes out +0.0; ``+ 0.0`` does the same. Elementwise,
    it fuses into what reads it, where BLAS took 100 us in-step for NCF's (1024, 1) @ (1, 64)."""
    a, b = node.inputs
    dtype = node.output.type.dtype
    if a.type.shape[-1] != 1 or dtype.category == dt.BOOL:
        return None
    out = node.output.type
    if not dtype.is_floating_point:
        return Node("mul", (a, b), {}, node.outputs, node.loc)
    product = context.emit("mul", (a, b), {}, out, node.loc)
    zero = context.emit_constant(np.zeros((), dtype.np), node.loc)
    return Node("add", (product, zero), {}, node.outputs, node.loc)


def _sum_of_one(node: Node, context: _Context) -> Node | None:
    """``reduce_sum`` over axes of size 1 only -> ``reshape(x) + 0.0`` (``copy(reshape(x))`` for
    integers and bools): each sum has one term, folded onto the identity (-0.0 comes out +0.0, as
    ``+ 0.0`` gives). Elementwise, it fuses into what reads it (a cell's final states,
    ``packed.sum(0)`` over one time step: 8 reduction kernels a step of an LSTMCell loop), and the
    result stays memory of its own, not a view of ``x``."""
    x, out = node.inputs[0], node.output.type
    if not out.is_static or x.type.dtype != out.dtype or any(x.type.shape[axis] != 1 for axis in node.attrs["axes"]):
        return None
    shaped = context.emit("reshape", (x,), {"shape": tuple(out.shape)}, out, node.loc)
    if not out.dtype.is_floating_point:
        return Node("copy", (shaped,), {}, node.outputs, node.loc)
    zero = context.emit_constant(np.zeros((), out.dtype.np), node.loc)
    return Node("add", (shaped, zero), {}, node.outputs, node.loc)


_RULES: dict[str, Rule] = {
    "mul": _identity_operand(_is_one, left=True),
    "div": _identity_operand(_is_one, left=False),
    "add": _first_of(_identity_operand(_is_negative_zero, left=True), _add_of_pads),
    "sub": _identity_operand(_is_positive_zero, left=False),
    "neg": _involution,
    "logical_not": _involution,  # not(not(x)) is bool(x): x only for bool x, which the type test checks
    "maximum": _idempotent_pair,
    "minimum": _idempotent_pair,
    "where": _where_same_branches,
    "cast": _cast,
    "reshape": _merge_or_drop,
    "expand": _merge_or_drop,
    "permute": _permute,
    "slice": _first_of(_slice, _slice_of_pad, _slice_of_concatenate),
    "copy": _first_of(_copy, _copy_of_permuted_take),
    "pad": _pad,
    "scatter_add": _one_hot_scatter,
    "matmul": _outer_product,
    "reduce_sum": _sum_of_one,
}
