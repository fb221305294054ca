"""Run a lowered program: compiled kernels through ctypes, other nodes through their eager kernels.

The executor decides nothing: the compile driver (``kiln.compiler.driver``) fused the graph,
inferred its layouts, chose the write-backs and planned the memory; a backend generated and loaded
the kernels. ``CompiledProgram(graph, kernels, plan, layouts, write_backs)`` turns that into a list
of steps once, and runs like the interpreter's ``Program``: ``program.run(arrays) -> list of arrays``.

At run time a step is one of:

- ``KernelCall``: a compiled kernel; its pointer table (inputs then outputs) is filled -- arena
  addresses once per thread, the arrays it reads or writes in place when one of them is not the
  array of the previous call, new outputs per call -- and the kernel is called through ctypes
  (which releases the GIL), split across the thread pool when the work pays for it;
- ``ExternCall`` (``extern_call``): an extern node (matmul, gather, views feeding them...), the primitive's eager
  kernel, with ``out=`` into the arena where the plan placed its result (matmul). A non-view result
  that numpy gave in another layout than C order (it keeps its inputs' order), or that shares
  memory with an argument, is copied: the kernels were compiled for C order, and the memory plan
  and the in-place write-back count on only view nodes aliasing;
- ``InterpretedKernel``: a kernel the code generator declined: its body, interpreted;
- ``LoopCall``: a loop node, its body's compiled program run once per trip (``loop_call``).

Intermediates live in an arena allocated once per thread (``frames.Frame``: two threads calling
one compiled function never share one); outputs handed to the caller come from the caching host
allocator.
Every array a kernel reads stays referenced by the call's environment until the call returns.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any, cast

import numpy as np

from ..ir.analysis import Liveness, constant_views
from ..ir.graph import CONSTANT, KERNEL, LOOP, Graph, Node, Value
from ..ir.interpreter import kernel_runner, node_error
from ..ir.primitives import PRIMITIVES
from . import allocator, profiling, threads
from .extern_call import ExternCall
from .frames import DATA_OFFSET, Frame, PointerTables, data_pointer
from .loop_call import LoopCall
from .step_labels import step_label

#: The kernel ABI: ``void kernel(void **args, int64 begin, int64 end)``.
KERNEL_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


@dataclass(frozen=True)
class Kernel:
    """A loaded kernel: its entry point (``KERNEL_TYPE``), parallel units and bytes read + written.

    ``status``: the kernel's pointer table ends with the address of a status word, which it sets
    when it finds an input it cannot handle (an index out of range) and leaves its output unfinished;
    the node then runs on its eager kernel, which raises what an eager call raises.
    """

    function: Any
    extent: int
    work_bytes: int
    status: bool = False
    sizes: tuple[int, ...] = ()  # symbolic sizes the kernel reads from its table, after the pointers


def _c_order(value: Value, strides: tuple) -> bool:
    """Whether ``strides`` lay ``value`` out in C order (a compiled program's shapes are static)."""
    t = value.type
    shape = cast(tuple[int, ...], t.shape)
    return bool(np.lib.stride_tricks.as_strided(np.empty(1, t.dtype.np), shape, strides).flags.c_contiguous)


# ----------------------------------------------------------------------------- steps
_CHECK_MIN = 8  # a program with this many inputs or more checks them first in C loops


class KernelCall:
    """A compiled kernel: fill its pointer table, call it (on the thread pool when the work pays)."""

    __slots__ = ("node", "position", "dead", "function", "table", "dynamic", "stable", "allocate", "conform",
                 "extent", "work_bytes", "work", "spin", "status", "args", "out")  # fmt: skip

    def __init__(self, node: Node, position: int, dead: tuple, kernel: Kernel, table: int, dynamic: tuple,
                 allocate: tuple, conform: tuple, slots: Mapping[Value, int], inputs: Mapping[int, int]) -> None:  # fmt: skip
        self.node, self.position, self.dead = node, position, dead
        self.status = kernel.status
        self.args = tuple(slots[v] for v in node.inputs)  # for the eager kernel, when the status says so
        self.out = slots[node.outputs[0]]
        self.function, self.extent, self.work_bytes = kernel.function, kernel.extent, kernel.work_bytes
        self.table = table  # this kernel's pointer table in each thread's frame
        # (position in the table, slot) of the arrays not in the arena: ``stable`` are the program's
        # inputs (an output written into an input has that input's slot), filled when the call's
        # input is another array than the last call's (``PointerTables.see``); ``dynamic`` the
        # others (new outputs, extern results), filled every call
        self.stable = tuple((p, slot) for p, slot in dynamic if slot in inputs)
        self.dynamic = tuple(entry for entry in dynamic if entry not in self.stable)
        self.allocate = allocate  # (slot, allocate, shape, dtype) of the new outputs
        # the slots of the arrays read that the kernel was compiled for in C order, but for the
        # program's inputs: those are in their traced layout at every run (``_check`` copies them
        # into it; ``run_checked_inputs``' callers compared their strides), C order here
        self.conform = tuple(slot for slot in conform if slot not in inputs)
        self.pool(spin=False)

    def pool(self, spin: bool) -> None:
        """Which pool splits this kernel: ``spin``, the native one (``threads.parallel_for``; the
        program chooses). Work 0 marks a kernel too small to be worth the pool's dispatch."""
        self.spin = spin
        big = self.work_bytes >= threads.min_work_bytes(spin) and self.extent > 1
        self.work = self.work_bytes if big else 0

    def run(self, env: list, tables: PointerTables) -> None:
        for slot, empty, shape, dtype in self.allocate:
            env[slot] = empty(shape, dtype)
        for slot in self.conform:
            array = env[slot]
            if not array.flags.c_contiguous:
                env[slot] = np.ascontiguousarray(array)
        frame_table = tables[self.table]
        table = frame_table.pointers  # the inputs' pointers (``stable``) are the call's (``PointerTables.see``)
        if DATA_OFFSET is not None:  # ``data_pointer`` without its call: a loop's trip fills dozens
            for position, slot in self.dynamic:
                table[position] = _from_address(id(env[slot]) + DATA_OFFSET).value
        else:  # pragma: no cover - a numpy whose array layout the check at import did not recognize
            for position, slot in self.dynamic:
                table[position] = data_pointer(env[slot])
        if self.work:
            threads.parallel_for(self.function, table, self.extent, self.work, self.spin)
        elif self.extent:  # too small to split: call it directly
            self.function(table, 0, self.extent)
        if self.status and frame_table.status.value:
            frame_table.status.value = 0
            self._run_eagerly(env)
        for slot in self.dead:
            env[slot] = None

    def runner(self) -> Callable[[list, PointerTables], None]:
        """What the call loop calls: ``run``, or ``_run_small`` for the usual kernel of a loop's trip
        (nothing to conform, no status word, too small to split)."""
        plain = not (self.conform or self.status or self.work) and self.extent
        return self._run_small if plain and DATA_OFFSET is not None else self.run

    def _run_small(self, env: list, tables: PointerTables) -> None:
        """``run`` for a kernel ``runner`` chose: allocate the new outputs, fill the pointers that
        change, call the kernel."""
        for slot, empty, shape, dtype in self.allocate:
            env[slot] = empty(shape, dtype)
        table = tables[self.table].pointers
        for position, slot in self.dynamic:
            table[position] = _from_address(id(env[slot]) + DATA_OFFSET).value  # type: ignore[operator]
        self.function(table, 0, self.extent)
        for slot in self.dead:
            env[slot] = None

    def _run_eagerly(self, env: list) -> None:
        """The node's eager kernel (it raises the eager call's error), its result where the kernel's goes."""
        node = self.node
        result = PRIMITIVES[node.op].eager(np, *[env[slot] for slot in self.args], **node.attrs)
        np.copyto(env[self.out], result)

    def describe(self) -> str:
        node = self.node
        if node.op != KERNEL:  # a primitive the backend compiled on its own (unfold, fold, take, index_put)
            return f"compiled {node.op}({', '.join(str(v.type) for v in node.inputs)}) -> {node.output.type}"
        shapes = ", ".join(str(v.type) for v in node.outputs[:2])
        more = "..." if len(node.outputs) > 2 else ""
        return f"kernel {node.attrs['name']} ({node.attrs['kind']}, {len(node.outputs)} outputs: {shapes}{more})"


class InterpretedKernel:
    """A kernel the code generator declined: its body on the interpreter, results in C order."""

    __slots__ = ("node", "position", "dead", "runner", "args", "outs")

    def __init__(self, node: Node, position: int, dead: tuple, slots: Mapping[Value, int], planned: Mapping,
                 into: Mapping[Value, int]) -> None:  # fmt: skip
        self.node, self.position, self.dead = node, position, dead
        self.runner = kernel_runner(node)
        self.args = tuple(slots[v] for v in node.inputs)
        # per output: (slot, in the arena, input slot written in place or -1)
        self.outs = tuple((slots[v], v in planned, into.get(v, -1)) for v in node.outputs)

    def run(self, env: list, tables: list) -> None:
        threads.park()
        results = self.runner(np, *[env[slot] for slot in self.args])
        for (slot, in_arena, into), array in zip(self.outs, results, strict=True):
            if in_arena:  # compiled kernels read it at its arena address
                np.copyto(env[slot], array)
            elif into >= 0:  # a write-back: the whole body ran before anything is written
                np.copyto(env[into], array)
                env[slot] = env[into]
            elif array.flags.c_contiguous:
                env[slot] = array
            else:  # the body's eager kernels keep their inputs' layouts; C order was promised
                env[slot] = np.array(array, order="C")
        for slot in self.dead:
            env[slot] = None

    def describe(self) -> str:
        return f"interpreted kernel {self.node.attrs['name']}"


Step = KernelCall | ExternCall | InterpretedKernel | LoopCall


# ----------------------------------------------------------------------------- the program
class CompiledProgram:
    """A lowered graph with its loaded kernels, ready for repeated runs on any thread.

    ``kernels``: the compiled kernel nodes (others run interpreted); ``plan``: the memory plan
    (offsets of the intermediates in the arena); ``layouts``: each value's byte strides;
    ``write_backs``: graph output -> graph input whose memory it is written into; ``keep``: what
    keeps the kernels' machine code alive; ``loops``: each loop node's body, compiled (a program).
    """

    def __init__(self, graph: Graph, kernels: Mapping[Node, Kernel], plan: Any, layouts: Mapping[Value, tuple],
                 write_backs: Mapping[int, int], keep: Any = None, loops: Mapping[Node, Any] | None = None) -> None:  # fmt: skip
        self.graph = graph
        self.plan = plan
        self.write_backs = dict(write_backs)
        self._keep = keep  # the loaded library: its functions live as long as it does
        planned = plan.offsets if plan is not None else {}
        slots: dict[Value, int] = {v: i for i, v in enumerate(graph.values())}
        # An output a kernel writes into an input's memory (a write-back outside the arena) is that
        # input's array: it takes the input's slot, which no step clears.
        kernel_outputs = {v for n in graph.nodes if n.op == KERNEL for v in n.outputs}
        for o, i in write_backs.items():
            if graph.outputs[o] in kernel_outputs and graph.outputs[o] not in planned:
                slots[graph.outputs[o]] = slots[graph.inputs[i]]
        self._slots = slots
        self._input_slots = tuple(slots[v] for v in graph.inputs)
        self._input_index = {slot: i for i, slot in enumerate(self._input_slots)}  # each input slot's input
        n = len(graph.inputs)
        self._inputs_first = self._input_slots == tuple(range(n))  # placed by one slice assignment
        self._input_checks = tuple((v.type.shape, v.type.dtype.np, layouts[v], v.type) for v in graph.inputs)
        # the usual call in three C loops: every input in the traced shape, dtype and strides
        self._expected = tuple(list(column) for column in zip(*self._input_checks))[:3] or ([], [], [])
        self._output_slots = tuple(slots[v] for v in graph.outputs)
        self._gather_outputs = itemgetter(*self._output_slots) if len(self._output_slots) > 1 else None
        # An output is never the program's own memory: constants (and views of them) are copied out.
        constants = constant_views(graph)
        self._copy_outputs = tuple(i for i, v in enumerate(graph.outputs) if v in constants)
        self._constants = [(slots[n.output], graph.constants[n.attrs["name"]]) for n in graph.nodes if n.op == CONSTANT]
        into = {graph.outputs[o]: slots[graph.inputs[i]] for o, i in write_backs.items()}
        # per kernel call: (table size, static (position, slot) pairs, a status word after them, sizes)
        self._tables: list[tuple[int, tuple, bool, tuple[int, ...]]] = []
        steps: list[Step] = []
        for position, (node, dead) in enumerate(zip(graph.nodes, _dead_after(graph, planned, slots), strict=True)):
            if node.op == CONSTANT:
                continue
            if node in kernels:
                steps.append(self._kernel_call(node, position, dead, kernels[node], planned, layouts))
            elif node.op == KERNEL:
                steps.append(InterpretedKernel(node, position, dead, slots, planned, into))
            elif node.op == LOOP:
                assert loops is not None and node in loops, f"loop {node.attrs['name']} has no compiled body"
                steps.append(LoopCall(node, position, dead, slots, loops[node]))
            else:
                steps.append(ExternCall(node, position, dead, slots, node.output in planned))
        self._steps = tuple(steps)
        self.kernel_calls = [s for s in steps if isinstance(s, KernelCall)]
        # Every program runs its large kernels on the native pool, whose workers spin between them (and
        # between the products of kiln's kernel, ``codegen/llvm/product_call.py``, which run there too);
        # the steps that may run on other threads -- a BLAS call, an interpreted body, a loop -- park
        # them first (``ExternCall.parks``). Programs that called eager kernels kept the sleeping Python
        # pool while their products were numpy's: GPT's step, whose products are kiln's, spent 1-2 ms of
        # its 15 in that pool's hand-offs.
        for call in self.kernel_calls:
            call.pool(True)
        # the slots whose array is the same object at every run of one thread's frame, while the
        # caller passes the same inputs: the inputs (and the outputs written into them), constants,
        # the arena's views
        self._same_arrays = (
            frozenset(self._input_slots) | {slot for slot, _ in self._constants} | {slots[v] for v in planned}
        )
        self._keep_views(frozenset())
        # Outputs that are always new memory of their own: a kernel's output allocated every call
        # (not written into an input), handed out once. The caller may wrap them without checks.
        fresh = {slot for call in self.kernel_calls for slot, _, _, _ in call.allocate}
        out_slots = [slots[v] for v in graph.outputs]
        self.fresh_outputs = frozenset(
            i for i, slot in enumerate(out_slots)
            if slot in fresh and out_slots.count(slot) == 1 and i not in self._copy_outputs
        )  # fmt: skip
        # ... and an extern's result of its own (not a view, not in the arena: ``ExternCall.run`` copies
        # one that aliases an argument): new at every call, though not from the caching allocator
        owned = fresh | {s.out for s in steps if isinstance(s, ExternCall) and s.normalize and s.into < 0}
        self.new_outputs = self.fresh_outputs | {
            i for i, slot in enumerate(out_slots)
            if slot in owned and out_slots.count(slot) == 1 and i not in self._copy_outputs
        }  # fmt: skip
        self._needs_errstate = len(self.kernel_calls) != len(steps)
        self._find_users()
        self._local = threading.local()

    def _keep_views(self, varying: frozenset[int]) -> None:
        """Let a view step keep its view between runs (``ExternCall._view``) only where its arguments
        can be the same arrays at the next run: the ``_same_arrays`` but the ``varying`` inputs, and the
        views kept of them. A view of a kernel's new output or of an extern's result (new arrays at
        every run) is made anew, with no weak references made and compared first; then bind the runs."""
        same = set(self._same_arrays - varying)
        for step in self._steps:
            if isinstance(step, ExternCall) and not step.normalize and step.into < 0:
                step.keep_views = all(slot in same for slot in step.args)
                if step.keep_views:
                    same.add(step.out)
        self._bind_runs()

    def _bind_runs(self) -> None:
        """Each step's callable, bound once (the call loop only calls), after anything that
        changes a step's ``runner``."""
        self._runs = tuple(step.runner() if isinstance(step, (KernelCall, ExternCall)) else step.run
                           for step in self._steps)  # fmt: skip

    def _find_users(self) -> None:
        """Per input, the places of its pointer in the kernels' tables (filled by ``PointerTables.see``)."""
        self._watch_inputs = any(call.stable for call in self.kernel_calls)
        users: list[list[tuple[int, int]]] = [[] for _ in self._input_slots]
        for call in self.kernel_calls:
            for p, slot in call.stable:
                users[self._input_index[slot]].append((call.table, p))
        self._users = tuple(map(tuple, users))

    def vary_inputs(self, indices: Sequence[int]) -> None:
        """Say that the inputs at ``indices`` are other arrays at every call (a loop body's carried and
        per-iteration inputs; ``loop_call``), before the first call: the kernels read their pointers from
        each call's environment (0.1 us each) instead of remembering them by identity (a weak reference
        with a callback per input and call), and a view of them is made anew, not compared with the
        last call's arguments (``ExternCall._view``) first."""
        varying = {self._input_slots[i] for i in indices}
        for call in self.kernel_calls:
            moved = tuple(entry for entry in call.stable if entry[1] in varying)
            call.stable = tuple(entry for entry in call.stable if entry not in moved)
            call.dynamic += moved
        self._find_users()
        self._local = threading.local()  # frames made before this hold the old users
        self._keep_views(frozenset(varying))

    def _kernel_call(self, node, position, dead, kernel, planned, layouts) -> KernelCall:
        slots = self._slots
        inputs = set(self._input_slots)
        values = list(node.inputs) + list(node.outputs)
        static, dynamic, allocate, conform = [], [], [], []
        for p, v in enumerate(values):
            if v in planned:
                static.append((p, slots[v]))
                continue
            dynamic.append((p, slots[v]))
            if p >= len(node.inputs) and slots[v] not in inputs:  # a new output, handed to the caller
                nbytes = v.type.dtype.itemsize * int(np.prod(v.type.shape, dtype=np.int64))
                empty = allocator.empty if nbytes >= allocator.HOST.min_cached_bytes else np.empty
                allocate.append((slots[v], empty, v.type.shape, v.type.dtype.np))
            elif p < len(node.inputs) and v.type.shape and _c_order(v, layouts[v]):
                conform.append(slots[v])
        self._tables.append((len(values), tuple(static), kernel.status, kernel.sizes))
        return KernelCall(node, position, dead, kernel, len(self._tables) - 1, tuple(dynamic), tuple(allocate),
                          tuple(conform), slots, self._input_index)  # fmt: skip

    def written_in_place(self) -> list[Value]:
        """The kernels' outputs written straight into an input's memory (write-backs with no copy)."""
        inputs = set(self._input_slots)
        return [v for call in self.kernel_calls for v in call.node.outputs if self._slots[v] in inputs]

    # ------------------------------------------------------------------ per-thread state
    def _frame(self) -> Frame:
        frame = getattr(self._local, "frame", None)
        if frame is None:
            frame = self._local.frame = Frame(self.plan, self._slots, self._constants, self._tables, self._users)
        return frame

    # ------------------------------------------------------------------ running
    def run(self, inputs: Sequence[Any]) -> list[Any]:
        return self.run_checked_inputs(self._check(inputs))

    __call__ = run

    def run_checked_inputs(self, inputs: Sequence[Any]) -> list[Any]:
        """``run`` for inputs the caller has already checked: in the traced shapes, dtypes and
        strides (a compiled call whose guards compared every captured tensor's layout)."""
        if self._needs_errstate:  # numpy kernels: inf and nan are values, not warnings
            with np.errstate(all="ignore"):
                return self.run_in_errstate(inputs)
        return self.run_in_errstate(inputs)

    def run_in_errstate(self, inputs: Sequence[Any]) -> list[Any]:
        """``run_checked_inputs`` for a caller that has set numpy's error state to ignore everything
        already (a loop's trips, inside the outer program's call)."""
        frame = self._frame()
        env = self._environment(frame, inputs)
        self._run_steps(env, frame.tables)
        gather = self._gather_outputs
        outputs = list(gather(env)) if gather is not None else [env[slot] for slot in self._output_slots]
        for i in self._copy_outputs:
            outputs[i] = outputs[i].copy()
        return outputs

    def _environment(self, frame: Frame, inputs: Sequence[Any]) -> list:
        """A call's environment: the frame's template (arena views, constants) with ``inputs`` placed."""
        env = frame.template.copy()
        if self._inputs_first:
            env[: len(inputs)] = inputs
        else:
            for slot, array in zip(self._input_slots, inputs):
                env[slot] = array
        if self._watch_inputs:
            frame.tables.see(inputs)
        return env

    def _run_steps(self, env: list, tables: PointerTables) -> None:
        if profiling.active:  # kiln.profiler records: time each step (one check per call when off)
            return self._run_steps_timed(env, tables)
        index = 0
        try:
            for index, run in enumerate(self._runs):  # noqa: B007 - read by the error handler
                run(env, tables)
        except Exception as error:  # the node, its op and the user's line, as the interpreter says them
            step = self._steps[index]
            raise node_error(step.node, step.position, error) from error

    def _run_steps_timed(self, env: list, tables: PointerTables) -> None:
        """``_run_steps`` with each step reported to ``kiln.profiler`` (name, time, bytes moved and allocated)."""
        labels = self._labels = getattr(self, "_labels", None) or [step_label(s) for s in self._steps]
        clock, record = profiling.clock, profiling.step
        index = 0
        try:
            for index, (run, label) in enumerate(zip(self._runs, labels)):  # noqa: B007 - read by the error handler
                start = clock()
                run(env, tables)
                record(start, clock(), *label)
        except Exception as error:
            step = self._steps[index]
            raise node_error(step.node, step.position, error) from error

    def profile(self, inputs: Sequence[Any], repeat: int = 10) -> list[tuple[str, float]]:
        """Median seconds per step over ``repeat`` runs, with each step's description, slowest first."""
        inputs = self._check(inputs)
        frame = self._frame()
        samples: list[list[float]] = [[] for _ in self._steps]
        clock = time.perf_counter
        with np.errstate(all="ignore"):
            for _ in range(repeat):
                env = self._environment(frame, inputs)
                for i, step in enumerate(self._steps):
                    start = clock()
                    step.run(env, frame.tables)
                    samples[i].append(clock() - start)
        medians = [(step.describe(), float(np.median(s))) for step, s in zip(self._steps, samples, strict=True)]
        return sorted(medians, key=lambda item: -item[1])

    def _check(self, inputs: Sequence[Any]) -> Sequence[Any]:
        if len(inputs) != len(self._input_checks):
            raise TypeError(f"the graph expects {len(self._input_checks)} inputs, got {len(inputs)}")
        if len(inputs) >= _CHECK_MIN:
            shapes, dtypes, all_strides = self._expected
            try:
                if (list(map(_SHAPE, inputs)) == shapes and list(map(_STRIDES, inputs)) == all_strides
                        and list(map(_DTYPE, inputs)) == dtypes):  # fmt: skip
                    return inputs
            except AttributeError:
                pass  # not an array: said below
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
            if array.strides != strides and array.size > 1 and not same_layout(shape, array.strides, strides):
                # The kernels were specialized on the traced layout: copy into it.
                conformed = conformed or list(inputs)
                conformed[i] = _into_layout(array, strides)
        return conformed or inputs


def _into_layout(array: np.ndarray, strides: tuple) -> np.ndarray:
    """A copy of ``array`` laid out with ``strides`` (dimensions ordered by stride, C order when
    they are C order's)."""
    order = sorted(range(array.ndim), key=lambda d: -abs(strides[d]))
    out = np.ascontiguousarray(array.transpose(order)).transpose(np.argsort(order))
    if not same_layout(out.shape, out.strides, strides):  # e.g. negative strides
        raise LayoutError(f"cannot lay out an input with strides {strides}")
    return out


def same_layout(shape: tuple, strides: tuple, expected: tuple) -> bool:
    """Whether ``strides`` address every element as ``expected`` does: the stride of a size-1 dim
    is never used (numpy calls an array with any stride there contiguous)."""
    return all(a == b for n, a, b in zip(shape, strides, expected, strict=True) if n != 1)


_SHAPE, _STRIDES, _DTYPE = attrgetter("shape"), attrgetter("strides"), attrgetter("dtype")
_from_address = ctypes.c_void_p.from_address


class LayoutError(RuntimeError):
    """An input arrived in a layout the compiled kernels cannot be given."""


def _dead_after(graph: Graph, planned: dict, slots: Mapping[Value, int]) -> list[tuple[int, ...]]:
    """Per node, the slots to drop after it (``Liveness.dead_after``), except values that live in
    the arena (their views are reused every call) and an input's slot that an output shares."""
    outputs = {slots[v] for v in graph.outputs}
    return [
        tuple(slots[v] for v in dead if slots[v] not in outputs) for dead in Liveness(graph).dead_after(keep=planned)
    ]
