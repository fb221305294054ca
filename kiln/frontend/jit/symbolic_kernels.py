"""Kernels over symbolic sizes after the first dimension, made kernels over one leading symbolic size.

The LLVM kernels take a symbolic LEADING dimension (kiln/codegen/llvm/symbolic.py): its size comes
from the argument table, every other size and stride stays a static immediate, so the inner loops
vectorize as before. A language model's length ``T`` in ``(B, T, C)``, or two symbols at once in
``(T, B, C)``, is not leading; but a kernel that treats its leading dims ``(B, T)`` alike -- every
value either has exactly those leading dims or broadcasts over them -- computes the same over the
flattened ``(B*T, C)``, whose leading size is the product ``B*T`` (``kiln.ir.types.SymProduct``).

``collapse_symbolic_prefixes`` rewrites each such kernel node of a fused symbolic graph: its body
over the flattened shapes, ``reshape`` views of its inputs before it and of its outputs after it
(C-order values: no copies). A kernel it cannot rewrite (a reduction or a view across the leading
dims, an input laid out per leading index) is left as it is; the code generator then runs it on its
eager kernels and says why.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from ...ir.graph import CONSTANT, KERNEL, Graph, Node, Value
from ...ir.primitives import PRIMITIVES, Kind
from ...ir.types import Dim, Sym, TensorType, sym_product

__all__ = ["collapse_symbolic_prefixes"]

TypeMap = Callable[[TensorType], TensorType]

#: The primitive kinds whose result is the same over an input broadcast first (numpy's rule).
_BROADCASTING = frozenset({Kind.UNARY, Kind.BINARY, Kind.TERNARY, Kind.CAST})

#: Kernel kinds whose bodies are elementwise ops and row reductions over the trailing dims.
_KINDS = ("elementwise", "reduction")


def collapse_symbolic_prefixes(graph: Graph) -> Graph:
    """``graph`` with each kernel whose symbolic sizes lie in leading dims it treats alike running over
    their product (see the module docstring). Needs: a fused graph. Establishes: the same values."""
    out = _Nodes(graph)
    new: dict[Value, Value] = {v: v for v in graph.inputs}
    for node in _members_apart(graph.nodes):
        inputs = tuple(new[v] for v in node.inputs)
        if node.op == "reduce_sum" and _leading_sum(out, node, inputs, new):
            continue
        if node.op == "matmul" and _flat_matmul(out, node, inputs, new):
            continue
        collapsed = (
            _collapsed(node, node.attrs.get("kind")) if node.op == KERNEL and node.attrs.get("kind") in _KINDS else None
        )
        if collapsed is None:
            out.keep(node if inputs == node.inputs else Node(node.op, inputs, node.attrs, node.outputs, node.loc))
            new.update((v, v) for v in node.outputs)
            continue
        body, flat, widen = collapsed
        kernel_inputs = tuple(out.reshaped(out.widened(v, widen(v.type), node.loc), flat(widen(v.type)), node.loc)
                              for v in inputs)  # fmt: skip
        outputs = tuple(Value(v.id, flat(v.type)) for v in node.outputs)
        out.add(Node(KERNEL, kernel_inputs, {**node.attrs, "bodies": (body,)}, outputs, node.loc))
        for v, flat_value in zip(node.outputs, outputs, strict=True):
            new[v] = out.reshaped(flat_value, v.type, node.loc)
    outputs = tuple(new[v] for v in graph.outputs)
    return graph if not out.changed else Graph(graph.inputs, out.used(outputs), outputs, graph.constants)


class _Nodes:
    """The nodes of the rewritten graph, and the reshape views this module adds between them: a
    value reshaped back and forth between two flattened kernels is read as it was (no view)."""

    def __init__(self, graph: Graph) -> None:
        self.nodes: list[Node] = []
        self.changed = False
        self._ids = itertools.count(max((v.id for v in graph.values()), default=-1) + 1)
        self._source: dict[Value, Value] = {}  # the output of an added reshape -> its input

    def keep(self, node: Node) -> None:
        self.nodes.append(node)

    def add(self, node: Node) -> None:
        self.nodes.append(node)
        self.changed = True

    def value(self, type: TensorType) -> Value:
        return Value(next(self._ids), type)

    def reshaped(self, v: Value, type: TensorType, loc) -> Value:
        """``v`` as ``type`` (a reshape view when the shapes differ)."""
        if v.type.shape == type.shape:
            return v
        source = self._source.get(v)
        if source is not None and source.type.shape == type.shape:
            return source
        out = self.value(type)
        self.add(Node("reshape", (v,), {"shape": type.shape}, (out,), loc))
        self._source[out] = v
        return out

    def widened(self, v: Value, type: TensorType, loc) -> Value:
        """``v`` broadcast to ``type`` and copied into memory of its own (C order: a reshape views it)."""
        if v.type.shape == type.shape:
            return v
        expanded, copied = self.value(type), self.value(type)
        self.add(Node("expand", (v,), {"shape": type.shape}, (expanded,), loc))
        self.add(Node("copy", (expanded,), {}, (copied,), loc))
        return copied

    def used(self, outputs: tuple[Value, ...]) -> tuple[Node, ...]:
        """The nodes without the added reshapes that nothing reads (a view read back as it was)."""
        read = set(outputs).union(*(node.inputs for node in self.nodes))
        return tuple(n for n in self.nodes if not n.outputs or n.outputs[0] in read or n.outputs[0] not in self._source)


def _members_apart(nodes) -> list[Node]:
    """``nodes`` with each horizontal kernel over a symbolic size split into one elementwise kernel per
    member (a horizontal kernel is generated for static sizes only; its members alone are not)."""
    out = []
    for node in nodes:
        if node.op != KERNEL or node.attrs.get("kind") != "horizontal" or not _symbolic(node):
            out.append(node)
            continue
        inputs, outputs = iter(node.inputs), iter(node.outputs)
        for k, body in enumerate(node.attrs["bodies"]):
            attrs = {**node.attrs, "name": f"{node.attrs['name']}_{k}", "kind": "elementwise", "bodies": (body,)}
            member_inputs = tuple(next(inputs) for _ in body.inputs)
            out.append(Node(KERNEL, member_inputs, attrs, tuple(next(outputs) for _ in body.outputs), node.loc))
    return out


def _symbolic(node: Node) -> bool:
    return any(v.type.symbols for v in (*node.inputs, *node.outputs))


def _flat_matmul(out: _Nodes, node: Node, inputs: tuple[Value, ...], new: dict) -> bool:
    """Append ``node`` (a matmul of ``(B, T, K)`` by a ``(K, N)`` matrix, with symbols in the leading
    dims) as one of the flattened rows ``(B*T, K)``: the rows a flattened kernel wrote are read as
    they are, and those it reads next need no view. False when it is not one."""
    (x, w), (result,) = inputs, node.outputs
    lead = x.type.shape[:-1]
    if len(lead) < 2 or w.type.ndim != 2 or not w.type.is_static or not any(isinstance(d, Sym) for d in lead):
        return False
    rows = sym_product(1, lead)
    flat_x = TensorType((rows, x.type.shape[-1]), x.type.dtype, x.type.device)
    product = out.value(TensorType((rows, result.type.shape[-1]), result.type.dtype, result.type.device))
    out.add(Node("matmul", (out.reshaped(x, flat_x, node.loc), w), node.attrs, (product,), node.loc))
    new[result] = out.reshaped(product, result.type, node.loc)
    return True


def _leading_sum(out: _Nodes, node: Node, inputs: tuple[Value, ...], new: dict) -> bool:
    """Append ``node`` (a reduce_sum over the leading dims up to the last symbolic one, or more) as a
    sum over the flattened leading size, which the LLVM backend compiles; False when it is not one."""
    (x,), (result,) = inputs, node.outputs
    shape, axes = x.type.shape, node.attrs["axes"]
    last = max((k for k, d in enumerate(shape) if isinstance(d, Sym)), default=0)
    if last == 0 or tuple(axes) != tuple(range(len(axes))) or len(axes) <= last:
        return False
    flat = TensorType((sym_product(1, shape[: last + 1]), *shape[last + 1 :]), x.type.dtype, x.type.device)
    summed = out.value(TensorType(shape[len(axes) :], result.type.dtype, result.type.device))
    attrs = {**node.attrs, "axes": tuple(range(len(axes) - last)), "keepdim": False}
    out.add(Node("reduce_sum", (out.reshaped(x, flat, node.loc),), attrs, (summed,), node.loc))
    new[result] = out.reshaped(summed, result.type, node.loc)
    return True


def _collapsed(node: Node, kind: object) -> tuple[Graph, TypeMap, TypeMap] | None:
    """The body of kernel ``node`` over its flattened leading dims, the map of types to their flattened
    types and the map of input types to the types they are broadcast to first (an input that spans
    part of the leading dims: ``(T, C)`` positions added to ``(B, T, C)``), or None when the kernel has
    no symbol after its first dim or cannot be flattened. A kernel that cannot be flattened through
    its last, symbolic dim keeps that dim: ``(B, H, T, T)`` with a ``(B, H, T, 1)`` row value (or a
    softmax reducing its rows) becomes ``(B*H*T, T)``, rows of a symbolic length
    (kiln/codegen/llvm/symbolic_rows.py)."""
    (body,) = node.attrs["bodies"]
    values = [*body.inputs, *(v for n in body.nodes for v in n.outputs)]
    # the longest shape, and of those one without broadcast dims (an expanded (1, 1, 1, 1) is not it)
    domain = max((v.type.shape for v in values), key=lambda shape: (len(shape), sum(d != 1 for d in shape)))
    last = max((k for v in values for k, d in enumerate(v.type.shape) if isinstance(d, Sym)), default=0)
    if last == 0:  # static, or symbolic in the leading dim alone: the generators take it as it is
        return None
    collapsed = _collapsed_over(body, values, domain, domain[: last + 1], ())
    if collapsed is None and kind in _KINDS and last == len(domain) - 1:
        collapsed = _collapsed_over(body, values, domain, domain[:last], domain[last:])
    return collapsed


def _collapsed_over(body: Graph, values: list[Value], domain: tuple, prefix: tuple, row: tuple):
    """``_collapsed`` with the leading dims ``prefix`` flattened; ``row``: the trailing symbolic dims a
    flattened value may keep (none, or the row length of a kernel of rows)."""
    product = sym_product(1, prefix)

    def flat(type: TensorType) -> TensorType:
        shape = type.shape
        if shape[: len(prefix)] == prefix:
            return TensorType((product, *shape[len(prefix) :]), type.dtype, type.device)
        if len(shape) >= len(prefix) and all(d == 1 for d in shape[: len(prefix)]):
            return TensorType((1, *shape[len(prefix) :]), type.dtype, type.device)
        return type

    def widen(type: TensorType) -> TensorType:
        shape, offset = type.shape, len(domain) - type.ndim
        if not type.symbols or shape[: len(prefix)] == prefix or shape[0] == product or not 0 < offset < len(prefix):
            return type
        if shape[: len(prefix) - offset] != prefix[offset:]:
            return type
        return TensorType((*prefix, *shape[len(prefix) - offset :]), type.dtype, type.device)

    inputs = set(body.inputs)
    for v in values:
        v_type = widen(v.type) if v in inputs else v.type
        inner = flat(v_type).shape[1:]
        if v_type.symbols and inner and inner != row and any(isinstance(d, Sym) for d in inner):
            return None
        if v_type.symbols and flat(v_type) == v_type and v_type.shape[0] != product and not _a_row(v_type.shape, row):
            return None  # a symbol outside the prefix's place (a broadcast over part of it)
    widened = {v for v in body.inputs if widen(v.type) != v.type}
    if any(PRIMITIVES[n.op].kind not in _BROADCASTING for n in body.nodes if widened.intersection(n.inputs)):
        return None  # a widened input read by a reduction or a view would be read over the wrong dims
    rewritten = _rewritten_body(body, flat, widen, len(prefix))
    return None if rewritten is None else (rewritten, flat, widen)


def _a_row(shape: tuple, row: tuple) -> bool:
    """Whether ``shape`` is one row of length ``row`` broadcast to every row (``(T,)``, ``(1, T)``)."""
    return (
        bool(row)
        and len(shape) >= len(row)
        and tuple(shape[len(shape) - len(row) :]) == row
        and all(d == 1 for d in shape[: len(shape) - len(row)])
    )


def _rewritten_body(body: Graph, flat: TypeMap, widen: TypeMap, prefix_dims: int) -> Graph | None:
    """``body`` over flattened types, each node's type checked by its shape rule; None when a node's
    attributes address the leading dims (a reduction across them, an expand or reshape into them)."""
    new: dict[Value, Value] = {v: Value(v.id, flat(widen(v.type))) for v in body.inputs}
    nodes = []
    for node in body.nodes:
        inputs = tuple(new[v] for v in node.inputs)
        outputs = tuple(Value(v.id, flat(v.type)) for v in node.outputs)
        attrs = node.attrs if node.op == CONSTANT else _attrs(node, flat, prefix_dims)
        if attrs is None:
            return None
        if node.op != CONSTANT:
            try:
                inferred = PRIMITIVES[node.op].infer(*(v.type for v in inputs), **attrs)
            except (TypeError, ValueError, IndexError, RuntimeError):
                return None
            if len(outputs) != 1 or inferred != outputs[0].type:
                return None
        nodes.append(Node(node.op, inputs, attrs, outputs, node.loc))
        new.update(zip(node.outputs, outputs, strict=True))
    return Graph(tuple(new[v] for v in body.inputs), tuple(nodes), tuple(new[v] for v in body.outputs),
                 body.constants)  # fmt: skip


def _attrs(node: Node, flat, prefix_dims: int) -> dict | None:
    """``node``'s attributes over the flattened types (axes after the prefix move down), or None."""
    attrs = dict(node.attrs)
    (out,) = node.outputs
    if "axes" in attrs:
        x = node.inputs[0].type
        shift = x.ndim - flat(x).ndim
        if shift and any(a < prefix_dims for a in attrs["axes"]):
            return None  # a reduction across the leading dims
        attrs["axes"] = tuple(a - shift for a in attrs["axes"])
    if "shape" in attrs:
        shape: tuple[Dim, ...] = attrs["shape"]
        if tuple(shape) != out.type.shape:
            return None
        attrs["shape"] = flat(out.type).shape
    if "axis" in attrs or "perm" in attrs or "starts" in attrs:
        return None  # a scan, a permutation or a slice: not rewritten
    return attrs
