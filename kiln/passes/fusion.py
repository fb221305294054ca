"""Fusion: group the graph's elementwise, view and reduction nodes into kernel nodes.

``fuse(graph)`` returns an equivalent graph whose nodes are extern nodes (primitives run by
their eager kernel: matmul, gather, random bits, views that extern nodes read...), constants and
kernel nodes (``kiln.ir.graph``), each fused node in exactly one kernel: no work is duplicated.

1. Classify (``fusion_rules``): elementwise, view, trailing-axes reduction, or extern.
2. Vertical fusion: walking the graph in order, each fusable node joins the kernel of each of
   its fusable producers in turn when the union is still a legal kernel (``kernel_kind``: one
   domain for an elementwise kernel; reductions of the same trailing axes of one shape, with
   full and row values, for a reduction kernel) and no path leaves the union and comes back
   (which would make the kernel depend on itself). Chains fuse; elementwise work before and
   after an extern node fuses around it (matmul -> add bias -> relu is matmul + one kernel);
   softmax, log_softmax, layer_norm and a sum of squares become one reduction kernel each.
   Values read outside a kernel, and graph outputs, are its outputs.
3. What is left of views alone (no elementwise or reduction work) stays extern; every other
   group, a single elementwise node included, is a kernel.
4. Horizontal fusion (``fusion_emit``): mutually independent elementwise kernels whose bodies
   are structurally identical (same ops, attributes, dtypes and constants; any shapes) -- the
   per-parameter updates of an optimizer step -- become one horizontal kernel.

The result is ordered topologically (ties broken by the position of each unit's first node in
the input graph), so the pass is deterministic. It is not in ``DEFAULT_PIPELINE``: a backend
that runs kernels asks for it.
"""

from __future__ import annotations

from ..ir.graph import Graph, Node, Value
from .eliminate_dead_code import eliminate_dead_code
from .fusion_emit import emit
from .fusion_rules import EXTERN, classify, kernel_kind


def fuse(graph: Graph) -> Graph:
    """``graph`` with its fusable nodes grouped into kernel nodes (see the module docstring).

    Needs: a verified graph in topological order. Establishes: every elementwise, fusable view
    and trailing-axes reduction node is in exactly one kernel body; the graph verifies; running
    it gives the same results as ``graph``, bit for bit, on the interpreter.
    """
    graph = eliminate_dead_code(graph)  # a kernel makes at least one output that something reads
    if not graph.nodes:
        return graph
    return emit(graph, _Grouping(graph).groups())


class _Grouping:
    """Union-find over the fusable nodes, growing kernels by merging groups."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes = graph.nodes
        self.position = {node: i for i, node in enumerate(self.nodes)}
        self.users: dict[Value, list[Node]] = {}
        self.producer: dict[Value, Node] = {}
        for node in self.nodes:
            for v in node.inputs:
                self.users.setdefault(v, []).append(node)
            for v in node.outputs:
                self.producer[v] = node
        self.outputs = set(graph.outputs)
        self.classes = classify(self.nodes, self.users, self.outputs)
        self.parent: dict[Node, Node] = {}
        self.members: dict[Node, list[Node]] = {}  # root -> its nodes in graph order
        for node in self.nodes:
            if self.classes[node] != EXTERN:
                self.parent[node] = node
                self.members[node] = [node]

    def find(self, node: Node) -> Node | None:
        """The root of ``node``'s group, or None for an extern node or a constant."""
        root = self.parent.get(node)
        if root is None:
            return None
        while self.parent[root] is not root:
            self.parent[root] = self.parent[self.parent[root]]
            root = self.parent[root]
        return root

    def groups(self) -> list[list[Node]]:
        """The kernels' node lists (graph order), after vertical fusion; views alone are left out."""
        # Repeat until nothing merges: a node that joined a kernel late may let that kernel take
        # in a producer it could not take before (e.g. a view whose reader joined after it).
        merged = True
        while merged:
            merged = False
            for node in self.nodes:
                if node not in self.parent:
                    continue
                for v in node.inputs:
                    producer = self.producer.get(v)
                    a, b = self.find(node), (self.find(producer) if producer is not None else None)
                    if b is not None and a is not b and self._try_merge(a, b):
                        merged = True
        roots = sorted({self.find(node) for node in self.parent}, key=self.position.__getitem__)
        groups = [self.members[root] for root in roots]
        return [g for g in groups if any(self.classes[node] != "view" for node in g)]

    def _try_merge(self, a: Node, b: Node) -> bool:
        merged = sorted(self.members[a] + self.members[b], key=self.position.__getitem__)
        union = set(merged)
        if kernel_kind(merged, union.__contains__, self.users, self.outputs) is None or self._cycle(merged, union):
            return False
        self.parent[b] = a
        self.members[a] = merged
        del self.members[b]
        return True

    def _cycle(self, merged: list[Node], union: set[Node]) -> bool:
        """Whether some path leaves ``merged`` and comes back (through extern nodes or other groups).

        A backward search from the outside producers of the union's inputs, group by group;
        nodes before the union's first node cannot depend on it and are not searched.
        """
        start = self.position[merged[0]]
        stack = [
            p for node in merged for v in node.inputs if (p := self.producer.get(v)) is not None and p not in union
        ]
        seen: set[Node] = set()
        while stack:
            producer = stack.pop()
            if self.position[producer] < start:
                continue
            if producer in union:
                return True
            root = self.find(producer)
            key = producer if root is None else root
            if key in seen:
                continue
            seen.add(key)
            for node in (producer,) if root is None else self.members[root]:
                stack.extend(p for v in node.inputs if (p := self.producer.get(v)) is not None)
        return False
