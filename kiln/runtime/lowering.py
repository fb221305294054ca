"""From a traced graph to a ``CompiledProgram``: passes, fusion, layouts, code generation, memory plan.

``compile_program(graph, input_strides)`` is the LLVM backend's compile step for an optimized
graph. Kernels the code generator declines run on the interpreter (the program stays correct;
``report`` says which and why). All kernels of a program go into one LLVM module, so LLVM is
invoked once.

``compile_cached(traced, optimize, input_strides, options)`` puts the on-disk cache in front of
it: the key is the traced graph's canonical text without source locations and its constants, the
input layouts, the compile options, kiln's version, a digest of the compiler's own source and the
host signature (LLVM, CPU name and features); an entry holds the fused graph, its constants and
the object code, so a hit skips the passes, fusion and LLVM. Entries are signed by the cache; one
that does not load is rebuilt.

Source locations stay out of the key (a comment added above a compiled function must not
recompile it), yet a program's nodes must name the lines of *this* trace, which errors and
``explain`` show. So an entry also keeps the location of every traced node it was compiled from;
on a hit, each location of the stored graph is replaced by the current trace's location of the
same traced node. Passes only copy locations from the nodes they rewrite, so the map is exact;
when one stored location now stands for several lines (a statement split in two), the entry
cannot say which, and it is rebuilt.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import safetensors.numpy

from ..codegen.llvm import Unsupported, engine
from ..codegen.llvm.kernels import KernelModule
from ..ir.dtypes import float16
from ..ir.graph import CONSTANT, KERNEL, Graph, kernel_bodies, qualified_constants
from ..ir.primitives import ELEMENTWISE, PRIMITIVES
from ..ir.printer import print_graph
from ..ir.serialize import graph_from_json, graph_to_json
from ..passes.fusion import fuse
from ..passes.memory_plan import plan_memory
from .cache import DiskCache, cache_key
from .executor import KERNEL_TYPE, CompiledProgram, KernelStep, LoweringReport, element_strides, infer_layouts

logger = logging.getLogger("kiln")

#: Bump when the layout of a cache entry changes.
ENTRY_FORMAT = 2


def compile_program(graph: Graph, input_strides: Sequence[tuple | None]) -> CompiledProgram:
    """Compile the optimized ``graph`` for inputs with ``input_strides`` (byte strides per graph
    input; None = C-contiguous)."""
    start = time.perf_counter()
    fused_graph = fuse(graph)
    layouts = infer_layouts(fused_graph, input_strides)
    report = LoweringReport()
    steps, objects = generate(fused_graph, layouts, report)
    program = load(fused_graph, steps, objects, layouts, report, eager_graph=graph)
    program.objects = objects
    report.compile_seconds = time.perf_counter() - start
    return program


def compile_cached(traced: Graph, optimize: Callable[[Graph], Graph], input_strides: Sequence[tuple | None],
                   options: str) -> CompiledProgram:  # fmt: skip
    """``compile_program(optimize(traced), input_strides)`` through the disk cache."""
    cache = _disk_cache()
    key = None
    if cache.enabled:
        key = cache_key("kiln program", str(ENTRY_FORMAT), _compiler_digest(), engine.host_signature(), options,
                        repr([tuple(s) if s is not None else None for s in input_strides]),
                        print_graph(traced, locations=False), *_constant_parts(traced))  # fmt: skip
        payload = cache.get(key)
        if payload is not None:
            start = time.perf_counter()
            try:
                program = _from_entry(payload, input_strides, _locations(traced))
            except Exception as error:  # noqa: BLE001 - a bad entry is rebuilt, never trusted
                logger.debug("kiln: compile cache entry did not load (%s); rebuilding", error)
            else:
                program.report.cache = "hit"
                program.report.compile_seconds = time.perf_counter() - start
                return program
    program = compile_program(optimize(traced), input_strides)
    if key is not None:
        cache.put(key, _to_entry(program, _locations(traced)))
        program.report.cache = "miss"
    return program


def generate(graph: Graph, layouts: dict, report: LoweringReport) -> tuple[dict, list[bytes]]:
    """Kernel steps (by node) and the object code of every kernel the code generator accepts.

    A kernel the code generator declines (``Unsupported``) or fails on -- an exception from the
    generator, or LLVM rejecting its code -- runs on the interpreter and the others stay compiled
    (``report.declined`` says which and why; ``KILN_JIT_STRICT=1`` raises instead, for tests).
    """
    module = KernelModule()
    steps = {}
    strides = {}
    externs: Counter = Counter()
    unfused: Counter = Counter()  # elementwise nodes left out of kernels because of their dtype
    for node in graph.nodes:
        if node.op == CONSTANT:
            continue
        if node.op != KERNEL:
            externs[node.op] += 1
            if PRIMITIVES[node.op].kind in ELEMENTWISE and any(v.type.dtype is float16 for v in node.outputs):
                unfused[node.op] += 1
            continue
        strides[node] = [element_strides(v, layouts[v]) for v in node.inputs]
        try:
            info = module.add(node, strides[node])
        except Unsupported as why:
            report.declined.append((node.attrs["name"], str(why)))
            continue
        except Exception as error:  # noqa: BLE001 - a code generator bug costs this kernel only
            _failed(report, node, "the LLVM code generator failed", error)
            continue
        steps[node] = KernelStep(node, info.symbol, info.extent, info.work_bytes)
    report.externs = dict(externs)
    if unfused:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(unfused.items()))
        report.declined.append(("(not fused)", f"float16 has no LLVM kernels; {ops} run on their eager kernels"))
    objects = _compile(module, steps, strides, report) if steps else []
    report.kernels = len(steps)
    return steps, objects


def _compile(module: KernelModule, steps: dict, strides: dict, report: LoweringReport) -> list[bytes]:
    """Object code for ``steps``: one LLVM compile of the whole module. Should LLVM fail on it, each
    kernel is compiled in a module of its own, to find the kernels it fails on; those leave
    ``steps`` (they run on the interpreter) and the others keep their own object code."""
    try:
        return [engine.compile_ir(module.ir())]
    except Exception as error:  # noqa: BLE001 - attributed to its kernels below
        if os.environ.get("KILN_JIT_STRICT") == "1":
            raise
        logger.debug("kiln: LLVM failed on the module (%s); compiling its kernels one by one", error)
    objects = []
    for node, step in list(steps.items()):
        alone = KernelModule()
        try:
            step.symbol = alone.add(node, strides[node]).symbol
            objects.append(engine.compile_ir(alone.ir()))
        except Exception as error:  # noqa: BLE001 - this kernel runs on the interpreter
            _failed(report, node, "LLVM failed on its code", error)
            del steps[node]
    return objects


def _failed(report: LoweringReport, node, what: str, error: Exception) -> None:
    if os.environ.get("KILN_JIT_STRICT") == "1":
        raise error
    why = f"{what} ({type(error).__name__}: {error}); a bug in kiln, please report it"
    logger.warning("kiln.compile: kernel %s runs on the interpreter: %s", node.attrs["name"], why)
    report.declined.append((node.attrs["name"], why))


def load(graph: Graph, steps: dict, objects: list[bytes], layouts: dict, report: LoweringReport,
         eager_graph: Graph | None = None) -> CompiledProgram:  # fmt: skip
    """Load object code, bind each kernel step to its function, plan memory, build the program."""
    library = engine.Library(objects) if objects else None
    for step in steps.values():
        step.function = KERNEL_TYPE(library.address(step.symbol))
    plan = plan_memory(graph, eager_graph=eager_graph)
    report.memory = plan.describe()
    return CompiledProgram(graph, steps, library, plan, layouts, report)


# ----------------------------------------------------------------------------- the disk cache
@functools.cache
def _disk_cache() -> DiskCache:
    return DiskCache()


@functools.cache
def _compiler_digest() -> str:
    """A digest of the source of everything that decides the machine code: the IR and its
    primitives' formulas, the passes, the code generator and the runtime."""
    import kiln  # noqa: PLC0415

    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(kiln.__version__.encode())
    for folder in ("ir", "passes", "codegen", "runtime"):
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _constant_parts(graph: Graph) -> list[bytes]:
    parts = []
    for name, array in sorted(graph.constants.items()):
        parts.append(f"{name} {array.dtype.str} {array.shape}".encode())
        parts.append(np.ascontiguousarray(array).tobytes())
    return parts


def _to_entry(program: CompiledProgram, traced_locations: list) -> bytes:
    graph = program.graph
    index = {node: i for i, node in enumerate(graph.nodes)}
    kernels = [[index[s.node], s.symbol, s.extent, s.work_bytes] for s in program.kernel_steps]
    constants = qualified_constants(graph)
    tensors = {f"constant/{k}": np.ascontiguousarray(v) for k, v in constants.items()}
    for i, obj in enumerate(program.objects):
        tensors[f"object/{i}"] = np.frombuffer(obj, np.uint8)
    report = program.report
    meta = {
        "graph": json.dumps(graph_to_json(graph)),
        "kernels": json.dumps(kernels),
        "declined": json.dumps(report.declined),
        "externs": json.dumps(report.externs),
        "objects": str(len(program.objects)),
        "shapes": json.dumps({k: list(v.shape) for k, v in constants.items()}),  # safetensors loads 0-d as (1,)
        "locations": json.dumps(traced_locations),
    }
    return safetensors.numpy.save(tensors, metadata=meta)


def _from_entry(payload: bytes, input_strides: Sequence[tuple | None], traced_locations: list) -> CompiledProgram:
    (size,) = struct.unpack("<Q", payload[:8])
    meta = json.loads(payload[8 : 8 + size])["__metadata__"]
    moved = _relocation(json.loads(meta["locations"]), traced_locations)
    if moved is None:
        raise ValueError("the source lines moved in a way the stored program cannot follow")
    tensors = safetensors.numpy.load(payload)
    shapes = json.loads(meta["shapes"])
    constants = {k: tensors[f"constant/{k}"].reshape(shape) for k, shape in shapes.items()}
    graph_json = json.loads(meta["graph"])
    _relocate(graph_json, moved)
    graph = graph_from_json(graph_json, constants)
    objects = [tensors[f"object/{i}"].tobytes() for i in range(int(meta["objects"]))]
    steps = {}
    for position, symbol, extent, work in json.loads(meta["kernels"]):
        node = graph.nodes[position]
        steps[node] = KernelStep(node, symbol, extent, work)
    report = LoweringReport(kernels=len(steps), declined=[tuple(d) for d in json.loads(meta["declined"])],
                            externs=json.loads(meta["externs"]))  # fmt: skip
    program = load(graph, steps, objects, infer_layouts(graph, input_strides), report)
    program.objects = objects
    return program


# ----------------------------------------------------------------------------- source locations
def _locations(graph: Graph) -> list:
    """Each node's source location as ``[file, line, function]`` (or None), bodies included, in order."""
    found: list = []
    for node in graph.nodes:
        loc = node.loc
        found.append(None if loc is None else [loc.filename, loc.line, loc.function])
        for body in kernel_bodies(node):
            found.extend(_locations(body))
    return found


def _relocation(stored: list, current: list) -> dict | None:
    """Stored location -> the current trace's location of the same node; None when a stored
    location now stands for two different ones (or the traces differ, which the key excludes)."""
    if len(stored) != len(current):
        return None
    moved: dict = {}
    for old, new in zip(stored, current, strict=True):
        if old is not None and moved.setdefault(tuple(old), new) != new:
            return None
    return moved


def _relocate(graph_json: dict, moved: dict) -> None:
    """Replace the locations of a graph's JSON form (``graph_to_json``) in place, bodies included;
    a location no traced node had is dropped rather than guessed."""
    for node in graph_json["nodes"]:
        loc = node["loc"]
        if loc is not None:
            new = moved.get((loc["file"], loc["line"], loc["function"]))
            node["loc"] = None if new is None else {"file": new[0], "line": new[1], "function": new[2]}
        if node["op"] == KERNEL:
            for body in node["attrs"]["bodies"]["graphs"]:
                _relocate(body, moved)
