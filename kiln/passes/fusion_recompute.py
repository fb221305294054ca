"""Fusion's recomputation: a cheap elementwise value that one kernel makes and a later kernel reads
is computed again in the reader, from values the reader reads anyway, rather than written to
memory by one and read back by the other.

A training step is where this pays: the forward's kernel of ``gelu(x @ w1 + b1)`` made five
full-size values for the backward's kernel (``h``, ``h * h * c + d``, ``(1 + tanh) / 2``,
``1 - tanh ** 2`` and the activation); the backward reads ``h`` anyway, and computes the three
others from it again with one ``tanh``: two values written and read where there were five.

For each kernel (the *reader*) and each value it reads from another kernel (the *maker*), the
nodes that compute the value inside the maker are copied into the reader when:

- they are elementwise nodes of the cheap kinds below, each making one value of the reader's
  domain shape (a full value of an elementwise or a reduction kernel: computed at the domain
  element's own index, so copying it into the reader changes no indexing);
- what they read is read by the reader already, or is a 0-d constant: the copy reads nothing new;
- at most ``MAX_COPIED`` nodes a reader, and a transcendental (``COSTLY``) only in an elementwise
  reader (a reduction kernel may evaluate a full value once per pass over its row) and only when
  no other kernel or extern node reads the value: one tanh per element costs about what one
  float read and write cost on this machine, so it is recomputed only where it saves both.

The copies are work done twice (the maker keeps computing what it needs itself); the maker stops
writing a value once every reader outside it computes the value itself.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from ..ir.analysis import Shape
from ..ir.graph import BODY_REDUCE_OPS, Node, Value
from .fusion_rules import ELEMENTWISE

#: Ops copied freely: a few cycles an element, less than reading the value.
CHEAP = frozenset({
    "add", "sub", "mul", "neg", "abs", "maximum", "minimum", "where", "cast", "logical_not",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
})  # fmt: skip
#: Ops copied only where they save a write and a read (see the module docstring).
COSTLY = frozenset({"tanh", "exp", "expm1", "sigmoid", "erf", "log", "log1p", "sqrt", "rsqrt", "div"})
MAX_COPIED = 24  # nodes copied into one reader
MAX_COSTLY = 2  # transcendental nodes copied into one reader


def recomputed(
    groups: Sequence[Sequence[Node]],
    domains: Sequence[Shape | None],
    users: Mapping[Value, list[Node]],
    outputs: Collection[Value],
    classes: Mapping[Node, str],
    constants: Collection[Value],
) -> list[list[Node]]:
    """Per group (``groups``: kernels' nodes in graph order, ``domains``: each kernel's domain
    shape), the nodes of other groups it computes again (graph order), by the rules above;
    ``constants``: the 0-d constants a kernel copies into its body."""
    home = {node: i for i, group in enumerate(groups) for node in group}
    producer = {v: node for group in groups for node in group for v in node.outputs}
    order = {node: k for k, node in enumerate(n for group in groups for n in group)}
    copies: list[list[Node]] = [[] for _ in groups]
    for i, (group, domain) in enumerate(zip(groups, domains, strict=True)):
        if domain is None:
            continue
        members = set(group)
        made = {v for node in group for v in node.outputs}
        reads = list(dict.fromkeys(v for node in group for v in node.inputs if v not in made))
        available = set(reads)
        elementwise = not any(node.op in BODY_REDUCE_OPS for node in group)
        budget = _Budget(MAX_COPIED, MAX_COSTLY if elementwise else 0)
        for v in reads:
            maker = producer.get(v)
            if maker is None or maker in members or v.type.shape != domain:
                continue
            alone = v not in outputs and all(home.get(u) in (i, home[maker]) for u in users.get(v, ()))
            chain = _chain(v, home[maker], available, domain, producer, home, classes, constants, budget, alone)
            if chain is not None:
                copies[i] += chain
                available.update(node.outputs[0] for node in chain)
        copies[i].sort(key=order.__getitem__)
    return copies


class _Budget:
    __slots__ = ("nodes", "costly")

    def __init__(self, nodes: int, costly: int) -> None:
        self.nodes, self.costly = nodes, costly


def _chain(v: Value, maker: int, available: set[Value], domain: Shape, producer: Mapping[Value, Node],
           home: Mapping[Node, int], classes: Mapping[Node, str], constants: Collection[Value], budget: _Budget,
           alone: bool) -> list[Node] | None:  # fmt: skip
    """The nodes of group ``maker`` that compute ``v`` from ``available`` values and 0-d constants
    (readers before what they read come last: an order to run them in), or None; spends ``budget``."""
    chain: list[Node] = []
    seen: set[Value] = set()
    nodes, costly = budget.nodes, budget.costly

    def visit(w: Value) -> bool:
        nonlocal nodes, costly
        if (w in available and w is not v) or w in constants or w in seen:
            return True
        node = producer.get(w)
        if node is None or home[node] != maker or classes[node] != ELEMENTWISE or len(node.outputs) != 1:
            return False
        if w.type.shape != domain or node.op not in CHEAP | COSTLY:
            return False
        if node.op in COSTLY:
            if not alone or costly == 0:
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
    budget.nodes, budget.costly = nodes, costly
    return chain
