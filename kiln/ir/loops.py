"""The loop node: one body graph run ``trips`` times, values carried from each iteration to the next.

A ``loop`` node (``kiln.ir.graph.LOOP``) is what ``kiln.passes.roll_loops`` makes of a trace that
repeats one computation (the steps of an unrolled RNN, a Python ``for`` over layers of one shape):
the passes, the memory plan and the code generators see the body once, an executor runs it
``trips`` times. Its attributes (all plain values but the body):

- ``name``: unique among the graph's kernels and loops (it qualifies the body's constants);
- ``bodies``: ``(body,)``; the body's inputs are the carried values, then the invariants, then the
  per-iteration inputs; its outputs are whatever the attributes below name;
- ``trips``: N >= 1, how many times the body runs;
- ``carried``: per carried value ``c``, the body output that iteration ``k + 1`` reads as body input
  ``c``; iteration 0 reads node input ``c`` (the initial value);
- ``invariant``: I, how many body inputs (after the carried ones) read the same node input on every
  iteration;
- ``per_iteration``: S, how many body inputs (after the invariants) read a different node input on
  each iteration: body input ``C + I + s`` reads node input ``C + I + s * N + k`` on iteration ``k``;
- ``last``: the body outputs whose value of the last iteration is a node output (outputs ``0..L-1``);
- ``stacked``: the body outputs whose value of every iteration is a node output: body output
  ``stacked[m]`` of iteration ``k`` is node output ``L + m * N + k``.

Per-iteration inputs and outputs are N separate values of the outer graph, so no stacking copies
are needed. Every iteration's outputs are new arrays: a loop writes none of its inputs.

>>> import numpy as np
>>> from kiln.ir.graph import GraphBuilder
>>> from kiln.ir.types import TensorType
>>> from kiln.ir.dtypes import float32
>>> b = GraphBuilder()
>>> h = b.input(TensorType((2,), float32))
>>> body = b.build([b.node("add", [h, h])])
>>> loop = Loop(body, trips=3, carried=(0,), invariant=0, per_iteration=0, last=(0,), stacked=())
>>> run_loop(loop, lambda arrays: [arrays[0] + arrays[0]], [np.ones(2, np.float32)])
[array([8., 8.], dtype=float32)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .graph import LOOP, Graph, Node
from .types import TensorType

__all__ = [
    "LOOP_ATTRS",
    "Loop",
    "LoopRuleError",
    "check_loop",
    "describe_loop",
    "loop_of",
    "loop_output_types",
    "run_loop",
]

#: The attributes of every loop node.
LOOP_ATTRS = frozenset({"name", "bodies", "trips", "carried", "invariant", "per_iteration", "last", "stacked"})


class LoopRuleError(ValueError):
    """A loop node's attributes, inputs or outputs break the rules of ``kiln.ir.loops``."""


@dataclass(frozen=True)
class Loop:
    """A loop node's attributes, by name (``loop_of(node)``; ``attrs()`` gives them back)."""

    body: Graph
    trips: int
    carried: tuple[int, ...]
    invariant: int
    per_iteration: int
    last: tuple[int, ...]
    stacked: tuple[int, ...]

    @property
    def input_count(self) -> int:
        """How many inputs the node takes."""
        return len(self.carried) + self.invariant + self.per_iteration * self.trips

    def attrs(self, name: str) -> dict[str, Any]:
        return {"name": name, "bodies": (self.body,), "trips": self.trips, "carried": self.carried,
                "invariant": self.invariant, "per_iteration": self.per_iteration, "last": self.last,
                "stacked": self.stacked}  # fmt: skip


def loop_of(node: Node) -> Loop:
    """The ``Loop`` of a loop node."""
    a = node.attrs
    return Loop(a["bodies"][0], a["trips"], a["carried"], a["invariant"], a["per_iteration"], a["last"], a["stacked"])


def loop_output_types(loop: Loop) -> list[TensorType]:
    """The types of the node's outputs: the ``last`` outputs', then each stacked output's, ``trips`` times."""
    outs = loop.body.outputs
    return [outs[j].type for j in loop.last] + [outs[j].type for j in loop.stacked for _ in range(loop.trips)]


def check_loop(node: Node, verify_body: Callable[[Graph], None]) -> None:
    """Raise ``LoopRuleError`` unless ``node`` is a well-formed loop node (``verify_body`` checks the body
    as a graph; the verifier passes its own check)."""
    if set(node.attrs) != LOOP_ATTRS:
        raise LoopRuleError(f"a loop's attrs are {', '.join(sorted(LOOP_ATTRS))}, got {', '.join(sorted(node.attrs))}")
    bodies = node.attrs["bodies"]
    if not isinstance(bodies, tuple) or len(bodies) != 1 or not isinstance(bodies[0], Graph):
        raise LoopRuleError(f"a loop's bodies are a tuple of one Graph, got {bodies!r:.80}")
    loop = loop_of(node)
    counts = (loop.trips, loop.invariant, loop.per_iteration)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in counts) or loop.trips < 1 or min(counts) < 0:
        raise LoopRuleError(f"trips >= 1, invariant >= 0 and per_iteration >= 0 are ints, got {counts}")
    body = loop.body
    for what, indices in (("carried", loop.carried), ("last", loop.last), ("stacked", loop.stacked)):
        if not isinstance(indices, tuple) or not all(
            isinstance(j, int) and 0 <= j < len(body.outputs) for j in indices
        ):
            raise LoopRuleError(f"{what} names body outputs (0..{len(body.outputs) - 1}), got {indices!r}")
    verify_body(body)
    carried = len(loop.carried)
    if len(body.inputs) != carried + loop.invariant + loop.per_iteration:
        raise LoopRuleError(
            f"the body takes {len(body.inputs)} inputs; the attributes say {carried} carried + {loop.invariant} "
            f"invariant + {loop.per_iteration} per iteration"
        )
    for c, j in enumerate(loop.carried):
        if body.inputs[c].type != body.outputs[j].type:
            raise LoopRuleError(f"carried value {c} is {body.inputs[c].type} in but {body.outputs[j].type} out")
    expected_inputs = [v.type for v in body.inputs[: carried + loop.invariant]]
    expected_inputs += [v.type for v in body.inputs[carried + loop.invariant :] for _ in range(loop.trips)]
    _same_types("input", [v.type for v in node.inputs], expected_inputs)
    _same_types("output", [v.type for v in node.outputs], loop_output_types(loop))


def _same_types(role: str, given: list[TensorType], expected: list[TensorType]) -> None:
    if len(given) != len(expected):
        raise LoopRuleError(f"the node has {len(given)} {role}s; its body and attributes make {len(expected)}")
    for i, (a, b) in enumerate(zip(given, expected, strict=True)):
        if a != b:
            raise LoopRuleError(f"{role} {i} has type {a} on the node but {b} by the body")


def run_loop(loop: Loop, call: Callable[[list[Any]], Sequence[Any]], arrays: Sequence[Any]) -> list[Any]:
    """The node's outputs for its input ``arrays``, where ``call(body inputs) -> body outputs`` runs the
    body once (the interpreter's program of it, or the compiled one)."""
    n, carried = loop.trips, len(loop.carried)
    # A trip's inputs: the carried values and the invariants (``head``, its first ``carried`` replaced
    # after each trip), then per-iteration input s of trip k, node input ``C + I + s * N + k``: every
    # N-th of ``per`` from k. (Plain list operations: a trip of an LSTM cell loop is some 100 us.)
    head = list(arrays[: carried + loop.invariant])
    per = list(arrays[carried + loop.invariant :])
    columns: list[list[Any]] = [[] for _ in loop.stacked]
    stacked = list(zip(columns, loop.stacked, strict=True))
    outputs: Sequence[Any] = ()
    for k in range(n):
        outputs = call(head + per[k::n] if per else head.copy())
        head[:carried] = [outputs[j] for j in loop.carried]
        for column, j in stacked:
            column.append(outputs[j])
    return [outputs[j] for j in loop.last] + [array for column in columns for array in column]


def describe_loop(node: Node) -> str:
    """One line for reports: ``loop0: 999 trips of a 52-node body (4 carried, 9 invariant, ...)``."""
    assert node.op == LOOP, node.op
    loop = loop_of(node)
    return (f"{node.attrs['name']}: {loop.trips} trips of a {len(loop.body.nodes)}-node body ({len(loop.carried)} "
            f"carried, {loop.invariant} invariant, {loop.per_iteration} per-iteration inputs; {len(loop.last)} "
            f"final, {len(loop.stacked)} per-iteration outputs)")  # fmt: skip
