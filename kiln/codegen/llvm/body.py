"""The core every LLVM kernel generator builds on: a kernel body's scalar DAG emitted as LLVM IR.

A kernel function is ``void @sym(ptr args, i64 begin, i64 end)`` (kiln/codegen/llvm/kernels.py);
``operand_pointers`` reads its operands' data pointers from ``args`` and ``element_pointer``
addresses an element. ``KernelBody`` emits a body's outputs (``plans.KernelOutput``: an operand,
a DAG root of kiln/codegen/kernel_dag.py, a store offset) at the builder's position, every load of
an element before its stores; ``DagEmitter`` emits the DAG nodes themselves through the scalar
formulas of the primitives, and ``Accumulator`` holds a reduction's running value.

A ``Scope`` holds what is already emitted where it dominates the current position: the row scope
of a reduction kernel holds each finished reduction's value, and every loop body opens a child
scope (values emitted in one loop do not dominate the next loop). Offsets are materialized from
``Lin`` expressions through ``loops.VarEnv``, which maps each domain variable to its loop value --
or to nothing when collapsing folded it into the next variable's loop (kiln/codegen/index.py: collapse).

A whole generator on this core, the plans and ``loops.nest`` fits in ten lines: see the test-only
kind of tests/codegen/llvm/test_kernel_core.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from ...ir.dtypes import DType
from ...ir.primitives import PRIMITIVES
from ..core import Unsupported
from ..kernel_dag import Apply, Const, Load, Node, Reduce, evaluate
from ..plans import KernelOutput
from .emitter import LLVMEmitter, Scalar, load, memory_type, register_type, store
from .loops import VarEnv, add, i64

__all__ = ["POINTER", "Accumulator", "DagEmitter", "KernelBody", "Scope", "element_pointer", "operand_pointers"]


class Scope:
    """Emitted scalars by DAG node (identity), falling back to the enclosing scope."""

    def __init__(self, parent: Scope | None = None) -> None:
        self.parent = parent
        self.values: dict[int, Scalar] = {}

    def get(self, node: Node) -> Scalar | None:
        """``node``'s emitted scalar here or in an enclosing scope; None where it is not emitted."""
        scope: Scope | None = self
        while scope is not None:
            found = scope.values.get(id(node))
            if found is not None:
                return found
            scope = scope.parent
        return None

    def child(self) -> Scope:
        """A scope for a loop body: it sees this scope's values, and its own stay inside the loop."""
        return Scope(self)


class DagEmitter:
    """Emits DAG nodes at the builder's position. ``pointer(load_node)`` gives each load's address."""

    def __init__(self, builder: ir.IRBuilder, pointer: Callable[[Load], ir.Value]) -> None:
        self.builder = builder
        self.em = LLVMEmitter(builder)
        self.pointer = pointer
        # divisor node id -> its reciprocal: a division by it is a multiplication (see
        # ``reduction.with_reciprocals``, which sets these for one pass)
        self.reciprocals: dict[int, Scalar] = {}

    def emit(self, node: Node, scope: Scope) -> Scalar:
        """``node``'s scalar, emitting what it needs first (operands left to right, no recursion:
        a fused chain may be thousands of nodes deep)."""

        def compute(top: Node) -> None:
            scope.values[id(top)] = self._emit_one(top, scope)

        evaluate(node, lambda n: scope.get(n) is not None, compute)
        found = scope.get(node)
        assert found is not None
        return found

    def _emit_one(self, node: Node, scope: Scope) -> Scalar:
        """One node whose operands are already in ``scope``."""
        if isinstance(node, Load):
            return load(self.builder, self.pointer(node), node.dtype)
        if isinstance(node, Const):
            return self.em.constant(node.value, node.dtype)
        if isinstance(node, Apply):
            args = [scope.get(a) for a in node.args]
            reciprocal = self.reciprocals.get(id(node.args[1])) if node.op == "div" else None
            if reciprocal is not None:
                numerator = args[0]
                assert numerator is not None  # emit() puts every operand in scope first
                return self.em.mul(numerator, reciprocal)
            formula = PRIMITIVES[node.op].scalar
            assert formula is not None, f"{node.op} has no scalar formula"  # the DAG builder checked
            result = formula(self.em, *args, **node.attrs)
            if result.dtype is not node.dtype:  # e.g. numpy's float64 from integer true division
                result = self.em.cast(result, node.dtype)
            return result
        raise AssertionError(f"{node.op}'s row value is used before its pass over the row")


#: An opaque pointer: what a kernel's pointer table holds.
POINTER = ir.PointerType()


def operand_pointers(builder: ir.IRBuilder, args: ir.Value, count: int, first: ir.Value | int = 0) -> list[ir.Value]:
    """The data pointers ``args[first:first + count]``."""
    start = i64(first) if isinstance(first, int) else first
    out = []
    for k in range(count):
        at = add(builder, start, i64(k))  # a constant slot where ``first`` is one: no ``add i64 0, 1``
        slot = builder.gep(args, [at], inbounds=True, source_etype=POINTER)
        out.append(builder.load(slot, typ=POINTER, name=f"p{k}"))
    return out


def element_pointer(builder: ir.IRBuilder, base: ir.Value, index: ir.Value, dtype: DType) -> ir.Value:
    """The address of element ``index`` of an array of ``dtype`` at ``base``."""
    return builder.gep(base, [index], inbounds=True, source_etype=memory_type(dtype))


class KernelBody:
    """Emits one body's outputs through the kernel's data ``pointers``, offsets from ``env``.

    A generator whose loads are not addressed by ``Lin`` offsets over ``env`` (a horizontal
    kernel's tables, a convolution's stack slab) overrides ``load_pointer``."""

    def __init__(self, builder: ir.IRBuilder, pointers: list[ir.Value], env: VarEnv) -> None:
        self.builder, self.pointers, self.env = builder, pointers, env
        self.emitter = DagEmitter(builder, self.load_pointer)

    def load_pointer(self, node: Load) -> ir.Value:
        """The address that DAG load ``node`` reads at the current position."""
        offset = self.env.materialize(self.builder, node.offset)
        return element_pointer(self.builder, self.pointers[node.operand], offset, node.dtype)

    def store_pointer(self, out: KernelOutput, k: int) -> ir.Value:
        """The address output ``out`` (the ``k``-th stored together) is written at."""
        offset = self.env.materialize(self.builder, out.at)
        return element_pointer(self.builder, self.pointers[out.operand], offset, out.root.dtype)

    def load_output(self, out: KernelOutput) -> Scalar:
        """The value already stored for ``out`` (a node kept there by an earlier pass)."""
        return load(self.builder, self.store_pointer(out, 0), out.root.dtype)

    def compute_then_store(self, outputs: Sequence[KernelOutput], scope: Scope) -> None:
        """Every output's value first (so every load of this element precedes its stores), then the stores."""
        values = [self.emitter.emit(out.root, scope) for out in outputs]
        for k, (out, value) in enumerate(zip(outputs, values, strict=True)):
            store(self.builder, value, self.store_pointer(out, k))


# ----------------------------------------------------------------------------- reduction accumulators


def _entry_alloca(builder: ir.IRBuilder, ty: ir.Type, name: str) -> ir.Value:
    """A stack slot in the entry block (where SROA promotes it to registers)."""
    with builder.goto_entry_block():
        return builder.alloca(ty, name=name)


class Accumulator:
    """One reduction's running value in a stack slot: ``init`` (the registry's ``identity``) before
    the row, ``update`` per element (the registry's ``combine`` op, ``LLVMEmitter.combine``),
    ``result`` after."""

    def __init__(self, builder: ir.IRBuilder, reduce: Reduce) -> None:
        prim = PRIMITIVES[reduce.op]
        if not prim.combine or prim.identity is None:
            raise Unsupported(f"{reduce.op} is not compiled (it has no combine op)")
        self.combine, self.identity = prim.combine, prim.identity
        self.builder = builder
        self.reduce = reduce
        self.em = LLVMEmitter(builder)
        self.type = register_type(reduce.dtype)
        self.slot = _entry_alloca(builder, self.type, "acc")

    def init(self) -> None:
        identity = self.em.constant(self.identity(self.reduce.dtype), self.reduce.dtype)
        self.builder.store(identity.value, self.slot)

    def update(self, x: Scalar) -> None:
        acc = Scalar(self.builder.load(self.slot, typ=self.type), self.reduce.dtype)
        self.builder.store(self.em.combine(self.combine, acc, x).value, self.slot)

    def result(self) -> Scalar:
        return Scalar(self.builder.load(self.slot, typ=self.type), self.reduce.dtype)
