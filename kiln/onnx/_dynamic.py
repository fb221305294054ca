"""Dynamic axes: which sizes of a traced program follow an input's dynamic dimension.

A trace sees concrete sizes only. To learn which sizes follow a dynamic axis, the function is
traced twice, at two sizes of each axis, and the two programs are compared: they must have the
same nodes, wiring and constants, and wherever a size or a size-like attribute differs it must be
one axis's size in both (it becomes that ``Sym``) or, in shapes, some other function of the sizes
(``None``: a size ONNX leaves unnamed, such as ``batch * 12`` after a flatten). A constant whose
shape follows the axis is accepted when it holds one value throughout (``zeros(batch, hidden)``)
and is written as that value expanded at run time. Anything else depends on the size in a way an
ONNX graph cannot follow, and the error says where.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import CONSTANT, Graph
from ..ir.types import Sym
from ._builder import OnnxExportError, where


def resized(array: np.ndarray, axis: int, size: int) -> np.ndarray:
    """``array`` with ``size`` entries along ``axis``, repeating its own (so indices stay valid)."""
    return np.take(array, np.arange(size) % array.shape[axis], axis=axis)


def symbolize(graph_a: Graph, graph_b: Graph, sizes: dict[Sym, tuple[int, int]]):
    """``(shapes, attrs, splats)`` for ``graph_a``: the symbolic shape of each value whose size
    follows a symbol, the attributes of each node that name one, and the fill value of each constant
    whose shape does. ``sizes``: each symbol's size in ``graph_a`` and in ``graph_b``."""
    by_pair = {pair: sym for sym, pair in sizes.items()}
    if len(by_pair) != len(sizes):
        raise OnnxExportError("kiln.onnx: two dynamic axes were traced at the same pair of sizes")
    values_a, values_b = list(graph_a.values()), list(graph_b.values())
    if len(graph_a.nodes) != len(graph_b.nodes) or len(values_a) != len(values_b):
        raise _differs(None, f"{len(graph_a.nodes)} nodes at one size and {len(graph_b.nodes)} at the other")
    position_b = {v: i for i, v in enumerate(values_b)}
    position_a = {v: i for i, v in enumerate(values_a)}
    shapes, attrs = {}, {}
    splats: dict = {}
    for va, vb in zip(values_a, values_b, strict=True):
        if va.type.dtype is not vb.type.dtype or va.type.ndim != vb.type.ndim:
            raise _differs(None, f"value %{va.id} is {va.type} at one size and {vb.type} at the other")
        shape = tuple(_dim(a, b, by_pair) for a, b in zip(va.type.shape, vb.type.shape, strict=True))
        if shape != tuple(va.type.shape):
            shapes[va] = shape
    for na, nb in zip(graph_a.nodes, graph_b.nodes, strict=True):
        if na.op != nb.op or [position_a[v] for v in na.inputs] != [position_b[v] for v in nb.inputs]:
            raise _differs(na.loc, f"{na.op} at one size, {nb.op} at the other (or other inputs)")
        if na.op == CONSTANT:
            _constant(na, graph_a.constants[na.attrs["name"]], graph_b.constants[nb.attrs["name"]], splats)
            continue
        if set(na.attrs) != set(nb.attrs):
            raise _differs(na.loc, f"{na.op} has other attributes at the other size")
        changed = {k: _attr(na, k, na.attrs[k], nb.attrs[k], by_pair) for k in na.attrs}
        if any(changed[k] is not na.attrs[k] for k in na.attrs):
            attrs[na] = changed
    outputs_a = [position_a[v] for v in graph_a.outputs]
    if outputs_a != [position_b[v] for v in graph_b.outputs]:
        raise _differs(None, "the outputs are other values at the other size")
    return shapes, attrs, splats


def _dim(a, b, by_pair):
    if a == b:
        return a
    return by_pair.get((a, b))  # None: follows the axes, but is no axis


def _attr(node, key: str, a, b, by_pair):
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        items = tuple(_attr(node, key, x, y, by_pair) for x, y in zip(a, b, strict=True))
        return a if all(x is y for x, y in zip(items, a, strict=True)) else items
    if a == b and type(a) is type(b):
        return a
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool):
        return by_pair.get((a, b))
    raise _differs(node.loc, f"{node.op}'s attribute {key} is {a!r} at one size and {b!r} at the other")


def _constant(node, a: np.ndarray, b: np.ndarray, splats: dict) -> None:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape == b.shape:
        if a.dtype != b.dtype or not np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
            raise _differs(node.loc, f"a constant of shape {list(a.shape)} holds other values at the other size "
                                     "(a number computed from the size, such as a mean's divisor)")  # fmt: skip
        return
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    if flat_a.size and flat_b.size and (flat_a == flat_a[0]).all() and (flat_b == flat_a[0]).all():
        splats[node.output] = flat_a[0]
        return
    raise _differs(node.loc, f"a constant's shape follows the dynamic axes ({list(a.shape)} and {list(b.shape)}) "
                             "and it holds more than one value")  # fmt: skip


def _differs(loc, what: str) -> OnnxExportError:
    return OnnxExportError(
        "kiln.onnx: with dynamic_axes the function is traced at two sizes of each dynamic axis and must give the "
        f"same program, up to those sizes; it does not: {what}{where(loc)}"
    )
