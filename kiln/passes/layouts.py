"""The layout of every value at run time: ``infer_layouts(graph, input_strides)``.

An analysis, not a rewrite: it returns each value's byte strides. The code generator compiles each
kernel for the strides of its inputs, the write-back choice needs C-contiguous inputs, and the
executor copies a value into its promised layout where numpy would hand back another one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from ..ir.graph import CONSTANT, NESTING_OPS, Graph, Node, Value
from ..ir.primitives import PRIMITIVES
from ..ir.primitives.movement import reshape_view

Layouts = dict[Value, tuple[int, ...]]


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """C-order strides in bytes, as numpy gives them (size-0 dims count as 1)."""
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def static_shape(value: Value) -> tuple[int, ...]:
    """``value``'s shape, which must be static: a layout is concrete strides."""
    shape = value.type.shape
    assert all(isinstance(d, int) for d in shape), f"layouts need static shapes, got %{value.id}: {value.type}"
    return cast(tuple[int, ...], shape)


def is_c_order(value: Value, strides: tuple) -> bool:
    """Whether ``strides`` are ``value``'s C-order strides."""
    return strides == c_strides(static_shape(value), value.type.dtype.itemsize)


def _fake(shape: tuple, strides: tuple, dtype: np.dtype) -> np.ndarray:
    """An array with this layout over a 1-element buffer: view ops read its strides, never its data."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, strides)


def view_strides(node: Node, strides: tuple) -> tuple | None:
    """The byte strides of a view node's result given its input's, or None when numpy copies."""
    source = node.inputs[0].type
    fake = _fake(source.shape, strides, source.dtype.np)
    if node.op == "reshape":
        view = reshape_view(fake, node.attrs["shape"])
        return None if view is None else view.strides  # None: not a view, numpy copies into C order
    return PRIMITIVES[node.op].eager(np, fake, **node.attrs).strides


def infer_layouts(graph: Graph, input_strides: Sequence[tuple | None]) -> Layouts:
    """Byte strides of every value at run time: inputs as given (None: C order), constants as
    stored, views derived, everything else C-contiguous (kernel outputs by construction; the
    results of extern nodes and of interpreted kernels are copied into C order at run time when
    numpy gave another layout).

    Needs: a graph in topological order (fused or not). Establishes: every value of the graph has
    its strides; a value that is not a view of an input or a constant has C-order strides.
    """
    layouts: Layouts = {}
    for value, strides in zip(graph.inputs, input_strides, strict=True):
        layouts[value] = strides if strides is not None else c_strides(static_shape(value), value.type.dtype.itemsize)
    for node in graph.nodes:
        if node.op == CONSTANT:
            layouts[node.output] = graph.constants[node.attrs["name"]].strides
            continue
        derived = None
        if node.op not in NESTING_OPS and PRIMITIVES[node.op].is_view:
            derived = view_strides(node, layouts[node.inputs[0]])
        for out in node.outputs:
            layouts[out] = derived if derived is not None else c_strides(static_shape(out), out.type.dtype.itemsize)
    return layouts


def describe_layouts(layouts: Layouts) -> str:
    """One line per value that is not in C order (what ``dump_dir`` shows after this stage)."""
    lines = [f"layouts of {len(layouts)} values; those not in C order:"]
    for value, strides in layouts.items():
        if not is_c_order(value, strides):
            lines.append(f"  %{value.id}: {value.type} strides {strides}")
    return "\n".join(lines) + "\n"
