"""``kiln.explain(fn, *args)``: what the compiler made of a function, summary first, then the IR.

``report.summary()`` is the readable part: per specialization the inputs and outputs by kind with
their shapes, the compiled kernels (one line each: what it fuses, the bytes it reads and writes,
the user's line), the nodes left to eager kernels, the memory plan's figures, why fusion kept
kernels apart (``not fused:`` lines, ``kiln.passes.fusion_refusals``), the guards and why
the specialization was made; then the trace breaks with their reasons and source lines and the
reasons for each retrace, and the compiles still running in the background (their calls run
eagerly until they are ready). ``str(report)`` is the summary followed by every specialization's full
IR (``report.full_ir()``); ``report.to_dot()`` draws the specializations as Graphviz DOT, kernels
as clusters and trace breaks as red notes (``kiln.ir.dot``).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ...ir.dot import BREAK_COLOR, digraph, dot_statements, quote
from ...ir.graph import CONSTANT, KERNEL, LOOP, Graph, Node, Value
from ...ir.printer import format_type
from ...passes.memory_picture import memory_plan_dot
from ...passes.memory_plan import format_bytes
from .backward import BackwardPlan, ConsumedPlan
from .call_cache import CompiledFunction
from .scalar_args import ANY
from .signature import (
    Argument,
    BornView,
    Captured,
    ExternalResult,
    ExternalView,
    NewGrad,
    Parameter,
    PythonValue,
    Repeat,
    Result,
    Saved,
    Seed,
    SetGrad,
    Signature,
)


@dataclass
class ExplainReport:
    name: str
    specializations: list = field(default_factory=list)
    breaks: list[str] = field(default_factory=list)
    recompiles: list[str] = field(default_factory=list)
    not_cached: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # per specialization: why it was made
    compiling: list[str] = field(default_factory=list)  # the compiles running in the background, in words

    @property
    def graphs(self) -> list:
        return [spec.graph for spec in self.specializations]

    def guards(self, spec) -> list[str]:
        """The guards of one specialization, in words."""
        lines = []
        for i, part in enumerate(spec.key[1]):
            if part[0] == "tensor":
                shape, strides, dtype, device, requires_grad, has_grad, alias, hooks = part[1:]
                shared = f", shares memory with argument {alias}" if alias != i else ""
                hooked = f", {hooks[0]} hook(s) and {hooks[1]} post-accumulate hook(s)" if hooks is not None else ""
                lines.append(f"argument {i}: {dtype.short}{list(shape)} strides {strides} on {device}, "
                             f"requires_grad={requires_grad}, .grad {'set' if has_grad else 'None'}{shared}{hooked}")  # fmt: skip
            elif part[0] == "object":
                lines.append(f"argument {i}: this {part[1].__name__} object (identity)")
            else:
                if part[1] is ANY:
                    lines.append(f"argument {i}: {part[0].__name__}, any value (an input of the program)")
                else:
                    lines.append(f"argument {i}: {part[0].__name__} == {part[1]!r}")
        lines.append(f"grad mode {'on' if spec.key[2] else 'off'}")
        captured = [s for s in spec.sources if s.kind == "capture"]
        if captured:
            lines.append(f"{len(captured)} captured tensor(s) alive, with the same shape, strides, dtype, "
                         f"requires_grad, .grad presence and hooks: {', '.join(s.name for s in captured)}")  # fmt: skip
        for _, training, name in spec.modules:
            lines.append(f"{name}.training == {training}")
        names = [name.removeprefix("closure:") for name, _ in spec.globals_guard]
        if names:
            lines.append(f"the same objects named {', '.join(names)}")
        return lines

    # ------------------------------------------------------------------ text
    def summary(self) -> str:
        """The readable part: one block per specialization, then trace breaks and retraces."""
        n = len(self.specializations)
        out = [f"kiln.explain({self.name}): {n} specialization(s), {len(self.breaks)} trace break(s), "
               f"{len(self.recompiles)} recompilation(s)"
               f"{f', {len(self.compiling)} compiling in the background' if self.compiling else ''}"]  # fmt: skip
        for i, spec in enumerate(self.specializations, 1):
            reason = self.reasons[i - 1] if i - 1 < len(self.reasons) else ""
            out.append("")
            out.extend(_describe_specialization(i, spec, reason, self.guards(spec)))
        for title, items in (("Compiling in the background (those calls run eagerly until it is ready):",
                              self.compiling), ("Trace breaks (those calls run eagerly):", self.breaks),
                             ("Recompilations:", self.recompiles), ("Calls not cached:", self.not_cached)):  # fmt: skip
            if items:
                out.append("\n" + title)
                out.extend(f"  {item}" for item in items)
        return "\n".join(out)

    def full_ir(self) -> str:
        """Every specialization's graph after the passes (and its compiled backward's), in the text form."""
        out = []
        for i, spec in enumerate(self.specializations, 1):
            out.append(f"Specialization {i}, graph after the passes:")
            out.extend(f"  {line}" for line in str(spec.graph).splitlines())
            if (backward := _compiled_backward(spec)) is not None:
                out.append(f"Specialization {i}, backward graph:")
                out.extend(f"  {line}" for line in str(backward.graph).splitlines())
        return "\n".join(out)

    def __str__(self) -> str:
        full = self.full_ir()
        return self.summary() + (f"\n\nFull IR\n=======\n{full}" if full else "")

    # ------------------------------------------------------------------ pictures
    def memory_to_dot(self, specialization: int = -1) -> str:
        """Graphviz DOT of a specialization's memory plan over time (``kiln.passes.memory_picture``):
        each intermediate's buffer across the nodes it lives for and the arena bytes it takes
        (``specialization``: its index, the last by default).

        >>> import kiln
        >>> report = kiln.explain(lambda x: (x.exp() + 1).sum(0) * 2, kiln.ones(64, 64))
        >>> report.memory_to_dot().startswith('digraph "memory plan of specialization 1"')
        True
        """
        if not self.specializations:
            raise ValueError(f"kiln.explain({self.name}): no specialization was compiled, so there is no memory plan")
        index = range(len(self.specializations))[specialization]
        spec = self.specializations[index]
        plan = spec.program.plan
        if plan is None:
            raise ValueError(f"specialization {index + 1} runs on a backend that plans no memory (the interpreter)")
        return memory_plan_dot(spec.graph, plan, name=f"memory plan of specialization {index + 1}")

    def to_dot(self, *, collapse_kernels: bool = False) -> str:
        """Graphviz DOT of every specialization (a cluster each; kernels as clusters inside, edges
        labelled with types, inputs and outputs by kind) and the trace breaks (red notes)."""
        statements = []
        for i, spec in enumerate(self.specializations, 1):
            names = captured_names(spec)
            parts = [(f"s{i}_", f"specialization {i}", spec.graph,
                      signature_labels(spec.signature, spec.graph, spec.backward, names))]  # fmt: skip
            if (bwd := _compiled_backward(spec)) is not None:
                parts.append((f"s{i}b_", f"specialization {i}, compiled backward", bwd.graph,
                              signature_labels(bwd.signature, bwd.graph, None, names)))  # fmt: skip
            for prefix, title, graph, (inputs, outputs) in parts:
                statements.append(f"  subgraph {quote('cluster_' + prefix)} {{")
                statements.append(f"    label={quote(f'{title}: {_count_kernels(graph)} kernel(s)')};")
                statements.append('    style=dashed; color="#6b7280";')
                body = dot_statements(graph, prefix, input_labels=inputs, output_labels=outputs,
                                      collapse_kernels=collapse_kernels)  # fmt: skip
                statements.extend("  " + line for line in body)
                statements.append("  }")
        for k, reason in enumerate(self.breaks):
            label = f"trace break (runs eagerly):\n{reason}"
            statements.append(f"  {quote(f'break{k}')} [label={quote(label)}, shape=octagon, style=filled, "
                              f"fillcolor={quote(BREAK_COLOR)}, color=red];")  # fmt: skip
        return digraph(f"kiln.explain({self.name})", statements)


# ---------------------------------------------------------------------- the summary's parts
def _nbytes(value: Value) -> int:
    shape = value.type.shape
    if not all(isinstance(d, int) for d in shape):
        return 0  # a symbolic size: unknown before the call
    return value.type.dtype.itemsize * int(np.prod(shape, dtype=np.int64))  # type: ignore[arg-type]  # ints: checked


def _where(node: Node) -> str:
    return f"{os.path.basename(node.loc.filename)}:{node.loc.line}" if node.loc is not None else ""


def _count_kernels(graph: Graph) -> int:
    return sum(node.op == KERNEL for node in graph.nodes)


def kernel_line(node: Node) -> str:
    """One kernel in a line: name, kind, outputs, the ops it fuses (in order, repeats counted), bytes, source."""
    ops = Counter(n.op for body in node.bodies for n in body.nodes if n.op != CONSTANT)
    fused = ", ".join(op if c == 1 else f"{op} x{c}" for op, c in ops.items())
    outs = ", ".join(format_type(v.type) for v in node.outputs[:2]) + (", ..." if len(node.outputs) > 2 else "")
    moved = sum(map(_nbytes, node.inputs)) + sum(map(_nbytes, node.outputs))
    where = _where(node)
    return (f"{node.attrs.get('name', '?')} {node.attrs.get('kind', '')} -> {outs}: {fused} "
            f"[{format_bytes(moved)}]{'  at ' + where if where else ''}")  # fmt: skip


def _runs_of_kernels(kernels: list[Node]) -> list[str]:
    """``kernel_line`` of each kernel, a run of consecutive kernels that read the same apart from
    their names in one line (an unrolled loop's steps: ``k1..k64 (64 kernels) elementwise ...``)."""
    lines: list[str] = []
    run: list[tuple[str, str]] = []  # (name, the rest of the line)

    def flush() -> None:
        if len(run) == 1:
            lines.append(f"{run[0][0]} {run[0][1]}")
        elif run:
            lines.append(f"{run[0][0]}..{run[-1][0]} ({len(run)} kernels) {run[0][1]}")
        run.clear()

    for node in kernels:
        name, _, rest = kernel_line(node).partition(" ")
        if run and rest != run[-1][1]:
            flush()
        run.append((name, rest))
    flush()
    return lines


def captured_names(spec) -> dict[int, str]:
    """Names for the tensors a specialization captured, by ``id``: ``model.0.weight`` for a module's
    parameter or buffer that the function names as a global or closure variable (or the compiled
    module's own, without a prefix), ``opt.state[model.0.weight].exp_avg`` for optimizer state."""
    names: dict[int, str] = {}
    try:
        _name_captured(spec, names)
    except Exception:  # noqa: BLE001 - names are a courtesy: an object that fails to list its tensors costs only them
        pass
    return names


def _name_captured(spec, names: dict[int, str]) -> None:
    owners = [(name.removeprefix("closure:"), obj) for name, obj in spec.globals_guard]
    if spec.modules:
        root = spec.modules[0][0]()
        if root is not None:
            owners.append(("", root))
    names.update(spec.state_float_names)  # floats of Python state read at each call
    for owner, obj in owners:  # tensors named as they are
        if owner and hasattr(obj, "_data") and hasattr(obj, "_dtype"):
            names.setdefault(id(obj), owner)
    for owner, obj in owners:  # modules before optimizers: optimizer state is named after the parameters
        for method in ("named_parameters", "named_buffers"):
            if callable(getattr(obj, method, None)) and callable(getattr(obj, "modules", None)):
                for name, t in getattr(obj, method)():
                    names.setdefault(id(t), f"{owner}.{name}" if owner else name)
    for owner, obj in owners:
        state, groups = getattr(obj, "state", None), getattr(obj, "param_groups", None)
        if isinstance(state, dict) and isinstance(groups, list):
            for p, entries in state.items():
                if isinstance(entries, dict):
                    for key, t in entries.items():
                        names.setdefault(id(t), f"{owner}.state[{names.get(id(p), '?')}].{key}")
            # kiln's optimizers keep each group's hyperparameters in 0-d tensors (``Optimizer._scalars``),
            # which a compiled step reads: a scheduler changes them without a retrace
            for i, scalars in enumerate(getattr(obj, "_scalars", None) or ()):
                for key, t in scalars.items() if isinstance(scalars, dict) else ():
                    where = f"{owner}.param_groups[{i}][{key!r}]"
                    for j, item in enumerate(t) if isinstance(t, tuple) else ():  # betas: a tensor each
                        names.setdefault(id(item), f"{where}[{j}]")
                    names.setdefault(id(t), where)


def _input_label(source, value: Value, captured: dict[int, str] | None = None) -> str:
    if isinstance(source, Argument):
        return f"argument {source.position}"
    if isinstance(source, Parameter):
        return f"parameter {source.name}"
    if isinstance(source, Captured):
        t = source.ref() if captured else None
        name = captured.get(id(t)) if captured and t is not None else None
        return f"captured {name}" if name else "captured"
    if isinstance(source, Seed):
        return f"gradient of result {source.index}"
    if isinstance(source, Saved):
        return f"saved {source.index}"
    return str(getattr(source, "kind", "input"))


def signature_labels(signature: Signature, graph: Graph, backward=None,
                     captured: dict[int, str] | None = None) -> tuple[list[str], list[str]]:  # fmt: skip
    """Per graph input and per graph output, its kind in words (``argument 0``, ``parameter fc.weight``,
    ``captured model.0.weight`` (names from ``captured``, see ``captured_names``), ``result 0``,
    ``writes back argument 1``, ``sets .grad of captured ...``, ``saved for backward``)."""
    names = [_input_label(s, v, captured) for s, v in zip(signature.inputs, graph.inputs, strict=False)]
    names += [f"input {i}" for i in range(len(names), len(graph.inputs))]
    outputs: list[list[str]] = [[] for _ in graph.outputs]
    for position, result in enumerate(signature.results):
        if isinstance(result, Result | BornView) and result.output < len(outputs):
            outputs[result.output].append(f"result {position}")
    for w in signature.writebacks:
        outputs[w.output].append(f"writes back {names[w.input]}")
    for g in signature.grads:
        if isinstance(g, SetGrad):
            outputs[g.output].append(f"sets .grad of {names[g.input]}")
    for i in getattr(backward, "saved_outputs", ()):
        outputs[i].append("saved for backward")
    return names, [" / ".join(kinds) or f"output {i}" for i, kinds in enumerate(outputs)]


def result_words(signature: Signature, graph: Graph, names: list[str]) -> list[str]:
    """Per result leaf, what it is: ``result 0 f32[4]``, ``result 1 is argument 0``..."""
    words = []
    for position, r in enumerate(signature.results):
        if isinstance(r, Result | BornView):
            view = " (a view)" if isinstance(r, BornView) else ""
            words.append(f"result {position} {format_type(graph.outputs[r.output].type)}{view}")
        elif isinstance(r, ExternalResult | ExternalView | NewGrad):
            what = {"external": "", "view": "a view of ", "grad": "the .grad of "}[r.kind]
            words.append(f"result {position} is {what}{names[r.input]}")
        elif isinstance(r, Repeat):
            words.append(f"result {position} is result {r.position}")
        elif isinstance(r, PythonValue):
            words.append(f"result {position} = {r.value!r}")
    return words


def _grouped(labels: list[str], values) -> str:
    """``argument 0 f32[16,64], argument 1 i64[16]; captured: f32[32,64], f32[32]`` (captured ones grouped)."""
    plain = [f"{label} {format_type(v.type)}" for label, v in zip(labels, values) if not label.startswith("captured")]
    captured = [f"{label.removeprefix('captured').strip()} {format_type(v.type)}".strip()
                for label, v in zip(labels, values) if label.startswith("captured")]  # fmt: skip
    parts = [", ".join(plain)] if plain else []
    if captured:
        parts.append(f"{len(captured)} captured: {', '.join(captured)}")
    return "; ".join(parts) or "none"


def _describe_specialization(i: int, spec, reason: str, guards: list[str]) -> list[str]:
    graph, signature = spec.graph, spec.signature
    names, _ = signature_labels(signature, graph, spec.backward, captured_names(spec))
    traced = len(spec.traced_graph.nodes) if spec.traced_graph is not None else len(graph.nodes)
    lines = [f"Specialization {i} ({spec.calls} compiled call(s){'; made because ' + reason if reason else ''})"]
    if spec.background_seconds is not None:
        lines.append(f"  compiled in the background: ready {spec.background_seconds:.3g} s after its trace")
    lines.append(f"  inputs:  {_grouped(names, graph.inputs)}")
    results = result_words(signature, graph, names)
    lines.append(f"  outputs: {', '.join(results) or 'none'}")
    written = [f"{names[w.input]} {format_type(graph.outputs[w.output].type)}" for w in signature.writebacks]
    if written:
        lines.append(f"  writes back {len(written)} input(s) changed in place: {_shorten(written)}")
    grads = [names[g.input] for g in signature.grads]
    if grads:
        lines.append(f"  sets .grad of {len(grads)} input(s)")
    kernels = [node for node in graph.nodes if node.op == KERNEL]
    primitives = Counter(node.op for node in graph.nodes if node.op not in (KERNEL, CONSTANT, LOOP))
    loops = sum(node.op == LOOP for node in graph.nodes)  # each body's kernels: the report's loop lines
    # what the backend left to eager kernels; the rest it compiled as functions of their own (unfold, take...)
    eager = Counter(spec.report.externs) if spec.report is not None else primitives
    native = primitives - eager
    compiled = f"{sum(native.values())} compiled primitive(s), " if native else ""
    rolled = f"{loops} loop(s), " if loops else ""
    lines.append(f"  nodes:   {traced} traced -> {len(graph.nodes)} after the passes: {len(kernels)} kernel(s), "
                 f"{rolled}{compiled}{sum(eager.values())} node(s) on eager kernels")  # fmt: skip
    lines.extend(f"    {line}" for line in _runs_of_kernels(kernels))
    if native:
        lines.append("    compiled primitives: " + ", ".join(f"{op} x{c}" for op, c in sorted(native.items())))
    if eager:
        lines.append("    eager kernels: " + ", ".join(f"{op} x{c}" for op, c in sorted(eager.items())))
    lines.extend(_memory_lines(spec))
    if spec.report is not None:
        lines.append("  code:")
        lines.extend(f"    {line}" for line in spec.report.describe() if not line.lstrip().startswith(
            ("extern nodes", "memory plan", "eager would hold", "in place:")))  # fmt: skip
    if (backward := _compiled_backward(spec)) is not None:
        bwd = backward.graph
        lines.append(f"  backward: {len(bwd.nodes)} nodes, {_count_kernels(bwd)} kernel(s), "
                     f"{len(backward.saved_outputs)} value(s) saved by the forward{_saved(backward)}")  # fmt: skip
    elif isinstance(spec.backward, ConsumedPlan):
        lines.append("  backward: none to compile; the call ran backward through its results itself "
                     "(they require grad, and a backward through them raises, as in eager)")  # fmt: skip
    lines.append("  guards:")
    lines.extend(f"    {line}" for line in guards)
    if spec.python_reads:
        lines.append("  Python values read (input: read on each call; guard: a change makes a new trace):")
        lines.extend(f"    {read}" for read in spec.python_reads)
    return lines


def _compiled_backward(spec) -> BackwardPlan | None:
    """The specialization's compiled backward: None without one, or when the call itself ran
    backward through the results (a ``ConsumedPlan``: no graph)."""
    return spec.backward if isinstance(spec.backward, BackwardPlan) else None


def _memory_lines(spec) -> list[str]:
    graph = spec.graph
    moved = sum(sum(map(_nbytes, n.inputs)) + sum(map(_nbytes, n.outputs)) for n in graph.nodes if n.op != CONSTANT)
    text = f"  memory:  {format_bytes(moved)} read and written per call by the nodes"
    out_bytes = sum(map(_nbytes, graph.outputs))
    text += f", {format_bytes(out_bytes)} of outputs"
    lines = [text]
    plan = spec.program.plan
    if plan is not None:
        lines.extend("    " + line.strip() for line in plan.describe().splitlines())
        lines.append("    (report.memory_to_dot() draws the plan over time; kiln.ir.dot.render makes it SVG)")
    return lines


def _shorten(items: list[str], limit: int = 6) -> str:
    return ", ".join(items[:limit]) + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def explain(fn, *args, **kwargs) -> ExplainReport:
    """Compile ``fn`` (or take the compiled ``fn``), call it with ``args`` if given, and report.

    The call runs for real (it is traced while it runs eagerly), side effects included, and the
    report waits for the compile it started (``fn.wait_compiled()``); without arguments it reports
    what is there now, compiles still running in the background included.
    ``print(report)`` shows the summary then the full IR; ``report.summary()`` the summary alone.
    """
    compiled = getattr(fn, "_compiled", fn)  # a compiled module holds its CompiledFunction
    if not isinstance(compiled, CompiledFunction):
        compiled = CompiledFunction(fn)
    if args or kwargs:
        compiled(*args, **kwargs)
        compiled.wait_compiled()
    report = ExplainReport(compiled._name(), list(compiled.state.specializations))
    now = time.perf_counter()
    report.compiling = [f"{e.nodes} traced nodes, for {now - e.started:.3g} s so far (made because {e.reason})"
                        for e in list(compiled.state.pending)]  # fmt: skip
    compiled_events = [e for e in compiled.state.events if e.kind == "compiled"]
    for e in compiled.state.events:
        if e.kind == "break":
            report.breaks.append(e.detail)
        elif e.kind == "not cached":
            report.not_cached.append(e.detail)
        elif e.kind == "recompile limit":
            report.recompiles.append(e.detail)
    report.recompiles[:0] = [e.detail for e in compiled_events[1:]]
    report.reasons = [e.detail.split(": ", 1)[-1] for e in compiled_events]
    return report


def _saved(plan) -> str:
    """The bytes a call's forward keeps for its compiled backward, and what the partition pass changed."""
    if not hasattr(plan, "saved_bytes"):
        return ""
    text = f" ({format_bytes(plan.saved_bytes)} per call"
    if plan.recomputed:
        text += (f"; {format_bytes(plan.saved_bytes_before)} before the partition pass: the backward recomputes "
                 f"{plan.recomputed} value(s) instead")  # fmt: skip
    return text + ")"
