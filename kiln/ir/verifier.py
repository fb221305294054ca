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

from .analysis import ELEMENTWISE_ROLE, REDUCE_ROLE, VIEW_ROLE, body_role
from .dtypes import DType
from .graph import (
    CONSTANT,
    KERNEL,
    LOOP,
    NESTING_OPS,
    QUALIFIER,
    Graph,
    Node,
    SourceLocation,
    Value,
    body_inputs_outputs,
    structure_key,
)
from .kernel_kinds import BodyRuleError, kernel_kind, kernel_kind_names
from .loops import LoopRuleError, check_loop
from .primitives import PRIMITIVES
from .printer import format_type
from .types import Device, Sym, SymProduct, SymSum, TensorType, base_symbols, plain_symbol

__all__ = ["VerificationError", "verify"]

_PLAIN_ATTRS = (bool, int, float, str, type(None), DType, Sym, SymProduct, SymSum)


class VerificationError(ValueError):
    """A graph breaks an invariant of the IR; the message names the node and its source location."""


def verify(graph: Graph) -> None:
    """Raise ``VerificationError`` unless ``graph`` is well formed and every type is its rule's.

    Kernel nodes are checked with their bodies: each body verifies on its own (with only the ops
    a body may hold), its input and output types are the node's, and it keeps the rule of the
    kernel's kind (``kiln.ir.kernel_kinds``; for the fused kinds, the rules fusion forms kernels by in
    ``kiln.ir.analysis``: one domain for an elementwise body; for a reduction body, reductions of the
    same trailing axes of one shape, full values and row values, each row value read at its own row)."""
    _verify_graph(graph, None)


def _verify_graph(graph: Graph, body_kind: str | None) -> None:
    """``verify``; ``body_kind`` is the kind of the kernel when ``graph`` is one of its bodies."""
    if not isinstance(graph, Graph):
        raise VerificationError(f"expected a Graph, got {type(graph).__name__}")
    defined: dict[int, Value] = {}  # id -> value
    for i, value in enumerate(graph.inputs):
        _check_value(value, f"graph input {i}")
        _define(defined, value, f"graph input {i}")
    producers = {v.id: i for i, node in enumerate(graph.nodes) for v in _outputs(node) if isinstance(v, Value)}
    kernels: dict[str, int] = {}
    for index, node in enumerate(graph.nodes):
        if not isinstance(node, Node):
            raise VerificationError(f"node {index}: expected a Node, got {type(node).__name__}")
        if body_kind is not None:
            _check_body_op(index, node, body_kind)
        if node.op == KERNEL:
            _check_kernel_node(index, node, defined, producers, kernels)
        elif node.op == LOOP:
            _check_loop_node(index, node, defined, producers, kernels)
        else:
            _check_node(graph, index, node, defined, producers)
    for i, value in enumerate(graph.outputs):
        if not isinstance(value, Value) or defined.get(value.id) is not value:
            raise VerificationError(f"graph output {i} ({_name(value)}) is not a value defined in the graph")
    _check_symbols_bound(graph)


def _symbols_of(value: Any) -> set[Sym]:
    """The Syms in an attribute value (tuples searched)."""
    if isinstance(value, Sym):
        return base_symbols(value)  # a product or a sum is bound when its symbols are
    if isinstance(value, tuple):
        return set().union(*map(_symbols_of, value)) if value else set()
    return set()


def _check_symbols_bound(graph: Graph) -> None:
    """Every symbolic dimension of a graph is the size of some input's dimension: running the graph
    binds it from there (a symbol only an attribute or a node's output names has no size)."""
    bound = {p[0] for v in graph.inputs for d in v.type.shape if (p := plain_symbol(d))}  # what binding reads
    for index, node in enumerate(graph.nodes):
        used = {s for v in node.outputs for d in v.type.shape for s in base_symbols(d)}
        if node.op not in NESTING_OPS:
            for value in node.attrs.values():
                used |= _symbols_of(value)
        unbound = used - bound
        if unbound:
            names = ", ".join(sorted(s.name for s in unbound))
            raise VerificationError(
                f"{_where(index, node)}: symbolic dimension {names} is not the size of any dimension of the "
                "graph's inputs, so running the graph could not bind it"
            )


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
    if not isinstance(t.shape, tuple) or not all(
        (isinstance(d, int) and not isinstance(d, bool)) or isinstance(d, Sym) for d in t.shape
    ):
        raise VerificationError(f"{what}: %{value.id} has shape {t.shape!r}, expected a tuple of ints and Syms")
    if any(isinstance(d, int) and d < 0 for d in t.shape):
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
    _check_inputs(where, node, defined, producers)
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
                "strings, None, kiln dtypes, Syms or tuples of these"
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


def _check_inputs(where: str, node: Node, defined: dict[int, Value], producers: dict[int, int]) -> None:
    if not isinstance(node.inputs, tuple) or not isinstance(node.outputs, tuple):
        raise VerificationError(f"{where}: inputs and outputs must be tuples of Values")
    for i, value in enumerate(node.inputs):
        if not isinstance(value, Value):
            raise VerificationError(f"{where}: input {i} is a {type(value).__name__}, expected a Value")
        if defined.get(value.id) is not value:
            raise VerificationError(f"{where}: input {i} uses %{value.id} {_why_undefined(value, defined, producers)}")


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


# ----------------------------------------------------------------------------- kernel nodes
def _check_kernel_node(
    index: int, node: Node, defined: dict[int, Value], producers: dict[int, int], kernels: dict[str, int]
) -> None:
    where = _where(index, node)
    if node.loc is not None and not isinstance(node.loc, SourceLocation):
        raise VerificationError(f"{where}: loc is {node.loc!r}, expected a SourceLocation or None")
    _check_inputs(where, node, defined, producers)
    attrs = node.attrs
    if not isinstance(attrs, Mapping) or set(attrs) != {"name", "kind", "bodies"}:
        got = sorted(attrs) if isinstance(attrs, Mapping) else type(attrs).__name__
        raise VerificationError(f"{where}: a kernel's attrs are name, kind and bodies, got {got}")
    name, kind, bodies = attrs["name"], attrs["kind"], attrs["bodies"]
    if not isinstance(name, str) or not name or QUALIFIER in name:
        raise VerificationError(f"{where}: a kernel's name is a non-empty string without {QUALIFIER!r}, got {name!r}")
    if name in kernels:
        raise VerificationError(f"{where}: kernel name {name!r} is already used by node {kernels[name]}")
    kernels[name] = index
    rule = kernel_kind(kind)
    if rule is None:
        raise VerificationError(f"{where}: kernel kind {kind!r} is not one of {', '.join(kernel_kind_names())}")
    if not isinstance(bodies, tuple) or not bodies or not all(isinstance(b, Graph) for b in bodies):
        raise VerificationError(f"{where}: bodies must be a non-empty tuple of Graphs, got {bodies!r:.80}")
    if not rule.members and len(bodies) != 1:
        raise VerificationError(f"{where}: a {kind} kernel has exactly one body, got {len(bodies)}")
    if sum(len(b.inputs) for b in bodies) != len(node.inputs) or sum(len(b.outputs) for b in bodies) != len(
        node.outputs
    ):
        raise VerificationError(
            f"{where}: the node has {len(node.inputs)} inputs and {len(node.outputs)} outputs, but its bodies "
            f"take {sum(len(b.inputs) for b in bodies)} and make {sum(len(b.outputs) for b in bodies)}"
        )
    if not node.outputs:
        raise VerificationError(f"{where}: a kernel makes at least one output")
    for member, (body, inputs, outputs) in enumerate(body_inputs_outputs(node)):
        what = f"{where}, body {member}"
        if not body.outputs:
            raise VerificationError(f"{what}: a body makes at least one output")
        try:  # the kind's rule (kiln.ir.kernel_kinds), given the check of a graph as a kernel body
            rule.verify_body(body, _verify_graph)
        except (VerificationError, BodyRuleError) as error:
            raise VerificationError(f"{what}: {error}") from error
        for role, inner, outer in (("input", body.inputs, inputs), ("output", body.outputs, outputs)):
            for i, (a, b) in enumerate(zip(inner, outer)):
                if a.type != b.type:
                    raise VerificationError(
                        f"{what}: {role} {i} has type {_type_text(a.type)} in the body but {_type_text(b.type)} "
                        "on the node"
                    )
    if rule.members:
        first = structure_key(bodies[0])
        for member, body in enumerate(bodies[1:], 1):
            if structure_key(body) != first:
                raise VerificationError(
                    f"{where}: member {member} of the {kind} kernel is not structurally identical to member 0 "
                    "(same ops, connections, attributes, dtypes and constants; only shapes may differ)"
                )
    for value in node.outputs:
        _check_value(value, where)
        _define(defined, value, where)


def _check_loop_node(
    index: int, node: Node, defined: dict[int, Value], producers: dict[int, int], names: dict[str, int]
) -> None:
    """A loop node: its inputs defined, its name unique, its body a graph of its own, the rules of
    ``kiln.ir.loops`` (types of the carried values, inputs and outputs)."""
    where = _where(index, node)
    _check_inputs(where, node, defined, producers)
    name = node.attrs.get("name")
    if not isinstance(name, str) or not name or QUALIFIER in name:
        raise VerificationError(f"{where}: a loop's name is a non-empty string without {QUALIFIER!r}, got {name!r}")
    if name in names:
        raise VerificationError(f"{where}: name {name!r} is already used by node {names[name]}")
    names[name] = index
    try:
        check_loop(node, lambda body: _verify_graph(body, None))
    except (VerificationError, LoopRuleError) as error:
        raise VerificationError(f"{where}: {error}") from error
    for value in node.outputs:
        _check_value(value, where)
        _define(defined, value, where)


def _check_body_op(index: int, node: Node, body_kind: str) -> None:
    op = node.op
    role = body_role(op) if isinstance(op, str) else None
    if not (
        op == CONSTANT or role in (ELEMENTWISE_ROLE, VIEW_ROLE) or (body_kind == "reduction" and role == REDUCE_ROLE)
    ):
        extra = ", reduce_sum/max/min/prod" if body_kind == "reduction" else ""
        raise VerificationError(
            f"{_where(index, node)}: op {op!r} is not allowed in a kernel body of kind {body_kind} (allowed: "
            f"elementwise primitives, 0-d constants, reshape/expand/permute/slice{extra})"
        )
