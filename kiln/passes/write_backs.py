"""Which mutated inputs a compiled program writes in place: ``choose_write_backs``.

A traced call that changes an argument or a captured tensor (an optimizer's update of its
parameters and moments) returns the new value as a graph output that the caller writes back into
the tensor's memory. Writing the output straight into that memory instead saves the copy and
keeps the caller's array, as eager does. This analysis decides, on the fused graph, where that is
safe; the executor then hands the input's array to the kernel that makes the output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..ir.analysis import Liveness, reads_at_own_index
from ..ir.graph import KERNEL, Graph, Value
from ..ir.primitives import has_effect
from .layouts import is_c_order


def choose_write_backs(
    graph: Graph, pairs: Sequence[tuple[int, int]], layouts: Mapping[Value, tuple]
) -> dict[int, int]:
    """``{output o: input i}`` for each requested pair ``(o, i)`` whose output may be written
    straight into input ``i``'s memory.

    Safe when the node making output ``o`` is a kernel that reads input ``i`` once, only at the
    index it writes (everything its body computes from the input is elementwise at the output's
    shape: no view or broadcast downstream either, see ``reads_at_own_index``) -- once: a
    horizontal kernel's other members may run after the one that writes, and one of them reading
    the input would read the new value --, the input is C-contiguous,
    no later node reads the old value (through the input or a view of it; extern results never
    alias their arguments, the executor copies one that does), and each input is written once.
    No kernel before the program's last check writes in place: a call that raises leaves
    arguments and captured state as they were, rather than half updated.

    Needs: the fused graph and its layouts. Establishes: an input named here is read by no node
    after the kernel that overwrites it.
    """
    chosen: dict[int, int] = {}
    last_check = max((k for k, node in enumerate(graph.nodes) if has_effect(node.op)), default=-1)
    producer = {v: (k, node) for k, node in enumerate(graph.nodes) for v in node.outputs}
    last_read = {v: k for k, node in enumerate(graph.nodes) for v in node.inputs}
    views = Liveness(graph).views(graph.inputs)
    for o, i in pairs:
        value, source = graph.outputs[o], graph.inputs[i]
        k, node = producer.get(value, (-1, None))
        aliases = views[source]  # the input and every view of it
        if (node is None or node.op != KERNEL or i in chosen.values() or k < last_check
                or any(a in graph.outputs or last_read.get(a, -1) > k for a in aliases)
                or sum(map(node.inputs.count, aliases)) != 1 or graph.outputs.count(value) > 1
                or not is_c_order(source, layouts[source]) or not reads_at_own_index(node, source, value)):  # fmt: skip
            continue
        chosen[o] = i
    return chosen


def describe_write_backs(graph: Graph, chosen: Mapping[int, int]) -> str:
    """What ``dump_dir`` shows after this stage: each output written into an input's memory."""
    lines = [f"{len(chosen)} output(s) written in place into the input they update:"]
    lines += [f"  output {o} (%{graph.outputs[o].id}) -> input {i} (%{graph.inputs[i].id})" for o, i in chosen.items()]
    return "\n".join(lines) + "\n"
