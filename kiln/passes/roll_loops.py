"""``roll_loops``: a trace whose middle repeats one computation becomes a loop node running it once per trip.

Needs: a graph in topological order, as traced (the driver rolls first, so that the other graph
passes run over the rolled graph, not the unrolled one; the iterations' copies of one view of an
input, a weight's transpose, become one value here, as CSE would make them). Establishes: every
maximal run of ``MIN_TRIPS`` or more consecutive blocks of nodes (``MIN_ROLLED_NODES`` at least)
that are the same computation is one ``loop`` node (``kiln.ir.loops``) whose body is one block;
the graph computes what it computed.

Finding the runs, in time near-linear in the node count (a 1,000-step loop of two LSTM cells with
its backward is about 100k nodes):

1. the views of the graph's inputs move to the front (a step's ``xs[t]`` names its step in its
   attributes; in front it is a per-iteration input), then each node that is not a constant gets
   a signature: op, attributes, input and output types (constants have no inputs: they stay
   outside, hoisted before the loop);
2. candidate periods P are the distances between occurrences of one signature that recur most
   often (weighted by the distance: what they could cover); for each, the positions where
   ``sig[i] == sig[i + P]`` form runs, and a run of length L covers ``L // P + 1`` blocks;
3. runs are taken greedily, most nodes covered first, never overlapping; each is then checked for
   dataflow. An input of a block's node must come, in every block alike, from the same block
   (a value of the body), the previous block (a carried value: block 0 reads its initial value
   from outside), one outside value (an invariant: a weight) or one outside value per block (a
   per-iteration input: a time step's slice, the forward loop's saved activations that the
   backward loop reads in reverse). A run that fails is tried without its first or last block,
   and from a later phase, before it is given up. A run of elementwise work (no matmul, convolution,
   gather... in a block) stays unrolled: fusion merges it across the blocks into a few passes over
   memory, where a loop would make one per trip.

A block's values used after the run become the loop's outputs: only the last block's value (a
final carried value, say) or every block's (per-iteration outputs). The outer graph keeps those
values, now defined by the loop node, so the nodes after the run are unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..ir.graph import CONSTANT, NESTING_OPS, Graph, Node, Value
from ..ir.loops import LOOP, Loop
from ..ir.primitives import ELEMENTWISE, PRIMITIVES, Kind
from ..ir.types import Sym
from .eliminate_common_subexpressions import substitute

logger = logging.getLogger("kiln")

#: Fewer repetitions than this stay unrolled: a loop of 2 or 3 saves little and costs a call per trip.
MIN_TRIPS = 4
#: Runs covering fewer nodes stay unrolled: rolling them saves little compile time, and each trip
#: costs a call of the body's program (tens of microseconds) that fusion across the steps would not.
MIN_ROLLED_NODES = 64
#: Candidate periods tried (the most promising first); each costs one pass over the signatures.
MAX_CANDIDATES = 16
#: Phases tried for a run whose blocks do not check at the phase it was found at.
MAX_PHASES = 8
#: The view ops (``kiln.ir.analysis.is_view``'s).
_VIEWS = frozenset(name for name, prim in PRIMITIVES.items() if prim.is_view)
#: The ops whose nodes have a name (``attrs["name"]``): constants and the nodes holding bodies.
_NAMED = NESTING_OPS | {CONSTANT}


@dataclass(frozen=True)
class Run:
    """``trips`` blocks of ``period`` nodes: positions ``start .. start + trips * period`` of the
    non-constant nodes (``Sequence`` indices, not node indices)."""

    start: int
    period: int
    trips: int

    @property
    def stop(self) -> int:
        return self.start + self.period * self.trips


def roll_loops(graph: Graph, min_trips: int = MIN_TRIPS, min_nodes: int = MIN_ROLLED_NODES) -> Graph:
    """``graph`` with each repeated run of at least ``min_trips`` blocks and ``min_nodes`` nodes rolled
    into a loop node (see the module docstring)."""
    if any(isinstance(d, Sym) for v in graph.inputs for d in v.type.shape):
        return graph  # a program over symbolic sizes is lowered by its own path, which runs no loops yet
    given, graph = graph, _hoist_input_views(graph)
    nodes = graph.nodes
    order, ids = _signatures(nodes)
    if len(order) < 2 * min_trips:
        return given
    plans = []
    taken = np.zeros(len(order), dtype=bool)
    for run in _runs(ids, min_trips):
        if run.period * run.trips < min_nodes or taken[run.start : run.stop].any():
            continue
        plan = _first_plan(graph, order, run, min_trips)
        if plan is not None:
            taken[plan.run.start : plan.run.stop] = True
            plans.append(plan)
    if not plans:
        return given
    return _rewrite(graph, order, sorted(plans, key=lambda p: p.run.start))


def _hoist_input_views(graph: Graph) -> Graph:
    """``graph`` with the views of its inputs (and views of those) moved to the front, one node per
    distinct view: a step's ``xs[t]`` differs from the next step's in its attributes, which would
    break the run; in front, it is a per-iteration input of the loop. The same view taken at every
    step (a weight's transpose, which the tracer records anew each time) becomes one value, an
    invariant of the loop, as CSE would make it. Views compute nothing, so the order costs nothing."""
    rooted = set(graph.inputs)
    front, rest = [], []
    seen: dict[tuple, Node] = {}
    replace: dict[Value, Value] = {}
    views = _VIEWS  # (``is_view``'s test inline: a call per node of a 100k-node trace costs more)
    for node in graph.nodes:
        if replace and not replace.keys().isdisjoint(node.inputs):
            node = substitute(node, replace)
        if node.op in views and rooted.issuperset(node.inputs):
            key = (node.op, node.attr_key(), node.inputs)
            first = seen.get(key)
            if first is None:
                seen[key] = node
                front.append(node)
                rooted.update(node.outputs)
            else:
                replace.update(zip(node.outputs, first.outputs, strict=True))
        else:
            rest.append(node)
    if not replace and tuple(front + rest) == graph.nodes:  # (nodes compare by identity)
        return graph
    outputs = tuple(replace.get(v, v) for v in graph.outputs)
    return Graph(graph.inputs, tuple(front + rest), outputs, graph.constants)


# ----------------------------------------------------------------------------- finding runs
def _signatures(nodes: Sequence[Node]) -> tuple[list[int], np.ndarray]:
    """The node indices of the non-constant nodes, and each one's signature as a small int
    (nodes holding bodies get one of their own: they never repeat).

    Equal signatures must mean the same computation (the body is built from the first block's
    nodes). The attributes are compared by their ``repr``, which tells apart every value an
    attribute may hold (1, 1.0 and True too), and types by their fields, whose hashes are C's:
    a trace of 100k nodes is signed in a fraction of the time ``Node.attr_key`` and
    ``TensorType.__hash__`` take. Two equal attribute dicts written in another order get two
    signatures: a run missed, never a wrong one.

    Signed in two rounds: each node first by the identities of its types (a trace makes a few dozen
    type objects, each shared by thousands of values), then each of the few distinct first-round
    keys by the types' fields, which merges the keys of equal types that are distinct objects. A
    node's types are read without a comprehension for the one or two inputs and the one output
    nearly every node has (LSTMCell loop, 49k nodes: 106 -> ~72 ms of CPU)."""
    first: dict[tuple, int] = {}
    shown: list[int] = []  # per first-round key, a node that has it (whose types are read in the second)
    order, ids = [], []
    for i, node in enumerate(nodes):
        op = node.op
        if op == CONSTANT:
            continue
        if op in NESTING_OPS:
            key: tuple = ("unique", i)
        else:
            ins, outs, attrs = node.inputs, node.outputs, node.attrs
            count = len(ins)
            if count == 1:
                types: tuple = (id(ins[0].type),)
            elif count == 2:
                types = (id(ins[0].type), id(ins[1].type))
            else:
                types = tuple([id(v.type) for v in ins])
            made = (id(outs[0].type),) if len(outs) == 1 else tuple([id(v.type) for v in outs])
            key = (op, repr(attrs) if attrs else "", types, made)
        order.append(i)
        number = first.get(key)
        if number is None:
            number = first[key] = len(shown)
            shown.append(i)
        ids.append(number)
    # the second round: the first round's keys by the types' fields
    table: dict[tuple, int] = {}
    final = np.empty(len(shown), dtype=np.int64)
    for key, number in first.items():
        if len(key) == 4:  # (not a nesting node's ("unique", i))
            node = nodes[shown[number]]
            key = (key[0], key[1], tuple([(v.type.shape, v.type.dtype, v.type.device) for v in node.inputs]),
                   tuple([(v.type.shape, v.type.dtype, v.type.device) for v in node.outputs]))  # fmt: skip
        final[number] = table.setdefault(key, len(table))
    return order, final[np.asarray(ids, dtype=np.int64)] if ids else np.zeros(0, dtype=np.int64)


def _candidate_periods(ids: np.ndarray, min_trips: int) -> list[int]:
    """Distances to the previous and the second previous occurrence of each signature, the most
    frequent first (by count times distance: the nodes a period could cover).

    Counted over the positions sorted by signature (stably: each signature's in order), where an
    occurrence's previous and second previous occurrences are the one and two places before it."""
    n = len(ids)
    positions = np.argsort(ids, kind="stable")
    signed = ids[positions]
    distances = [positions[gap:] - positions[:-gap] for gap in (1, 2) if n > gap]
    same = [signed[gap:] == signed[:-gap] for gap in (1, 2) if n > gap]
    found = np.concatenate([d[m] for d, m in zip(distances, same, strict=True)]) if distances else ids[:0]
    counts = np.bincount(found)
    d = np.flatnonzero((counts >= max(min_trips - 1, 1)) & (np.arange(len(counts)) * min_trips <= n))
    covered = counts[d] * d
    best = np.lexsort((d, -covered))[:MAX_CANDIDATES]  # the most covered first, then the shorter
    return [int(x) for x in d[best]]


def _runs(ids: np.ndarray, min_trips: int) -> list[Run]:
    """Every maximal periodic run of a candidate period with ``min_trips`` blocks or more, the most
    nodes covered first (then the shorter period)."""
    runs = []
    for period in _candidate_periods(ids, min_trips):
        match = np.concatenate(([False], ids[:-period] == ids[period:], [False]))
        edges = np.flatnonzero(np.diff(match.astype(np.int8)))
        starts, trips = edges[::2], (edges[1::2] - edges[::2] + period) // period
        kept = trips >= min_trips  # (most matches are a few nodes alike: no Run made for them)
        runs += [Run(a, period, t) for a, t in zip(starts[kept].tolist(), trips[kept].tolist(), strict=True)]
    runs.sort(key=lambda r: (-r.trips * r.period, r.period, r.start))
    return runs


# ----------------------------------------------------------------------------- checking dataflow
@dataclass
class Plan:
    """A run that checked: where each input of each body node comes from, what leaves the loop."""

    run: Run
    sources: list[list[tuple]]  # per body node, per input: ("local", j, o) | ("carried", j, o, init) |
    # ("invariant", value) | ("per_iteration", values)
    last: list[tuple[int, int]]  # (j, o) whose last block's value is used after the loop
    stacked: list[tuple[int, int]]  # (j, o) whose every block's value is an output


def _first_plan(graph: Graph, order: list[int], run: Run, min_trips: int) -> Plan | None:
    """The plan of ``run``, or of the first variant of it that checks (without the first or last
    block, from a later phase); None when none does."""
    variants = [run, Run(run.start + run.period, run.period, run.trips - 1), Run(run.start, run.period, run.trips - 1)]
    variants += [Run(run.start + shift, run.period, run.trips - 1) for shift in range(1, min(run.period, MAX_PHASES))]
    why = ""
    for variant in variants:
        if variant.trips < min_trips:
            continue
        plan = _plan(graph, order, variant)
        if isinstance(plan, Plan):
            return plan
        why = why or plan
    logger.debug("roll_loops: %d blocks of %d nodes not rolled: %s", run.trips, run.period, why)
    return None


def _plan(graph: Graph, order: list[int], run: Run) -> Plan | str:
    """The plan of ``run``, or why its blocks are not one computation's iterations.

    Checked a column at a time: an input of a body node, in every block (``values``), against the
    values that one node of the body makes in every block, compared as lists: ``Value`` is compared
    by identity, so the lists' C comparison is the identity test of each pair (a 100k-node trace
    looks up where a value is made once per node of block 0, not once per input of every block)."""
    nodes, period, trips = graph.nodes, run.period, run.trips
    base = run.start
    columns = [[nodes[order[base + k * period + j]] for k in range(trips)] for j in range(period)]
    if not any(_bounds_kernels(column[0]) for column in columns):
        return "the blocks are elementwise work, which fusion merges across them into fewer passes over memory"
    places = {v: (j, o) for j, column in enumerate(columns) for o, v in enumerate(column[0].outputs)}
    made: dict[tuple[int, int], list[Value]] = {}  # (j, o) -> the value that output is in each block
    for j, column in enumerate(columns):
        for o in range(len(column[0].outputs)):
            made[j, o] = [node.outputs[o] for node in column]
    inside = {v for values in made.values() for v in values}
    sources = []
    for j, column in enumerate(columns):
        row = []
        for s in range(len(column[0].inputs)):
            source = _source([node.inputs[s] for node in column], places, made, inside)
            if source is None:
                return f"input {s} of node {j} of the body comes from different places in different blocks"
            row.append(source)
        sources.append(row)
    last_node = order[run.stop - 1]
    # the values read after the run (by a later node, or as the graph's outputs)
    after = {v for node in nodes[last_node + 1 :] for v in node.inputs}
    after.update(graph.outputs)
    last, stacked = [], []
    for key, values in made.items():
        if after.isdisjoint(values):
            continue
        if values[-1] in after and not after.intersection(values[:-1]):
            last.append(key)
        else:
            stacked.append(key)
    return Plan(run, sources, last, stacked)


def _bounds_kernels(node: Node) -> bool:
    """Whether ``node`` ends the kernels fusion makes (a matmul, a convolution, a gather...): the
    unrolled program then runs at least one kernel per block too, and rolling costs no fusion."""
    prim = PRIMITIVES.get(node.op)
    return prim is not None and prim.kind not in ELEMENTWISE and prim.kind is not Kind.REDUCE and not prim.is_view


def _source(values: list[Value], places: dict, made: dict, inside: set) -> tuple | None:
    """Where one input of a body node comes from in every block (``Plan.sources``), or None:
    ``values`` are that input in each block, ``places`` the ``(node, output)`` of each value block 0
    makes, ``made`` each such output's values in every block, ``inside`` all of those. (In
    topological order, block 0 reads no later block's value.)"""
    place = places.get(values[0])
    if place is not None:  # block 0's own value: each block must read its own
        return ("local", *place) if values == made[place] else None
    if inside.isdisjoint(values):
        first = values[0]
        return ("invariant", first) if values.count(first) == len(values) else ("per_iteration", tuple(values))
    place = places.get(values[1])
    if place is not None and values[1:] == made[place][:-1]:  # each block reads the previous block's
        return ("carried", *place, values[0])
    return None


# ----------------------------------------------------------------------------- rewriting
def _rewrite(graph: Graph, order: list[int], plans: list[Plan]) -> Graph:
    """The graph with each planned run replaced by constants hoisted, then the loop node."""
    nodes = list(graph.nodes)
    new_nodes: list[Node] = []
    special = [n for n in nodes if n.op in _NAMED]  # (one pass over a 100k-node trace, not two)
    names = {n.attrs.get("name") for n in special if n.op in NESTING_OPS}
    constants = {n.outputs[0]: n for n in special if n.op == CONSTANT}
    position = 0
    for plan in plans:
        first, last = order[plan.run.start], order[plan.run.stop - 1]
        new_nodes += nodes[position:first]
        new_nodes += [n for n in nodes[first : last + 1] if n.op == CONSTANT]
        name = next(f"loop{i}" for i in range(len(names) + 1) if f"loop{i}" not in names)
        names.add(name)
        new_nodes.append(_loop_node(graph, order, plan, name, constants))
        position = last + 1
    new_nodes += nodes[position:]
    return Graph(graph.inputs, tuple(new_nodes), graph.outputs, graph.constants)


@dataclass
class _Inputs:
    """The loop's inputs by kind, each numbered in its kind: carried values by ``(j, o, initial)``,
    invariants by value (outer constants aside: the body holds those), per-iteration ones by values."""

    carried: dict[tuple, int]
    invariant: dict[Value, int]
    per_iteration: dict[tuple, int]

    def outer(self) -> list[Value]:
        """The loop node's inputs: initial values, invariants, then each per-iteration input's values."""
        return [key[2] for key in self.carried] + list(self.invariant) + [v for vs in self.per_iteration for v in vs]

    def body(self) -> list[Value]:
        """The body's inputs, numbered from 0 in the same order (one per per-iteration input)."""
        types = [key[2].type for key in self.carried] + [v.type for v in self.invariant]
        types += [values[0].type for values in self.per_iteration]
        return [Value(i, t) for i, t in enumerate(types)]


def _classify(plan: Plan, outer_constants: dict[Value, Node]) -> _Inputs:
    inputs = _Inputs({}, {}, {})
    for row in plan.sources:
        for source in row:
            if source[0] == "carried":
                inputs.carried.setdefault(source[1:], len(inputs.carried))
            elif source[0] == "invariant" and source[1] not in outer_constants:
                inputs.invariant.setdefault(source[1], len(inputs.invariant))
            elif source[0] == "per_iteration":
                inputs.per_iteration.setdefault(source[1], len(inputs.per_iteration))
    return inputs


def _loop_node(graph: Graph, order: list[int], plan: Plan, name: str, outer_constants: dict[Value, Node]) -> Node:
    """The loop node of a plan: its body built from block 0, its outputs the outer values they replace."""
    run, nodes = plan.run, graph.nodes
    template = [nodes[order[run.start + j]] for j in range(run.period)]
    inputs = _classify(plan, outer_constants)
    body, made = _body(graph, template, plan, inputs, outer_constants)
    wanted = list(dict.fromkeys([key[:2] for key in inputs.carried] + plan.last + plan.stacked))
    index = {key: i for i, key in enumerate(wanted)}
    body = Graph(body.inputs, body.nodes, tuple(made[key] for key in wanted), body.constants)
    loop = Loop(body, run.trips, tuple(index[key[:2]] for key in inputs.carried), len(inputs.invariant),
                len(inputs.per_iteration), tuple(index[key] for key in plan.last),
                tuple(index[key] for key in plan.stacked))  # fmt: skip
    start, period, trips = run.start, run.period, run.trips
    results = [nodes[order[start + (trips - 1) * period + j]].outputs[o] for j, o in plan.last]
    results += [nodes[order[start + k * period + j]].outputs[o] for j, o in plan.stacked for k in range(trips)]
    return Node(LOOP, tuple(inputs.outer()), loop.attrs(name), tuple(results), template[0].loc)


def _body(graph: Graph, template: list[Node], plan: Plan, inputs: _Inputs,
          outer_constants: dict[Value, Node]) -> tuple[Graph, dict[tuple[int, int], Value]]:  # fmt: skip
    """The body's graph (no outputs yet) made of the template block's nodes, and its value of each
    ``(node, output)`` position."""
    body_inputs = inputs.body()
    invariants = len(inputs.carried)
    per_iteration = invariants + len(inputs.invariant)
    ids = iter(range(len(body_inputs), 1 << 62))
    nodes: list[Node] = []
    constants: dict[str, np.ndarray] = {}
    made: dict[tuple[int, int], Value] = {}
    for j, (node, row) in enumerate(zip(template, plan.sources, strict=True)):
        args = []
        for source in row:
            kind = source[0]
            if kind == "local":
                args.append(made[source[1:3]])
            elif kind == "carried":
                args.append(body_inputs[inputs.carried[source[1:]]])
            elif kind == "per_iteration":
                args.append(body_inputs[per_iteration + inputs.per_iteration[source[1]]])
            elif source[1] in inputs.invariant:
                args.append(body_inputs[invariants + inputs.invariant[source[1]]])
            else:  # an outer constant: the body holds it
                args.append(_body_constant(graph, outer_constants[source[1]], constants, nodes, ids))
        outputs = tuple(Value(next(ids), v.type) for v in node.outputs)
        made.update(((j, o), v) for o, v in enumerate(outputs))
        nodes.append(Node(node.op, tuple(args), node.attrs, outputs, node.loc))
    return Graph(tuple(body_inputs), tuple(nodes), (), constants), made


def _body_constant(graph: Graph, node: Node, constants: dict, body_nodes: list[Node], ids) -> Value:
    """A copy, inside the body, of the outer constant node ``node`` (made once per body)."""
    value = node.outputs[0]
    name = str(node.attrs["name"])
    for existing in body_nodes:
        if existing.op == CONSTANT and existing.attrs["name"] == name:
            return existing.outputs[0]
    constants[name] = graph.constants[name]
    out = Value(next(ids), value.type)
    body_nodes.append(Node(CONSTANT, (), {"name": name}, (out,), node.loc))
    return out
