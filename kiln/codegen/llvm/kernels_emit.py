"""Emitting a scalar DAG (kiln/codegen/kernel_dag.py) as LLVM IR: element offsets, loads, formulas, accumulators.

A ``Scope`` holds what is already emitted where it dominates the current position: the row scope
of a reduction kernel holds each finished reduction's value, and every loop body opens a child
scope (values emitted in one loop do not dominate the next loop). Offsets are materialized from
``Lin`` expressions through ``VarEnv``, which maps each domain variable to its loop value -- or to
nothing when collapsing folded it into the next variable's loop (see kiln/codegen/index.py: collapse).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from ...ir import dtypes as dt
from ...ir.dtypes import DType
from ...ir.primitives import PRIMITIVES
from ...ir.types import is_static
from ..index import Div, Lin
from ..kernel_dag import Apply, Const, Load, Node, Reduce
from . import Unsupported
from .emitter import LLVMEmitter, Scalar, load, memory_type, register_type
from .loops import for_range, i64

_NSW = ("nsw",)


class VarEnv:
    """Domain variable -> its i64 value; ``None`` marks a variable folded into a collapsed loop."""

    def __init__(self) -> None:
        self.values: dict[int, ir.Value | None] = {}

    def bind_group(self, group: Sequence[int], value: ir.Value) -> None:
        """A collapsed loop over ``group``'s variables: the loop value stands in for the last one,
        whose coefficient every leaf scales the loop value by (the collapse condition)."""
        for var in group[:-1]:
            self.values[var] = None
        self.values[group[-1]] = value

    def materialize(self, builder: ir.IRBuilder, e: Lin) -> ir.Value:
        """``e`` as an i64 value."""
        total: ir.Value | None = None
        for atom, coef in e.terms:
            if isinstance(atom, int):
                value = self.values.get(atom)
                if value is None:
                    if atom not in self.values:
                        raise AssertionError(f"domain variable {atom} has no loop here")
                    continue
            else:
                inner = self.materialize(builder, atom.expr)
                op = builder.sdiv if isinstance(atom, Div) else builder.srem  # indices are never negative
                value = op(inner, i64(atom.divisor))
            term = value if coef == 1 else builder.mul(value, i64(coef), flags=_NSW)
            total = term if total is None else builder.add(total, term, flags=_NSW)
        if total is None:
            return i64(e.const)
        return total if e.const == 0 else builder.add(total, i64(e.const), flags=_NSW)


class Scope:
    """Emitted scalars by DAG node (identity), falling back to the enclosing scope."""

    def __init__(self, parent: Scope | None = None) -> None:
        self.parent = parent
        self.values: dict[int, Scalar] = {}

    def get(self, node: Node) -> Scalar | None:
        scope: Scope | None = self
        while scope is not None:
            found = scope.values.get(id(node))
            if found is not None:
                return found
            scope = scope.parent
        return None

    def child(self) -> Scope:
        return Scope(self)


class DagEmitter:
    """Emits DAG nodes at the builder's position. ``pointer(load_node)`` gives each load's address."""

    def __init__(self, builder: ir.IRBuilder, pointer: Callable[[Load], ir.Value]) -> None:
        self.builder = builder
        self.em = LLVMEmitter(builder)
        self.pointer = pointer
        # divisor node id -> its reciprocal: a division by it is a multiplication (see
        # ``kernels._with_reciprocals``, which sets these for one pass)
        self.reciprocals: dict[int, Scalar] = {}

    def emit(self, node: Node, scope: Scope) -> Scalar:
        """``node``'s scalar, emitting what it needs first (operands left to right, no recursion:
        a fused chain may be thousands of nodes deep)."""
        pending = [node]
        while pending:
            top = pending[-1]
            if scope.get(top) is not None:
                pending.pop()
                continue
            if isinstance(top, Apply):
                missing = [a for a in top.args if scope.get(a) is None]
                if missing:
                    pending.extend(reversed(missing))
                    continue
            pending.pop()
            scope.values[id(top)] = self._emit_one(top, scope)
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


def float_static(node) -> str | None:
    """Why a native float op's node (a window op, a direct convolution, a sum of rows) runs on its
    eager kernel for its dtype or its shapes (None: float32 or float64, static shapes)."""
    dtype = node.output.type.dtype
    if dtype not in (dt.float32, dt.float64):
        return f"{node.op} of {dtype.name} runs on its eager kernel"
    if not all(is_static(v.type.shape) for v in (*node.inputs, *node.outputs)):
        return f"{node.op} over a symbolic dimension runs on its eager kernel"
    return None


#: An opaque pointer: what a kernel's pointer table holds.
POINTER = ir.PointerType()


def operand_pointers(builder: ir.IRBuilder, args: ir.Value, count: int, first: ir.Value | int = 0) -> list[ir.Value]:
    """The data pointers ``args[first:first + count]``."""
    first = i64(first) if isinstance(first, int) else first
    out = []
    for k in range(count):
        slot = builder.gep(args, [builder.add(first, i64(k)) if k else first], inbounds=True, source_etype=POINTER)
        out.append(builder.load(slot, typ=POINTER, name=f"p{k}"))
    return out


def element_pointer(builder: ir.IRBuilder, base: ir.Value, index: ir.Value, dtype: DType) -> ir.Value:
    """The address of element ``index`` of an array of ``dtype`` at ``base``."""
    return builder.gep(base, [index], inbounds=True, source_etype=memory_type(dtype))


#: An element of an array: its base pointer and the element offset from it (an i64).
Pointer = tuple[ir.Value, ir.Value]


def transfer_row(
    builder: ir.IRBuilder, count: int, src: Pointer, dst: Pointer, src_step: int, dst_step: int, dtype: DType, add: bool
) -> None:
    """dst[i * dst_step] (+)= src[i * src_step] for i < count, ``src`` and ``dst`` each a (base
    pointer, element offset) pair. A short row of unit steps (both contiguous, under 64 elements:
    convolution rows are 4 to 32 wide, an embedding's 8 to 64) is a few explicit vectors of
    descending widths (28 = 16 + 8 + 4 floats). The loop vectorizer's own choice on AVX-512, 4
    vectors of 16 lanes an iteration, runs such a row in its scalar remainder, and once the row is
    unrolled the SLP vectorizer cannot prove the input and output apart. Longer or strided rows
    are a loop."""
    kind = memory_type(dtype)
    combine = builder.fadd if dtype.is_floating_point else builder.add
    if src_step == dst_step == 1 and count < 64:
        lanes, done = 64 // dtype.itemsize, 0
        while done < count:
            while lanes > count - done:
                lanes //= 2
            vector = ir.VectorType(kind, lanes) if lanes > 1 else kind
            offset = i64(done)
            source = element_pointer(builder, src[0], builder.add(src[1], offset, flags=("nsw",)), dtype)
            target = element_pointer(builder, dst[0], builder.add(dst[1], offset, flags=("nsw",)), dtype)
            value = builder.load(source, typ=vector, align=dtype.itemsize)
            if add:
                value = combine(builder.load(target, typ=vector, align=dtype.itemsize), value)
            builder.store(value, target, align=dtype.itemsize)
            done += lanes
        return
    with for_range(builder, 0, count, name="o", parallel=True) as o:
        at_src = builder.add(src[1], builder.mul(o, i64(src_step), flags=("nsw",)), flags=("nsw",))
        at_dst = builder.add(dst[1], builder.mul(o, i64(dst_step), flags=("nsw",)), flags=("nsw",))
        target = element_pointer(builder, dst[0], at_dst, dtype)
        value = builder.load(element_pointer(builder, src[0], at_src, dtype), typ=kind)
        if add:
            value = combine(builder.load(target, typ=kind), value)
        builder.store(value, target)


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
