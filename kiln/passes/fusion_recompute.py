"""Fusion's recomputation: a cheap elementwise value that one kernel makes and later kernels read
is computed again in its readers, rather than written to memory by one and read back by the others.

A training step is where this pays. The forward's kernel of ``gelu(x @ w1 + b1)`` made five
full-size values for the backward's kernel (``h``, ``h * h * c + d``, the tanh's two forms, the
activation); the backward reads ``h`` anyway and computes the others from it again with one
``tanh``. BatchNorm's forward made ``x - mean`` in a kernel of its own, read by the sum of the
deviations and by the next kernel; both compute it from ``x`` and ``mean`` now, and the kernel
that made it is gone.

For each value ``v`` that a kernel (its *maker*) makes and other kernels (its *readers*) read, in
graph order, the nodes that compute ``v`` are copied into a reader when:

- they are elementwise nodes of the cheap kinds below, each making one value of ``v``'s shape,
  and they reach the reader's domain as ``v`` does (the same index, or index remapping through
  the reader's views of ``v``: the analysis fusion's merges use, ``kiln.ir.analysis.unremapped``);
- what they read is read by the reader already, or is a 0-d constant -- or, only where every
  reader computes ``v`` (so that the maker stops writing it: no extern node or graph output reads
  it), a value in memory anyway (not a kernel's value that no kernel writes any more) of at most
  ``v``'s bytes in all: the reader then reads that instead of ``v``;
- at most ``MAX_COPIED`` nodes a reader, and a transcendental (``COSTLY``) only into an
  elementwise reader (a reduction kernel may evaluate a full value once per pass over its row)
  and only where every reader computes ``v``: one tanh per element costs about what one float's
  write and read cost on this machine, so it is recomputed only where it saves both. A
  transcendental in ``v``'s chain whose own value stays written (a reader of it that is no kernel,
  a flip, reads it from memory) is read there, not computed again.

The copies are work done twice (a maker keeps computing what it needs itself); a maker stops
writing a value that every reader computes itself, and a maker left with nothing to write is gone.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from ..ir.analysis import Space, fits, unremapped
from ..ir.graph import BODY_REDUCE_OPS, Node, Value
from ..ir.primitives import Cost, ops_of_cost
from .fusion_rules import ELEMENTWISE

#: Ops copied freely: a few cycles an element, less than reading the value (``Primitive.cost``).
CHEAP = ops_of_cost(Cost.CHEAP)
#: Ops copied only where they save a write and a read (see the module docstring): a division or a
#: square root costs about what a float's write and read do, a routine (tanh) more.
COSTLY = ops_of_cost(Cost.DIVISION) | ops_of_cost(Cost.ROUTINE)
MAX_COPIED = 24  # nodes copied into one reader
MAX_COSTLY = 2  # transcendental nodes copied into one reader
#: New reads a reader may take on for a value it no longer reads, beyond the value's own bytes
#: (a BatchNorm's per-channel mean beside its input): a sixteenth of the value.
SLACK = 16


class _Reader:
    """A kernel's state while copies are added to it."""

    __slots__ = ("members", "space", "available", "copies", "nodes", "costly")

    def __init__(self, group: Sequence[Node], space: Space) -> None:
        self.members = set(group)
        self.space = space
        made = {v for node in group for v in node.outputs}
        self.available = {v for node in group for v in node.inputs if v not in made}  # read anyway
        self.copies: list[Node] = []
        self.nodes = MAX_COPIED
        self.costly = 0 if any(node.op in BODY_REDUCE_OPS for node in group) else MAX_COSTLY


def recomputed(
    groups: Sequence[Sequence[Node]],
    spaces: Sequence[Space | None],
    users: Mapping[Value, list[Node]],
    outputs: Collection[Value],
    classes: Mapping[Node, str],
    constants: Collection[Value],
) -> list[list[Node]]:
    """Per group (``groups``: kernels' nodes in graph order, ``spaces``: each kernel's space), the
    nodes of other groups it computes again (graph order), by the rules above; ``constants``: the
    0-d constants a kernel copies into its body."""
    home = _Homes((node, i) for i, group in enumerate(groups) for node in group)
    producer = {v: node for group in groups for node in group for v in node.outputs}
    order = {node: k for k, node in enumerate(n for group in groups for n in group)}
    readers = {i: _Reader(group, space) for i, (group, space) in enumerate(zip(groups, spaces, strict=True)) if space}
    unmade: set[Value] = set()  # values no kernel writes any more (every reader computes them)
    for v in sorted(producer, key=lambda v: order[producer[v]]):
        maker = home[producer[v]]
        if classes[producer[v]] != ELEMENTWISE:
            continue
        homes = {home.get(u) for u in users.get(v, ())} - {maker}
        reading = [i for i in homes if i is not None and i in readers]
        if not reading:
            continue
        # v dies when every reader computes it: no extern node, graph output or spaceless kernel reads it
        dies = v not in outputs and len(reading) == len(homes)
        chains: dict[int, tuple[list[Node], set[Value]] | None] = {}
        if dies:
            chains = {
                i: _chain(v, readers[i], producer, home, classes, constants, outputs, unmade, users, True)
                for i in reading
            }
            if all(chains.values()):
                unmade.add(v)
            else:
                chains = {}
        if v not in unmade:  # v stays in memory: only chains that read nothing new are worth copying
            chains = {
                i: _chain(v, readers[i], producer, home, classes, constants, outputs, unmade, users, False)
                for i in reading
            }
        for i, chain in chains.items():
            if chain is None:
                continue
            nodes, new = chain
            reader = readers[i]
            reader.copies += nodes
            reader.available.update(node.outputs[0] for node in nodes)
            reader.available.update(new)
            reader.nodes -= len(nodes)
            reader.costly -= sum(node.op in COSTLY for node in nodes)
    copies: list[list[Node]] = [[] for _ in groups]
    for i, reader in readers.items():
        copies[i] = sorted(reader.copies, key=order.__getitem__)
    return copies


def _chain(v: Value, reader: _Reader, producer: Mapping[Value, Node], home: _Homes,
           classes: Mapping[Node, str], constants: Collection[Value], outputs: Collection[Value], unmade: set[Value],
           users: Mapping[Value, list[Node]], dies: bool) -> tuple[list[Node], set[Value]] | None:  # fmt: skip
    """``(nodes, new reads)``: the nodes that compute ``v`` in ``reader`` (what they read before the
    readers) and the values they read that ``reader`` did not; None when the rules above refuse."""
    chain: list[Node] = []
    new: set[Value] = set()
    seen: set[Value] = set()
    shape = v.type.shape
    nodes, costly = reader.nodes, reader.costly

    def leaf(w: Value) -> bool:
        if w in reader.available or w in constants:
            return True
        if not dies or not _in_memory(w, producer, home, users, outputs, unmade):
            return False
        new.add(w)
        return True

    def visit(w: Value) -> bool:
        nonlocal nodes, costly
        if w in seen or (w is not v and (w in reader.available or w in constants)):
            return True
        node = producer.get(w)
        if node is not None and node in reader.members:
            return False  # (a reader's own value cannot come before what it reads: kept out all the same)
        if node is None or classes[node] != ELEMENTWISE or len(node.outputs) != 1:
            return leaf(w) if w is not v else False
        if w.type.shape != shape or node.op not in CHEAP | COSTLY:
            return leaf(w) if w is not v else False
        if node.op in COSTLY:
            if w is not v and _in_memory(w, producer, home, users, outputs, unmade):
                return leaf(w)  # written anyway (for a reader that does not compute it): read, not made twice
            if not dies or costly == 0:
                return False
            costly -= 1
        nodes -= 1
        if nodes < 0 or not all(map(visit, node.inputs)):
            return False
        seen.add(w)
        chain.append(node)
        return True

    if not visit(v):
        return None
    if new and sum(map(_nbytes, new)) > _nbytes(v) + _nbytes(v) // SLACK:
        return None
    if not _reaches_the_domain(chain, reader, users):
        return None
    return chain, new


def _in_memory(w: Value, producer: Mapping[Value, Node], home: _Homes, users: Mapping[Value, list[Node]],
               outputs: Collection[Value], unmade: set[Value]) -> bool:  # fmt: skip
    """Whether ``w`` is in memory at run time: no kernel's value (an input, an extern node's result),
    or a kernel's output (read outside its kernel) that is still written."""
    node = producer.get(w)
    if node is None:
        return True
    return w not in unmade and (w in outputs or home.read_elsewhere(w, node, users))


class _Homes(dict):
    """Each node's group, and whether a value is read outside the group that makes it (asked for
    the same value by every chain that reads it, so remembered: a value that each step of an
    unrolled loop reads has as many readers as the loop has steps)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self._elsewhere: dict[Value, bool] = {}

    def read_elsewhere(self, w: Value, node: Node, users: Mapping[Value, list[Node]]) -> bool:
        known = self._elsewhere.get(w)
        if known is None:
            known = self._elsewhere[w] = any(self.get(u) != self[node] for u in users.get(w, ()))
        return known


def _reaches_the_domain(chain: list[Node], reader: _Reader, users: Mapping[Value, list[Node]]) -> bool:
    """Whether the copied values that do not fit the reader's space reach it by index remapping."""
    inside = reader.members.union(chain)
    values = {w for node in chain for w in (*node.inputs, *node.outputs)}
    misfits = [w for w in values if not fits(w, reader.space)]
    if not misfits:
        return True
    position = {node.outputs[0]: k for k, node in enumerate(chain)}
    misfits.sort(key=lambda w: -position.get(w, -1))  # readers before what they read
    return unremapped(misfits, inside.__contains__, users, ()) is None


def _nbytes(v: Value) -> int:
    shape = v.type.shape
    if not all(isinstance(d, int) for d in shape):
        return 1 << 62  # symbolic: never a cheaper read
    return v.type.dtype.itemsize * math.prod(shape)  # type: ignore[arg-type]
