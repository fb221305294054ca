"""Composite regions: which nodes of a trace one composite op (linear, conv2d, softmax...) made.

Composite ops are plain Python over primitives and are inlined when traced (DESIGN.md). Tools
that want them back whole (the ONNX exporter writes ``Conv``, not im2col) read the regions a
trace records: a ``Region`` names the op, its arguments (tensor arguments as the IR values they
held when the op was called, other arguments as given) and the IR values of its results.

A region says nothing about the nodes in between: a consumer that replaces a region by one
operator computes the region's results from its arguments with the op's own semantics, and
drops the region when a value it names is gone from the graph (a pass replaced it).

``composite(name)`` is the decorator; outside a trace it costs one integer test per call.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

from ...ir.graph import SourceLocation, Value
from . import state


@dataclass(frozen=True, eq=False)
class Region:
    """One call of a composite op: ``outputs = name(**arguments)``."""

    name: str
    arguments: dict[str, Any]  # tensors as Values (None when a tensor could not be bound), others as given
    outputs: tuple[Value, ...]
    loc: SourceLocation | None = None


def composite(name: str):
    """Mark a function as the composite op ``name``: traces record a ``Region`` for each call.

    >>> @composite("my_op")
    ... def my_op(x, scale=2.0):
    ...     return x * scale
    """

    def decorate(fn):
        signature = inspect.signature(fn)

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
    from .trace import user_location  # noqa: PLC0415

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
