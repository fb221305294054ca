"""Composite regions: which nodes of a trace one composite op (linear, conv2d, softmax...) made.

Composite ops are plain Python over primitives and are inlined when traced (DESIGN.md). Tools
that want them back whole (the ONNX exporter writes ``Conv``, not im2col) read the regions a
trace records: a ``Region`` names the op, its arguments (tensor arguments as the IR values they
held when the op was called, other arguments as given) and the IR values of its results.

A region says nothing about the nodes in between: a consumer that replaces a region by one
operator computes the region's results from its arguments with the op's own semantics, and
drops the region when a value it names is gone from the graph (a pass replaced it).

``composite(name)`` is the decorator; outside a trace it costs one integer test per call.
``regions_to_json``/``regions_from_json`` carry regions in exported files (values by id; an
argument that is an object, such as the module of an LSTM's direction, by its class's full name).
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any

from ...ir import dtypes as dt
from ...ir.graph import Graph, SourceLocation, Value
from . import state


@dataclass(frozen=True, eq=False)
class Region:
    """One call of a composite op: ``outputs = name(**arguments)``."""

    name: str
    arguments: dict[str, Any]  # tensors as Values (None when a tensor could not be bound), others as given
    outputs: tuple[Value, ...]
    loc: SourceLocation | None = None


#: The composite ops by name, undecorated: ``region_check`` runs a stored region's op to check it.
IMPLEMENTATIONS: dict[str, Any] = {}


def composite(name: str):
    """Mark a function as the composite op ``name``: traces record a ``Region`` for each call.

    >>> @composite("my_op")
    ... def my_op(x, scale=2.0):
    ...     return x * scale
    """

    def decorate(fn):
        signature = inspect.signature(fn)
        IMPLEMENTATIONS.setdefault(name, fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not state.tracing:
                return fn(*args, **kwargs)
            trace = state.current.get()
            if trace is None or not hasattr(trace, "regions"):
                return fn(*args, **kwargs)
            return _record(trace, name, signature, fn, args, kwargs)

        return wrapper

    return decorate


def _record(trace, name: str, signature: inspect.Signature, fn, args: tuple, kwargs: dict):
    from ..tensor import Tensor  # noqa: PLC0415
    from .locations import user_location  # noqa: PLC0415

    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return fn(*args, **kwargs)  # the function itself raises the error the user should see
    bound.apply_defaults()
    arguments = {}
    for key, arg in bound.arguments.items():
        arguments[key] = _values(trace, arg, Tensor)
    result = fn(*args, **kwargs)
    if state.current.get() is not trace:
        return result  # the trace stopped inside the op
    leaves = _flat(result)
    if all(isinstance(t, Tensor) and trace.is_bound(t) for t in leaves):
        outputs = tuple(trace.value_of(t) for t in leaves)
        trace.regions.append(Region(name, arguments, outputs, user_location(3)))
    return result


def _flat(result) -> list:
    if isinstance(result, tuple | list):
        return [leaf for item in result for leaf in _flat(item)]
    return [result]


def _values(trace, arg, tensor_type):
    if isinstance(arg, tensor_type):
        return trace.value_of(arg) if state.current.get() is trace else None
    if isinstance(arg, tuple | list) and any(isinstance(a, tensor_type) for a in arg):
        return tuple(_values(trace, a, tensor_type) for a in arg)
    return arg


# ----------------------------------------------------------------------------- in files
class _Unstorable(Exception):
    pass


def class_name(obj) -> str:
    """``module.QualName`` of an object's class, or the name a stored region kept for it."""
    if isinstance(obj, dict) and isinstance(obj.get("object"), str):
        return obj["object"]
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def regions_to_json(regions, graph: Graph, traced: Graph | None = None) -> list:
    """The regions whose values are all in ``graph``, as JSON. ``traced``: the graph the regions were
    recorded on, when ``graph`` is that graph after the passes; a value the passes merged with an equal
    one (CSE) is found again. A region with an argument JSON cannot hold (a non-finite float, an object
    other than the first argument) or a value the passes replaced otherwise is left out."""
    present = {v: v for v in graph.values()}
    if traced is not None:  # a value CSE dropped has an equal twin in the traced graph that survived
        numbers = _value_numbers(traced)
        survivor: dict = {}
        for v, n in numbers.items():
            if v in present:
                survivor.setdefault(n, v)
        present.update((v, survivor[n]) for v, n in numbers.items() if v not in present and n in survivor)
    stored = []
    for region in regions:
        try:
            arguments = {
                key: _to_json(arg, present, first=i == 0) for i, (key, arg) in enumerate(region.arguments.items())
            }
            outputs = [_to_json(v, present)["value"] for v in region.outputs]
        except _Unstorable:
            continue
        stored.append({"name": region.name, "arguments": arguments, "outputs": outputs})
    return stored


def _value_numbers(graph: Graph) -> dict:
    """A number per value, equal for values that compute the same thing the same way."""
    numbers: dict = {}  # each structure interned once, so keys stay flat
    found: dict = {}
    for k, v in enumerate(graph.inputs):
        found[v] = numbers.setdefault(("input", k), len(numbers))
    for node in graph.nodes:
        if node.op == "constant":
            array = graph.constants[node.attrs["name"]]
            head: tuple = ("constant", array.dtype.str, array.shape, array.tobytes())
        else:
            head = (node.op, node.attr_key(), tuple(found.get(v, -1) for v in node.inputs))
        for index, v in enumerate(node.outputs):
            found[v] = numbers.setdefault((head, index), len(numbers))
    return found


def _to_json(arg, present: dict, first: bool = False):
    if isinstance(arg, Value):
        if arg not in present:
            raise _Unstorable
        return {"value": present[arg].id}
    if arg is None or isinstance(arg, bool | int | str):
        return arg
    if isinstance(arg, float):
        if not math.isfinite(arg):
            raise _Unstorable
        return arg
    if isinstance(arg, tuple | list):
        return {"tuple": [_to_json(a, present) for a in arg]}
    if isinstance(arg, dt.DType):
        return {"dtype": arg.name}
    if first:  # self: a method's object, kept by its class name
        return {"object": class_name(arg)}
    raise _Unstorable


def regions_from_json(stored, graph: Graph) -> tuple[Region, ...]:
    """Regions read back from a file; ``ValueError``/``TypeError`` say what is malformed."""
    if not isinstance(stored, list):
        raise TypeError(f"regions must be a list, got {type(stored).__name__}")
    by_id = {v.id: v for v in graph.values()}
    regions = []
    for entry in stored:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError(f"bad region {str(entry)[:60]!r}")
        arguments = entry["arguments"]
        if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
            raise ValueError(f"bad region arguments {str(arguments)[:60]!r}")
        decoded = {key: _from_json(arg, by_id) for key, arg in arguments.items()}
        outputs = tuple(_value(by_id, i) for i in entry["outputs"])
        regions.append(Region(entry["name"], decoded, outputs))
    return tuple(regions)


def _value(by_id: dict, i) -> Value:
    if type(i) is not int or i not in by_id:
        raise ValueError(f"a region names value {str(i)[:20]!r}, which the graph does not define")
    return by_id[i]


def _from_json(obj, by_id: dict):
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, dict) and len(obj) == 1:
        ((kind, payload),) = obj.items()
        if kind == "value":
            return _value(by_id, payload)
        if kind == "tuple" and isinstance(payload, list):
            return tuple(_from_json(a, by_id) for a in payload)
        if kind == "dtype" and payload in dt.BY_NAME:
            return dt.BY_NAME[payload]
        if kind == "object" and isinstance(payload, str):
            return {"object": payload}
    raise ValueError(f"bad region argument {str(obj)[:60]!r}")
