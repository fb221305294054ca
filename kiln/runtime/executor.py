"""Run a fused graph: compiled kernels through ctypes, other nodes through their eager kernels.

``compile_program(graph, input_strides)`` lowers an optimized graph for the CPU: fusion
(``kiln.passes.fusion``) groups its nodes into kernel nodes, every value gets a static layout
(the strides it will have at run time), the LLVM code generator compiles each kernel for those
layouts into one object, and the memory planner (``kiln.passes.memory_plan``) places the
intermediates in an arena. The result, a ``CompiledProgram``, runs like the interpreter's
``Program``: ``program.run(arrays) -> list of arrays``.

At run time a step is one of:

- a compiled kernel: its pointer table (inputs then outputs) is filled -- arena addresses once
  per thread, the rest per call -- and the kernel is called through ctypes (which releases the
  GIL), split across the thread pool when the work pays for it;
- an extern node (matmul, gather, views feeding them...): the primitive's eager kernel, with
  ``out=`` into the arena where the plan placed its result (matmul). A non-view result that numpy
  gave in another layout than C order (it keeps its inputs' order), or that shares memory with
  an argument, is copied: the kernels were compiled for C order, and the memory plan and the
  in-place write-back count on only view nodes aliasing;
- a kernel the code generator declined: its body, interpreted (the reason is kept for explain).

Intermediates live in an arena allocated once per thread (two threads calling one compiled
function never share one); outputs handed to the caller come from the caching host allocator.
Every array a kernel reads stays referenced by the call's environment until the call returns.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.analysis import Liveness, constant_views, reads_at_own_index
from ..ir.graph import CONSTANT, KERNEL, Graph, Node, Value
from ..ir.interpreter import kernel_runner, node_error
from ..ir.primitives import PRIMITIVES, has_effect
from . import allocator, threads

KERNEL_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
ALIGNMENT = 64

# A numpy array's data pointer sits right after the object header (PyArrayObject_fields.data);
# reading it there costs 0.1 us where ``array.ctypes.data`` costs 0.9 us. Checked at import.
_DATA_OFFSET = object.__basicsize__
_probe = np.arange(4.0)[1:]
if ctypes.c_void_p.from_address(id(_probe) + _DATA_OFFSET).value != _probe.ctypes.data:  # pragma: no cover

    def data_pointer(array: np.ndarray) -> int:
        return array.ctypes.data
else:
    _from_address = ctypes.c_void_p.from_address

    def data_pointer(array: np.ndarray) -> int:
        return _from_address(id(array) + _DATA_OFFSET).value


del _probe


# ----------------------------------------------------------------------------- layouts
def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """C-order strides in bytes, as numpy gives them (size-0 dims count as 1)."""
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _fake(shape: tuple, strides: tuple, dtype: np.dtype) -> np.ndarray:
    """An array with this layout over a 1-element buffer: view ops read its strides, never its data."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, strides)


def view_strides(node: Node, strides: tuple) -> tuple | None:
    """The byte strides of a view node's result given its input's, or None when numpy copies."""
    source = node.inputs[0].type
    fake = _fake(source.shape, strides, source.dtype.np)
    if node.op == "reshape":
        try:
            return np.reshape(fake, node.attrs["shape"], copy=False).strides
        except ValueError:  # not expressible as a view: numpy copies into C order
            return None
    return PRIMITIVES[node.op].eager(np, fake, **node.attrs).strides


def infer_layouts(graph: Graph, input_strides: Sequence[tuple | None]) -> dict[Value, tuple]:
    """Byte strides of every value at run time: inputs as given, constants as stored, views derived,
    everything else C-contiguous (kernel outputs by construction; the results of extern nodes and
    of interpreted kernels are copied into C order at run time when numpy gave another layout)."""
    layouts: dict[Value, tuple] = {}
    for value, strides in zip(graph.inputs, input_strides, strict=True):
        layouts[value] = strides if strides is not None else _c_strides(value.type.shape, value.type.dtype.itemsize)
    for node in graph.nodes:
        if node.op == CONSTANT:
            layouts[node.output] = graph.constants[node.attrs["name"]].strides
            continue
        derived = None
        if node.op != KERNEL and PRIMITIVES[node.op].is_view:
            derived = view_strides(node, layouts[node.inputs[0]])
        for out in node.outputs:
            layouts[out] = derived if derived is not None else _c_strides(out.type.shape, out.type.dtype.itemsize)
    return layouts


def element_strides(value: Value, strides: tuple) -> tuple[int, ...]:
    size = value.type.dtype.itemsize
    return tuple(s // size for s in strides)


# ----------------------------------------------------------------------------- the program
@dataclass
class KernelStep:
    """A kernel node compiled to ``symbol``; ``function`` is set once the library is loaded."""

    node: Node
    symbol: str
    extent: int
    work_bytes: int
    function: Any = None


@dataclass
class LoweringReport:
    """What lowering did, for ``kiln.explain``."""

    kernels: int = 0
    declined: list[tuple[str, str]] = field(default_factory=list)  # (kernel name, reason)
    externs: dict[str, int] = field(default_factory=dict)
    memory: str = ""
    compile_seconds: float = 0.0
    cache: str = "off"  # "hit" | "miss" | "off"

    def describe(self) -> list[str]:
        lines = [f"{self.kernels} compiled kernel(s); compile cache: {self.cache}; "
                 f"code generation {self.compile_seconds * 1e3:.1f} ms"]  # fmt: skip
        if self.externs:
            lines.append(
                "extern nodes (eager kernels): " + ", ".join(f"{k} x{v}" for k, v in sorted(self.externs.items()))
            )
        lines.extend(f"kernel {name} runs on the interpreter: {why}" if name[0] != "(" else f"{name[1:-1]}: {why}"
                     for name, why in self.declined)  # fmt: skip
        if self.memory:
            lines.extend(self.memory.splitlines())
        return lines


class CompiledProgram:
    """A fused graph with its compiled kernels, ready for repeated runs on any thread."""

    def __init__(self, graph: Graph, kernels: dict[Node, KernelStep], library: Any, plan: Any,
                 layouts: dict[Value, tuple], report: LoweringReport) -> None:  # fmt: skip
        self.graph = graph
        self.report = report
        self.kernel_steps = list(kernels.values())
        self._kernels = kernels
        self.objects: list[bytes] = []  # the object code, kept for the disk cache
        self._library = library  # keeps the machine code alive
        self._plan = plan
        slots: dict[Value, int] = {v: i for i, v in enumerate(graph.values())}
        self._slots = slots
        self._input_slots = tuple(slots[v] for v in graph.inputs)
        self._input_checks = tuple((v.type.shape, v.type.dtype.np, layouts[v], v.type) for v in graph.inputs)
        self._output_slots = tuple(slots[v] for v in graph.outputs)
        # An output is never the program's own memory: constants (and views of them) are copied out.
        constants = constant_views(graph)
        self._copy_outputs = tuple(i for i, v in enumerate(graph.outputs) if v in constants)
        self._constants = [(slots[n.output], graph.constants[n.attrs["name"]]) for n in graph.nodes if n.op == CONSTANT]
        outputs = set(graph.outputs)
        self._steps = []
        self._allocations: dict[Node, list] = {}  # per compiled kernel: [slot, shape, dtype, input slot or -1]
        self._arg_specs = []  # per kernel step: (size of its pointer table, static (position, slot) pairs)
        planned = plan.offsets if plan is not None else {}
        frees = _dead_after(graph, planned)
        self._step_nodes = []
        for node, dead in zip(graph.nodes, frees, strict=True):
            if node.op == CONSTANT:
                continue
            self._step_nodes.append(node)
            if node.op == KERNEL and node in kernels:
                self._steps.append(self._kernel_step(node, kernels[node], slots, planned, outputs, layouts, dead))
            elif node.op == KERNEL:
                outs = tuple((slots[v], v in planned) for v in node.outputs)
                self._steps.append(("interpret", kernel_runner(node), tuple(slots[v] for v in node.inputs), outs, dead))
            else:
                out = node.output
                eager = PRIMITIVES[node.op].eager
                into = slots[out] if (node.op == "matmul" and out in planned) else -1
                normalize = not PRIMITIVES[node.op].is_view  # a view's layout is derived from its input's
                self._steps.append(("extern", eager, tuple(slots[v] for v in node.inputs), dict(node.attrs),
                                    slots[out], out.type.dtype.np, into, normalize, dead))  # fmt: skip
        self._needs_errstate = any(step[0] != "kernel" for step in self._steps)
        self._local = threading.local()

    def _kernel_step(self, node, kstep, slots, planned, outputs, layouts, dead) -> tuple:
        values = list(node.inputs) + list(node.outputs)
        static, dynamic, allocate, conform = [], [], [], []
        for position, v in enumerate(values):
            if v in planned:
                static.append((position, slots[v]))
            else:
                dynamic.append((position, slots[v]))
                if position >= len(node.inputs):  # an output not in the arena: handed to the caller
                    nbytes = v.type.dtype.itemsize * int(np.prod(v.type.shape, dtype=np.int64))
                    empty = allocator.empty if nbytes >= allocator.HOST.min_cached_bytes else np.empty
                    allocate.append([slots[v], empty, v.type.shape, v.type.dtype.np, -1])
                elif layouts[v] == _c_strides(v.type.shape, v.type.dtype.itemsize) and v.type.shape:
                    conform.append(slots[v])
        index = len(self._arg_specs)
        self._arg_specs.append((len(values), tuple(static)))
        self._allocations[node] = allocate
        # work 0 marks a kernel too small to be worth the thread pool's dispatch
        work = kstep.work_bytes if kstep.work_bytes >= threads.PARALLEL_MIN_WORK_BYTES and kstep.extent > 1 else 0
        return ("kernel", kstep.function, index, tuple(dynamic), allocate, tuple(conform), kstep.extent, work, dead)

    def write_in_place(self, pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Let graph output ``o`` be written straight into graph input ``i``'s memory, for each pair
        ``(o, i)`` where that is safe; returns the pairs accepted.

        This is how a compiled optimizer step updates parameters and moments in place, as eager
        does, instead of writing new arrays and copying them back. Safe when the kernel making
        output ``o`` is compiled, reads input ``i`` only at the index it writes (everything its
        body computes from the input is elementwise at the output's shape: no view or broadcast
        downstream either, see ``reads_at_own_index``), the input is C-contiguous, and no later
        node reads the old value (through the input or a view of it; extern results never alias
        their arguments, the run loop copies one that does).
        At run time an input that had to be copied into its layout is not written (the caller
        copies back as before: the caller checks ``output is input``).

        No kernel before the program's last check writes in place: a call that raises leaves
        arguments and captured state as they were (the write-backs after the program are not
        applied either), rather than half updated. Checks come from the forward pass, updates at
        the end of a training step, so a step still updates its parameters in place.
        """
        accepted = []
        taken: set[int] = set()
        last_check = max((k for k, node in enumerate(self.graph.nodes) if has_effect(node.op)), default=-1)
        producer = {v: (k, node) for k, node in enumerate(self.graph.nodes) for v in node.outputs}
        last_read = {v: k for k, node in enumerate(self.graph.nodes) for v in node.inputs}
        views = Liveness(self.graph).views(self.graph.inputs)
        for o, i in pairs:
            value, source = self.graph.outputs[o], self.graph.inputs[i]
            k, node = producer.get(value, (-1, None))
            aliases = views[source]  # the input and every view of it
            if (node is None or node not in self._allocations or i in taken or k < last_check
                    or any(a in self.graph.outputs or last_read.get(a, -1) > k for a in aliases)
                    or sum(a in node.inputs for a in aliases) != 1 or self.graph.outputs.count(value) > 1
                    or self._input_checks[i][2] != _c_strides(source.type.shape, source.type.dtype.itemsize)
                    or not reads_at_own_index(node, source, value)):  # fmt: skip
                continue
            for entry in self._allocations[node]:
                if entry[0] == self._slots[value]:
                    entry[4] = self._input_slots[i]
                    accepted.append((o, i))
                    taken.add(i)
        return accepted

    # ------------------------------------------------------------------ per-thread state
    def _frame(self):
        frame = getattr(self._local, "frame", None)
        if frame is None:
            frame = self._local.frame = _Frame(self)
        return frame

    # ------------------------------------------------------------------ running
    def run(self, inputs: Sequence[Any]) -> list[Any]:
        inputs = self._check(inputs)
        frame = self._frame()
        env = frame.template.copy()
        for slot, array in zip(self._input_slots, inputs):
            env[slot] = array
        if self._needs_errstate:  # numpy kernels: inf and nan are values, not warnings
            with np.errstate(all="ignore"):
                self._run_steps(env, frame)
        else:
            self._run_steps(env, frame)
        outputs = [env[slot] for slot in self._output_slots]
        for i in self._copy_outputs:
            outputs[i] = outputs[i].copy()
        return outputs

    __call__ = run

    def profile(self, inputs: Sequence[Any], repeat: int = 10) -> list[tuple[str, float]]:
        """Median seconds per step over ``repeat`` runs, with each step's description, slowest first."""
        inputs = self._check(inputs)
        frame = self._frame()
        samples: list[list[float]] = [[] for _ in self._steps]
        with np.errstate(all="ignore"):
            for _ in range(repeat):
                env = frame.template.copy()
                for slot, array in zip(self._input_slots, inputs):
                    env[slot] = array
                timings: list[float] = []
                self._run_steps(env, frame, timings)
                for i, t in enumerate(timings):
                    samples[i].append(t)
        medians = [(self._describe(i), float(np.median(s))) for i, s in enumerate(samples)]
        return sorted(medians, key=lambda item: -item[1])

    def _describe(self, index: int) -> str:
        step = self._steps[index]
        if step[0] == "kernel":
            node = next(n for n, k in self._kernels.items() if k.function is step[1])
            kind, name = node.attrs["kind"], node.attrs["name"]
            shapes = ", ".join(str(v.type) for v in node.outputs[:2])
            return (
                f"kernel {name} ({kind}, {len(node.outputs)} outputs: {shapes}{'...' if len(node.outputs) > 2 else ''})"
            )
        if step[0] == "extern":
            node = self._step_nodes[index]
            return f"{node.op}({', '.join(str(v.type) for v in node.inputs)}) -> {node.output.type}"
        return f"interpreted kernel {self._step_nodes[index].attrs['name']}"

    def _run_steps(self, env: list, frame: _Frame, timings: list | None = None) -> None:
        read = env.__getitem__
        ndarray = np.ndarray
        clock = time.perf_counter
        step: tuple = ()
        try:
            for step in self._steps:
                if timings is not None:
                    timings.append(-clock())
                kind = step[0]
                if kind == "kernel":
                    _, function, index, dynamic, allocate, conform, extent, work, dead = step
                    for slot, empty, shape, dtype, into in allocate:
                        env[slot] = empty(shape, dtype) if into < 0 else env[into]
                    for slot in conform:
                        array = env[slot]
                        if not array.flags.c_contiguous:
                            env[slot] = np.ascontiguousarray(array)
                    table = frame.tables[index]
                    for position, slot in dynamic:
                        table[position] = data_pointer(env[slot])
                    if work:
                        threads.parallel_for(function, table, extent, work)
                    elif extent:  # too small to split: call it directly
                        function(table, 0, extent)
                elif kind == "extern":
                    _, eager, args, attrs, out, dtype, into, normalize, dead = step
                    if into >= 0:
                        np.matmul(*map(read, args), out=env[into])
                    else:
                        result = eager(np, *map(read, args), **attrs)
                        if result.__class__ is not ndarray:
                            result = np.asarray(result, dtype=dtype)
                        elif normalize and (not result.flags.c_contiguous or _aliases_an_argument(result, args, env)):
                            # numpy keeps its input's layout (order="K") where the kernels were compiled
                            # for C order (``infer_layouts``); and the memory plan and the in-place
                            # write-back see a non-view node's result as memory of its own
                            result = result.copy(order="C")
                        env[out] = result
                else:
                    _, runner, args, outs, dead = step
                    for (slot, in_arena), array in zip(outs, runner(np, *map(read, args)), strict=True):
                        if in_arena:  # compiled kernels read it at its arena address
                            np.copyto(env[slot], array)
                        elif array.flags.c_contiguous:
                            env[slot] = array
                        else:  # the body's eager kernels keep their inputs' layouts; C order was promised
                            env[slot] = np.array(array, order="C")
                for slot in dead:
                    env[slot] = None
                if timings is not None:
                    timings[-1] += clock()
        except Exception as error:  # the node, its op and the user's line, as the interpreter says them
            raise self._step_error(step, error) from error

    def _step_error(self, step: tuple, error: Exception) -> Exception:
        index = next(i for i, s in enumerate(self._steps) if s is step)
        node = self._step_nodes[index]
        return node_error(node, self.graph.nodes.index(node), error)

    def _check(self, inputs: Sequence[Any]) -> Sequence[Any]:
        if len(inputs) != len(self._input_checks):
            raise TypeError(f"the graph expects {len(self._input_checks)} inputs, got {len(inputs)}")
        conformed = None
        for i, (array, (shape, dtype, strides, expected)) in enumerate(zip(inputs, self._input_checks)):
            try:
                mismatch = array.shape != shape or array.dtype != dtype
            except AttributeError:
                raise TypeError(f"input {i} of the graph: expected {expected}, got a {type(array).__name__}") from None
            if mismatch:
                raise TypeError(
                    f"input {i} of the graph: expected {expected}, got {array.dtype} of shape {array.shape}"
                )
            if array.strides != strides and array.size > 1:
                # The kernels were specialized on the traced layout: copy into it.
                conformed = conformed or list(inputs)
                conformed[i] = _into_layout(array, strides)
        return conformed or inputs


def _into_layout(array: np.ndarray, strides: tuple) -> np.ndarray:
    """A copy of ``array`` laid out with ``strides`` (C order when they are C order's)."""
    if strides == _c_strides(array.shape, array.itemsize):
        return np.ascontiguousarray(array)
    order = sorted(range(array.ndim), key=lambda d: -abs(strides[d]))
    base = np.ascontiguousarray(array.transpose(order))
    inverse = np.argsort(order)
    out = base.transpose(inverse)
    if out.strides != strides:  # e.g. negative strides: fall back to what the kernel can read
        raise LayoutError(f"cannot lay out an input with strides {strides}")
    return out


class LayoutError(RuntimeError):
    """An input arrived in a layout the compiled kernels cannot be given."""


class _Frame:
    """One thread's arena, its views and the kernels' pointer tables with arena addresses filled in."""

    def __init__(self, program: CompiledProgram) -> None:
        plan = program._plan
        template: list[Any] = [None] * len(program._slots)
        for slot, array in program._constants:
            template[slot] = array
        self.arena = None
        if plan is not None and plan.offsets:  # also when all are empty: size-0 values get their views
            raw = np.empty(plan.arena_bytes + ALIGNMENT, np.uint8)
            start = (-raw.ctypes.data) % ALIGNMENT
            self.arena = raw[start : start + plan.arena_bytes]
            for value, offset in plan.offsets.items():
                t = value.type
                nbytes = t.dtype.itemsize * int(np.prod(t.shape, dtype=np.int64))
                template[program._slots[value]] = self.arena[offset : offset + nbytes].view(t.dtype.np).reshape(t.shape)
        self.template = template
        self.tables = []
        for size, static in program._arg_specs:
            table = (ctypes.c_void_p * size)()
            for position, slot in static:
                table[position] = data_pointer(template[slot])
            self.tables.append(table)


def _dead_after(graph: Graph, planned: dict) -> list[tuple[int, ...]]:
    """Per node, the slots to drop after it (``Liveness.dead_after``), except values that live in
    the arena (their views are reused every call)."""
    slots = {v: i for i, v in enumerate(graph.values())}
    return [tuple(map(slots.__getitem__, dead)) for dead in Liveness(graph).dead_after(keep=planned)]


def _aliases_an_argument(result: np.ndarray, args: tuple[int, ...], env: list) -> bool:
    """Whether an extern's result is one of its arguments or may share memory with one (bounds only:
    cheap; a result that owns its memory shares none)."""
    owns = result.base is None
    for slot in args:
        array = env[slot]
        if array is result or (not owns and np.may_share_memory(result, array)):
            return True
    return False
