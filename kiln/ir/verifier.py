"""Checks a graph's invariants: SSA, topological order, known ops, well-formed attributes, and types.

``verify(graph)`` re-runs every primitive's type rule on its input types, so a pass that
builds a node with the wrong type (or a tampered file) is caught at the node that is wrong:

>>> from kiln.ir.graph import GraphBuilder
>>> from kiln.ir.dtypes import float32
>>> b = GraphBuilder()
>>> x = b.input(TensorType((2,), float32))
>>> y = b.node("exp", [x], type=TensorType((3,), float32))
>>> verify(b.build([y]))
Traceback (most recent call last):
...
kiln.ir.verifier.VerificationError: node 0 (%1 = exp): output type f32[3] does not match the type rule's f32[2]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .dtypes import DType
from .graph import CONSTANT, Graph, Node, SourceLocation, Value
from .primitives import PRIMITIVES
from .printer import format_type
from .types import Device, TensorType

__all__ = ["VerificationError", "verify"]

_PLAIN_ATTRS = (bool, int, float, str, type(None), DType)


class VerificationError(ValueError):
    """A graph breaks an invariant of the IR; the message names the node and its source location."""


def verify(graph: Graph) -> None:
    """Raise ``VerificationError`` unless ``graph`` is well formed and every type is its rule's."""
    if not isinstance(graph, Graph):
        raise VerificationError(f"expected a Graph, got {type(graph).__name__}")
    defined: dict[int, Value] = {}  # id -> value
    for i, value in enumerate(graph.inputs):
        _check_value(value, f"graph input {i}")
        _define(defined, value, f"graph input {i}")
    producers = {v.id: i for i, node in enumerate(graph.nodes) for v in _outputs(node) if isinstance(v, Value)}
    for index, node in enumerate(graph.nodes):
        if not isinstance(node, Node):
            raise VerificationError(f"node {index}: expected a Node, got {type(node).__name__}")
        _check_node(graph, index, node, defined, producers)
    for i, value in enumerate(graph.outputs):
        if not isinstance(value, Value) or defined.get(value.id) is not value:
            raise VerificationError(f"graph output {i} ({_name(value)}) is not a value defined in the graph")


def _outputs(node: Any) -> tuple:
    outputs = getattr(node, "outputs", ())
    return outputs if isinstance(outputs, tuple) else ()


def _name(value: Any) -> str:
    return f"%{value.id}" if isinstance(value, Value) else repr(value)


def _where(index: int, node: Node) -> str:
    outputs = ", ".join(_name(v) for v in _outputs(node)) or "()"
    text = f"node {index} ({outputs} = {node.op}"
    if isinstance(node.loc, SourceLocation):
        text += f", at {node.loc}"
    return text + ")"


def _check_value(value: Any, what: str) -> None:
    if not isinstance(value, Value):
        raise VerificationError(f"{what}: expected a Value, got {type(value).__name__}")
    if not isinstance(value.id, int) or isinstance(value.id, bool) or value.id < 0:
        raise VerificationError(f"{what}: value ids are non-negative ints, got {value.id!r}")
    t = value.type
    if not isinstance(t, TensorType):
        raise VerificationError(f"{what}: %{value.id} has type {t!r}, expected a TensorType")
    if not isinstance(t.shape, tuple) or not all(isinstance(d, int) and not isinstance(d, bool) for d in t.shape):
        raise VerificationError(f"{what}: %{value.id} has shape {t.shape!r}, expected a tuple of ints")
    if any(d < 0 for d in t.shape):
        raise VerificationError(f"{what}: %{value.id} has a negative dimension in shape {t.shape}")
    if not isinstance(t.dtype, DType) or not isinstance(t.device, Device):
        raise VerificationError(f"{what}: %{value.id} has dtype {t.dtype!r} and device {t.device!r}, expected kiln's")


def _define(defined: dict[int, Value], value: Value, what: str) -> None:
    if value.id in defined:
        same = "the same value" if defined[value.id] is value else "another value with the same id"
        raise VerificationError(f"{what}: %{value.id} is defined twice ({same} is defined earlier)")
    defined[value.id] = value


def _check_node(graph: Graph, index: int, node: Node, defined: dict[int, Value], producers: dict[int, int]) -> None:
    where = _where(index, node)
    if not isinstance(node.op, str):
        raise VerificationError(f"{where}: the op must be a string, got {type(node.op).__name__}")
    if node.loc is not None and not isinstance(node.loc, SourceLocation):
        raise VerificationError(f"{where}: loc is {node.loc!r}, expected a SourceLocation or None")
    if not isinstance(node.inputs, tuple) or not isinstance(node.outputs, tuple):
        raise VerificationError(f"{where}: inputs and outputs must be tuples of Values")
    for i, value in enumerate(node.inputs):
        if not isinstance(value, Value):
            raise VerificationError(f"{where}: input {i} is a {type(value).__name__}, expected a Value")
        if defined.get(value.id) is not value:
            raise VerificationError(f"{where}: input {i} uses %{value.id} {_why_undefined(value, defined, producers)}")
    _check_attrs(where, node.attrs)
    if len(node.outputs) != 1:
        raise VerificationError(f"{where}: expected exactly one output, got {len(node.outputs)}")
    for value in node.outputs:
        _check_value(value, where)
        _define(defined, value, where)
    if node.op == CONSTANT:
        _check_constant(graph, where, node)
    else:
        _check_type(where, node)


def _why_undefined(value: Value, defined: dict[int, Value], producers: dict[int, int]) -> str:
    if value.id in defined:
        return "but that is another value with the same id (a value from another graph?)"
    if value.id in producers:
        return f"before its definition by node {producers[value.id]}"
    return "but it is not defined in the graph"


def _check_attrs(where: str, attrs: Any) -> None:
    if not isinstance(attrs, Mapping):
        raise VerificationError(f"{where}: attrs is a {type(attrs).__name__}, expected a mapping")
    for key, value in attrs.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise VerificationError(f"{where}: attribute names are identifiers, got {key!r}")
        bad = _bad_attr(value)
        if bad is not None:
            kind = (
                type(bad).__name__
                if type(bad).__module__ == "builtins"
                else f"{type(bad).__module__}.{type(bad).__name__}"
            )
            raise VerificationError(
                f"{where}: attribute {key}={value!r} holds a {kind}; expected ints, floats, bools, "
                "strings, None, kiln dtypes or tuples of these"
            )


def _bad_attr(value: Any) -> Any:
    """The first part of ``value`` that is not an allowed attribute kind, or None."""
    if isinstance(value, tuple):
        for item in value:
            bad = _bad_attr(item)
            if bad is not None:
                return bad
        return None
    return None if type(value) in _PLAIN_ATTRS or isinstance(value, DType) else value


def _check_constant(graph: Graph, where: str, node: Node) -> None:
    if node.inputs or set(node.attrs) != {"name"} or not isinstance(node.attrs["name"], str):
        raise VerificationError(f'{where}: a constant has no inputs and attrs {{name="..."}}, got {dict(node.attrs)}')
    name = node.attrs["name"]
    if name not in graph.constants:
        raise VerificationError(f"{where}: constant {name!r} is missing from the graph's constants")
    array = graph.constants[name]
    t = node.outputs[0].type
    if not isinstance(array, np.ndarray):
        raise VerificationError(f"{where}: constant {name!r} is a {type(array).__name__}, expected a numpy array")
    if array.shape != t.shape or array.dtype != t.dtype.np:
        raise VerificationError(
            f"{where}: constant {name!r} is an array of shape {array.shape} and dtype {array.dtype}, "
            f"but the value's type is {t}"
        )


def _check_type(where: str, node: Node) -> None:
    prim = PRIMITIVES.get(node.op)
    if prim is None:
        raise VerificationError(f"{where}: unknown op {node.op!r} (neither 'constant' nor a registered primitive)")
    try:
        expected = prim.infer(*(v.type for v in node.inputs), **node.attrs)
    except Exception as error:  # the rule's own message says what is wrong with the inputs or attrs
        raise VerificationError(f"{where}: the type rule rejects the node: {type(error).__name__}: {error}") from error
    given = node.outputs[0].type
    if given != expected:
        raise VerificationError(
            f"{where}: output type {_type_text(given)} does not match the type rule's {_type_text(expected)}"
        )


def _type_text(t: TensorType) -> str:
    return format_type(t) if isinstance(t, TensorType) else repr(t)
