"""A memory plan as a picture: each planned buffer a box, across the nodes it is alive for (left to
right, the schedule) and over the bytes of the arena it occupies (bottom to top), so reuse -- a buffer
placed where an earlier one died -- and the peak are seen at a glance.

``memory_plan_dot(graph, plan)`` writes Graphviz DOT with pinned positions (neato lays nothing out);
``kiln.ir.dot.render`` turns it into SVG or PNG, as it does the graphs' pictures. ``kiln.explain``'s
report offers it per specialization (``ExplainReport.memory_to_dot``).
"""

from __future__ import annotations

from ..ir.analysis import Liveness
from ..ir.dot import quote
from ..ir.graph import Graph
from .memory_plan import MemoryPlan, aligned, format_bytes, nbytes

WIDTH, HEIGHT = 9.0, 4.5  # inches of the plotting area
INPLACE_COLOR, BUFFER_COLOR = "#fde68a", "#bfdbfe"


def memory_plan_dot(graph: Graph, plan: MemoryPlan, name: str = "memory plan") -> str:
    """``plan``'s buffers over ``graph``'s schedule (the graph the plan was made for) as DOT."""
    live = Liveness(graph)
    steps = max(len(graph.nodes), 1)
    arena = max(plan.arena_bytes, 1)
    statements = [
        f"digraph {quote(name)} {{",
        '  graph [layout=neato, splines=false, outputorder=edgesfirst, fontname="Helvetica"];',
        '  node [shape=box, fixedsize=true, style=filled, fontname="Helvetica", fontsize=8, color="#1f2937"];',
    ]
    for value, offset in plan.offsets.items():
        start, end = live.start[value], max(live.end[value], live.start[value])
        size = aligned(nbytes(value))
        width = (end - start + 1) / steps * WIDTH
        height = max(size / arena * HEIGHT, 0.03)
        x = start / steps * WIDTH + width / 2  # neato reads pinned positions in inches
        y = offset / arena * HEIGHT + height / 2
        color = INPLACE_COLOR if value in plan.inplace else BUFFER_COLOR
        label = f"%{value.id}" if width > 0.3 and height > 0.15 else ""
        tip = f"%{value.id}: {value.type}, {format_bytes(size)} at offset {offset}, nodes {start}..{end}"
        statements.append(f"  {quote(f'v{value.id}')} [pos={quote(f'{x:.3f},{y:.3f}!')}, width={width:.3f}, "
                          f"height={height:.3f}, label={quote(label)}, tooltip={quote(tip)}, fillcolor={quote(color)}];")  # fmt: skip
    caption = (f"{name}: arena {format_bytes(plan.arena_bytes)} (peak live {format_bytes(plan.peak_bytes)}, "
               f"{format_bytes(plan.intermediate_bytes)} without reuse), {len(plan.offsets)} intermediates over "
               f"{len(graph.nodes)} nodes; x: the schedule, y: the arena's bytes; yellow: written in place")  # fmt: skip
    statements.append(f"  caption [shape=plaintext, style=\"\", fixedsize=false, fontsize=10, label={quote(caption)}, "
                      f"pos={quote(f'{WIDTH / 2:.3f},{-0.35:.3f}!')}];")  # fmt: skip
    frame = f"{WIDTH / 2:.3f},{HEIGHT / 2:.3f}!"
    statements.append(f"  frame [shape=box, style=dashed, fillcolor=none, label=\"\", width={WIDTH}, height={HEIGHT}, "
                      f"pos={quote(frame)}];")  # fmt: skip
    statements.append("}")
    return "\n".join(statements) + "\n"
