"""A dynamic specialization's program: code generated once for symbolic sizes, loaded per size.

The symbolic graph (``dynamic.py``) goes through the graph passes and fusion once, and its kernels
are generated once: a kernel over the symbolic leading dimension reads the size from its argument
table (``codegen/llvm/symbolic.py``), a kernel without one is the static kernel it always
was. A kernel whose symbols lie in leading dims it treats alike (``(B, T, C)`` with a symbolic
``T``) runs over their product as one leading size (``symbolic_kernels.py``); one with two
symbolic dims no leading size flattens (attention's ``(B, H, T, T)`` scores) runs over rows of a
symbolic length, ``(B*H*T, T)``, when it is elementwise (``codegen/llvm/symbolic_rows.py``), and on
its eager kernels otherwise. What depends on the sizes -- the layouts, the write-backs, the memory plan, each kernel's
number of parallel units -- is computed per set of sizes when a call first brings it, from the
fused graph bound to those sizes, and kept: a size seen before costs a dictionary lookup.

A kernel is compiled symbolically only when its values' layouts do not depend on the sizes (they
are the same at two probe sizes); any other kernel runs on its eager kernels at every size, and
``report.declined`` says so. The interpreter backend runs the symbolic graph as it is.

The fused graph, the kernels' code and the layouts they were generated for go to the disk cache
(``symbolic_cache``), so a second process loads the program without the passes or LLVM.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from math import prod
from typing import Any, cast

from ...codegen.backend import Lowered, LoweringReport
from ...compiler import driver, program_cache
from ...ir.graph import Graph, Node, Value
from ...ir.types import Sym, SymProduct, SymSum, dim_size, plain_symbol
from ...passes.layouts import infer_layouts
from ...passes.memory_plan import plan_memory
from ...passes.write_backs import choose_write_backs
from ...runtime.executor import KERNEL_TYPE, CompiledProgram, Kernel
from .dynamic_binding import bind_graph, position_sizes, symbol_positions
from .symbolic_cache import C_ORDER, from_entry, symbolic_key, to_entry
from .symbolic_kernels import collapse_symbolic_prefixes
from .symbolic_reductions import split_batch_sums

logger = logging.getLogger("kiln")

#: Sizes the layouts are inferred at to learn which do not depend on the size (any two >= 2 do).
PROBES = (2, 3)


class Unlowered(Exception):
    """The symbolic graph cannot be compiled once for every size (the message says why)."""


class _ProgramPerSizes:
    """A dynamic specialization's program: each call runs the program of its sizes
    (``program_for``), kept per set of sizes, at most ``_limit`` of them (the oldest is dropped)."""

    _programs: dict[tuple[int, ...], Any]
    _limit: int
    _last: tuple  # the sizes of the last call and their program

    def program_for(self, arrays: Sequence) -> Any:
        raise NotImplementedError

    def _keep(self, key: tuple[int, ...], program: Any) -> None:
        if len(self._programs) >= self._limit:
            del self._programs[next(iter(self._programs))]
        self._programs[key] = program

    def __call__(self, arrays: Sequence) -> list:
        return self.program_for(arrays)(arrays)

    def run_checked_inputs(self, arrays: Sequence) -> list:
        return self.program_for(arrays).run_checked_inputs(arrays)

    # what kiln.explain shows: the program of the sizes run last
    @property
    def plan(self) -> Any:
        return None if self._last[1] is None else self._last[1].plan

    @property
    def kernel_calls(self) -> Sequence[Any]:
        return () if self._last[1] is None else self._last[1].kernel_calls


class SymbolicProgram(_ProgramPerSizes):
    """Runs a fused symbolic graph whose kernels are compiled once (see the module docstring)."""

    def __init__(self, fused: Graph, backend, code, report: LoweringReport, strides: tuple, requested: tuple,
                 layouts: dict[int, tuple | str], limit: int = 64) -> None:  # fmt: skip
        self.graph = fused
        self.report = report
        self._backend = backend
        self._code = code
        self._library = None
        self._strides = strides
        self._requested = requested
        self._layouts = layouts  # value position -> the layout its kernels were generated for, or C_ORDER
        self._positions = symbol_positions(fused)
        self._programs: dict[tuple[int, ...], CompiledProgram] = {}
        self._limit = limit
        self._last: tuple = ((), None)  # the sizes of the last call and their program
        self.lowerings = 0  # programs made for a set of sizes (no code generated for them)
        self.fresh_outputs: frozenset[int] = frozenset()  # see ``prime``

    def prime(self, first: Graph) -> None:
        """Load the program for the sizes of ``first`` (the graph bound to them) now, and take its
        ``fresh_outputs`` (which outputs are new memory: a matter of the graph's structure, the same
        at every size, and checked for each size loaded later)."""
        key = tuple(first.inputs[i].type.shape[axis] for _, i, axis in self._positions)
        self.fresh_outputs = self._program(key).fresh_outputs  # type: ignore[arg-type]  # a bound graph

    def program_for(self, arrays: Sequence) -> CompiledProgram:
        key = tuple([arrays[i].shape[axis] for _, i, axis in self._positions])
        last_key, program = self._last
        if key == last_key:
            return program
        program = self._program(key)
        self._last = (key, program)
        return program

    def _program(self, key: tuple[int, ...]) -> CompiledProgram:
        program = self._programs.get(key)
        if program is None:
            program = self._load(position_sizes(self._positions, key))
            assert program.fresh_outputs >= self.fresh_outputs, (
                f"outputs {sorted(self.fresh_outputs - program.fresh_outputs)} of a dynamic program are new memory "
                f"at other sizes but not at {key}"
            )
            self._keep(key, program)
        return program

    def _load(self, sizes: dict[Sym, int]) -> CompiledProgram:
        """The runtime program for ``sizes``: layouts, write-backs and memory plan of the bound graph,
        and the kernels generated once, each told its number of units (and the size, in its table)."""
        self.lowerings += 1
        bound = bind_graph(self.graph, sizes)
        layouts = infer_layouts(bound, self._strides)
        write_backs = choose_write_backs(bound, self._requested, layouts)
        plan = plan_memory(bound)
        if self._library is None and self._code.objects:
            from ...codegen.llvm.backend import load_objects  # noqa: PLC0415 - the LLVM backend only

            self._library = load_objects(self._code.objects)
        position = {v: k for k, v in enumerate(bound.values())}
        kernels: dict[Node, Kernel] = {}
        for index, info in self._code.kernels.items():
            node = bound.nodes[index]
            if not all(_laid_out(v, layouts[v], self._layouts.get(position[v])) for v in (*node.inputs, *node.outputs)):
                continue  # laid out otherwise at these sizes than the code assumes: its eager kernels run
            assert self._library is not None, "kernels without object code"
            for product in info.symbols:  # a kernel over a flattened symbolic size (3*T) reads the product
                sizes.setdefault(product, dim_size(product, sizes))
            function = KERNEL_TYPE(self._library.address(info.symbol))
            slots = tuple(int(sizes[s]) for s in info.symbols)
            kernels[node] = Kernel(function, info.units(sizes), info.work(sizes), status=_status(node), sizes=slots)
        return CompiledProgram(bound, kernels, plan, layouts, write_backs, self._library)


def _c_order(value: Value, strides: tuple) -> bool:
    """Whether ``strides`` (bytes) are C order for ``value``'s (bound) shape."""
    shape = cast(list[int], list(value.type.shape))  # bound: ints
    return tuple(strides) == tuple(value.type.dtype.itemsize * prod(shape[k + 1 :]) for k in range(len(shape)))


def _strides_follow_sizes(value: Value) -> bool:
    """Whether ``value``'s C-order strides depend on a symbolic size (one after its first non-1 dim)."""
    dims = [d for d in value.type.shape if d != 1]
    return any(isinstance(d, Sym) for d in dims[1:])


def _laid_out(value: Value, strides: tuple, expected) -> bool:
    """Whether ``value`` (bound), of byte ``strides``, is laid out as its kernels' code assumes."""
    return _c_order(value, strides) if expected == C_ORDER else strides == expected


def _status(node: Node) -> bool:
    from ...codegen.llvm.kernel_info import STATUS_OPS  # noqa: PLC0415

    return node.op in STATUS_OPS


def _probe_base(graph: Graph) -> int:
    """What the probe sizes are raised by so that every size ``graph`` derives from its symbols (a
    conv's ``(H-4)//2``) is at least 2 there: a window larger than the probe fits nowhere."""
    most = 0
    for v in graph.values():
        for d in v.type.shape:
            for term in _sums(d):
                most = max(most, 2 * term.divisor - term.offset)
    return max(0, most)


def _sums(d) -> list[SymSum]:
    if isinstance(d, SymProduct):
        return [s for f in d.factors for s in _sums(f)]
    return [d] if isinstance(d, SymSum) else []


def lower_symbolic(graph: Graph, options, strides: Sequence[tuple | None], write_backs: Sequence[tuple[int, int]],
                   first: Graph | None = None):  # fmt: skip
    """``(fused graph, program, report)`` for a symbolic graph: see the module docstring.
    ``Unlowered`` when the backend does not generate code once for every size (then the caller
    lowers the graph per size). ``first``: the graph bound to the sizes of the first call, whose
    program is loaded now (``SymbolicProgram.prime``)."""
    backend = driver.choose_backend(graph, options)
    strides, requested = tuple(strides), tuple(write_backs)
    if not backend.stages:  # the interpreter runs symbolic graphs as they are
        compiled = driver.compile_graph(graph, options, strides, requested)
        return compiled.graph, compiled.program, compiled.report
    if backend.name != "llvm":
        raise Unlowered(f"the {backend.name} backend generates code for static sizes only")
    start = time.perf_counter()
    key = symbolic_key(graph, backend, options, strides, requested, PROBES)
    payload = None if key is None else program_cache.disk_cache().get(key)
    cached = None if payload is None else _from_cache(payload, graph, backend, strides, requested, start)
    if cached is not None:
        return _loaded(cached, first)
    split = split_batch_sums(graph)  # BatchNorm's sums across the batch: two sums compiled over any batch
    record: list = []
    seconds: list = []
    stages = [*driver.graph_stages(options), *(s for s in driver.LOWERING_STAGES if s.name == "fuse")]
    state = driver._run(driver.Compilation(split, backend, strides, requested), stages, options, record, seconds)
    fused = collapse_symbolic_prefixes(state.graph)  # a symbol after the first dim: flattened where it can be
    base = _probe_base(fused)
    try:
        probes = [bind_graph(fused, {plain_symbol(d)[0]: base + n for d, _, _ in symbol_positions(fused)})  # type: ignore[index]
                  for n in PROBES]  # fmt: skip
    except ValueError as why:  # the graph needs its symbols apart (a slice of s1 to s0+1): lowered per size
        raise Unlowered(f"its layouts cannot be probed with every symbol at one size ({why})") from None
    layouts = [infer_layouts(g, strides) for g in probes]
    values = [list(g.values()) for g in probes]
    same: dict[int, tuple | str] = {
        k: layouts[0][a] for k, (a, b) in enumerate(zip(*values, strict=True)) if layouts[0][a] == layouts[1][b]
    }
    # A value C-contiguous at both probes whose strides follow its size ((B*H*T, T) scores) is
    # addressed by code that reads its row length at run time (codegen/llvm/symbolic_rows.py).
    same.update((k, C_ORDER) for k, (a, b) in enumerate(zip(*values, strict=True))
                if k not in same and _c_order(a, layouts[0][a]) and _c_order(b, layouts[1][b]))  # fmt: skip
    # The code is generated for the first probe's layouts; ``SymbolicProgram._load`` uses a kernel
    # only at sizes where its values are laid out as they were then (``same``).
    by_value = {v: layouts[0][values[0][k]] for k, v in enumerate(fused.values())}
    report = LoweringReport(cache="off" if key is None else "miss", not_fused=list(state.not_fused))
    generating = time.perf_counter()
    timeout = getattr(options, "compile_timeout", None)  # the same deadline as a static compile's
    deadline = None if timeout is None else start + timeout - time.perf_counter() + time.monotonic()
    code = backend.generate(Lowered(fused, by_value, {}, None, deadline), report)
    position = {v: k for k, v in enumerate(fused.values())}
    for index in list(code.kernels):
        node = fused.nodes[index]
        operands = (*node.inputs, *node.outputs)
        if any(position[v] not in same for v in operands):
            report.declined.append((node.attrs.get("name", node.op), "its layouts depend on the symbolic size"))
            del code.kernels[index]
        elif any(same[position[v]] != C_ORDER for v in operands if _strides_follow_sizes(v)):
            # the code addresses such a value at row * n (symbolic_rows.py): C order at every size
            report.declined.append((node.attrs.get("name", node.op), "a value of a symbolic row length not in C order"))
            del code.kernels[index]
    seconds.append((f"generate ({backend.name})", time.perf_counter() - generating))
    report.stage_seconds = seconds
    report.compile_seconds = time.perf_counter() - start
    report.kernels = len(code.kernels)
    program = SymbolicProgram(fused, backend, code, report, strides, requested, same)
    _loaded(program, first)
    if key is not None and not report.abandoned:  # abandoned code would be the next process's too
        program_cache.disk_cache().put(key, to_entry(fused, backend, code, report, same, graph))
    return fused, program, report


def _from_cache(payload: bytes, graph: Graph, backend, strides: tuple, requested: tuple,
                start: float) -> SymbolicProgram | None:  # fmt: skip
    """The program of a cache entry (``symbolic_cache``), or None when it does not load (it is rebuilt)."""
    try:
        fused, code, report, same = from_entry(payload, graph, backend)
    except Exception as error:  # noqa: BLE001 - a bad entry is rebuilt, never trusted
        logger.debug("kiln: dynamic program cache entry did not load (%s); rebuilding", error)
        return None
    report.stage_seconds = [("read the cache entry", time.perf_counter() - start)]
    report.compile_seconds = time.perf_counter() - start
    return SymbolicProgram(fused, backend, code, report, strides, requested, same)


def _loaded(program: SymbolicProgram, first: Graph | None):
    """``(fused graph, program, report)`` of ``program``, primed for ``first`` (see ``lower_symbolic``)."""
    if first is not None:
        program.prime(first)
    return program.graph, program, program.report


class SizedProgram(_ProgramPerSizes):
    """The program of a dynamic specialization: ``graph`` (symbolic) lowered for the sizes of each
    call. The sizes are read off the inputs (``symbol_positions``); the lowered program of each
    set of sizes is kept (``lower(concrete graph) -> program``), so a size seen before costs a
    dictionary lookup. ``lowerings`` counts how many there were."""

    def __init__(self, graph: Graph, lower, first: tuple[Graph, Any] | None = None, limit: int = 64) -> None:
        self.graph = graph
        self._lower = lower
        self._positions = symbol_positions(graph)
        self._programs: dict[tuple[int, ...], Any] = {}
        if first is not None:  # the program already lowered for the traced call's sizes
            concrete, program = first
            self._programs[tuple(concrete.inputs[i].type.shape[axis] for _, i, axis in self._positions)] = program  # type: ignore[misc]  # bound: ints
        self._limit = limit  # programs kept at most (the oldest is dropped first)
        self._last: tuple = ((), None)
        self.lowerings = 0

    def sizes(self, arrays: Sequence) -> dict[Sym, int]:
        return position_sizes(self._positions, [arrays[i].shape[axis] for _, i, axis in self._positions])

    def program_for(self, arrays: Sequence):
        key = tuple(arrays[i].shape[axis] for _, i, axis in self._positions)
        program = self._programs.get(key)
        if program is None:
            program = self._lower(bind_graph(self.graph, position_sizes(self._positions, key)))
            self.lowerings += 1
            self._keep(key, program)
        self._last = (key, program)
        return program

    fresh_outputs: frozenset[int] = frozenset()  # not tracked across sizes: results are checked for aliasing
