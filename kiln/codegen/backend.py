"""The seam between the compiler and its code generators: the ``Backend`` protocol and its registry.

The compile driver (``kiln.compiler.driver``) asks a backend three things, in this order:

1. ``declines(node)``: why this node may not be part of a kernel (None: it may). Fusion consults
   it, so it never forms a kernel that the backend then declines (the LLVM backend compiles no
   float16);
2. ``generate(lowered, report)``: code for the kernels of the lowered program (a fused graph, its
   layouts, the write-back choice and the memory plan), opaque to the driver; past
   ``lowered.deadline`` a backend may give up, leave its kernels to the interpreter and say why in
   ``report.abandoned`` (the driver then caches nothing);
3. ``load(lowered, code)``: that code, loaded into a program the runtime runs:
   ``program(list of arrays) -> list of arrays``.

A backend that computes a convolution's elementwise consumers inside the convolution's kernel
also gives ``takes_epilogue(node)``: whether it compiles ``node``, a kernel of kind ``conv`` that
fusion proposes (``kiln.passes.epilogues``); the others leave it out, and fusion makes none.

A backend whose programs run loop nodes (``kiln.ir.loops``) says so with ``runs_loops = True``: the
driver then rolls repeated computations into loops and gives ``load`` each loop body's compiled
program (``Lowered.loops``); the others get the unrolled graph.

``stages`` names the lowering stages it needs after the graph passes (``fuse``, ``infer_layouts``,
``choose_write_backs``, ``plan_memory``); the interpreter needs none. For the on-disk cache a
backend gives ``signature()`` (what decides its code besides the IR, such as the host CPU; None:
never cached) and ``encode``/``decode`` of its code.

Backends are registered by name with the device types they compile for: ``backend_for(graph)``
picks the one for the graph's device, ``backend_named(name)`` an explicit one (the
``backend=`` compile option). A test may register a backend of its own.

>>> backend_named("interpreter").stages
()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..ir.graph import Graph, Node, Value
from ..ir.interpreter import prepare


@dataclass(frozen=True)
class Lowered:
    """A program ready for code generation: what every stage after the graph passes decided."""

    graph: Graph  # the fused graph, nodes in run order
    layouts: Mapping[Value, tuple] = field(default_factory=dict)  # byte strides of every value
    write_backs: Mapping[int, int] = field(default_factory=dict)  # graph output -> input it is written into
    plan: Any = None  # the MemoryPlan of the intermediates (kiln.passes.memory_plan)
    deadline: float | None = None  # time.monotonic() by which code generation gives up (None: never)
    loops: Mapping[Node, Any] = field(default_factory=dict)  # each loop node's body, compiled (a Program)


@dataclass
class LoweringReport:
    """What compiling did, for ``kiln.explain``."""

    kernels: int = 0
    declined: list[tuple[str, str]] = field(default_factory=list)  # (kernel name, reason)
    not_fused: list[str] = field(default_factory=list)  # merges fusion declined, worded (a few of each kind)
    externs: dict[str, int] = field(default_factory=dict)
    memory: str = ""
    compile_seconds: float = 0.0
    stage_seconds: list[tuple[str, float]] = field(default_factory=list)  # every stage of the driver, timed
    generate_seconds: list[tuple[str, float]] = field(default_factory=list)  # the parts of code generation, timed
    cache: str = "off"  # "hit" | "miss" | "off"
    abandoned: str = ""  # why code generation gave up (its deadline passed): such code is never cached
    loops: list[str] = field(default_factory=list)  # each loop node (trips, body size) and its body's report
    worker: bool = False  # the passes and code generation ran in the program worker (``compiler.program_worker``)

    def describe(self) -> list[str]:
        lines = [f"{self.kernels} compiled kernel(s); compile cache: {self.cache}; "
                 f"code generation {self.compile_seconds * 1e3:.1f} ms"]  # fmt: skip
        if self.worker:
            lines.append("compiled in the program worker (a process of its own), loaded here")
        if self.stage_seconds:
            lines.append("stages: " + ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in self.stage_seconds))
        if self.generate_seconds:
            lines.append(
                "code generation: " + ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in self.generate_seconds)
            )
        if self.externs:
            lines.append(
                "extern nodes (eager kernels): " + ", ".join(f"{k} x{v}" for k, v in sorted(self.externs.items()))
            )
        lines.extend(f"kernel {name} runs on the interpreter: {why}" if name[0] != "(" else f"{name[1:-1]}: {why}"
                     for name, why in self.declined)  # fmt: skip
        lines.extend(f"not fused: {line}" for line in self.not_fused)
        lines.extend(self.loops)
        if self.memory:
            lines.extend(self.memory.splitlines())
        return lines


class Program(Protocol):
    """What a backend's ``load`` returns: the lowered graph, runnable.

    ``program(inputs)`` runs it on a list of arrays (the graph's inputs, in order) and returns its
    outputs, checking each input's shape, dtype and layout; ``run_checked_inputs`` does the same for
    inputs the caller has checked already. ``fresh_outputs`` are the positions of the outputs that are
    always new memory (never an input's, a constant's or another output's), ``plan`` the memory plan
    it runs with (None: none), ``kernel_calls`` its steps that run compiled code (each has its
    ``node``) -- what ``kiln.explain`` and the call path read."""

    @property
    def plan(self) -> Any: ...

    @property
    def fresh_outputs(self) -> frozenset[int]: ...

    @property
    def kernel_calls(self) -> Sequence[Any]: ...

    def __call__(self, inputs: Sequence[Any], /) -> list[Any]: ...

    def run_checked_inputs(self, inputs: Sequence[Any], /) -> list[Any]: ...


class InterpretedProgram:
    """The interpreter backend's ``Program``: every node runs its eager kernel."""

    plan = None
    fresh_outputs: frozenset[int] = frozenset()
    kernel_calls: tuple = ()

    def __init__(self, graph: Graph) -> None:
        self._run = prepare(graph).run

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        return self._run(inputs)

    run_checked_inputs = __call__


class Backend(Protocol):
    """A code generator and the loader of what it generates (see the module docstring). A backend
    may also have ``prepare(deadline)``, which the driver calls when a compile is sure to come (a
    cache miss, before the passes) so that the backend can start what it needs meanwhile (the LLVM
    backend starts its compile worker); the others need not have it."""

    name: str
    stages: tuple[str, ...]

    def declines(self, node: Node) -> str | None: ...

    def signature(self) -> str | None: ...

    def generate(self, lowered: Lowered, report: LoweringReport) -> Any: ...

    def load(self, lowered: Lowered, code: Any) -> Program: ...

    def encode(self, code: Any) -> bytes: ...

    def decode(self, data: bytes, graph: Graph) -> Any: ...


class InterpreterBackend:
    """The reference: every node runs its eager kernel (``kiln.ir.interpreter``); nothing is fused,
    nothing generated, nothing cached."""

    name = "interpreter"
    stages: tuple[str, ...] = ()
    runs_loops = True  # the interpreter runs a loop node's body graph as it is

    def declines(self, node: Node) -> str | None:
        return "the interpreter runs every node by its eager kernel"

    def signature(self) -> str | None:
        return None

    def generate(self, lowered: Lowered, report: LoweringReport) -> None:
        return None

    def load(self, lowered: Lowered, code: None) -> InterpretedProgram:
        return InterpretedProgram(lowered.graph)

    def encode(self, code: None) -> bytes:
        return b""

    def decode(self, data: bytes, graph: Graph) -> None:
        return None


# ----------------------------------------------------------------------------- the registry
_FACTORIES: dict[str, Callable[[], Backend]] = {}
_BACKENDS: dict[str, Backend] = {}
_BY_DEVICE: dict[str, str] = {}


def register_backend(name: str, factory: Callable[[], Backend], devices: tuple[str, ...] = ()) -> None:
    """Make ``factory()`` the backend called ``name`` (made on first use, so a heavy code generator
    is imported only when asked for), and the default for graphs on ``devices`` (device types)."""
    _FACTORIES[name] = factory
    _BACKENDS.pop(name, None)
    for device in devices:
        _BY_DEVICE[device] = name


def unregister_backend(name: str) -> None:
    """Forget backend ``name`` (and the devices it was the default for)."""
    _FACTORIES.pop(name, None)
    _BACKENDS.pop(name, None)
    for device in [d for d, n in _BY_DEVICE.items() if n == name]:
        del _BY_DEVICE[device]


def backend_names() -> tuple[str, ...]:
    return tuple(_FACTORIES)


def backend_named(name: str) -> Backend:
    """The backend registered as ``name`` (``KeyError`` naming the known ones otherwise)."""
    backend = _BACKENDS.get(name)
    if backend is None:
        if name not in _FACTORIES:
            raise KeyError(f"no kiln backend {name!r}; known: {', '.join(_FACTORIES)}")
        backend = _BACKENDS[name] = _FACTORIES[name]()
    return backend


def graph_device(graph: Graph) -> str:
    """The device type the graph's values live on ("cpu" for a graph of no tensors; "mixed" when
    they live on several)."""
    types = {v.type.device.type for v in graph.inputs} | {v.type.device.type for v in graph.outputs}
    return types.pop() if len(types) == 1 else ("cpu" if not types else "mixed")


def backend_for(graph: Graph) -> Backend:
    """The backend registered for the graph's device; the interpreter where none is."""
    return backend_named(_BY_DEVICE.get(graph_device(graph), "interpreter"))


def _llvm() -> Backend:
    from .llvm.backend import LLVMBackend  # noqa: PLC0415 - llvmlite is imported when first needed

    return LLVMBackend()


register_backend("interpreter", InterpreterBackend)
register_backend("llvm", _llvm, devices=("cpu",))


def _cuda() -> Backend:
    from .cuda.backend import CudaBackend  # noqa: PLC0415 - numba is imported when first needed

    return CudaBackend()


register_backend("cuda", _cuda, devices=("cuda",))
