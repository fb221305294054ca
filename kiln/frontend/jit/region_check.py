"""Regions read from a file, checked against the graph they describe (``load_exported``).

A stored region says "these values are ``softmax(x, dim=-1)``"; an exporter that trusts it writes
``Softmax(axis=-1)`` instead of the nodes, so a region whose arguments were changed in the file (the
dim, a weight) would write a different model than the graph computes. ``check_regions`` runs each
region both ways on the same sample arguments: the graph's nodes between the region's arguments and
its results (by the interpreter), and the composite op itself (eagerly, as traced); results that
differ, or that depend on a value that is not one of the region's arguments, refuse the file.

A region whose op this kiln does not know, or whose arguments hold an object kiln cannot stand in
for, cannot be checked and is dropped (an exporter then writes the graph's own nodes, which is
still the same model).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ...ir import dtypes as dt
from ...ir.graph import Graph, Value
from ...ir.interpreter import interpret
from ..autograd.grad_mode import no_grad
from ..tensor import make_tensor
from .regions import IMPLEMENTATIONS, Region

__all__ = ["check_regions"]

# kiln's recurrences whose direction (``_RNNBase._direction``) reads only these of its module
_RECURRENCES = {"kiln.nn.modules.rnn.LSTM": "LSTM", "kiln.nn.modules.rnn.GRU": "GRU"}


def check_regions(regions: tuple[Region, ...], graph: Graph) -> tuple[Region, ...]:
    """The regions that agree with ``graph``; ``ValueError`` names the first that does not. A region
    over dynamic sizes is checked on the graph at sample sizes (``_at_sample_sizes``)."""
    producers = graph.producers()
    sampled = None if all(_static(r) for r in regions) else _at_sample_sizes(graph)
    kept = []
    for k, region in enumerate(regions):
        fn = IMPLEMENTATIONS.get(region.name)
        checked, on, by = region, graph, producers
        if not _static(region):
            if sampled is None:
                continue  # the graph does not bind at sample sizes: not checked, so dropped
            checked, on, by = _mapped(region, sampled[1]), sampled[0], sampled[2]
        arguments = _stand_in(checked.arguments)
        if fn is None or arguments is None:
            continue
        problem = _disagreement(fn, checked, arguments, on, by)
        if problem:
            raise ValueError(f"region {k} ({region.name}) does not match the graph: {problem}")
        kept.append(region)
    return tuple(kept)


def _at_sample_sizes(graph: Graph) -> tuple[Graph, dict[Value, Value], dict] | None:
    """``graph`` with its symbols bound to small, distinct sizes (3, 4, ...), each of its values -> its
    counterpart there, and the bound graph's producers; None when the graph does not bind."""
    from ...ir.types import plain_symbol  # noqa: PLC0415
    from .dynamic_binding import bind_graph, symbol_positions  # noqa: PLC0415 - dynamic imports the tracer

    sizes = {plain_symbol(d)[0]: 3 + k for k, (d, _, _) in enumerate(symbol_positions(graph))}  # type: ignore[index]
    try:
        bound = bind_graph(graph, sizes)
    except (KeyError, ValueError):  # a symbol no input binds; a slice past its dim at these sizes
        return None
    values = dict(zip(graph.values(), bound.values(), strict=True))
    return bound, values, bound.producers()


def _mapped(region: Region, values: dict[Value, Value]) -> Region:
    def value(arg: Any) -> Any:
        if isinstance(arg, tuple):
            return tuple(value(a) for a in arg)
        return values.get(arg, arg) if isinstance(arg, Value) else arg

    arguments = {key: value(arg) for key, arg in region.arguments.items()}
    return Region(region.name, arguments, tuple(values.get(v, v) for v in region.outputs), region.loc)


def _static(region: Region) -> bool:
    return all(
        isinstance(n, int) for v in _tensor_values(region.arguments) + list(region.outputs) for n in v.type.shape
    )


def _tensor_values(arguments: dict) -> list[Value]:
    found: list[Value] = []
    for arg in arguments.values():
        for a in arg if isinstance(arg, tuple) else (arg,):
            if isinstance(a, Value) and a not in found:
                found.append(a)
    return found


def _slice(region: Region, graph: Graph, producers: dict) -> Graph | str:
    """The graph's nodes from the region's arguments to its results, as a graph of its own."""
    arguments = _tensor_values(region.arguments)
    needed, stack = set(), list(region.outputs)
    while stack:
        v = stack.pop()
        if v in needed or v in arguments:
            continue
        node = producers.get(v)
        if node is None:
            return f"its results depend on %{v.id}, which is none of its arguments"
        needed.add(v)
        stack += node.inputs
    nodes = tuple(n for n in graph.nodes if any(v in needed for v in n.outputs))
    return Graph(tuple(arguments), nodes, tuple(region.outputs), graph.constants)


def _sample(v: Value, rng: np.random.Generator) -> np.ndarray:
    dtype = v.type.dtype
    if dtype.category == dt.FLOATING:
        return rng.standard_normal(v.type.shape).astype(dtype.np)  # type: ignore[arg-type]  # traced: int dims
    return np.zeros(v.type.shape, dtype.np)  # type: ignore[arg-type]  # index-like arguments: 0 is in range wherever any index is


def _disagreement(fn, region: Region, arguments: dict, graph: Graph, producers: dict) -> str:
    sub = _slice(region, graph, producers)
    if isinstance(sub, str):
        return sub
    rng = np.random.default_rng(0)
    samples = {v: _sample(v, rng) for v in sub.inputs}
    try:
        expected = interpret(sub, [samples[v] for v in sub.inputs])
        tensors = {v: make_tensor(a.copy()) for v, a in samples.items()}
        with no_grad():
            got = fn(**{key: _bind(arg, tensors) for key, arg in arguments.items()})
    except Exception as error:  # noqa: BLE001 - a tampered argument may make the op itself fail
        return f"running it on sample arguments fails ({type(error).__name__}: {str(error)[:200]})"
    got = _flat(got)
    if len(got) != len(expected):
        return f"the op gives {len(got)} results, the region names {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        g = g.numpy() if hasattr(g, "numpy") else np.asarray(g)
        if g.shape != e.shape or g.dtype != e.dtype:
            return f"result {i} is {g.dtype}{list(g.shape)} by the op, {e.dtype}{list(e.shape)} in the graph"
        if not np.allclose(g, e, rtol=1e-3, atol=1e-4, equal_nan=True):
            return f"result {i} differs from the graph's by up to {float(np.nanmax(np.abs(g - e))):.3g}"
    return ""


def _bind(arg: Any, tensors: dict) -> Any:
    if isinstance(arg, Value):
        return tensors[arg]
    if isinstance(arg, tuple):
        return tuple(_bind(a, tensors) for a in arg)
    return arg


def _flat(result: Any) -> list:
    if isinstance(result, tuple | list):
        return [leaf for item in result for leaf in _flat(item)]
    return [result]


class _Recurrence:
    """The module of a stored LSTM or GRU direction: its class's methods, on the two fields they read."""

    def __init__(self, cls: type, mode: str, hidden_size: int) -> None:
        self._cls, self.mode, self.hidden_size = cls, mode, hidden_size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cls, name).__get__(self)


def _stand_in(arguments: dict) -> dict | None:
    """The arguments with a stored object (``{"object": class name}``) replaced by a stand-in, or None."""
    out = dict(arguments)
    for key, arg in arguments.items():
        if not isinstance(arg, dict):
            continue
        name = arg.get("object", "")
        module, _, qualname = name.rpartition(".")
        cls = getattr(sys.modules.get(module), qualname, None)  # never imports: kiln's own modules are loaded
        weights = arguments.get("weights")
        if name not in _RECURRENCES or cls is None or not isinstance(weights, tuple) or len(weights) != 4:
            return None
        if not isinstance(weights[1], Value) or len(weights[1].type.shape) != 2:
            return None
        out[key] = _Recurrence(cls, _RECURRENCES[name], weights[1].type.shape[1])  # type: ignore[arg-type]
    return out
