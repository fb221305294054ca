"""Epilogue fusion: a direct convolution takes the elementwise kernels that read its result.

After ``fuse``, a convolution is an extern node and what follows it -- the bias, the activation
(and the mask its gradient keeps), then max pooling -- are elementwise kernels that read the
convolution's result, and each other's, back from memory. ``fuse_epilogues(graph, takes)`` makes
them one kernel node of kind ``conv`` (``kiln.ir.graph.conv_epilogue``): its code computes the
epilogue on each unit's block of output channels while that block is in cache, and the
convolution's result, and what only the epilogue reads, are never arrays of the program.

Walking the graph in order, a convolution (or a conv kernel made so far) takes the first elementwise
kernel that reads one of its results when:

- no node between them reads its results (the merged node takes the later one's place, so every
  value it reads is defined before it and every reader of its results comes after it);
- a plain convolution's result has no other reader and is not a graph output (a conv kernel's code
  keeps the convolution's result on the stack; a conv kernel's own results may have other readers,
  and stay its outputs then);
- the backend compiles the merged kernel (``takes(node)``: among others, each epilogue output
  reads the convolution's result only inside the block of channels of its own sample and
  channel, so that one unit's block feeds exactly its own outputs), so that fusion never makes a
  kernel that then runs on the interpreter.

Results of the earlier node that only the taken kernel read become values inside the merged body.
A merge declined says why (``fusion_refusals``): the first reader is a kernel of another kind, the
plain convolution's result is read elsewhere too, or the backend does not take the merged kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..ir.graph import CONSTANT, KERNEL, Graph, Node, Value
from ..ir.kernel_kinds import CONV, ELEMENTWISE
from .fusion_refusals import Refusal


def fuse_epilogues(graph: Graph, takes: Callable[[Node], bool], refusals: list[Refusal] | None = None) -> Graph:
    """``graph`` with each convolution merged with the elementwise kernels after it that read its
    results (see the module docstring); ``takes(node)``: whether the backend compiles the merged
    conv kernel ``node``; ``refusals`` receives why each merge declined was declined.

    Needs: a fused graph in topological order. Establishes: the graph verifies and computes the same
    values on the interpreter (a conv kernel's body is the convolution, then the kernels' bodies).
    """
    nodes = list(graph.nodes)
    results = set(graph.outputs)
    merged_any = False
    position = 0
    while position < len(nodes):
        found = _merge_at(nodes, position, results, takes)
        if found is None or isinstance(found, Refusal):
            if found is not None and refusals is not None:
                refusals.append(found)
            position += 1
            continue
        reader, merged = found
        nodes[reader] = merged
        del nodes[position]  # the merged node, now at reader - 1, is visited again and may grow
        merged_any = True
    return Graph(graph.inputs, tuple(nodes), graph.outputs, graph.constants) if merged_any else graph


def _merge_at(nodes: list[Node], position: int, results: set[Value], takes) -> tuple[int, Node] | Refusal | None:
    """``(index of the reader, merged node)`` when ``nodes[position]`` (a convolution or a conv
    kernel) takes the next elementwise kernel that reads its results; else why it takes none, None
    when there was nothing to take (it is no convolution, or no kernel reads it)."""
    node = nodes[position]
    if node.op != "conv" and not (node.op == KERNEL and node.attrs["kind"] == CONV.name):
        return None
    made = set(node.outputs)
    for index in range(position + 1, len(nodes)):
        reader = nodes[index]
        if made.isdisjoint(reader.inputs):
            continue
        if reader.op != KERNEL:
            return None  # an extern node: nothing to fuse
        if reader.attrs["kind"] != ELEMENTWISE.name:
            return Refusal("conv reader", node.outputs[0], reader.outputs[0])
        later = {v for n in nodes[index + 1 :] for v in n.inputs} | results
        if node.op == "conv" and node.output in later:
            return Refusal("conv result", node.output, reader.outputs[0])
        merged = _merge(node, reader, kept=[v for v in node.outputs if v in later])
        return (index, merged) if takes(merged) else Refusal("conv backend", node.outputs[0], reader.outputs[0])
    return None


def _merge(node: Node, reader: Node, kept: Sequence[Value]) -> Node:
    """One conv kernel: ``node``'s body (a convolution's, for a plain one), then ``reader``'s body
    reading ``node``'s results from there; its outputs are those of ``kept`` and ``reader``'s."""
    body, inputs = _body(node)
    inner = {outer: value for outer, value in zip(node.outputs, body.outputs, strict=True)}
    copy = _Copier(body)
    (reader_body,) = reader.attrs["bodies"]
    extra = []
    for outer, value in zip(reader.inputs, reader_body.inputs, strict=True):
        if outer in inner:
            copy.values[value] = inner[outer]
        else:
            copy.values[value] = copy.fresh(value)
            extra.append((outer, copy.values[value]))
    copied = [copy.node(n, reader_body) for n in reader_body.nodes]
    outputs = [inner[v] for v in kept] + [copy.values[v] for v in reader_body.outputs]
    merged = Graph((*body.inputs, *(v for _, v in extra)), (*body.nodes, *copied), tuple(outputs), copy.constants)
    attrs = {"name": reader.attrs["name"], "kind": CONV.name, "bodies": (merged,)}
    return Node(KERNEL, (*inputs, *(o for o, _ in extra)), attrs, (*kept, *reader.outputs), reader.loc)


def _body(node: Node) -> tuple[Graph, tuple[Value, ...]]:
    """A conv kernel's body and inputs; for a convolution, a body of the convolution alone."""
    if node.op == KERNEL:
        return node.attrs["bodies"][0], node.inputs
    operands = tuple(Value(k, v.type) for k, v in enumerate(node.inputs))
    result = Value(len(operands), node.output.type)
    conv = Node(node.op, operands, node.attrs, (result,), node.loc)
    return Graph(operands, (conv,), (result,), {}), node.inputs


class _Copier:
    """Copies another body's nodes into ``body``'s value numbering and constant table."""

    def __init__(self, body: Graph) -> None:
        self.next_id = 1 + max(v.id for v in body.values())
        self.constants = dict(body.constants)
        self.values: dict[Value, Value] = {}

    def fresh(self, value: Value) -> Value:
        copy = Value(self.next_id, value.type)
        self.next_id += 1
        return copy

    def node(self, node: Node, source: Graph) -> Node:
        attrs = node.attrs
        if node.op == CONSTANT:
            name = str(attrs["name"])
            while name in self.constants:
                name += "_"
            self.constants[name] = source.constants[attrs["name"]]
            attrs = {**attrs, "name": name}
        outputs = tuple(self.fresh(v) for v in node.outputs)
        self.values.update(zip(node.outputs, outputs, strict=True))
        return Node(node.op, tuple(self.values[v] for v in node.inputs), attrs, outputs, node.loc)
