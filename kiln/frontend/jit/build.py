"""From a finished trace to a ``Specialization``: its signature, the backward, passes.

Two steps, so that the second can run in the background (``kiln.compile(wait=False)``):
``trace_specialization`` does what needs the call's tensors and autograd graph (the signature,
the backward's trace) and leaves a ``PendingSpecialization`` of graphs alone; its ``compile()``
runs the partition pass, the pass pipeline, code generation and loading (``kiln.compiler.driver``).

The forward graph's outputs are, in order: the call's tensor results, the final values of the
externals it mutated, the new ``.grad`` values (``signature.number_outputs``), and (when the
results need gradients) the forward values the backward graph reads.
"""

from __future__ import annotations

import functools
import gc
import itertools
import logging
import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...compiler.driver import compile_graph
from ...ir.analysis import Liveness
from ...ir.graph import Graph, Node, Value
from ...ir.verifier import VerificationError, verify
from ...passes.layouts import c_strides
from ...passes.partition import partition
from ..autograd.grad_mode import state as grad_state
from ..autograd.graph import FreedGraphError
from ..tensor import Tensor, make_tensor
from .backward import BackwardPlan, ConsumedPlan
from .dynamic import NotDynamic, Pending, size_symbols, symbolize
from .dynamic_binding import SizesFit, with_derived
from .eager_checks import watched_versions
from .escapes import escaped_tensors
from .hazards import reachable_tensors
from .outcomes import TraceBreak
from .pytree import flatten
from .scalar_args import python_results
from .signature import Argument, BornView, Captured, ExternalView, Result, Saved, Seed, number_outputs
from .specialization import Specialization
from .symbolic_backward import lower_plan, symbolic_backward
from .symbolic_program import SizedProgram, Unlowered, lower_symbolic
from .trace import Trace
from .watched_sizes import guards_of

logger = logging.getLogger("kiln")


def build_specialization(compiled, trace: Trace, result, leaves: list, key: tuple, closure_values: dict,
                         dynamic=None):  # fmt: skip
    """``(Specialization, None)``, or ``(None, why)`` when this trace must not be reused: ``why`` is a
    ``TraceBreak`` when calls with this key can never be compiled (they run eagerly from then on), a
    ``dynamic.Pending`` when it waits for another size. ``dynamic``: see ``CompiledFunction._dynamic_partner``."""
    pending, why = trace_specialization(compiled, trace, result, leaves, key, closure_values, dynamic)
    return (None, why) if pending is None else (pending.compile(), None)


@dataclass
class Decision:
    """What ``PendingSpecialization.decide`` found: the forward and backward over symbolic sizes (None
    when the program stays static, ``not_dynamic`` saying why) and the guards its sizes keep."""

    symbolic: Graph | None
    symbolic_backward: Graph | None
    not_dynamic: str | None
    size_guards: list


def _field(name: str, make: Callable[[], Any]) -> Any:
    """A property reading and writing the Specialization's field ``name`` in ``fields`` (``make()`` until set)."""

    def read(self):
        return self.fields.setdefault(name, make())

    def write(self, value) -> None:
        self.fields[name] = value

    return property(read, write)


@dataclass(eq=False)
class PendingSpecialization:
    """A traced call whose graphs are not compiled yet: everything it holds is graphs and Python
    values, never the call's tensors' autograd graph, so ``compile()`` may run on any thread. The
    compiler sets its guards (``guards``, ``checks``, ``python_reads``) before it compiles."""

    compiled: Any  # the CompiledFunction (its options, name and dump directory)
    forward: Graph
    backward: Any  # a _PendingBackward, a ConsumedPlan or None
    sources: list
    mutated: set[int]
    strides: list
    writebacks: list[tuple[int, int]]
    fields: dict  # the Specialization's other fields
    trace_seconds: float
    nodes: int  # traced nodes, for the notices
    dynamic: Any = None  # CompiledFunction._dynamic_partner's answer for this trace
    size_compared: str | None = None  # the trace's branch on a size (Trace.size_compared)
    size_guards: list = field(default_factory=list)  # the trace's comparisons of sizes (Trace.size_guards)
    partitioned: tuple | None = None  # (forward, backward) when the partition ran already
    guards: Any = None
    checks: list = field(default_factory=list)
    python_reads: list = field(default_factory=list)
    decision: Decision | None = None  # decide()'s answer, once asked

    @property
    def modules(self) -> list:
        return self.fields["modules"]

    @property
    def key(self) -> tuple:
        return self.fields["key"]

    @key.setter
    def key(self, key: tuple) -> None:  # (a dynamic float argument's, decided before the compile)
        self.fields["key"] = key

    @property
    def scalar_arguments(self) -> tuple[int, ...]:
        return self.fields["scalar_arguments"]

    @property
    def scalar_program(self) -> tuple | None:
        return self.fields["scalar_program"]

    # set once a watched trace of floats is decided (``partners.py``): the Specialization's fields
    globals_guard = _field("globals_guard", list)
    state_float_slots = _field("state_float_slots", frozenset)
    state_float_names = _field("state_float_names", dict)
    value_guards = _field("value_guards", list)

    @property
    def sizes_source(self) -> Graph | tuple[Graph, Graph | None] | None:
        """What a trace at other sizes is compared with (``dynamic.py``): the forward graph, and the
        backward graph when the results need gradients outside the call (``(forward, backward)``,
        known once the partition ran); None when Python branched on a size (the program holds for
        this size alone)."""
        if self.size_compared is not None:
            return None
        if self.partitioned is not None:
            graph, backward = self.partitioned
            return (graph, backward.traced) if isinstance(backward, BackwardPlan) else graph
        return None if isinstance(self.backward, _PendingBackward) else self.forward

    def partition(self) -> tuple[Graph, Any]:
        if self.partitioned is None:
            self.partitioned = _partition(self.compiled.options, self.backward, self.forward, self.sources,
                                          self.mutated)  # fmt: skip
        return self.partitioned

    def decide(self) -> Decision:
        """Whether this trace makes a dynamic program, and over which symbols: the graphs compared
        (``_symbolic``, ``guards_of``, ``symbolic_backward``), nothing lowered. Cheap enough for the
        caller's thread (measured in ``CompiledFunction._pending_key``), so a dynamic program's
        ``PendingEntry`` is cached under its dynamic key before the lowering starts; run once."""
        if self.decision is None:
            graph, backward = self.partition()
            symbolic, not_dynamic = _symbolic(graph, backward, self.dynamic, self.sources)
            size_guards: list  # SizeGuards, and a SizesFit
            size_guards, why_not = ([], None) if symbolic is None else guards_of(self.size_guards, self.dynamic)
            if why_not is not None:
                symbolic, not_dynamic = None, why_not
            symbolic_bwd = None
            if isinstance(backward, BackwardPlan) and symbolic is not None:
                sizes = with_derived(symbolic, {s: (b, a) for s, (a, b) in size_symbols(self.dynamic[2]).items()})
                symbolic_bwd, why_not = symbolic_backward(backward, self.dynamic[1], sizes, symbolic)
                if symbolic_bwd is None:
                    symbolic, not_dynamic = None, why_not
            if self.size_compared is not None:
                not_dynamic = not_dynamic or f"Python branches on a size that would be dynamic ({self.size_compared})"
            if symbolic is not None:  # sizes its ops do not take (a slice past a dim's end) trace again
                fit = SizesFit.of(symbolic, [s.position if isinstance(s, Argument) else None for s in self.sources])
                size_guards = size_guards if fit is None else [*size_guards, fit]
            self.decision = Decision(symbolic, symbolic_bwd, not_dynamic, size_guards)
        return self.decision

    def compile(self) -> Specialization:
        """The passes, code generation and loading: the ``Specialization``, ready to run. A dynamic
        program whose backward the backend lowers per size only (``lower_plan``) is static after all
        (``not_dynamic`` says why), whatever ``decide`` said."""
        options = self.compiled.options
        graph, backward = self.partition()
        sizes_source = self.sizes_source
        decision = self.decide()
        symbolic, not_dynamic, size_guards = decision.symbolic, decision.not_dynamic, decision.size_guards
        if isinstance(backward, BackwardPlan):  # lowered with the forward: for these sizes, or all
            backward, why_lowered = lower_plan(options, backward, decision.symbolic_backward)
            if symbolic is not None and why_lowered is not None:
                symbolic, not_dynamic = None, why_lowered
        # mutated externals updated in place where that is safe, as eager does
        in_place = [(o, i) for i, o in self.writebacks]
        record: list = []
        if symbolic is not None:
            optimized, program, report = _lower_symbolic(options, symbolic, graph, self.strides, in_place, record)
        else:
            optimized, program, report, record = _lower(graph, options, self.strides, in_place)
        spec = Specialization(graph=optimized, program=program, backward=backward, passes_record=record,
                              traced_graph=graph if symbolic is None else symbolic, report=report,
                              guards=self.guards, checks=self.checks, python_reads=self.python_reads,
                              sizes_source=sizes_source, not_dynamic=not_dynamic,
                              dynamic=None if symbolic is None else self.dynamic[3], size_guards=size_guards,
                              **self.fields)  # fmt: skip
        if report is not None:  # the traced call is the compile's first stage
            report.stage_seconds.insert(0, ("trace (the eager call)", self.trace_seconds))
        _dump(self.compiled, spec)
        return spec


def trace_specialization(compiled, trace: Trace, result, leaves: list, key: tuple, closure_values: dict,
                         dynamic=None):  # fmt: skip
    """``(PendingSpecialization, None)``, or ``(None, why)`` as ``build_specialization``: the steps that
    read the call's tensors, run on the calling thread right after the traced call."""
    out_leaves, out_tree = flatten(result)
    traced = trace.finish(out_leaves)
    if trace.broken is not None:
        return None, f"the trace stopped: {trace.broken}"
    new_grads = [t._grad for t, _ in trace.grads.values() if t._grad is not None]
    tensors = [leaf for leaf in out_leaves if isinstance(leaf, Tensor)]
    keep = tensors + new_grads + [e.tensor for e in traced.externals]
    escaped = escaped_tensors(trace.born, keep)
    if escaped:  # or only kept alive by a reference cycle (a tensor and the autograd node saving it)
        # Cycles this call made are young: collecting the young generations frees them for a
        # fraction of a full collection, which walks every object of the process (~100 ms once
        # torch is imported). Escapes that survive it make this call run eagerly; should the next
        # call's survive too, a full collection decides (a cycle promoted to the old generation
        # mid-trace then costs one eager call, not every call).
        state = compiled.state
        gc.collect() if state.escapes_survived_young_collection else gc.collect(1)
        escaped = escaped_tensors(trace.born, keep)
        state.escapes_survived_young_collection = bool(escaped)
    if escaped:
        trace.release()
        return None, (
            f"the call stored {len(escaped)} new tensor(s) in Python state ({escaped[0]}, ...), as an optimizer's "
            "first step does; this call ran eagerly and the next one traces again"
        )
    for writeback in traced.writebacks:
        ext = traced.externals[writeback.input]
        if ext.tensor.grad_fn is not ext.grad_fn or ext.tensor._requires_grad != ext.state[3]:
            trace.release()  # the same on every call with this key: such calls run eagerly
            return None, TraceBreak(
                f"an in-place change gives {_source(ext, trace.grad_reads).name} autograd history inside the call (a compiled call "
                "writes values back, not history)",
                None,
            )
    sources = [_source(e, trace.grad_reads) for e in traced.externals]
    signature, outputs = number_outputs(sources, traced.outputs, traced.writebacks, traced.grads)
    writebacks = [(w.input, w.output) for w in signature.writebacks]
    backward = None
    if grad_state.grad_enabled:
        backward, why = _trace_backward(compiled.options, trace, traced, out_leaves, outputs)
        if why is not None:
            trace.release()
            return None, why
    size_compared = trace.size_compared
    if size_compared is not None and dynamic is not None:
        dynamic = ("static", f"Python branches on a size that would be dynamic ({size_compared})")
    elif dynamic is not None and any(isinstance(r, ExternalView | BornView) for r in signature.results):
        # such a result is rebuilt from the shape, strides and offset it had at the traced sizes
        dynamic = ("static", "a result views the memory of an argument (or of another result), a view whose shape "
                   "a dynamic program does not follow")  # fmt: skip
    arg_aliases = _arguments_that_are_state(traced, leaves, list(closure_values.values()) +
                                            [value for _, value in compiled.guarded_names({})])  # fmt: skip
    fields = dict(
        signature=signature, out_tree=out_tree,
        modules=[(ref, training, type(ref()).__name__) for ref, training in traced.modules],
        prologues=traced.prologues, globals_guard=compiled.guarded_names(closure_values), key=key,
        arg_aliases=arg_aliases,
        arg_hooks=[(e.arg_index, e.state[5]) for e in traced.externals if e.kind == "arg" and e.hooks_ran],
        scalar_arguments=tuple(sorted(p for _, _, p in trace.scalar_args.values() if p is not None)),
    )  # fmt: skip
    pending = PendingSpecialization(
        compiled, traced.builder.build(outputs), backward, sources, {i for i, _ in writebacks},
        [e.tensor._data.strides for e in traced.externals], writebacks, fields, trace.seconds,
        len(traced.builder.nodes), dynamic, size_compared, list(trace.size_guards),
    )  # fmt: skip
    # what a trace at another value of its float arguments is compared with (scalar_args.py)
    fields["scalar_program"] = (pending.forward, python_results(out_leaves)) if trace.scalar_args else None
    if dynamic is not None and dynamic[0] == "defer":  # kept, not compiled, until another size comes
        graph, partitioned_backward = pending.partition()
        if not isinstance(partitioned_backward, BackwardPlan):
            trace.release()
            return None, Pending(key, graph)
    trace.release()
    return pending, None


_NEEDS_BACKWARD = "the results need gradients outside the call at one of the two sizes only"


def _symbolic(graph: Graph, backward, dynamic, sources: list) -> tuple[Graph | None, str | None]:
    """``(symbolic graph, None)`` when this trace and the earlier one of ``dynamic`` (``("compare",
    graph, size pairs, positions)``) make one program over symbolic sizes, else ``(None, why not)``.
    ``sources``: the kind of each input of ``graph``; only arguments may have symbolic sizes (any
    other input, a tensor made from numpy inside the call, is read at its traced size)."""
    if dynamic is None or dynamic[0] == "defer":
        return None, None
    if dynamic[0] == "static":
        return None, dynamic[1]
    _, earlier, pairs, _ = dynamic
    if isinstance(earlier, tuple) != isinstance(backward, BackwardPlan):
        return None, _NEEDS_BACKWARD
    if isinstance(earlier, tuple):  # (forward, backward): the backward is compared by the caller
        earlier = earlier[0]
    sizes = size_symbols(pairs)
    try:
        symbolic = symbolize(graph, earlier, {s: (b, a) for s, (a, b) in sizes.items()})
        verify(symbolic)
    except (NotDynamic, VerificationError) as why:
        return None, str(why)
    for value, source in zip(symbolic.inputs, sources, strict=True):
        if value.type.symbols and not isinstance(source, Argument):
            return None, (f"a tensor the call reads besides its arguments ({getattr(source, 'name', None) or source}) "
                          f"has a size that follows the dynamic size ({value.type}): it is read as traced")  # fmt: skip
    return symbolic, None


def _lower_symbolic(options, symbolic: Graph, traced: Graph, strides: list, write_backs: list, record: list):
    """``lower`` for a dynamic specialization: its kernels generated once for every size
    (``symbolic_program``), or, where the backend cannot, the graph lowered per call's sizes
    (``dynamic.SizedProgram``; ``traced`` is the call's own graph, lowered now)."""
    strides = _dynamic_strides(symbolic, traced, strides)
    try:
        fused, program, report = lower_symbolic(symbolic, options, strides, write_backs, first=traced)
    except Unlowered as why:
        optimized, first, report, stages = _lower(traced, options, strides, write_backs)
        record.extend(stages)
        logger.info("kiln.compile: a dynamic specialization is lowered per size: %s", why)
        if report is not None:
            report.declined.append(("(dynamic sizes)", f"lowered again for each new size: {why}"))
        lowering = functools.partial(_lower_program, options, strides, write_backs)
        return optimized, SizedProgram(symbolic, lowering, first=(traced, first)), report
    record.append(("symbolic", fused))
    return fused, program, report


def _dynamic_strides(symbolic: Graph, traced: Graph, strides: list) -> list:
    """The input strides of a dynamic program: None (C order at every size) for a symbolic input the
    traced call passed in C order, whose strides change with an inner size; others as traced (the
    call key keeps their strides, so a call with others traces again)."""
    out = []
    for sym_input, input, given in zip(symbolic.inputs, traced.inputs, strides, strict=True):
        shape = input.type.shape
        expected = c_strides(shape, input.type.dtype.itemsize)  # type: ignore[arg-type]  # traced: static
        c_order = given is not None and all(a == b for n, a, b in zip(shape, given, expected, strict=True) if n != 1)
        out.append(None if not sym_input.type.is_static and c_order else given)
    return out


def _lower_program(options, strides: list, write_backs: list, graph: Graph):
    """The program of ``graph`` (a dynamic specialization bound to one call's sizes)."""
    return _lower(graph, options, strides, write_backs)[1]


def _lower(graph: Graph, options, strides: list, write_backs: list):
    """``(graph the program runs, program, report, each stage's (name, result))`` for ``graph``."""
    lowered = compile_graph(graph, options, strides, write_backs)
    return lowered.graph, lowered.program, lowered.report, lowered.stages


def _arguments_that_are_state(traced, leaves: list, named: list) -> list[tuple[int, weakref.ref]]:
    """``(argument position, tensor)`` for each tensor argument that shares memory with state the
    function can also reach without it (its closure, the globals it names, the modules it called):
    the graph reads both through one input, so later calls must pass that same tensor again."""
    roots = reachable_tensors(named + [ref() for ref, _ in traced.modules])
    aliases = []
    for ext in traced.externals:
        t = ext.tensor
        root = roots.get(id(t._base if t._base is not None else t))
        if ext.kind == "arg" and root is not None:
            aliases.append((ext.arg_index, weakref.ref(leaves[ext.arg_index])))
    return aliases


def _source(external, grad_reads: set[int]) -> Argument | Captured:
    """The input kind of an external. A captured tensor's snapshot holds None for whether its
    ``.grad`` is set unless the call read that (``Trace.grad_reads``): a model's forward reads no
    ``.grad``, so the first ``backward`` setting them makes no new trace."""
    t = external.tensor
    if external.kind == "arg":
        return Argument(external.arg_index)
    snapshot = external.state if id(t) in grad_reads else (*external.state[:4], None, external.state[5])
    return Captured(weakref.ref(t), snapshot, name=f"{t._dtype.short}{list(t._data.shape)}")


def _dump(compiled, spec: Specialization) -> None:
    """The traced graph and the result of every stage, one file each (graphs as ``.ir``, analyses as ``.txt``)."""
    directory = compiled.options.dump_dir
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    number = len(compiled.state.specializations) + 1
    stem = os.path.join(directory, f"{compiled._name()}.{number}")
    with open(f"{stem}.0-traced.ir", "w") as f:
        f.write(str(spec.traced_graph))
    for i, (name, result) in enumerate(spec.passes_record, 1):
        with open(f"{stem}.{i}-{name}.{'ir' if isinstance(result, Graph) else 'txt'}", "w") as f:
            f.write(str(result))
    seconds = getattr(spec.report, "stage_seconds", None)  # a LoweringReport (None for the interpreter)
    if seconds:
        with open(f"{stem}.{len(spec.passes_record) + 1}-timings.txt", "w") as f:
            f.writelines(f"{name}: {s * 1e3:.3f} ms\n" for name, s in seconds)


# ---------------------------------------------------------------------- the backward
def _trace_backward(options, trace: Trace, traced, out_leaves: list, fwd_outputs: list[Value]):
    """Trace the gradients of the differentiable results with respect to the externals."""
    from ..autograd.api import partial_grad  # noqa: PLC0415

    # Results the program computes carry its gradients; a tensor from before the call returned
    # itself (or twice) keeps its own history.
    made = [isinstance(item, Result | ExternalView | BornView) for item in traced.outputs]
    diff = [
        i for i, leaf in enumerate(out_leaves)
        if made[i] and isinstance(leaf, Tensor) and leaf._requires_grad and leaf.grad_fn is not None
    ]  # fmt: skip
    if not diff:
        return None, None
    wrt = [k for k, e in enumerate(traced.externals) if e.tensor._requires_grad]
    if not wrt:
        return None, None
    bwd = Trace(parent=trace).start()
    try:
        seeds = []
        for i in diff:
            seed = make_tensor(np.ones_like(out_leaves[i]._data), out_leaves[i]._device)
            bwd.add_external(seed, "seed")
            seeds.append(seed)
        # the tensors the user can still reach and change whose versions eager's backward checks
        reachable = [e.tensor for e in traced.externals] + [t for t in out_leaves if isinstance(t, Tensor)]
        try:
            with watched_versions(reachable) as checked:
                grads = partial_grad(
                    [out_leaves[i] for i in diff], [traced.externals[k].tensor for k in wrt], seeds, retain_graph=True
                )
        except FreedGraphError:  # the call already ran backward through them (a training step)
            bwd.abandon()
            return ConsumedPlan(diff), None
        except RuntimeError as error:
            bwd.abandon()
            return None, f"the backward could not be traced: {error}"
        for writeback in traced.writebacks:
            if traced.externals[writeback.input].tensor._requires_grad:
                bwd.abandon()
                return None, "a tensor that requires grad was changed in place inside the compiled call"
        result = bwd.finish(list(grads), values_only=True)  # no gradient: a None result
    except BaseException:
        bwd.abandon()
        raise
    if bwd.broken is not None:
        return None, f"the backward could not be traced: {bwd.broken}"
    saved_outputs = []
    for value in bwd.foreign:
        saved_outputs.append(len(fwd_outputs))
        fwd_outputs.append(value)
    inputs: list = []
    seed_index = {id(s): k for k, s in enumerate(seeds)}
    saved = iter(range(len(bwd.foreign)))  # the other inputs read forward values, in this order
    externals = {e.value: e for e in result.externals}
    for value in result.builder.inputs:
        ext = externals.get(value)
        if ext is not None and id(ext.tensor) in seed_index:
            inputs.append(Seed(seed_index[id(ext.tensor)]))
        elif ext is not None:
            inputs.append(Captured(weakref.ref(ext.tensor)))
        else:
            inputs.append(Saved(next(saved)))
    graph = result.builder.build(number_outputs(inputs, result.outputs)[1])
    bwd.release()
    external_counters = {id(e.tensor._version) for e in traced.externals}
    checked_inputs = [k for k, e in enumerate(traced.externals) if id(e.tensor._version) in checked]
    checked_results = [i for i, t in enumerate(out_leaves) if made[i] and isinstance(t, Tensor)
                       and id(t._version) in checked and id(t._version) not in external_counters]  # fmt: skip
    pending = _PendingBackward(graph, inputs, result.outputs, diff, saved_outputs, wrt, checked_inputs, checked_results)
    return pending, None


@dataclass
class _PendingBackward:
    """A traced backward not yet lowered: the partition pass first decides what the forward saves."""

    graph: Graph
    inputs: list  # Seed, Captured and Saved kinds, one per graph input
    results: list  # the traced results, for ``number_outputs``
    diff: list[int]
    saved_outputs: list[int]  # forward output indices of the saved values, one per Saved input
    wrt: list[int]
    # what eager's backward checked for in-place changes (``eager_checks``): the externals (forward
    # inputs) by index, and the results (besides views of externals) by their flattened position
    checked_inputs: list[int]
    checked_results: list[int]


def _partition(
    options, pending: _PendingBackward | ConsumedPlan | None, forward: Graph, sources: list, mutated: set[int]
):
    """The forward graph without what the backward now recomputes, and the ``BackwardPlan`` (not lowered yet).
    ``mutated``: the forward inputs the call writes back into (changed in place): the backward
    would read their new values, so nothing is recomputed from them."""
    if not isinstance(pending, _PendingBackward):
        return forward, pending  # None or a ConsumedPlan
    saved_inputs = [i for i, kind in enumerate(pending.inputs) if isinstance(kind, Saved)]
    read_by_backward = {id(kind.ref()): i for i, kind in enumerate(pending.inputs) if isinstance(kind, Captured)}
    readable = {f: read_by_backward[id(s.ref())] for f, s in enumerate(sources)
                if isinstance(s, Captured) and id(s.ref()) in read_by_backward and f not in mutated}  # fmt: skip
    part = partition(forward, pending.graph, pending.saved_outputs, saved_inputs, readable, mutated)
    still_saved = {saved_inputs[j]: k for k, j in enumerate(part.kept)}  # backward input -> its new Saved index
    inputs = [Saved(still_saved[i]) if isinstance(kind, Saved) else kind
              for i, kind in enumerate(pending.inputs) if not isinstance(kind, Saved) or i in still_saved]  # fmt: skip
    inputs += [Saved(len(part.kept) + k) for k in range(part.promoted)]
    signature, _ = number_outputs(inputs, pending.results)
    # A saved value over memory the user can change before the backward (an input's) is read there
    # only if eager's backward checked that input (the check then raises first); else it is copied.
    unchecked = set(range(len(forward.inputs))) - set(pending.checked_inputs)
    forward = _own_copies(part.forward, part.saved, mutated | unchecked)
    # lowered when the specialization is compiled (``symbolic_backward.lower_plan``): for its sizes, or all
    plan = BackwardPlan(part.backward, _not_lowered, signature, pending.diff, list(part.saved), pending.wrt,
                        saved_bytes=part.saved_bytes, saved_bytes_before=part.saved_bytes_before,
                        recomputed=len(part.recomputed), checked_inputs=pending.checked_inputs,
                        checked_results=pending.checked_results, traced=part.backward)  # fmt: skip
    return forward, plan


def _not_lowered(arrays: list) -> list:
    raise AssertionError("a backward plan run before its specialization was compiled")


def _own_copies(forward: Graph, saved: Sequence[int], inputs: set[int]) -> Graph:
    """``forward`` with each saved value that is a view of one of ``inputs`` replaced by a copy of it.
    Those are the inputs whose memory eager's backward did not read at its own time: the call writes
    them back, or eager's backward did not check them (``eager_checks``). Tracing succeeded, so the
    value eager saved was memory of its own (``v.copy_(a)`` then ``a.add_(2)``), and only the graph,
    which knows values and not memory, made it a view (``expand(a)``). Saved as a view, a write-back
    or the user's in-place change would change it under the backward."""
    root, position = Liveness(forward).root, {v: k for k, v in enumerate(forward.inputs)}
    outputs, nodes = list(forward.outputs), list(forward.nodes)
    ids = itertools.count(max((v.id for v in forward.values()), default=-1) + 1)
    for i in saved:
        v = outputs[i]
        if root[v] in position and position[root[v]] in inputs:
            copied = Value(next(ids), v.type)
            nodes.append(Node("copy", (v,), {}, (copied,)))
            outputs[i] = copied
    if len(nodes) == len(forward.nodes):
        return forward
    return Graph(forward.inputs, tuple(nodes), tuple(outputs), forward.constants)
