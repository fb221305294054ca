"""The LLVM backend: kernel nodes compiled for the host CPU through llvmlite, loaded with ctypes.

``generate`` makes each distinct kernel of a program once (the steps of an unrolled loop share
one function), takes those the kernel cache holds from it (``kernel_cache``: one entry per kernel,
so a second specialization, another length of a loop or another process compiles only the kernels
it has not seen), and compiles the others, several to a module (``kernel_modules``), each module as
soon as it is full, while the rest is generated (``compile_stream``); a kernel of little work is
optimized lightly (``LIGHT_BELOW_BYTES``), one of almost none as cheaply as LLVM can
(``TINY_BELOW_BYTES``). They go to the cache. The window nodes
of convolution (``unfold``, ``fold``: ``window``), direct convolutions (``conv``, ``conv_weight``:
``conv``), the gathers and scatters of embeddings
(``take``, ``index_put``: ``gather_scatter``) and sums over leading axes (``reduce_sum`` keeping the
last axis: ``leading_sums``) are compiled there too. A kernel
the code generator declines (``Unsupported``) or fails on -- an exception from the generator, or
LLVM rejecting its code -- runs on the interpreter and the others stay compiled (``report.declined``
says which and why; ``KILN_JIT_STRICT=1`` raises instead, for tests). LLVM runs within the
compile's deadline (``Lowered.deadline``): past it the compile is abandoned and every kernel runs
on the interpreter (``report.abandoned``; strict mode raises ``CompileTimeout``). ``load`` loads
the object code (``kiln.runtime.elf`` where it can, llvmlite's MCJIT elsewhere) and builds the runtime's
``CompiledProgram``. The code (kernel symbols and object code) encodes to bytes for the disk
cache; loading it from there, with the host signature remembered (``host``), needs no LLVM.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...ir.dtypes import float16
from ...ir.graph import KERNEL, Graph, Node
from ...ir.types import Sym
from ...runtime import elf, threads
from ...runtime.executor import KERNEL_TYPE, CompiledProgram, Kernel
from ..backend import Lowered, LoweringReport
from . import Unsupported, host, kernel_cache, kernel_modules
from .kernel_info import NATIVE_OPS, STATUS_OPS, KernelInfo, native_code

if TYPE_CHECKING:
    from .compile_stream import CompileStream

logger = logging.getLogger("kiln")

_LENGTH = struct.Struct("<Q")

#: A static kernel that reads and writes fewer bytes than this per call is optimized lightly
#: (``engine.LIGHT``: no loop unrolling), which about halves LLVM's time on it; at that size a call
#: costs microseconds, and unrolling a loop the vectorizer has already widened and interleaved saves
#: little of them. Larger kernels, and kernels over symbolic sizes (whose work is not known), get the
#: whole O3 pipeline. Measured (one process, interleaved): DCGAN's 63 kernels compile in 1.43 s
#: instead of 2.54 s and its step runs as fast (1.31 vs 1.30 ms); at 1 MB it compiled in 1.38 s
#: but its step took 1.44 ms.
LIGHT_BELOW_BYTES = 256 << 10

#: A static kernel that reads and writes fewer bytes than this per call (a few hundred elements at
#: most) is compiled as cheaply as LLVM can (``engine.TINY``: two cleanup passes, the fast
#: instruction selector), unless it calls kiln's math routines: such a call costs its dispatch, not
#: its loop, and LLVM's whole pipeline costs about 10 ms a kernel. Measured (one process,
#: interleaved, a busy machine): DCGAN's 23 such kernels take LLVM 0.03 s instead of 0.27 s and its
#: step runs as fast (1.001x and 0.996x the step time with every kernel fully compiled); at 64 KB its
#: step took 1.3-1.5x as long.
TINY_BELOW_BYTES = 1 << 10

#: A tiny kernel that calls kiln's math routines (``kiln.math.exp.f32``...) is compiled cheaply too when
#: none of its outputs holds more than this many elements: unoptimized, each call of a routine costs
#: about 0.1 us more (a 16-element ``exp``/``log1p`` kernel: 1.5 us a call), but LLVM's pipeline
#: inlines and optimizes the whole routine, 15-22 ms a kernel against 1.5-2 ms. Measured on DCGAN
#: (Adam's bias correction, ``pow`` of a scalar; the loss's 16 ``exp``/``log1p``): LLVM's time on its
#: three such kernels 58 ms -> 5 ms.
TINY_MATH_ELEMENTS = 16


@dataclass
class LLVMCode:
    """Each compiled kernel (by its position in the graph) and the object code holding them all."""

    kernels: dict[int, KernelInfo]
    objects: list[bytes]


class LLVMBackend:
    """See the module docstring; chosen for graphs on the CPU."""

    name = "llvm"
    stages: tuple[str, ...] = ("fuse", "infer_layouts", "choose_write_backs", "plan_memory")
    runs_loops = True  # loop nodes run their bodies' programs (``kiln.runtime.loop_call``)

    def declines(self, node: Node) -> str | None:
        for v in (*node.inputs, *node.outputs):
            if v.type.dtype is float16 or v.type.dtype.short == "bf16":  # bfloat16 exists only once ml_dtypes is in
                return f"{v.type.dtype.name} has no LLVM kernels"
        axes = node.attrs.get("axes") if node.op.startswith("reduce_") else None
        shape = node.inputs[0].type.shape if axes is not None else ()
        rows = len(shape) >= 2 and tuple(axes or ()) == (len(shape) - 1,)  # each row of a symbolic length
        if axes is not None and any(isinstance(shape[a], Sym) for a in axes) and not rows:
            # symbolic compiles rows over the symbol, and rows of a symbolic length (symbolic_rows),
            # not a sum across other dims: fused, the whole kernel would run on the interpreter;
            # alone, the reduction runs on its eager kernel
            return "a reduction over a symbolic dimension has no LLVM kernel"
        return None

    def takes_epilogue(self, node: Node) -> bool:
        from .conv_epilogue import takes_epilogue  # noqa: PLC0415 - a cache hit loads code without the generator

        return takes_epilogue(node)

    def signature(self) -> str:
        return host.signature()

    def prepare(self, deadline: float | None) -> None:
        """A compile with a deadline runs in the worker process: start it now, while the passes run,
        so its start-up (about 0.2 s: Python and llvmlite) overlaps them instead of adding to them.
        Either way, the CPU's idle time is looked at now: whether a core stays idle while the passes
        run decides whether LLVM starts while the code is generated (``compile_stream.worth_it``)."""
        from . import engine, worker_pool  # noqa: PLC0415 - loads LLVM, which loading the program needs anyway

        if deadline is not None:
            engine.start_worker()  # it looks, choosing the workers to start
        else:
            worker_pool.look()

    def generate(self, lowered: Lowered, report: LoweringReport) -> LLVMCode:
        start = time.perf_counter()
        kernels: dict[int, KernelInfo] = {}
        kernel_nodes = sum(node.op == KERNEL or node.op in NATIVE_OPS for node in lowered.graph.nodes)
        batch = _Batch(kernel_cache.kernel_cache(), lowered.deadline, kernel_nodes)
        try:
            self._add_kernels(lowered, report, batch, kernels)
        except BaseException:  # strict mode's error, an interrupt: the modules sent are not waited for
            batch.cancel()
            raise
        generated = time.perf_counter()
        pool = _pool_meanwhile() if batch.pending else None
        objects = batch.compile(report, lowered.deadline)
        if pool is not None:
            pool.join()
        light_kernels = sum(light(info) for _, info, _, _ in batch.pending)
        report.generate_seconds = [
            (
                f"kernel code ({len(batch.known)} distinct, {batch.from_cache} from the kernel cache)",
                generated - start,
            ),
            (
                f"LLVM ({len(batch.pending)} kernels in {batch.modules} modules, {light_kernels} light, "
                f"{batch.tiny} tiny)",
                time.perf_counter() - generated,
            ),
        ]
        if report.abandoned:
            kernels.clear()
        kernels = {p: info for p, info in kernels.items() if info.symbol not in batch.failed}
        report.kernels = len(kernels)
        return LLVMCode(kernels, objects)

    @staticmethod
    def _add_kernels(lowered: Lowered, report: LoweringReport, batch: _Batch, kernels: dict[int, KernelInfo]) -> None:
        """Each kernel node's function into ``kernels`` (by position), through ``batch``; a declined
        or failed kernel into ``report.declined``."""
        for position, node in enumerate(lowered.graph.nodes):
            if node.op in NATIVE_OPS:
                why = _native(node)
                if why is not None:
                    if not _eager_by_choice(node):  # a fallback is said: "conv: conv with stride (2, 1) runs on ..."
                        report.declined.append((f"({node.op})", why))
                    continue
            elif node.op != KERNEL:
                continue
            try:
                info = batch.add(node, [_element_strides(v, lowered.layouts[v]) for v in node.inputs])
            except Unsupported as why:
                report.declined.append((_name(node), str(why)))
            except Exception as error:  # noqa: BLE001 - a code generator bug costs this kernel only
                _failed(report, node, "the LLVM code generator failed", error)
            else:
                kernels[position] = info

    def load(self, lowered: Lowered, code: LLVMCode) -> CompiledProgram:
        library = load_objects(code.objects) if code.objects else None
        nodes = lowered.graph.nodes
        kernels = {}
        for position, info in code.kernels.items():
            assert library is not None, "kernels without object code"
            node = nodes[position]
            function = KERNEL_TYPE(library.address(info.symbol))
            kernels[node] = Kernel(function, info.extent, info.work_bytes, status=node.op in STATUS_OPS)
        return CompiledProgram(lowered.graph, kernels, lowered.plan, lowered.layouts, lowered.write_backs, library,
                               loops=lowered.loops)  # fmt: skip

    def encode(self, code: LLVMCode) -> bytes:
        # a kernel over symbolic sizes (a dynamic program's: ``frontend/jit/symbolic_cache.py``) keeps them
        kernels = [[p, *kernel_cache.info_record(k)] for p, k in code.kernels.items()]
        parts = [json.dumps(kernels).encode(), *code.objects]
        return b"".join(_LENGTH.pack(len(part)) + part for part in parts)

    def decode(self, data: bytes, graph: Graph) -> LLVMCode:
        parts, offset = [], 0
        while offset < len(data):
            (size,) = _LENGTH.unpack_from(data, offset)
            parts.append(data[offset + _LENGTH.size : offset + _LENGTH.size + size])
            offset += _LENGTH.size + size
        if offset != len(data) or not parts:
            raise ValueError("truncated LLVM code")
        kernels = {}
        for position, *record in json.loads(parts[0]):
            if graph.nodes[position].op != KERNEL and graph.nodes[position].op not in NATIVE_OPS:
                raise ValueError(f"node {position} of the stored graph is not a kernel")
            kernels[position] = kernel_cache.info_from_record(record)
        return LLVMCode(kernels, parts[1:])


def _pool_meanwhile() -> threading.Thread | None:
    """The native pool built (``threads.prepare_native_pool``) on a thread of its own while LLVM compiles
    the program's modules, if it is not built yet: else the program's first split kernel builds it, in
    the second call of a cold process (LLVM's compile of the pool's module, the tiny tier's target
    machine, the source digest of its cache key: 15 ms of the CNN's 16 ms second call)."""
    if not threads.native_pool_unbuilt():
        return None
    thread = threading.Thread(target=threads.prepare_native_pool, name="kiln-native-pool-build", daemon=True)
    thread.start()
    return thread


def load_objects(objects: list[bytes]):
    """The object code loaded: by kiln's own ELF loader where it applies (a cache hit then loads no
    LLVM at all), else through llvmlite's MCJIT. Both run the same machine code."""
    if elf.supported():
        try:
            return elf.LoadedObjects(objects)
        except elf.Unsupported as why:
            logger.debug("kiln: loading the object code through LLVM: %s", why)
    from . import engine  # noqa: PLC0415 - loads LLVM

    return engine.Library(objects)


def _native(node) -> str | None:
    """Why the primitive node ``node`` is not compiled as a function of its own (None: it is)."""
    return native_code(node.op).compilable(node)


def _eager_by_choice(node) -> bool:
    """Whether the native node runs on its eager kernel because that is faster (no fallback to report)."""
    eager_by_choice = getattr(native_code(node.op), "eager_by_choice", None)
    return eager_by_choice is not None and eager_by_choice(node) is not None


def _elements(value) -> int:
    """How many elements ``value`` holds (over symbolic sizes, more than any static kernel)."""
    return value.type.numel if not value.type.symbols else 1 << 62


def _element_strides(value, strides: tuple) -> tuple[int, ...]:
    size = value.type.dtype.itemsize
    return tuple(s // size for s in strides)


class _Batch:
    """A program's kernels, each generated once (an unrolled loop's steps share one function) and
    taken from the kernel cache where it holds them; ``compile`` makes the object code of the rest,
    several kernels to a module (``kernel_modules``), and stores it in the cache. A module goes to
    LLVM as soon as it is full (``compile_stream``), so LLVM works while the rest is generated."""

    def __init__(self, cache, deadline: float | None = None, kernels: int = 0) -> None:
        self.cache = cache
        self.deadline = deadline
        self.tiny = 0  # kernels compiled as cheaply as LLVM can (``TINY_BELOW_BYTES``)
        self.known: dict[str, KernelInfo] = {}  # kernel text -> its function
        self.cached: dict[bytes, None] = {}  # object code from the cache (a module's once, in order)
        self.from_cache = 0  # kernels taken from the cache
        self.modules_read: dict[str, bytes | None] = {}  # module key -> its object code from the cache
        self.modules = 0  # modules the pending kernels were compiled in
        self.pending: list[tuple[str, KernelInfo, str, Node]] = []  # (key, info, LLVM IR, node) to compile
        self.failed: set[str] = set()  # symbols of kernels LLVM failed on
        # the pending kernels not yet sent to LLVM; the first alone where the program (``kernels``
        # kernel nodes, counting an unrolled loop's steps) fills more than one module
        self.filling = kernel_modules.Modules(first_alone=kernels > kernel_modules.KERNELS_PER_MODULE)
        self.groups: list[list[int]] = []  # the pending kernels (positions) of each module sent, in order
        self.stream: CompileStream | None = None  # compiles the modules sent (started by the first)
        self.streaming: bool | None = None  # whether modules go to LLVM while generating (decided at the first)

    def add(self, node: Node, layouts: list) -> KernelInfo:
        """The kernel's function: already made, from the cache, or generated (``Unsupported`` when declined)."""
        text = kernel_cache.kernel_text(node, layouts)
        if text in self.known:
            return self.known[text]
        key = kernel_cache.kernel_key(text)
        payload = self.cache.get(key) if self.cache.enabled else None
        if payload is not None:
            try:
                info, its_module = kernel_cache.from_entry(payload, key)
            except ValueError as error:  # a bad entry is rebuilt, never trusted
                logger.debug("kiln: kernel cache entry did not load (%s); compiling the kernel again", error)
            else:
                code = self._module(its_module)
                if code is not None:
                    self.cached[code] = None  # the kernels of one module share its object code
                    self.from_cache += 1
                    self.known[text] = info
                    return info
        from . import engine  # noqa: PLC0415 - a cache hit loads code without LLVM
        from .kernels import KernelModule  # noqa: PLC0415 - a cache hit loads code without the generator

        module = KernelModule()
        info = module.add(node, layouts)
        ir, info = kernel_cache.renamed(module.ir(), info, kernel_cache.symbol(key))
        tier = _tier_line(info, ir, max((_elements(v) for v in node.outputs), default=0))
        self.tiny += tier == engine.TINY
        ir = tier + ir
        self.pending.append((key, info, ir, node))
        self.known[text] = info
        self._send(self.filling.add(len(self.pending) - 1, ir))
        return info

    def _send(self, group: list[int] | None) -> None:
        """The pending kernels ``group`` to LLVM as one module (None: nothing to send yet)."""
        if group is None:
            return
        from . import compile_stream, engine  # noqa: PLC0415 - a cache hit compiles nothing

        if self.streaming is None:
            self.streaming = compile_stream.worth_it()
        if not self.streaming:  # a busy machine: every module in one request at the end
            return
        if self.stream is None:
            self.stream = compile_stream.CompileStream(_seconds_left(self.deadline))
        self.groups.append(group)
        self.stream.submit(engine.join_modules([self.pending[k][2] for k in group]))

    def cancel(self) -> None:
        """Compile no more modules (the generator raised)."""
        if self.stream is not None:
            self.stream.cancel()

    def _module(self, key: str) -> bytes | None:
        """The object code of the module entry ``key`` (read once a program; None: missing or wrong)."""
        if key not in self.modules_read:
            self.modules_read[key] = kernel_cache.module_of(self.cache.get(key), key)
            if self.modules_read[key] is None:
                logger.debug("kiln: a kernel's module is not in the kernel cache; compiling the kernel again")
        return self.modules_read[key]

    def compile(self, report: LoweringReport, deadline: float | None) -> list[bytes]:
        """The object code of every kernel: the cached ones' and the new ones' (stored in the cache),
        several kernels to a module (``kernel_modules``). Should LLVM fail on the request, each kernel is
        compiled alone, to find the kernels it fails on (they go to ``failed`` and run on the
        interpreter); past the ``deadline`` every kernel runs on the interpreter (``_abandon``)."""
        from . import worker  # noqa: PLC0415 - a cache hit loads code without LLVM

        if not self.pending:
            return list(self.cached)
        compiled: list[bytes | None] | None
        try:
            compiled = self._in_modules()
        except worker.CompileTimeout as error:
            _abandon(report, len(self.known), error)
            return []
        except Exception as error:  # noqa: BLE001 - attributed to its kernels below
            if os.environ.get("KILN_JIT_STRICT") == "1":
                raise
            logger.debug("kiln: LLVM failed on the kernels (%s); compiling them one by one", error)
            compiled = self._one_by_one(report, deadline)
            if compiled is None:
                return []
        if self.cache.enabled:
            self._store(compiled)
        return list(dict.fromkeys([*self.cached, *(code for code in compiled if code is not None)]))

    def _store(self, compiled: list[bytes | None]) -> None:
        """Each module's object code in the cache once, then the entries of its kernels, naming it."""
        modules = {code: kernel_cache.module_key(code) for code in compiled if code is not None}
        for code, key in modules.items():
            self.cache.put(key, code)
        for (key, info, _, _), obj in zip(self.pending, compiled, strict=True):
            if obj is not None:
                self.cache.put(key, kernel_cache.to_entry(info, modules[obj]))

    def _in_modules(self) -> list[bytes | None]:
        """Each pending kernel's object code: its module's, several kernels to a module. Streaming,
        the modules ``Modules`` cut, the last ones sent now; else those of ``kernel_modules.grouped``,
        in one request."""
        from . import engine  # noqa: PLC0415

        if self.stream is not None:
            for group in self.filling.rest():
                self._send(group)
            groups, objects = self.groups, self.stream.finish()
        else:
            groups = kernel_modules.grouped([ir for _, _, ir, _ in self.pending])
            texts = [engine.join_modules([self.pending[k][2] for k in group]) for group in groups]
            objects = engine.compile_many(texts, _seconds_left(self.deadline))
        self.modules = len(groups)
        compiled: list[bytes | None] = [None] * len(self.pending)
        for group, code in zip(groups, objects, strict=True):
            for k in group:
                compiled[k] = code
        return compiled

    def _one_by_one(self, report: LoweringReport, deadline: float | None) -> list[bytes | None] | None:
        from . import engine, worker  # noqa: PLC0415

        compiled: list[bytes | None] = []
        self.modules = len(self.pending)
        for _, info, ir, node in self.pending:
            try:
                compiled.append(engine.compile_ir(ir, _seconds_left(deadline)))
            except worker.CompileTimeout as error:
                _abandon(report, len(self.known), error)
                return None
            except Exception as error:  # noqa: BLE001 - this kernel runs on the interpreter
                _failed(report, node, "LLVM failed on its code", error)
                self.failed.add(info.symbol)
                compiled.append(None)
        return compiled


def light(info: KernelInfo) -> bool:
    """Whether the kernel of ``info`` is optimized lightly (``LIGHT_BELOW_BYTES``), or less (``tiny``)."""
    return not info.symbols and info.fixed_work_bytes < LIGHT_BELOW_BYTES


def tiny(info: KernelInfo) -> bool:
    """Whether the kernel of ``info`` is compiled as cheaply as LLVM can (``TINY_BELOW_BYTES``)."""
    return not info.symbols and info.fixed_work_bytes < TINY_BELOW_BYTES


def _tier_line(info: KernelInfo, ir: str, elements: int) -> str:
    """The first line of the kernel's module (LLVM IR ``ir``, at most ``elements`` elements in an
    output) that tells LLVM how hard to work (``engine``). A kernel calling kiln's math routines
    (``kiln.math.exp.f32``...) is tiny only over ``TINY_MATH_ELEMENTS`` elements or fewer:
    unoptimized, each element's call costs tens of instructions more."""
    from .engine import LIGHT, TINY  # noqa: PLC0415 - LLVM is loaded to compile it anyway

    if tiny(info) and ("kiln.math." not in ir or elements <= TINY_MATH_ELEMENTS):
        return TINY
    return LIGHT if light(info) else ""


def _seconds_left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


def _abandon(report: LoweringReport, kernels: int, error: Exception) -> None:
    """The compile deadline passed: every kernel runs on the interpreter, and the driver caches
    nothing (the next compile, in this process or another, tries again). ``KILN_JIT_STRICT=1``
    raises instead: in tests, a compile that long is a bug to see."""
    why = (f"code generation passed its deadline ({error}); the program's {kernels} kernel(s) run on the "
           "interpreter and nothing is cached. The limit is kiln.CompileOptions(compile_timeout=seconds), by default "
           "$KILN_COMPILE_TIMEOUT or 60 s")  # fmt: skip
    if os.environ.get("KILN_JIT_STRICT") == "1":
        raise error
    logger.warning("kiln.compile: %s", why)
    report.abandoned = why
    report.declined.append(("(compile deadline)", why))


def _failed(report: LoweringReport, node: Node, what: str, error: Exception) -> None:
    if os.environ.get("KILN_JIT_STRICT") == "1":
        raise error
    why = f"{what} ({type(error).__name__}: {error}); a bug in kiln, please report it"
    logger.warning("kiln.compile: kernel %s runs on the interpreter: %s", _name(node), why)
    report.declined.append((_name(node), why))


def _name(node: Node) -> str:
    """A kernel node's name, or a compiled primitive node's op (``unfold``)."""
    return node.attrs.get("name", node.op)
