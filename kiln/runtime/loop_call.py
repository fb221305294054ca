"""The executor's step for a loop node: the body's compiled program, run once per trip.

The compile driver compiled the body on its own (``kiln.compiler.driver``); this step feeds it the
carried values, the invariants and each iteration's inputs (``kiln.ir.loops.run_loop``). The outer
program sees a loop's outputs as the results of an extern node, so each must be memory of its own
in C order: a body output the body program does not promise to be new memory (a view, an input
passed through) is copied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..ir.graph import Node, Value
from ..ir.loops import loop_of, run_loop
from ..ir.primitives import recurrence_native
from . import threads


class LoopCall:
    """A loop node: ``program`` (its body, compiled) run ``trips`` times."""

    __slots__ = ("node", "position", "dead", "loop", "program", "run_body", "copied", "args", "outs")

    def __init__(self, node: Node, position: int, dead: tuple, slots: Mapping[Value, int], program: Any) -> None:
        self.node, self.position, self.dead = node, position, dead
        self.loop = loop_of(node)
        self.program = program
        # the outer program runs its steps with numpy's errors ignored (a loop is no compiled kernel):
        # the trips need not set that state again
        self.run_body = getattr(program, "run_in_errstate", program.run_checked_inputs)
        loop = self.loop
        vary = getattr(program, "vary_inputs", None)
        if vary is not None:  # every trip's carried and per-iteration inputs are new arrays
            carried, invariant = len(loop.carried), loop.invariant
            vary([*range(carried), *range(carried + invariant, carried + invariant + loop.per_iteration)])
        body_outputs = len(self.loop.body.outputs)
        new = getattr(program, "new_outputs", program.fresh_outputs)
        self.copied = tuple(j for j in range(body_outputs) if j not in new)
        self.args = tuple(slots[v] for v in node.inputs)
        self.outs = tuple(slots[v] for v in node.outputs)

    def _body(self, inputs: list[Any]) -> Sequence[Any]:
        # every input is in C order (``run`` conformed the node's inputs; the carried values are
        # the body's outputs, fresh or copied below) and of the types the verifier checked
        outputs = self.run_body(inputs)
        for j in self.copied:
            outputs[j] = np.array(outputs[j], order="C", copy=True)
        return outputs

    def run(self, env: list, tables: Any) -> None:
        threads.park()  # the body's own steps choose their pools
        arrays = [_c_order(env[slot]) for slot in self.args]  # the body was compiled for C order
        carried = len(self.loop.carried)
        # a loop writes none of its inputs: the invariants stay as they are over the trips (an LSTM
        # cell's step keeps its weight's transposed copy)
        with recurrence_native.unchanging(arrays[carried : carried + self.loop.invariant]):
            results = run_loop(self.loop, self._body, arrays)
        for slot, array in zip(self.outs, results, strict=True):
            env[slot] = array
        for slot in self.dead:
            env[slot] = None

    def describe(self) -> str:
        return f"loop {self.node.attrs['name']} ({self.loop.trips} trips of {len(self.loop.body.nodes)} nodes)"


def _c_order(array: Any) -> Any:
    """``array``, or a copy of it in C order (the layout the body's program was compiled for)."""
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)
