"""``kiln.explain(fn, *args)``: what the compiler made of a function, in words and IR.

The report lists each specialization (node counts before and after the passes, the guards it
checks, its graph), the trace breaks with their reasons and source lines, and why each
specialization after the first was made (which guard changed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...passes.memory_plan import format_bytes
from .compiler import CompiledFunction


def _saved(plan) -> str:
    """What a call's forward keeps for its compiled backward, and what the partition pass changed."""
    if not hasattr(plan, "saved_bytes"):  # the call ran backward itself: nothing kept
        return ""
    text = f"; each call saves {format_bytes(plan.saved_bytes)} for it"
    if plan.recomputed:
        text += (f" ({format_bytes(plan.saved_bytes_before)} before the partition pass; the backward "
                 f"recomputes {plan.recomputed} saved value(s) instead)")  # fmt: skip
    return text


@dataclass
class ExplainReport:
    name: str
    specializations: list = field(default_factory=list)
    breaks: list[str] = field(default_factory=list)
    recompiles: list[str] = field(default_factory=list)
    not_cached: list[str] = field(default_factory=list)

    @property
    def graphs(self) -> list:
        return [spec.graph for spec in self.specializations]

    def guards(self, spec) -> list[str]:
        """The guards of one specialization, in words."""
        lines = []
        for i, part in enumerate(spec.key[1]):
            if part[0] == "tensor":
                shape, strides, dtype, device, requires_grad, has_grad, alias = part[1:]
                shared = f", shares memory with argument {alias}" if alias != i else ""
                lines.append(f"argument {i}: {dtype.short}{list(shape)} strides {strides} on {device}, "
                             f"requires_grad={requires_grad}, .grad {'set' if has_grad else 'None'}{shared}")  # fmt: skip
            elif part[0] == "object":
                lines.append(f"argument {i}: this {part[1].__name__} object (identity)")
            else:
                lines.append(f"argument {i}: {part[0].__name__} == {part[1]!r}")
        lines.append(f"grad mode {'on' if spec.key[2] else 'off'}")
        captured = [s for s in spec.sources if s.kind == "capture"]
        if captured:
            lines.append(f"{len(captured)} captured tensor(s) alive, with the same shape, strides, dtype, "
                         f"requires_grad and .grad presence: {', '.join(s.name for s in captured)}")  # fmt: skip
        for _, training, name in spec.modules:
            lines.append(f"{name}.training == {training}")
        names = [name.removeprefix("closure:") for name, _ in spec.globals_guard]
        if names:
            lines.append(f"the same objects named {', '.join(names)}")
        return lines

    def __str__(self) -> str:
        n = len(self.specializations)
        out = [f"kiln.explain({self.name}): {n} specialization(s), {len(self.breaks)} trace break(s), "
               f"{len(self.recompiles)} recompilation(s)"]  # fmt: skip
        for i, spec in enumerate(self.specializations, 1):
            traced = len(spec.traced_graph.nodes) if spec.traced_graph is not None else len(spec.graph.nodes)
            counts = ", ".join(f"{op} x{c}" for op, c in sorted(spec.graph.op_counts().items()))
            out.append(f"\nSpecialization {i} ({spec.calls} compiled call(s)): {len(spec.graph.nodes)} nodes after "
                       f"the passes ({traced} traced)")  # fmt: skip
            out.append(f"  ops: {counts}")
            if spec.backward is not None:
                out.append(f"  backward graph: {len(spec.backward.graph.nodes)} nodes{_saved(spec.backward)}")
            if spec.report is not None:
                out.append("  code:")
                out.extend(f"    {line}" for line in spec.report.describe())
            out.append("  guards:")
            out.extend(f"    {line}" for line in self.guards(spec))
            out.append("  graph:")
            out.extend(f"    {line}" for line in str(spec.graph).splitlines())
        if self.breaks:
            out.append("\nTrace breaks (those calls run eagerly):")
            out.extend(f"  {b}" for b in self.breaks)
        if self.recompiles:
            out.append("\nRecompilations:")
            out.extend(f"  {r}" for r in self.recompiles)
        if self.not_cached:
            out.append("\nCalls not cached:")
            out.extend(f"  {r}" for r in self.not_cached)
        return "\n".join(out)


def explain(fn, *args, **kwargs) -> ExplainReport:
    """Compile ``fn`` (or take the compiled ``fn``), call it with ``args`` if given, and report.

    The call runs for real (it is traced while it runs eagerly), side effects included.
    """
    compiled = getattr(fn, "_compiled", fn)  # a compiled module holds its CompiledFunction
    if not isinstance(compiled, CompiledFunction):
        compiled = CompiledFunction(fn)
    if args or kwargs:
        compiled(*args, **kwargs)
    report = ExplainReport(compiled._name(), list(compiled.state.specializations))
    compiled_events = [e for e in compiled.state.events if e.kind == "compiled"]
    for e in compiled.state.events:
        if e.kind == "break":
            report.breaks.append(e.detail)
        elif e.kind == "not cached":
            report.not_cached.append(e.detail)
        elif e.kind == "recompile limit":
            report.recompiles.append(e.detail)
    report.recompiles[:0] = [e.detail for e in compiled_events[1:]]
    return report
