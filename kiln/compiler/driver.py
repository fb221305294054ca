"""The compile driver: from a traced graph to a program, calling the layers in order.

``compile_graph(traced, options, input_strides, write_backs)`` runs frontend -> passes -> codegen
-> runtime and nothing calls back up:

1. the backend is chosen from the graph's device (``kiln.codegen.backend``; the ``backend=``
   compile option overrides it, for tests);
2. the disk cache is consulted (``program_cache``); a hit resumes after fusion;
3. the pipeline, a tuple of named ``Stage``s: ``roll_loops`` (with ``options.loops``, for a backend
   that runs loop nodes: ``runs_loops``; each loop's body is compiled on its own by this same driver
   when the program is loaded, so its cache entry and its kernels are the body's, made once), the
   graph passes (``options.passes``, by default fold, simplify, CSE, DCE) over the rolled graph,
   then the lowering stages the backend asks for: ``fuse`` (with the
   backend's ``declines``, so no kernel is formed that it cannot compile), ``infer_layouts``,
   ``choose_write_backs`` (which mutated inputs the program writes in place) and ``plan_memory``;
4. the backend generates code for the lowered program and loads it into a runtime program.

Every compile has a deadline, ``options.compile_timeout`` seconds from its start (None: none; by
default ``$KILN_COMPILE_TIMEOUT`` or ``DEFAULT_COMPILE_TIMEOUT``): past it the backend abandons code
generation (the LLVM backend kills the worker compiling for it), the program runs on the
interpreter, ``kiln.explain`` says why, and nothing is cached, so a later compile tries again.

``compiled.stages`` holds what each stage made (a graph, or the text of an analysis: a ``StageText``,
written when first read), which ``dump_dir`` writes, one file per stage, and ``not_fused`` after ``fuse`` when fusion declined
merges (why, ``kiln.passes.fusion_refusals``; the report shows the same lines). Should a backend fail -- a bug, never the user's -- the
call still runs: on the interpreter, with a warning saying why (``KILN_JIT_STRICT=1``, set by the
test suite, raises instead).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..codegen.backend import Backend, Lowered, LoweringReport, Program, backend_for, backend_named
from ..ir.graph import CONSTANT, KERNEL, LOOP, Graph, Node, Value
from ..ir.loops import describe_loop, loop_of
from ..ir.primitives import ELEMENTWISE, PRIMITIVES
from ..passes import DEFAULT_PIPELINE, PassError
from ..passes.fusion import fuse
from ..passes.fusion_refusals import Refusal, summarize
from ..passes.layouts import describe_layouts, infer_layouts
from ..passes.memory_plan import plan_memory
from ..passes.roll_loops import roll_loops
from ..passes.write_backs import choose_write_backs, describe_write_backs
from . import program_cache, program_worker
from .options import CompileOptions, options_text

logger = logging.getLogger("kiln")


@dataclass(frozen=True)
class Compilation:
    """What the stages have decided so far about one traced graph."""

    graph: Graph
    backend: Backend
    input_strides: tuple = ()
    requested: tuple[tuple[int, int], ...] = ()  # (graph output, graph input) pairs the caller writes back
    unfused: Graph | None = None  # the graph before fusion: the memory plan compares with eager on it
    layouts: dict[Value, tuple] = field(default_factory=dict)
    write_backs: dict[int, int] = field(default_factory=dict)
    plan: Any = None
    not_fused: tuple[str, ...] = ()  # why fusion declined merges, worded (``fusion_refusals.summarize``)


@dataclass(frozen=True)
class Stage:
    """A named step of the pipeline: ``run`` makes the next ``Compilation``, ``show`` what ``dump_dir``
    writes after it (a graph, or text); ``notes``, if given, a second text (named ``notes[0]``),
    written only when there is one."""

    name: str
    run: Callable[[Compilation], Compilation]
    show: Callable[[Compilation], Any]
    notes: tuple[str, Callable[[Compilation], str]] | None = None


def graph_stage(graph_pass: Callable[[Graph], Graph]) -> Stage:
    """A ``Graph -> Graph`` pass as a stage."""
    return Stage(getattr(graph_pass, "__name__", repr(graph_pass)),
                 lambda c: replace(c, graph=graph_pass(c.graph)), lambda c: c.graph)  # fmt: skip


class StageText:
    """The text of an analysis stage (``Stage.show``), written on first use: only ``dump_dir`` and a
    reader of ``Compiled.stages`` ask for it, yet the layouts' text alone took ~10 ms of each load of
    a 2,000-kernel program from the cache (a warm process's first call), made and never read.
    ``str()`` of it is the text; it compares equal to that text."""

    __slots__ = ("_make", "_args", "_text")

    def __init__(self, make: Callable[..., str], *args: Any) -> None:
        self._make, self._args = make, args
        self._text: str | None = None

    def __str__(self) -> str:
        text = self._text
        if text is None:
            text = self._text = self._make(*self._args)
            self._make, self._args = str, ()  # (what it read is not kept alive past this)
        return text

    def __eq__(self, other: object) -> bool:
        return str(self) == (str(other) if isinstance(other, StageText) else other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __repr__(self) -> str:
        return repr(str(self))


def _fuse(c: Compilation) -> Compilation:
    backend = c.backend
    refusals: list[Refusal] = []
    graph = fuse(c.graph, lambda node: backend.declines(node) is None, getattr(backend, "takes_epilogue", None),
                 refusals)  # fmt: skip
    return replace(c, graph=graph, unfused=c.graph, not_fused=tuple(summarize(refusals, graph)))


def _plan_text(plan) -> str:
    return plan.describe() + "\n"


def _not_fused(c: Compilation) -> str:
    return "".join(f"{line}\n" for line in c.not_fused)


#: The stages after the graph passes; a backend runs those it names in ``Backend.stages``. Fusion
#: comes first so that a cache hit, which stores the fused graph, resumes right after it.
LOWERING_STAGES: tuple[Stage, ...] = (
    Stage("fuse", _fuse, lambda c: c.graph, ("not_fused", _not_fused)),
    Stage("infer_layouts", lambda c: replace(c, layouts=infer_layouts(c.graph, c.input_strides)),
          lambda c: StageText(describe_layouts, c.layouts)),
    Stage("choose_write_backs", lambda c: replace(c, write_backs=choose_write_backs(c.graph, c.requested, c.layouts)),
          lambda c: StageText(describe_write_backs, c.graph, c.write_backs)),
    Stage("plan_memory", lambda c: replace(c, plan=plan_memory(c.graph, eager_graph=c.unfused)),
          lambda c: StageText(_plan_text, c.plan)),
)  # fmt: skip


def graph_stages(options: CompileOptions) -> tuple[Stage, ...]:
    """The graph passes of ``options`` (None: ``DEFAULT_PIPELINE``) as stages."""
    return tuple(graph_stage(p) for p in (DEFAULT_PIPELINE if options.passes is None else options.passes))


#: Rolls repeated computations into loop nodes, first: the graph passes then run over the rolled
#: graph, not the unrolled one (a 1,000-step loop of two LSTM cells: 3,100 nodes, not 94,000;
#: fold, simplify, CSE and DCE 3.1 s -> 0.2 s), and each body gets them when it is compiled.
#: Before fusion, which sees a loop node as one opaque node.
LOOP_STAGE = graph_stage(roll_loops)


def pipeline(options: CompileOptions, backend: Backend) -> tuple[Stage, ...]:
    """The stages that compile for ``backend`` with ``options``, in order."""
    loops = (LOOP_STAGE,) if options.loops and getattr(backend, "runs_loops", False) else ()
    return loops + graph_stages(options) + tuple(s for s in LOWERING_STAGES if s.name in backend.stages)


@dataclass
class Compiled:
    """A compiled graph: the graph its program runs, the program, the report and every stage's result."""

    graph: Graph
    program: Program
    report: LoweringReport | None
    stages: list[tuple[str, Any]]


def choose_backend(graph: Graph, options: CompileOptions) -> Backend:
    return backend_for(graph) if options.backend is None else backend_named(options.backend)


def compile_graph(traced: Graph, options: CompileOptions, input_strides: Sequence[tuple | None] | None = None,
                  write_backs: Sequence[tuple[int, int]] = ()) -> Compiled:  # fmt: skip
    """Compile ``traced`` for inputs with ``input_strides`` (byte strides per graph input; None: C
    order), writing graph output ``o`` into input ``i``'s memory for the pairs ``(o, i)`` of
    ``write_backs`` where that is safe (the caller copies the others back).

    >>> import numpy as np
    >>> from kiln.ir.graph import GraphBuilder
    >>> from kiln.ir.types import TensorType
    >>> from kiln.ir.dtypes import float32
    >>> from kiln.compiler.options import CompileOptions
    >>> b = GraphBuilder()
    >>> x = b.input(TensorType((3,), float32))
    >>> compiled = compile_graph(b.build([b.node("neg", [b.node("neg", [x])])]), CompileOptions(backend="interpreter"))
    >>> [name for name, _ in compiled.stages]
    ['roll_loops', 'fold_constants', 'simplify', 'eliminate_common_subexpressions', 'eliminate_dead_code']
    >>> compiled.program([np.arange(3, dtype=np.float32)])
    [array([0., 1., 2.], dtype=float32)]
    >>> [stage.name for stage in pipeline(CompileOptions(), backend_named("llvm"))][5:]
    ['fuse', 'infer_layouts', 'choose_write_backs', 'plan_memory']
    """
    strides = tuple(input_strides) if input_strides is not None else (None,) * len(traced.inputs)
    backend = choose_backend(traced, options)
    timeout = options.compile_timeout
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        return _compile(traced, options, backend, strides, tuple(write_backs), deadline)
    except Exception as error:
        if not backend.stages or isinstance(error, PassError) or os.environ.get("KILN_JIT_STRICT") == "1":
            raise
        logger.warning("kiln.compile: the %s backend failed (%s: %s); running on the interpreter",
                       backend.name, type(error).__name__, error)  # fmt: skip
        return _compile(traced, options, backend_named("interpreter"), strides, (), None)


def optimize(graph: Graph, options: CompileOptions, record: list | None = None) -> Graph:
    """The graph passes alone (no backend): what export runs."""
    start = Compilation(graph, backend_named("interpreter"))
    return _run(start, graph_stages(options), options, [] if record is None else record).graph


def _compile(traced: Graph, options: CompileOptions, backend: Backend, strides: tuple, requested: tuple,
             deadline: float | None) -> Compiled:  # fmt: skip
    stages = pipeline(options, backend)
    resume = next((i + 1 for i, s in enumerate(stages) if s.name == "fuse"), None)
    cache = program_cache.disk_cache()
    key = None
    if resume is not None and cache.enabled and backend.signature() is not None:
        key = program_cache.program_key(traced, f"{backend.name}; {backend.signature()}", options_text(options),
                                        strides)  # fmt: skip
        payload = cache.get(key)
        if payload is not None:
            try:
                return _from_cache(payload, traced, backend, stages[resume - 1 :], options, strides, requested)
            except Exception as error:  # noqa: BLE001 - a bad entry is rebuilt, never trusted
                logger.debug("kiln: compile cache entry did not load (%s); rebuilding", error)
    if resume is not None and program_worker.takes(backend, options):
        sent = program_worker.compile_entry(traced, options, strides, requested, deadline)
        if sent is not None:  # else it is compiled here, as if no worker were asked
            return _from_worker(sent, traced, backend, stages[resume - 1 :], options, strides, requested, key)
    prepare = getattr(backend, "prepare", None)
    if prepare is not None:  # a compile is coming: let the backend start what it needs meanwhile
        prepare(deadline)
    if not backend.stages:  # the graph runs as it is: no code, nothing to report
        record: list = []
        state = _run(Compilation(traced, backend, strides, requested), stages, options, record)
        return Compiled(state.graph, backend.load(_lowered(state), None), None, record)
    state, code, report, record = _generate(traced, options, backend, stages, strides, requested, deadline, key)
    loading = time.perf_counter()
    program = _load(state, backend, code, report, options)
    report.stage_seconds.append(("load", time.perf_counter() - loading))
    report.compile_seconds += report.stage_seconds[-1][1]
    if key is not None and not report.abandoned:  # abandoned code would be the next process's too
        cache.put(key, _entry(state, backend, code, report, traced))
    _report_externs(state.graph, backend, report, program)
    return Compiled(state.graph, program, report, record)


def _generate(traced: Graph, options: CompileOptions, backend: Backend, stages: Sequence[Stage], strides: tuple,
              requested: tuple, deadline: float | None, key: str | None):  # fmt: skip
    """``(the final Compilation, the backend's code, its report, each stage's result)``: the pass
    pipeline and code generation, without loading -- all a program worker does."""
    lowering = next((i for i, s in enumerate(stages) if s in LOWERING_STAGES), len(stages))
    record: list = []
    seconds: list = []
    state = _run(Compilation(traced, backend, strides, requested), stages[:lowering], options, record, seconds)
    start = time.perf_counter()
    state = _run(state, stages[lowering:], options, record, seconds)
    report = LoweringReport(cache="off" if key is None else "miss", not_fused=list(state.not_fused))
    generating = time.perf_counter()
    code = backend.generate(_lowered(state, deadline), report)
    seconds.append((f"generate ({backend.name})", time.perf_counter() - generating))
    report.stage_seconds = seconds
    report.compile_seconds = time.perf_counter() - start
    return state, code, report, record


def _entry(state: Compilation, backend: Backend, code: Any, report: LoweringReport, traced: Graph) -> bytes:
    return program_cache.to_entry(state.graph, backend.encode(code), report.kernels, report.declined, traced,
                                  report.not_fused)  # fmt: skip


def compile_entry(traced: Graph, options: CompileOptions, strides: tuple, requested: tuple,
                  deadline: float | None) -> tuple[bytes, list]:  # fmt: skip
    """What the program worker runs: ``(the cache entry of traced's program, each stage's (name,
    seconds))``, its passes and code generated here; ``RuntimeError`` where the backend abandoned
    code generation at ``deadline`` (its caller then compiles it, past the deadline: as abandoned)."""
    backend = choose_backend(traced, options)
    prepare = getattr(backend, "prepare", None)
    if prepare is not None:
        prepare(deadline)
    state, code, report, _ = _generate(traced, options, backend, pipeline(options, backend), strides, requested,
                                       deadline, None)  # fmt: skip
    if report.abandoned:
        raise RuntimeError(f"code generation was abandoned: {report.abandoned}")
    return _entry(state, backend, code, report, traced), report.stage_seconds


def _from_worker(sent: tuple[bytes, list], traced: Graph, backend: Backend, stages: Sequence[Stage],
                 options: CompileOptions, strides: tuple, requested: tuple, key: str | None) -> Compiled:  # fmt: skip
    """The program of the cache entry the program worker made (``sent``: the entry and the worker's
    stage timings), loaded as a disk-cache hit is, and stored in the disk cache under ``key``."""
    payload, seconds = sent
    compiled = _from_cache(payload, traced, backend, stages, options, strides, requested)
    if key is not None:
        program_cache.disk_cache().put(key, payload)
    report = compiled.report
    assert report is not None, "a cache entry has a report"
    report.cache = "miss" if key is not None else "off"
    report.worker = True
    report.stage_seconds[:0] = [(f"{name} (program worker)", s) for name, s in seconds]
    report.compile_seconds += sum(s for _, s in seconds)
    return compiled


def _from_cache(payload: bytes, traced: Graph, backend: Backend, stages: Sequence[Stage], options: CompileOptions, strides: tuple,
                requested: tuple) -> Compiled:  # fmt: skip
    """The program of a cache entry: the stored fused graph goes through the stages after fusion
    (``stages[0]`` is fusion, which the entry replaces), and the stored code is loaded."""
    start = time.perf_counter()
    graph, code, kernels, declined, not_fused = program_cache.from_entry(payload, traced)
    record: list = [(stages[0].name, graph)]
    if not_fused:
        record.append(("not_fused", "".join(f"{line}\n" for line in not_fused)))
    seconds: list = [("read the cache entry", time.perf_counter() - start)]
    state = _run(Compilation(graph, backend, strides, requested), stages[1:], options, record, seconds)
    report = LoweringReport(kernels=kernels, declined=declined, cache="hit", not_fused=not_fused)
    loading = time.perf_counter()
    program = _load(state, backend, backend.decode(code, graph), report, options)
    seconds.append(("load", time.perf_counter() - loading))
    report.stage_seconds = seconds
    report.compile_seconds = time.perf_counter() - start
    _report_externs(graph, backend, report, program)
    return Compiled(graph, program, report, record)


def _run(state: Compilation, stages: Sequence[Stage], options: CompileOptions, record: list,
         seconds: list | None = None) -> Compilation:  # fmt: skip
    """Run ``stages`` in order; ``record`` gets each one's result, ``seconds`` its ``(name, time)``."""
    if options.verify:
        from ..ir import verifier  # noqa: PLC0415 - only needed when verifying
    for stage in stages:
        before = state.graph
        start = time.perf_counter()
        state = stage.run(state)
        if seconds is not None:
            seconds.append((stage.name, time.perf_counter() - start))
        if options.verify and state.graph is not before:
            try:
                verifier.verify(state.graph)
            except verifier.VerificationError as error:
                raise PassError(f"the graph after pass {stage.name} does not verify: {error}") from error
        record.append((stage.name, stage.show(state)))
        if stage.notes is not None and (text := stage.notes[1](state)):
            record.append((stage.notes[0], text))
    return state


def _lowered(state: Compilation, deadline: float | None = None, loops: dict | None = None) -> Lowered:
    return Lowered(state.graph, state.layouts, state.write_backs, state.plan, deadline, loops or {})


def _load(state: Compilation, backend: Backend, code: Any, report: LoweringReport, options: CompileOptions):
    if state.plan is not None:
        report.memory = state.plan.describe()
    return backend.load(_lowered(state, loops=_compile_loops(state.graph, options, report)), code)


def _compile_loops(graph: Graph, options: CompileOptions, report: LoweringReport) -> dict[Node, Program]:
    """The program of each loop node's body, compiled by this driver (the body is a graph of its own:
    its own passes, kernels and cache entry), for the executor to run ``trips`` times."""
    programs: dict[Node, Program] = {}
    # A body is not rolled again: the loops found inside one iteration are short runs of small nodes
    # (a cell's gates), which cost a call per trip and gain little compile time.
    flat = replace(options, loops=False)
    for node in graph.nodes:
        if node.op == LOOP:
            body = compile_graph(loop_of(node).body, flat)
            programs[node] = body.program
            report.loops.append(describe_loop(node))
            if body.report is not None:
                report.loops.extend(f"  {line}" for line in body.report.describe())
    return programs


def _report_externs(graph: Graph, backend: Backend, report: LoweringReport, program: Program) -> None:
    """The nodes left to their eager kernels, and the elementwise ones among them the backend declined."""
    compiled = {id(call.node) for call in program.kernel_calls}  # unfold/fold, for one
    externs: Counter = Counter()
    unfused: dict[str, Counter] = {}
    for node in graph.nodes:
        if node.op in (CONSTANT, KERNEL, LOOP) or id(node) in compiled:
            continue
        externs[node.op] += 1
        why = backend.declines(node)
        if why is not None and PRIMITIVES[node.op].kind in ELEMENTWISE:
            unfused.setdefault(why, Counter())[node.op] += 1
    report.externs = dict(externs)
    for why, ops in unfused.items():
        listed = ", ".join(f"{op} x{n}" for op, n in sorted(ops.items()))
        report.declined.append(("(not fused)", f"{why}; {listed} run on their eager kernels"))
