"""A kernel body as a scalar DAG: what one domain element computes, with view nodes resolved.

``DagBuilder.element(value, index)`` gives the DAG node computing ``value`` at ``index`` (a tuple
of ``Lin`` over the domain's variables, see kiln/codegen/index.py). Elementwise nodes become ``Apply``
nodes over their inputs at the broadcast-adjusted index, view nodes only remap the index, body
inputs become ``Load`` nodes at a linear element offset, 0-d constants become ``Const``
immediates, and reductions become ``Reduce`` nodes: one value per row, computed in a loop over
the row before anything that reads it. Nodes are memoized per ``(value, index)`` so a shared
subexpression is computed once per element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..ir.dtypes import DType
from ..ir.graph import CONSTANT, Graph, Value
from ..ir.primitives import ELEMENTWISE, FUSIBLE_REDUCE_OPS, PRIMITIVES, VIEW_OPS
from . import index as ix
from .core import Unsupported
from .index import Lin, Space

VIEWS = VIEW_OPS
REDUCES = FUSIBLE_REDUCE_OPS


@dataclass(eq=False)
class Load:
    """The element of kernel operand ``operand`` at element offset ``offset``."""

    operand: int
    offset: Lin
    dtype: DType
    after: int = -1  # the highest reduction level it depends on (-1: none)


@dataclass(eq=False)
class Const:
    value: Any
    dtype: DType
    after: int = -1


@dataclass(eq=False)
class Apply:
    """``PRIMITIVES[op].scalar(em, *args, **attrs)``."""

    op: str
    attrs: dict
    args: tuple
    dtype: DType
    after: int = -1


@dataclass(eq=False)
class Reduce:
    """A row's reduction of ``arg`` (the row's elements); ``level`` orders the passes over a row."""

    op: str
    arg: Any
    dtype: DType
    level: int = 0
    after: int = 0  # == level: its value exists once the pass of its level is done


Node = Load | Const | Apply | Reduce


@dataclass(frozen=True)
class Rows:
    """A reduction kernel's split of the domain: the first ``outer`` dims index rows."""

    outer: int
    axes: tuple[int, ...]


class DagBuilder:
    """Builds the DAG of one body over ``space`` (the domain); body input ``i`` is kernel operand
    ``first_operand + i`` with element strides ``strides[i]``."""

    def __init__(self, body: Graph, space: Space, strides: Sequence[Sequence[int]], rows: Rows | None = None) -> None:
        self.body = body
        self.space = space
        self.strides = strides
        self.rows = rows
        self.producers = body.producers()
        self.input_index = {v: i for i, v in enumerate(body.inputs)}
        self.memo: dict[tuple[Value, tuple[Lin, ...]], Node] = {}
        self.reduces: list[Reduce] = []
        self._reduce_memo: dict[Value, Reduce] = {}

    def element(self, value: Value, index: tuple[Lin, ...]) -> Node:
        """The DAG node of ``value`` at ``index``, built without recursion: a body may be a chain of
        thousands of nodes, deeper than Python's stack."""
        key = (value, index)
        pending = [key]
        while pending:
            top = pending[-1]
            if top in self.memo:
                pending.pop()
                continue
            missing = [k for k in self._needs(*top) if k not in self.memo]
            if missing:
                pending.extend(reversed(missing))  # the first operand is built first
                continue
            pending.pop()
            self.memo[top] = self._build(*top)
        return self.memo[key]

    def _needs(self, value: Value, index: tuple[Lin, ...]) -> list[tuple[Value, tuple[Lin, ...]]]:
        """The ``(value, index)`` pairs that ``_build(value, index)`` reads from the memo."""
        if value in self.input_index:
            return []
        node = self.producers[value]
        if node.op in VIEWS:
            return [(node.inputs[0], self._view_index(node, index))]
        if node.op in REDUCES:
            done = node.output in self._reduce_memo
            return [] if done or self.rows is None else [(node.inputs[0], self.space.identity())]
        if node.op == CONSTANT:
            return []
        return [(v, ix.broadcast(index, v.type.shape)) for v in node.inputs]

    def _build(self, value: Value, index: tuple[Lin, ...]) -> Node:
        if value in self.input_index:
            i = self.input_index[value]
            return Load(i, ix.offset(index, self.strides[i]), value.type.dtype)
        node = self.producers[value]
        op, attrs = node.op, node.attrs
        if op == CONSTANT:
            array = self.body.constants[attrs["name"]]
            if array.ndim != 0:
                raise Unsupported(f"a constant of shape {list(array.shape)} in a kernel body (only 0-d are compiled)")
            return Const(array.item(), value.type.dtype)
        if op in VIEWS:
            return self.memo[(node.inputs[0], self._view_index(node, index))]
        if op in REDUCES:
            return self._reduce(node, index)
        prim = PRIMITIVES.get(op)
        if prim is None or prim.kind not in ELEMENTWISE or prim.scalar is None:
            raise Unsupported(f"{op} cannot be compiled inside a kernel body")
        args = tuple(self.memo[(v, ix.broadcast(index, v.type.shape))] for v in node.inputs)
        return Apply(op, dict(attrs), args, value.type.dtype, max((a.after for a in args), default=-1))

    def _view_index(self, node, index: tuple[Lin, ...]) -> tuple[Lin, ...]:
        """The index into the view's input that ``index`` into its output reads (the registry's map)."""
        (source,) = node.inputs
        return ix.view(self.space, node.op, index, source.type.shape, node.output.type.shape, node.attrs)

    def _reduce(self, node, index: tuple[Lin, ...]) -> Reduce:
        rows = self.rows
        (source,) = node.inputs
        if rows is None:
            raise Unsupported(f"{node.op} inside an elementwise kernel")
        if source.type.shape != self.space.sizes or tuple(node.attrs["axes"]) != rows.axes:
            raise Unsupported(
                f"{node.op} over axes {node.attrs['axes']} of shape {list(source.type.shape)}; the kernel reduces "
                f"axes {rows.axes} of {list(self.space.sizes)}"
            )
        row = tuple(self.space.var(j) for j in range(rows.outer))
        expected = row + (ix.ZERO,) * len(rows.axes) if node.attrs["keepdim"] else row
        if index != expected:
            raise Unsupported(f"the result of {node.op} is read at another row's index")
        reduce = self._reduce_memo.get(node.output)
        if reduce is None:
            arg = self.memo[(source, self.space.identity())]
            level = arg.after + 1
            reduce = Reduce(node.op, arg, node.output.type.dtype, level, level)
            self._reduce_memo[node.output] = reduce
            self.reduces.append(reduce)
        return reduce


def loads(roots: Sequence[Node]) -> list[Load]:
    """Every Load reachable from ``roots`` (inside reductions too), in a deterministic order."""
    return [n for n in walk(roots) if isinstance(n, Load)]


def walk(roots: Sequence[Node]) -> list[Node]:
    """Every node reachable from ``roots``, children before parents, each once (no recursion)."""
    seen: set[int] = set()
    order: list[Node] = []
    for root in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        pending = [(root, iter(_children(root)))]
        while pending:
            node, children = pending[-1]
            child = next(children, None)
            if child is None:
                pending.pop()
                order.append(node)
            elif id(child) not in seen:
                seen.add(id(child))
                pending.append((child, iter(_children(child))))
    return order


def evaluate(root: Node, known: Callable[[Node], bool], compute: Callable[[Node], None]) -> None:
    """Call ``compute(node)`` on every node under ``root`` (and ``root``) that is not ``known``,
    each after its operands, left to right: the order a code generator emits a DAG in. No
    recursion: a fused chain may be thousands of nodes deep. ``compute`` makes its node known; a
    known node's operands are not visited (a reduction's value, once computed, stands for its row)."""
    pending = [root]
    while pending:
        top = pending[-1]
        if known(top):
            pending.pop()
            continue
        if isinstance(top, Apply):
            missing = [a for a in top.args if not known(a)]
            if missing:
                pending.extend(reversed(missing))
                continue
        pending.pop()
        compute(top)


def _children(n: Node) -> tuple:
    if isinstance(n, Apply):
        return n.args
    if isinstance(n, Reduce):
        return (n.arg,)
    return ()


def signature(roots: Sequence[Node]) -> tuple:
    """The DAG's structure without its offsets: equal for horizontal members of one structure."""
    order = walk(roots)
    position = {id(n): k for k, n in enumerate(order)}
    out: list[tuple] = []
    for n in order:
        if isinstance(n, Load):
            out.append(("load", n.operand, n.dtype.name))
        elif isinstance(n, Const):
            out.append(("const", repr(n.value), n.dtype.name))
        elif isinstance(n, Apply):
            attrs = tuple(sorted((k, repr(v)) for k, v in n.attrs.items()))
            out.append(("apply", n.op, attrs, n.dtype.name, tuple(position[id(a)] for a in n.args)))
        else:
            out.append(("reduce", n.op))
    return tuple(out) + (tuple(position[id(r)] for r in roots),)
