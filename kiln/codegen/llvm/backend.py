"""The LLVM backend: kernel nodes compiled for the host CPU through llvmlite, loaded with ctypes.

``generate`` puts every kernel of a program into one LLVM module, so LLVM is invoked once; the
window nodes of convolution (``unfold``, ``fold``: ``window``), direct convolutions
(``conv``, ``conv_weight``: ``conv``), the gathers and scatters of embeddings
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
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...ir.dtypes import float16
from ...ir.graph import KERNEL, Graph, Node
from ...ir.types import Sym
from ...runtime import elf
from ...runtime.executor import KERNEL_TYPE, CompiledProgram, Kernel
from ..backend import Lowered, LoweringReport
from . import Unsupported, host
from .kernel_info import NATIVE_OPS, STATUS_OPS, KernelInfo, native_code

if TYPE_CHECKING:
    from .kernels import KernelModule

logger = logging.getLogger("kiln")

_LENGTH = struct.Struct("<Q")


@dataclass
class LLVMCode:
    """Each compiled kernel (by its position in the graph) and the object code holding them all."""

    kernels: dict[int, KernelInfo]
    objects: list[bytes]


class LLVMBackend:
    """See the module docstring; chosen for graphs on the CPU."""

    name = "llvm"
    stages: tuple[str, ...] = ("fuse", "infer_layouts", "choose_write_backs", "plan_memory")

    def declines(self, node: Node) -> str | None:
        for v in (*node.inputs, *node.outputs):
            if v.type.dtype is float16 or v.type.dtype.short == "bf16":  # bfloat16 exists only once ml_dtypes is in
                return f"{v.type.dtype.name} has no LLVM kernels"
        axes = node.attrs.get("axes") if node.op.startswith("reduce_") else None
        if axes is not None and any(isinstance(node.inputs[0].type.shape[a], Sym) for a in axes):
            # symbolic compiles rows over the symbol, not a sum across it: fused, the whole
            # kernel would run on the interpreter; alone, the reduction runs on its eager kernel
            return "a reduction over a symbolic dimension has no LLVM kernel"
        return None

    def takes_epilogue(self, node: Node) -> bool:
        from .conv_epilogue import takes_epilogue  # noqa: PLC0415 - a cache hit loads code without the generator

        return takes_epilogue(node)

    def signature(self) -> str:
        return host.signature()

    def prepare(self, deadline: float | None) -> None:
        """A compile with a deadline runs in the worker process: start it now, while the passes run,
        so its start-up (about 0.2 s: Python and llvmlite) overlaps them instead of adding to them."""
        if deadline is not None:
            from . import engine  # noqa: PLC0415 - loads LLVM, which loading the program needs anyway

            engine.start_worker()

    def generate(self, lowered: Lowered, report: LoweringReport) -> LLVMCode:
        from .kernels import KernelModule  # noqa: PLC0415 - a cache hit loads code without the generator

        module = KernelModule()
        kernels: dict[int, KernelInfo] = {}
        strides: dict[int, list] = {}
        for position, node in enumerate(lowered.graph.nodes):
            if node.op in NATIVE_OPS:
                why = _native(node)
                if why is not None:
                    if not _eager_by_choice(node):  # a fallback is said: "conv: conv with stride (2, 1) runs on ..."
                        report.declined.append((f"({node.op})", why))
                    continue
            elif node.op != KERNEL:
                continue
            strides[position] = [_element_strides(v, lowered.layouts[v]) for v in node.inputs]
            try:
                kernels[position] = module.add(node, strides[position])
            except Unsupported as why:
                report.declined.append((_name(node), str(why)))
            except Exception as error:  # noqa: BLE001 - a code generator bug costs this kernel only
                _failed(report, node, "the LLVM code generator failed", error)
        objects = _compile(module, lowered.graph, kernels, strides, report, lowered.deadline) if kernels else []
        report.kernels = len(kernels)
        return LLVMCode(kernels, objects)

    def load(self, lowered: Lowered, code: LLVMCode) -> CompiledProgram:
        library = load_objects(code.objects) if code.objects else None
        nodes = lowered.graph.nodes
        kernels = {}
        for position, info in code.kernels.items():
            assert library is not None, "kernels without object code"
            node = nodes[position]
            function = KERNEL_TYPE(library.address(info.symbol))
            kernels[node] = Kernel(function, info.extent, info.work_bytes, status=node.op in STATUS_OPS)
        return CompiledProgram(lowered.graph, kernels, lowered.plan, lowered.layouts, lowered.write_backs, library)

    def encode(self, code: LLVMCode) -> bytes:
        kernels = [[p, k.symbol, k.extent, k.work_bytes] for p, k in code.kernels.items()]
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
        for position, symbol, extent, work in json.loads(parts[0]):
            if graph.nodes[position].op != KERNEL and graph.nodes[position].op not in NATIVE_OPS:
                raise ValueError(f"node {position} of the stored graph is not a kernel")
            kernels[position] = KernelInfo(symbol, extent, work)
        return LLVMCode(kernels, parts[1:])


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


def _element_strides(value, strides: tuple) -> tuple[int, ...]:
    size = value.type.dtype.itemsize
    return tuple(s // size for s in strides)


def _compile(module: KernelModule, graph: Graph, kernels: dict, strides: dict, report: LoweringReport,
             deadline: float | None) -> list[bytes]:  # fmt: skip
    """Object code for ``kernels``: one LLVM compile of the whole module. Should LLVM fail on it, each
    kernel is compiled in a module of its own, to find the kernels it fails on; those leave
    ``kernels`` (they run on the interpreter) and the others keep their own object code. Past the
    ``deadline`` every kernel left runs on the interpreter (``_abandon``)."""
    from . import engine, worker  # noqa: PLC0415 - a cache hit loads code without LLVM

    try:
        return [engine.compile_ir(module.ir(), _seconds_left(deadline))]
    except worker.CompileTimeout as error:
        _abandon(report, kernels, error)
        return []
    except Exception as error:  # noqa: BLE001 - attributed to its kernels below
        if os.environ.get("KILN_JIT_STRICT") == "1":
            raise
        logger.debug("kiln: LLVM failed on the module (%s); compiling its kernels one by one", error)
    from .kernels import KernelModule  # noqa: PLC0415 - see ``generate``

    objects = []
    for position in list(kernels):
        node, alone = graph.nodes[position], KernelModule()
        try:
            kernels[position] = alone.add(node, strides[position])
            objects.append(engine.compile_ir(alone.ir(), _seconds_left(deadline)))
        except worker.CompileTimeout as error:
            _abandon(report, kernels, error)
            return []
        except Exception as error:  # noqa: BLE001 - this kernel runs on the interpreter
            _failed(report, node, "LLVM failed on its code", error)
            del kernels[position]
    return objects


def _seconds_left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


def _abandon(report: LoweringReport, kernels: dict, error: Exception) -> None:
    """The compile deadline passed: every kernel runs on the interpreter, and the driver caches
    nothing (the next compile, in this process or another, tries again). ``KILN_JIT_STRICT=1``
    raises instead: in tests, a compile that long is a bug to see."""
    why = (f"code generation passed its deadline ({error}); the program's {len(kernels)} kernel(s) run on the "
           "interpreter and nothing is cached. The limit is kiln.CompileOptions(compile_timeout=seconds), by default "
           "$KILN_COMPILE_TIMEOUT or 60 s")  # fmt: skip
    if os.environ.get("KILN_JIT_STRICT") == "1":
        raise error
    logger.warning("kiln.compile: %s", why)
    report.abandoned = why
    report.declined.append(("(compile deadline)", why))
    kernels.clear()


def _failed(report: LoweringReport, node: Node, what: str, error: Exception) -> None:
    if os.environ.get("KILN_JIT_STRICT") == "1":
        raise error
    why = f"{what} ({type(error).__name__}: {error}); a bug in kiln, please report it"
    logger.warning("kiln.compile: kernel %s runs on the interpreter: %s", _name(node), why)
    report.declined.append((_name(node), why))


def _name(node: Node) -> str:
    """A kernel node's name, or a compiled primitive node's op (``unfold``)."""
    return node.attrs.get("name", node.op)
