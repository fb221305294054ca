"""LLVM for kiln: the host target, the optimization pipeline, object code and loaded libraries.

Every kernel kiln compiles goes through here. ``compile_ir(text)`` parses LLVM IR, optimizes it
for the host CPU (its name and features, so AVX-512 is used where the machine has it) and
returns object code; ``Library(objects)`` loads object code into a JIT engine and hands out
function addresses. Splitting the two steps is what makes the on-disk cache possible: a cache
hit skips straight to ``Library``.

``host_signature()`` names everything that decides what machine code comes out (llvmlite's and
LLVM's versions, the CPU name and features): the disk cache keys on it, so an object built for
another machine or another LLVM is never loaded.
"""

from __future__ import annotations

import functools
import logging
import threading

import llvmlite
import llvmlite.binding as llvm

logger = logging.getLogger("kiln")

OPT_LEVEL = 3  # the code generator's (instruction selection, scheduling, register allocation)
#: The optimization pipeline's level (``PassBuilder``'s O2 with loop and SLP vectorization on): O3's
#: extra passes (more aggressive unswitching and instcombine, a higher inline threshold) change 13 of
#: the 143 kernels of DCGAN, the CNN, the GPT and the LSTM LM, the CNN's six largest 2-4x smaller,
#: and cost LLVM 8% more time (the CNN's 15%). Measured (one process, interleaved blocks of steps,
#: a busy machine), the O2 step time over O3's: DCGAN 1.011x and 1.002x, CNN 0.995x and 0.971x, GPT
#: 0.991x and 1.010x, LSTM LM 0.920x and 1.003x (its blocks spread 0.77-1.23): no slower.
PIPELINE_LEVEL = 2
#: The first line of a module to optimize lightly: no loop unrolling (vectorization and the
#: vectorizer's interleaving stay). Unrolling roughly doubles LLVM's time on kiln's kernels (the
#: optimizer and the code generator then work on several copies of each vectorized loop: DCGAN's
#: 63 kernels 2.5 s -> 1.4 s, the CNN's 1.9 -> 1.1 s) and pays only on kernels with much work per
#: call; the backend chooses per kernel (``backend.LIGHT_BELOW_BYTES``). A comment, so the module
#: stays valid LLVM IR and the worker's protocol needs nothing new.
LIGHT = "; kiln: light\n"
#: The first line of a module to compile as cheaply as LLVM can (a kernel of almost no work: the
#: optimizer scalars, a bias's few elements): two cleanup passes, then LLVM's fast instruction
#: selector and register allocator (the code generator's level 0). Its time is spent in the call,
#: not in the loop: measured on DCGAN's 23 smallest kernels, LLVM's time 0.27 s -> 0.03 s and the step
#: runs as fast (``backend.TINY_BELOW_BYTES``).
TINY = "; kiln: tiny\n"
#: Between the modules of one text (``join_modules``): LLVM parses each and links them into one module,
#: which it optimizes and makes object code of once. Each module costs the pipeline's and the code
#: generator's set-up (pass managers, analyses, the object file): measured (CPU time, one process) over
#: DCGAN's 63 kernels, 0.55 s a module each, 0.46 s four to a module, 0.44 s eight; the CNN's 43: 0.45,
#: 0.39, 0.39 s. A comment line, so the worker's protocol needs nothing new (a request is still texts).
NEXT_MODULE = "\n; kiln: next module\n"

_lock = threading.Lock()  # LLVM's global state (targets, contexts) is not thread safe
#: The compile count, never held while LLVM runs: under ``_lock``, a thread that only counted its request
#: (or started the workers, which takes no lock now) waited for another thread's compile in this process
#: (a cold DCGAN's first call: 33-117 ms, starting the workers while the eager thread compiled a product
#: kernel).
_count_lock = threading.Lock()


@functools.cache
def _initialized() -> bool:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return True


@functools.cache
def target_machine(opt: int = OPT_LEVEL) -> llvm.TargetMachine:
    """The host's target machine: its CPU and features, position-independent code, its code
    generator at level ``opt`` (0 for ``TINY`` modules)."""
    return _new_target_machine(opt)


def _new_target_machine(opt: int = OPT_LEVEL) -> llvm.TargetMachine:
    _initialized()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=opt,
        reloc="pic", codemodel="default",
    )  # fmt: skip


@functools.cache
def host_signature() -> str:
    """What decides the machine code besides the IR: versions, triple, CPU name and features."""
    _initialized()
    return (
        f"llvmlite {llvmlite.__version__}; llvm {'.'.join(map(str, llvm.llvm_version_info))}; "
        f"{llvm.get_default_triple()}; {llvm.get_host_cpu_name()}; {llvm.get_host_cpu_features().flatten()}"
    )


def triple() -> str:
    _initialized()
    return llvm.get_default_triple()


def data_layout() -> str:
    return str(target_machine().target_data)


def _optimize(module: llvm.ModuleRef, light: bool = False) -> None:
    # A pass builder per compile, on purpose. llvmlite (0.50) gives each pass builder a
    # PassInstrumentationCallbacks that nothing frees (about 70 KB: the names of every pass), so
    # each compile keeps that much; but a builder must not be reused: each run registers the
    # callbacks of a StandardInstrumentations that lives on the C++ stack of that run only, and
    # later runs through the same builder call them (reusing one aborted on an LLVM assertion).
    options = llvm.create_pipeline_tuning_options(speed_level=PIPELINE_LEVEL)
    options.loop_vectorization = True
    options.slp_vectorization = True
    options.loop_unrolling = not light
    builder = llvm.create_pass_builder(target_machine(), options)
    builder.getModulePassManager().run(module, builder)


def _clean_up(module: llvm.ModuleRef) -> None:
    """A ``TINY`` module's passes: fold the generator's redundant index arithmetic and branches."""
    builder = llvm.create_pass_builder(target_machine(0), llvm.create_pipeline_tuning_options(speed_level=1))
    passes = llvm.create_new_module_pass_manager()
    passes.add_instruction_combine_pass()
    passes.add_simplify_cfg_pass()
    passes.run(module, builder)


def join_modules(texts: list[str]) -> str:
    """One text of the modules ``texts`` (each kernel's), compiled as one module (``NEXT_MODULE``):
    their functions must have distinct names; what is internal to each (kiln's math routines, tables)
    may share names, the linker renames it."""
    return NEXT_MODULE.join(texts)


def parse(ir_text: str) -> llvm.ModuleRef:
    """Parse and verify LLVM IR text, the modules of a ``join_modules`` text linked into one (raises
    ``RuntimeError`` naming LLVM's complaint)."""
    _initialized()
    first, *others = ir_text.split(NEXT_MODULE)
    module = llvm.parse_assembly(first)
    for text in others:
        module.link_in(llvm.parse_assembly(text))
    module.verify()
    return module


def _optimized(ir_text: str) -> llvm.ModuleRef:
    module = parse(ir_text)
    module.triple = triple()
    module.data_layout = data_layout()
    if ir_text.startswith(TINY):
        _clean_up(module)
    else:
        _optimize(module, light=ir_text.startswith(LIGHT))
    return module


def _machine(ir_text: str) -> llvm.TargetMachine:
    """The target machine that makes the machine code of ``ir_text`` (by its first line)."""
    return target_machine(0 if ir_text.startswith(TINY) else OPT_LEVEL)


def _object(ir_text: str) -> bytes:
    return _machine(ir_text).emit_object(_optimized(ir_text))


_compiles = 0


def compile_ir(ir_text: str, timeout: float | None = None) -> bytes:
    """Optimized object code for the host from LLVM IR text: in this process for its first
    ``worker.IN_PROCESS_COMPILES`` modules, then in a worker process (see ``worker.py``: llvmlite
    keeps memory for good per compile). With a ``timeout`` (seconds) the compile always runs in
    the worker, where it can be stopped: ``worker.CompileTimeout`` when it does not finish in time
    (at once for a timeout <= 0). Where no worker can start, compiles run here, without a limit."""
    return compile_many([ir_text], timeout)[0]


def compile_many(ir_texts: list[str], timeout: float | None = None) -> list[bytes]:
    """``compile_ir`` for several modules at once (one object each), in one request to the worker:
    each module counts as one compile, towards ``IN_PROCESS_COMPILES`` and the worker's
    ``WORKER_COMPILES``. ``RuntimeError`` when LLVM fails on any of them."""
    global _compiles
    from . import worker, worker_pool  # noqa: PLC0415

    if not ir_texts:
        return []
    if timeout is not None and timeout <= 0:
        raise worker.CompileTimeout("the compile's time was spent before LLVM started")
    with _count_lock:
        _compiles += len(ir_texts)
        outside = (timeout is not None or _compiles > worker.IN_PROCESS_COMPILES) and not worker.WORKER.broken
    if outside:  # the workers serve one thread each: no lock here, so two threads compile at once
        try:
            return worker_pool.compile_in_workers(ir_texts, timeout)
        except OSError as error:
            worker.WORKER.broken = True
            logger.warning("kiln: the LLVM compile worker could not start (%s); compiling in this process", error)
    with _lock:
        return [_object(text) for text in ir_texts]


def start_worker() -> None:
    """Start the compile worker processes that are not running (they load in the background); the
    next ``compile_ir`` with a time limit then finds them ready."""
    from . import worker, worker_pool  # noqa: PLC0415

    # no lock: a worker is started by the thread that claims it (``worker_pool``), and LLVM is not involved
    if not worker.WORKER.broken:
        try:
            worker_pool.start_all()
        except OSError as error:
            worker.WORKER.broken = True
            logger.warning("kiln: the LLVM compile worker could not start (%s); compiling in this process", error)


#: An empty function, compiled by each compile worker as it starts (``warm_up``).
_WARM_UP = "define void @kiln_warm_up() {\n  ret void\n}\n"


def warm_up() -> None:
    """Compile an empty function at the light and the tiny tier (the two target machines) and
    forget it: a new process's first compile pays once for LLVM's set-up (target machines, pass and
    code generator state), measured (CPU time, fresh processes) ~7.5 ms more for a light and a tiny
    kernel of DCGAN than their next compile. This pays ~6 ms of it for ~8.5 ms; a compile worker
    does it as it starts, while its caller's passes run (``LLVMBackend.prepare``), so the first
    module of a program, which the caller waits for, comes sooner."""
    for tier in (LIGHT, TINY):
        compile_here(tier + _WARM_UP)


def compile_here(ir_text: str) -> bytes:
    """``compile_ir`` in this process, whatever the count (the worker's own compiles)."""
    with _lock:
        return _object(ir_text)


def assembly(ir_text: str) -> str:
    """The optimized host assembly of LLVM IR text (tests look for vector registers in it)."""
    with _lock:
        return _machine(ir_text).emit_assembly(_optimized(ir_text))


class Library:
    """Object code loaded into memory; ``address(name)`` gives a function's entry point.

    The library keeps its engine alive; function pointers taken from it are valid while the
    library object lives, so whoever calls them holds a reference to it.
    """

    def __init__(self, objects: list[bytes]) -> None:
        with _lock:
            _initialized()
            empty = llvm.parse_assembly(f'target triple = "{triple()}"\n')
            # The engine takes ownership of its target machine (and frees it): give it its own.
            self._engine = llvm.create_mcjit_compiler(empty, _new_target_machine())
            for obj in objects:
                self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            self._engine.finalize_object()

    def address(self, name: str) -> int:
        address = self._engine.get_function_address(name)
        if not address:
            raise KeyError(f"the compiled library has no function {name!r}")
        return address
