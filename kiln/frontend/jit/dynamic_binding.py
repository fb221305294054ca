"""Binding a symbolic graph to one call's sizes, and reading those sizes off the call's inputs.

``bind_graph`` writes each symbol's size into types, attributes and kernel bodies, and checks what
two traces could not: a slice to a dynamic size stays within its dim, and a size a shape rule
derived (a conv's ``(H-2)``) is one the op takes at these sizes (an image smaller than the
kernel fails as eagerly). ``symbol_positions`` and ``position_sizes`` find each symbol's size in
the inputs: a dim that is the symbol, or the symbol plus a whole number (a backward graph may see
an image only padded).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
        if node.op == "slice" and node.attrs["stops"] != attrs["stops"]:
            _check_slice(node, attrs["stops"], new[node.inputs[0]].type.shape)
        if any(isinstance(d, SymSum) for v in node.outputs for d in v.type.shape):
            _check_derived(node, [new[v].type for v in node.inputs], attrs)
        builder.nodes.append(Node(node.op, tuple(new[v] for v in node.inputs), attrs, outputs, node.loc))
    builder.constants.update(graph.constants)
    return builder.build([new[v] for v in graph.outputs])


def _check_derived(node: Node, types: list[TensorType], attrs: dict) -> None:
    """A size the shape rule derived from the dynamic ones (a conv's ``(H-2)``) holds only for sizes
    the op takes: the rule runs again on the bound types, so a call with an image smaller than the
    kernel fails as eagerly, naming the op and where, rather than running with a negative size."""
    from ...ir.primitives import PRIMITIVES  # noqa: PLC0415

    primitive = PRIMITIVES.get(node.op)
    if primitive is None:  # a fused kernel: its nodes were checked before fusion bound them
        return
    try:
        primitive.infer(*types, **attrs)
    except (RuntimeError, ValueError, IndexError) as error:
        where = f" at {node.loc}" if node.loc else ""
        raise ValueError(f"kiln.compile: this call's dynamic sizes do not fit {node.op}{where}: {error}") from None


def _check_slice(node: Node, stops: tuple[int, ...], shape: tuple) -> None:
    """A slice to a dynamic size (``mask[:T]``) must stay within the dim it slices: eager slicing
    would stop at its end, and the program's later ops expect the size (ValueError says so)."""
    for axis, (stop, n) in enumerate(zip(stops, shape, strict=True)):
        if stop > n:
            where = f" at {node.loc}" if node.loc else ""
            raise ValueError(
                f"kiln.compile: this call's dynamic size {stop} slices past the end of a dimension of size {n} "
                f"(dim {axis}{where}); eager slicing would stop at {n}: call the function with sizes up to {n}"
            )


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
