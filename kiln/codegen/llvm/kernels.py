"""Kernel nodes compiled to LLVM IR: ``KernelModule.add(node, layouts) -> KernelInfo``.

Every kernel is one function ``void @sym(ptr args, i64 begin, i64 end)``: ``args`` holds the data
pointers of ``node.inputs`` then ``node.outputs`` (element [0, ..., 0] of each), and the call does
the parallel units ``[begin, end)`` of ``range(info.extent)``. Code is specialized on the static
shapes and on the inputs' strides (``layouts``, in elements; 0 broadcasts, negative runs
backwards); outputs are C-contiguous. Over a symbolic leading (batch) dimension the size follows
the pointers in ``args`` and ``info.units(sizes)`` is the number of units (``symbolic``).

A kernel's kind picks its generator from the table in ``kinds`` (a kind without one is declined).
The built-in kinds' generators are modules of their own, each building on the shared core
(``body``: the DAG emitted as IR; ``loops``: loops, loop nests, index arithmetic) and on the plans
both code generators share (kiln/codegen/plans.py): ``elementwise``, ``reduction``, ``horizontal``
and ``conv_epilogue``. A primitive compiled as a function of its own (``kernel_info.NATIVE_FAMILIES``:
``window`` and ``tiles``, ``gather_scatter``, ``conv``, ``leading_sums``) is added the same way.

In-place safety: the executor may give an output the buffer of an input read at the same index.
Each element's loads are emitted before its stores, and the innermost loops are declared parallel
(``llvm.loop.parallel_accesses``) instead of marking pointers ``noalias``: no iteration reads what
another iteration writes, which holds for in-place buffers too, so no ``noalias`` promise is ever
broken and the vectorizer needs no runtime overlap check (which in-place buffers would fail).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeAlias

from llvmlite import ir

from ...ir.graph import KERNEL, Graph, Node, body_inputs_outputs, structure_key
from ..core import Unsupported
from ..kernel_dag import VIEWS
from ..plans import check_layouts, checked_bodies
from .body import POINTER
from .emitter import register_type
from .kernel_info import NATIVE_OPS, KernelInfo, moved_bytes, native_code
from .kinds import kind_generator
from .loops import I64
from .symbolic import symbolic_dimension, symbolic_work_bytes
from .symbolic_rows import emit_rows, row_domain, row_work_terms

__all__ = ["KernelInfo", "KernelModule", "Unsupported"]

_Builder: TypeAlias = ir.IRBuilder


class KernelModule:
    """Collects kernels into one LLVM module; ``ir()`` is its text for ``engine.compile_ir``."""

    def __init__(self, name: str = "kiln_kernels") -> None:
        self.module = ir.Module(name)
        self._symbols: set[str] = set()
        self._known: dict[tuple, KernelInfo] = {}  # kernel key -> the function already made for it

    def add(self, node: Node, layouts: Sequence[tuple[int, ...]]) -> KernelInfo:
        """Compile kernel ``node`` for inputs with element strides ``layouts``; ``Unsupported`` when
        the code generator declines (the module is left as it was)."""
        if node.op in NATIVE_OPS:
            return self._add_native(node, layouts)
        kind = node.attrs.get("kind")
        check_layouts(node, layouts)
        generator = kind_generator(kind)
        if generator is None or not isinstance(kind, str):
            raise Unsupported(f"the LLVM backend has no generator for kernel kind {kind!r}")
        bodies = checked_bodies(node)
        for body in bodies:
            for value in body.values():
                register_type(value.type.dtype)  # raises Unsupported for float16 and friends
        rows = row_domain(node)
        sym = None if rows is not None else symbolic_dimension(node, layouts, None if generator.symbolic else kind)
        key = _kernel_key(kind, bodies, layouts)
        if key in self._known:  # the same code (an unrolled loop's steps, repeated blocks): one function
            return self._known[key]
        symbol = self._symbol(str(node.attrs.get("name", "kernel")))
        existing = set(self.module.globals)
        try:
            builder, args = self._function(symbol)
            extent = (emit_rows if rows is not None else generator.emit)(builder, args, node, layouts)
        except BaseException:
            self._drop_new_functions(existing)
            raise
        if rows is not None:  # rows of a symbolic length: the size slots hold R (if symbolic), then n
            assert isinstance(extent, tuple)
            count, n = rows
            if isinstance(count, int):  # a unit a row, R of them whatever n
                info = KernelInfo(symbol, count, 0, (n,), 0, 1, work_terms=row_work_terms(node))
            else:
                info = KernelInfo(symbol, 0, 0, (count, n), extent[0], extent[1], work_terms=row_work_terms(node))
        elif isinstance(extent, int):
            info = KernelInfo(symbol, extent, _work_bytes(node))
        else:  # (rows per unit of the size, rows per unit) of a kernel over ``sym``
            assert sym is not None
            fixed, per_size = symbolic_work_bytes(node, sym)
            info = KernelInfo(symbol, 0, fixed, (sym,), extent[0], extent[1], per_size)
        self._known[key] = info
        return info

    def _add_native(self, node: Node, layouts: Sequence[tuple[int, ...]]) -> KernelInfo:
        """A primitive compiled as a function of its own by its family's module (``NativeFamily``): a
        window node (unfold, fold: ``window``), an index node (take, index_put:
        ``gather_scatter``), a direct convolution (conv, conv_weight: ``conv``) or a sum of
        rows (reduce_sum keeping the last axis: ``leading_sums``)."""
        check_layouts(node, layouts)
        symbolic = any(v.type.symbols for v in (*node.inputs, *node.outputs))
        family = native_code(node.op)
        symbolic_info = getattr(family, "symbolic_info", None)  # a family's units over symbolic sizes
        if symbolic and symbolic_info is None and node.op != "reduce_sum":
            raise Unsupported(f"{node.op} over a symbolic dimension runs on its eager kernel")
        emit = family.emit
        key = ("native", node.op, node.attr_key(), tuple(v.type for v in (*node.inputs, *node.outputs)),
               tuple(map(tuple, layouts)))  # fmt: skip
        if key in self._known:
            return self._known[key]
        symbol = self._symbol(node.op)
        existing = set(self.module.globals)
        try:
            builder, args = self._function(symbol)
            extent = emit(builder, args, node, layouts)
        except BaseException:
            self._drop_new_functions(existing)
            raise
        if symbolic and symbolic_info is not None:  # index positions (gather_scatter.py), a batch (conv.py)
            symbols, fixed_extent, per_size, per_unit, fixed, bytes_per_size = symbolic_info(node, extent)
            info = KernelInfo(symbol, fixed_extent, fixed, symbols, per_size, per_unit, bytes_per_size)
            self._known[key] = info
            return info
        symbols = node.inputs[0].type.symbols if node.inputs else ()
        if symbols:  # a sum over a symbolic leading size (leading_sums): its units do not depend on it
            fixed, per_size = symbolic_work_bytes(node, symbols[0])
            info = self._known[key] = KernelInfo(symbol, extent, fixed, symbols[:1], 0, 1, per_size)
            return info
        info = self._known[key] = KernelInfo(symbol, extent, _work_bytes(node))
        return info

    def _drop_new_functions(self, existing: set[str]) -> None:
        """Leave the module as it was before a kernel that failed: a half-built function would make
        the whole module invalid. The declarations it added (intrinsics, libm) stay: they are valid
        alone, and their names stay taken in the module's scope, so a later kernel reuses them."""
        for name in set(self.module.globals) - existing:
            value = self.module.globals[name]
            if not (isinstance(value, ir.Function) and value.is_declaration):
                del self.module.globals[name]

    def ir(self) -> str:
        """The module's LLVM IR text (every kernel added so far)."""
        return str(self.module)

    def _symbol(self, name: str) -> str:
        base = "kiln_" + re.sub(r"\W", "_", name)
        symbol, k = base, 1
        while symbol in self._symbols or self.module.scope.is_used(symbol):  # declined kernels keep their name
            symbol, k = f"{base}_{k}", k + 1
        self._symbols.add(symbol)
        return symbol

    def _function(self, symbol: str) -> tuple[_Builder, tuple]:  # (in this class, ``ir`` is the method)
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [POINTER, I64, I64]), symbol)
        fn.attributes.add("nounwind")
        for arg, name in zip(fn.args, ("args", "begin", "end"), strict=True):
            arg.name = name
        return ir.IRBuilder(fn.append_basic_block("entry")), fn.args


def _kernel_key(kind: str, bodies: Sequence[Graph], layouts: Sequence[tuple[int, ...]]) -> tuple:
    """What decides a kernel's code: its bodies' structure, every value's shape, the view
    attributes (which ``structure_key`` leaves out) and the inputs' layouts."""
    parts = tuple(
        (
            structure_key(b),
            tuple(v.type.shape for v in b.values()),
            tuple(n.attr_key() for n in b.nodes if n.op in VIEWS),
        )
        for b in bodies
    )
    return kind, parts, tuple(tuple(s) for s in layouts)


def _work_bytes(node: Node) -> int:
    """Bytes read and written (what decides whether the thread pool is worth its dispatch). An
    input that the body reads only through a smaller view (an LSTM step's slice of the whole
    sequence's input projection) counts that view's size, not the whole array's."""
    if node.op != KERNEL:
        own = getattr(native_code(node.op), "work_bytes", None)  # take, conv: their own count
        if own is not None:
            return own(node)
        return moved_bytes(node)
    total = sum(v.type.numel * v.type.dtype.itemsize for v in node.outputs)
    generator = kind_generator(node.attrs["kind"])
    if generator is not None and generator.arithmetic is not None:
        total += generator.arithmetic(node)
    for body, outer, _ in body_inputs_outputs(node):
        uses = body.uses()
        for inner, value in zip(body.inputs, outer, strict=True):
            readers = uses.get(inner, [])
            read = value.type.numel
            if readers and all(n.op in VIEWS for n in readers):
                read = min(read, sum(n.output.type.numel for n in readers))
            total += read * value.type.dtype.itemsize
    return total
