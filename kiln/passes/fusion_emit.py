"""Fusion's second half: kernel bodies, horizontal fusion, and the fused graph in a valid order.

Bodies keep the ids of the values they replace (each body is its own scope, so this is only for
reading: a body reads like the code it came from). A 0-d constant that a body reads is copied
into the body's own constants (a constant is not work, so copying it duplicates nothing);
larger constants are kernel inputs. A kernel's outputs are the very values of the input graph,
so extern nodes and the graph's outputs read them unchanged.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from ..ir.analysis import Space
from ..ir.graph import BODY_REDUCE_OPS, CONSTANT, KERNEL, Graph, Node, Value, structure_key
from ..ir.kernel_kinds import ELEMENTWISE, HORIZONTAL, REDUCTION
from .fusion_checks import CheckOrderCycle, checks_first
from .fusion_recompute import recomputed
from .fusion_refusals import Refusal
from .fusion_rules import classify


@dataclass
class _Kernel:
    """One body and the outer values it reads and makes."""

    body: Graph
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    kind: str  # ELEMENTWISE.name or REDUCTION.name (kiln.ir.kernel_kinds)


@dataclass
class _Unit:
    """A node of the fused graph: an extern or constant node as it was, or kernels (several: horizontal)."""

    first: int  # the position of its first node in the input graph (ties in the order)
    node: Node | None = None
    kernels: list[_Kernel] = field(default_factory=list)

    @property
    def reads(self) -> list[Value]:
        if self.node is not None:
            return list(self.node.inputs)
        return [v for k in self.kernels for v in k.inputs]

    @property
    def defines(self) -> list[Value]:
        if self.node is not None:
            return list(self.node.outputs)
        return [v for k in self.kernels for v in k.outputs]


def emit(graph: Graph, groups: list[list[Node]], spaces: list[Space | None] | None = None,
         refusals: list[Refusal] | None = None) -> Graph:  # fmt: skip
    """The fused graph: ``groups`` (node lists in graph order) become kernels, other nodes stay.
    With the groups' ``spaces``, a kernel also computes again the cheap values of other kernels
    that it would read (``fusion_recompute``); ``refusals`` receives the horizontal merges declined."""
    position = {node: i for i, node in enumerate(graph.nodes)}
    users: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for v in node.inputs:
            users.setdefault(v, []).append(node)
    outputs = set(graph.outputs)
    small_constants = {
        node.outputs[0]: graph.constants[node.attrs["name"]]
        for node in graph.nodes
        if node.op == CONSTANT and node.outputs[0].type.shape == ()
    }
    classes = classify(graph.nodes, users, outputs)
    copies = recomputed(groups, spaces, users, outputs, classes, small_constants) if spaces else [[]] * len(groups)
    # Where each node's value is at hand: its own group's kernel and the kernels that compute it again.
    home = {node: i for i, group in enumerate(groups) for node in group}
    computed_in = [set(group).union(extra) for group, extra in zip(groups, copies, strict=True)]
    units: list[_Unit] = []
    grouped: set[Node] = set()
    for group, extra in zip(groups, copies, strict=True):
        grouped.update(group)
        kernel = _make_kernel(group, extra, computed_in, home, users, outputs, small_constants, position)
        if kernel.outputs:  # else every value it made is computed again where it is read
            units.append(_Unit(position[group[0]], kernels=[kernel]))
    units += [_Unit(position[node], node=node) for node in graph.nodes if node not in grouped]
    # Checks keep their order and run before the extern nodes they guard (``fusion_checks``).
    waits = checks_first(graph, {unit.node for unit in units if unit.node is not None})
    if len(_topological(units, _predecessors(units, waits))) < len(units):
        raise CheckOrderCycle("a kernel both feeds a check and reads what the check guards")
    units = _fuse_horizontally(units, waits, refusals)
    return _build(graph, [units[i] for i in _order(units, _predecessors(units, waits))])


def _make_kernel(
    group: list[Node],
    copies: list[Node],
    computed_in: list[set[Node]],
    home: dict[Node, int],
    users: dict[Value, list[Node]],
    graph_outputs: set[Value],
    small_constants: dict[Value, np.ndarray],
    position: dict[Node, int],
) -> _Kernel:
    members = sorted([*group, *copies], key=position.__getitem__) if copies else group
    inner: dict[Value, Value] = {}
    inputs: list[Value] = []
    outer_inputs: list[Value] = []
    nodes: list[Node] = []
    constants: dict[str, np.ndarray] = {}
    for node in members:
        for v in node.inputs:
            if v in inner:
                continue
            w = inner[v] = Value(v.id, v.type)
            if v in small_constants:
                name = f"c{len(constants)}"
                constants[name] = small_constants[v]
                nodes.append(Node(CONSTANT, (), {"name": name}, (w,)))
            else:
                inputs.append(w)
                outer_inputs.append(v)
        outs = tuple(inner.setdefault(v, Value(v.id, v.type)) for v in node.outputs)
        nodes.append(Node(node.op, tuple(inner[v] for v in node.inputs), dict(node.attrs), outs, node.loc))
    # A value is made for the graph's outputs and for the readers that do not compute it themselves
    # (a copy's value is its maker's to make).
    made = [
        v
        for node in group
        for v in node.outputs
        if v in graph_outputs or any(u not in home or node not in computed_in[home[u]] for u in users.get(v, ()))
    ]
    # What no made value needs goes (the work of values that every reader now computes itself).
    needed = {inner[v] for v in made}
    kept: list[Node] = []
    for node in reversed(nodes):
        if not needed.isdisjoint(node.outputs):
            kept.append(node)
            needed.update(node.inputs)
    kept.reverse()
    live = [k for k, w in enumerate(inputs) if w in needed]
    constants = {n.attrs["name"]: constants[n.attrs["name"]] for n in kept if n.op == CONSTANT}
    body = Graph(tuple(inputs[k] for k in live), tuple(kept), tuple(inner[v] for v in made), constants)
    kind = REDUCTION.name if any(node.op in BODY_REDUCE_OPS for node in kept) else ELEMENTWISE.name
    return _Kernel(body, tuple(outer_inputs[k] for k in live), tuple(made), kind)


# ----------------------------------------------------------------------------- order and dependencies
def _predecessors(units: list[_Unit], waits: dict[Node, set[Node]]) -> list[set[int]]:
    """For each unit, the units it reads from and the checks it waits for (``fusion_checks``)."""
    defined_by = {v: i for i, unit in enumerate(units) for v in unit.defines}
    unit_of = {unit.node: i for i, unit in enumerate(units) if unit.node is not None}
    preds = []
    for i, unit in enumerate(units):
        checks = waits.get(unit.node, ()) if unit.node is not None else ()
        preds.append(({defined_by[v] for v in unit.reads if v in defined_by} | {unit_of[c] for c in checks}) - {i})
    return preds


def _order(units: list[_Unit], preds: list[set[int]]) -> list[int]:
    """A topological order of the units; among those ready, the one that came first in the input graph."""
    order = _topological(units, preds)
    assert len(order) == len(units), "fusion made a cycle"
    return order


def _topological(units: list[_Unit], preds: list[set[int]]) -> list[int]:
    """``_order``, or as much of it as there is when ``preds`` has a cycle (the units on it left out)."""
    waiting = [len(p) for p in preds]
    succs: list[list[int]] = [[] for _ in units]
    for i, p in enumerate(preds):
        for j in p:
            succs[j].append(i)
    ready = [(unit.first, i) for i, unit in enumerate(units) if not waiting[i]]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for j in succs[i]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, (units[j].first, j))
    return order


# ----------------------------------------------------------------------------- horizontal fusion
def _fuse_horizontally(units: list[_Unit], waits: dict[Node, set[Node]],
                       refusals: list[Refusal] | None = None) -> list[_Unit]:  # fmt: skip
    """Merge mutually independent elementwise kernels with identical structure into horizontal units
    (``waits``: the checks each extern node waits for, edges as real as the data's); ``refusals``
    receives, for each kernel left out of a merge of its own bucket, the first member it depends on
    or that depends on it."""
    buckets: dict[tuple, list[int]] = {}
    for i, unit in enumerate(units):
        if unit.node is None and unit.kernels[0].kind == ELEMENTWISE.name:
            buckets.setdefault(structure_key(unit.kernels[0].body), []).append(i)
    pending = [sorted(b, key=lambda i: units[i].first) for b in buckets.values() if len(b) >= 2]
    if not pending:
        return units
    pending.sort(key=lambda b: units[b[0]].first)
    graph = _Dependencies(units, waits)
    refused: set[int] = set()  # units whose refusal is recorded (each said once)
    for bucket in pending:
        candidates = [units[i] for i in bucket]
        while len(candidates) >= 2:
            ancestors = graph.ancestors()
            chosen: list[_Unit] = []
            bits = 0
            for unit in candidates:
                if ancestors[id(unit)] & bits or any(ancestors[id(c)] >> graph.bit[id(unit)] & 1 for c in chosen):
                    if refusals is not None and id(unit) not in refused:
                        refused.add(id(unit))
                        refusals.append(_dependent(unit, chosen, ancestors, graph.bit))
                    continue
                chosen.append(unit)
                bits |= 1 << graph.bit[id(unit)]
            if len(chosen) < 2:
                break
            graph.merge(chosen, _Unit(min(u.first for u in chosen), kernels=[u.kernels[0] for u in chosen]))
            taken = {id(u) for u in chosen}
            candidates = [u for u in candidates if id(u) not in taken]
    return list(graph.alive.values())


def _dependent(unit: _Unit, chosen: list[_Unit], ancestors: dict[int, int], bit: dict[int, int]) -> Refusal:
    """Why ``unit`` joins none of ``chosen``: the first of them on a path to or from it (the earlier side first)."""
    for c in chosen:
        if ancestors[id(unit)] >> bit[id(c)] & 1:
            return Refusal("horizontal", c.kernels[0].outputs[0], unit.kernels[0].outputs[0])
        if ancestors[id(c)] >> bit[id(unit)] & 1:
            return Refusal("horizontal", unit.kernels[0].outputs[0], c.kernels[0].outputs[0])
    raise AssertionError("a unit left out of a horizontal merge depends on none of its members")


class _Dependencies:
    """The units' dependency graph, kept up to date as horizontal fusion merges units (by identity),
    so that each round costs one pass over it instead of rebuilding it from the values."""

    def __init__(self, units: list[_Unit], waits: dict[Node, set[Node]]) -> None:
        self.alive = {id(u): u for u in units}  # in order: units, then merged units as they come
        self.bit = {id(u): k for k, u in enumerate(units)}  # each unit's bit in the ancestor sets
        self.preds = {id(u): {id(units[p]) for p in preds} for u, preds in zip(units, _predecessors(units, waits))}
        self.succs: dict[int, set[int]] = {k: set() for k in self.preds}
        for k, preds in self.preds.items():
            for p in preds:
                self.succs[p].add(k)
        self._ancestors: dict[int, int] | None = None  # ``ancestors()`` since the last merge

    def merge(self, members: list[_Unit], merged: _Unit) -> None:
        ids = {id(u) for u in members}
        preds = set().union(*(self.preds.pop(k) for k in ids)) - ids
        succs = set().union(*(self.succs.pop(k) for k in ids)) - ids
        for p in preds:
            self.succs[p] = (self.succs[p] - ids) | {id(merged)}
        for s in succs:
            self.preds[s] = (self.preds[s] - ids) | {id(merged)}
        self.preds[id(merged)], self.succs[id(merged)] = preds, succs
        for k in ids:
            del self.alive[k]
        self.alive[id(merged)] = merged
        self.bit[id(merged)] = len(self.bit)
        self._ancestors = None

    def ancestors(self) -> dict[int, int]:
        """For each unit, a bit set (an int) of the units it depends on, directly or transitively (not
        to be changed: the same dict until the next merge, as a bucket whose last round merged nothing
        leaves the graph to the next one as it found it). DCGAN's horizontal fusion computed it 24 times
        for 17 merges, now 17 (the CNN's 13 for 7, now 7): its fuse 43.7 -> 42.1 ms of CPU, the CNN's
        23.7 -> 22.9 (medians of 10 blocks, one process, alternating; the same fused graph)."""
        if self._ancestors is None:
            self._ancestors = self._all_ancestors()
        return self._ancestors

    def _all_ancestors(self) -> dict[int, int]:
        waiting = {k: len(p) for k, p in self.preds.items()}
        ready = [k for k, n in waiting.items() if not n]
        ancestors: dict[int, int] = {}
        while ready:
            k = ready.pop()
            bits = 0
            for p in self.preds[k]:
                bits |= ancestors[p] | (1 << self.bit[p])
            ancestors[k] = bits
            for s in self.succs[k]:
                waiting[s] -= 1
                if not waiting[s]:
                    ready.append(s)
        assert len(ancestors) == len(self.preds), "fusion made a cycle"
        return ancestors


# ----------------------------------------------------------------------------- the graph
def _build(graph: Graph, units: list[_Unit]) -> Graph:
    needed = set(graph.outputs)
    for unit in units:
        needed.update(unit.reads)
    nodes: list[Node] = []
    names: set[str] = set()
    count = 0
    for unit in units:
        if unit.node is not None:
            if unit.node.op == CONSTANT and unit.node.outputs[0] not in needed:
                continue  # a 0-d constant that only kernels read: they hold their own copy
            if unit.node.op == CONSTANT:
                names.add(unit.node.attrs["name"])
            nodes.append(unit.node)
            continue
        bodies = tuple(k.body for k in unit.kernels)
        kind = HORIZONTAL.name if len(bodies) > 1 else unit.kernels[0].kind
        loc = next((n.loc for n in bodies[0].nodes if n.loc is not None), None)
        attrs = {"name": f"k{count}", "kind": kind, "bodies": bodies}
        count += 1
        inputs = tuple(v for k in unit.kernels for v in k.inputs)
        outputs = tuple(v for k in unit.kernels for v in k.outputs)
        nodes.append(Node(KERNEL, inputs, attrs, outputs, loc))
    constants = {name: array for name, array in graph.constants.items() if name in names}
    return Graph(graph.inputs, tuple(nodes), graph.outputs, constants)
