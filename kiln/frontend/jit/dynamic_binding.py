"""Binding a symbolic graph to one call's sizes, and reading those sizes off the call's inputs.

``bind_graph`` writes each symbol's size into types, attributes and kernel bodies, and checks what
two traces could not: a slice to a dynamic size stays within its dim, and a size a shape rule
derived (a conv's ``(H-2)``) is one the op takes at these sizes (an image smaller than the
kernel fails as eagerly). ``symbol_positions`` and ``position_sizes`` find each symbol's size in
the inputs: a dim that is the symbol, or the symbol plus a whole number (a backward graph may see
an image only padded). ``SizesFit`` makes those checks a guard of a compiled function's dynamic
specialization: a call at sizes its ops do not take misses and traces again, running as eagerly
(eager slicing stops at a dim's end; the program's later ops expect the size).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...ir.graph import Graph, GraphBuilder, Node, Value
from ...ir.types import Dim, Sym, SymSum, TensorType, dim_size, plain_symbol


def bind_graph(graph: Graph, sizes: Mapping[Sym, int]) -> Graph:
    """``graph`` (fused or not) with each symbol replaced by its size in ``sizes``: types, attributes
    and kernel bodies. The nodes keep their positions, so one index names a node in either graph."""
    builder = GraphBuilder()
    new: dict[Value, Value] = {v: builder.input(v.type.bind(sizes)) for v in graph.inputs}
    for node in graph.nodes:
        outputs = tuple(builder.value(v.type.bind(sizes)) for v in node.outputs)
        new.update(zip(node.outputs, outputs, strict=True))
        attrs = {k: _bind_attr(v, sizes) for k, v in node.attrs.items()}
        misfit = _misfit(node, [new[v].type for v in node.inputs], attrs)
        if misfit is not None:
            raise ValueError(f"kiln.compile: {misfit}")
        builder.nodes.append(Node(node.op, tuple(new[v] for v in node.inputs), attrs, outputs, node.loc))
    builder.constants.update(graph.constants)
    return builder.build([new[v] for v in graph.outputs])


def _misfit(node: Node, types: list[TensorType], attrs: dict) -> str | None:
    """Why the op ``node`` does not take these sizes (``types``: its inputs', ``attrs`` its attributes
    bound to them), or None: a slice to a dynamic size past the end of its dim (``mask[:T]``: eager
    slicing would stop at the end), a size its shape rule derived (a conv's ``(H-2)``) that the rule
    refuses at these sizes (an image smaller than the kernel)."""
    where = f" at {node.loc}" if node.loc else ""
    if node.op == "slice" and node.attrs["stops"] != attrs["stops"]:
        for axis, (stop, n) in enumerate(zip(attrs["stops"], types[0].shape, strict=True)):
            if stop > n:
                return (f"this call's dynamic size {stop} slices past the end of a dimension of size {n} (dim {axis}"
                        f"{where}); eager slicing would stop at {n}")  # fmt: skip
    if any(isinstance(d, SymSum) for v in node.outputs for d in v.type.shape):
        from ...ir.primitives import PRIMITIVES  # noqa: PLC0415

        primitive = PRIMITIVES.get(node.op)
        if primitive is None:  # a fused kernel: its nodes were checked before fusion bound them
            return None
        try:
            primitive.infer(*types, **attrs)
        except (RuntimeError, ValueError, IndexError) as error:
            return f"this call's dynamic sizes do not fit {node.op}{where}: {error}"
    return None


@dataclass
class SizesFit:
    """A guard of a compiled function's dynamic program (``Specialization.size_guards``): the call's
    sizes fit every op that ``bind_graph`` checks (``_misfit``), or the call misses and traces again,
    as eager (a size past a slice's dim, that eager slicing stops at, needs a program of its own).
    ``positions``: each symbol's ``(dim, leaf position, axis)`` in the call's arguments."""

    graph: Graph
    positions: tuple
    _checked: dict = field(default_factory=dict)  # the sizes seen -> why they misfit (None: they fit)

    @staticmethod
    def of(graph: Graph, leaf_positions: Sequence[int | None]) -> SizesFit | None:
        """The guard of the symbolic ``graph`` whose input ``i`` is leaf ``leaf_positions[i]`` of a
        call's arguments (None: not an argument); None when no op of it needs one."""
        if not any(_may_misfit(node) for node in graph.nodes):
            return None
        positions = []
        for d, i, axis in symbol_positions(graph):
            if leaf_positions[i] is None:
                return None
            positions.append((d, leaf_positions[i], axis))
        return SizesFit(graph, tuple(positions))

    def miss(self, leaves: list) -> str | None:
        key = tuple(int(leaves[p].shape[axis]) for _, p, axis in self.positions)
        if key not in self._checked:
            if len(self._checked) > 256:  # (sizes seen, bounded)
                self._checked.clear()
            self._checked[key] = self._misfit(position_sizes(self.positions, key))
        return self._checked[key]

    def _misfit(self, sizes: dict[Sym, int]) -> str | None:
        types = {v: v.type.bind(sizes) for v in self.graph.inputs}
        for node in self.graph.nodes:
            for v in node.outputs:
                types[v] = v.type.bind(sizes)
            if _may_misfit(node):
                attrs = {k: _bind_attr(v, sizes) for k, v in node.attrs.items()}
                why = _misfit(node, [types[v] for v in node.inputs], attrs)
                if why is not None:
                    return why
        return None

    def __str__(self) -> str:
        return "its sizes fit its ops"


def _may_misfit(node: Node) -> bool:
    """Whether ``_misfit`` can refuse ``node`` at some sizes."""
    if node.op == "slice" and any(not isinstance(s, int) for s in node.attrs["stops"]):
        return True
    return any(isinstance(d, SymSum) for v in node.outputs for d in v.type.shape)


def _bind_attr(value, sizes: Mapping[Sym, int]):
    if isinstance(value, Sym):
        return dim_size(value, sizes)
    if isinstance(value, Graph):
        return bind_graph(value, sizes)
    if isinstance(value, tuple):
        return tuple(_bind_attr(v, sizes) for v in value)
    return value


def with_derived(graph: Graph, sizes: Mapping[Sym, tuple[int, int]]) -> dict[Sym, tuple[int, int]]:
    """``sizes`` (each symbol's size in two traces) and each size ``graph`` derives from them (a
    conv's ``(s0-2)``, a product) with its two sizes: what symbolizing a backward graph, whose
    inputs have the forward's derived sizes, reads them as."""
    out = dict(sizes)
    at = ({s: a for s, (a, _) in sizes.items()}, {s: b for s, (_, b) in sizes.items()})
    for v in graph.values():
        for d in v.type.shape:
            if isinstance(d, Sym) and d not in out:
                pair = (dim_size(d, at[0]), dim_size(d, at[1]))
                if pair[0] != pair[1] and min(pair) >= 2:
                    out[d] = pair
    return out


def symbol_positions(graph: Graph) -> tuple[tuple[Dim, int, int], ...]:
    """``(dimension, input, axis)`` for the first input dimension that binds each symbol: the symbol
    itself, else a symbol plus a whole number (a backward graph may see an image only padded)."""
    found: dict[Sym, tuple[Dim, int, int]] = {}
    for exact in (True, False):
        for i, v in enumerate(graph.inputs):
            for axis, d in enumerate(v.type.shape):
                solved = plain_symbol(d)
                if solved is not None and solved[0] not in found and (solved[1] == 0) == exact:
                    found[solved[0]] = (d, i, axis)
    return tuple(found.values())


def position_sizes(positions, key: Sequence[int]) -> dict[Sym, int]:
    """Each symbol's size from the sizes ``key`` of the input dimensions at ``positions``
    (``symbol_positions``)."""
    sizes = {}
    for (d, _, _), n in zip(positions, key, strict=True):
        sym, offset = plain_symbol(d)  # type: ignore[misc]  # positions hold solvable dims only
        sizes[sym] = int(n) - offset
    return sizes
