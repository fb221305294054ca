"""The scalar emitter protocol (kiln/ir/emitter.py) in LLVM IR: kiln's semantics over ``LLVMCore``.

A primitive's ``scalar(em, *values)`` formula, evaluated on an ``LLVMEmitter``, appends the
instructions for one element at the builder's position. Values flowing through formulas are
``Scalar``\\ s: an LLVM register value and the kiln dtype it holds (bool is ``i1`` in registers,
``i8`` 0/1 in memory). The semantics themselves (numpy-exact divmod, integer pow, saturating
casts...) live in kiln/codegen/semantics.py; this module adds what only LLVM has: loads and
stores, and two native overrides (``combine``, and the freeze in integer pow's squaring chain).

>>> from llvmlite import ir
>>> from kiln.ir import dtypes as dt
>>> fn = ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), []), "f")
>>> em = LLVMEmitter(ir.IRBuilder(fn.append_basic_block()))
>>> em.lt(em.constant(1, dt.int32), em.constant(2, dt.int32)).dtype is dt.bool_
True
"""

from __future__ import annotations

from llvmlite import ir

from ...ir import dtypes as dt
from ...ir.dtypes import DType
from ..core import Scalar
from ..semantics import Semantics
from . import flags
from .core import LLVMCore, intrinsic, register_type

__all__ = ["LLVMEmitter", "Scalar", "load", "memory_type", "register_type", "store"]

_I8 = ir.IntType(8)


def memory_type(dtype: DType) -> ir.Type:
    """The LLVM type of an element of ``dtype`` in memory (bool is a byte holding 0 or 1)."""
    return _I8 if dtype is dt.bool_ else register_type(dtype)


def load(builder: ir.IRBuilder, pointer: ir.Value, dtype: DType) -> Scalar:
    """Load the element at ``pointer``; a bool byte reads as True when nonzero."""
    value = builder.load(pointer, typ=memory_type(dtype), align=dtype.itemsize)
    if dtype is dt.bool_:
        value = builder.icmp_unsigned("!=", value, ir.Constant(_I8, 0))
    return Scalar(value, dtype)


def store(builder: ir.IRBuilder, scalar: Scalar, pointer: ir.Value) -> None:
    """Store ``scalar`` at ``pointer`` (bool as the byte 0 or 1)."""
    value = scalar.value
    if scalar.dtype is dt.bool_:
        value = builder.zext(value, _I8)
    builder.store(value, pointer, align=scalar.dtype.itemsize)


class LLVMEmitter(Semantics):
    """Emits LLVM IR for scalar formulas at ``builder``'s position (see the module docstring)."""

    def __init__(self, builder: ir.IRBuilder) -> None:
        super().__init__(LLVMCore(builder))
        self.builder = builder

    def combine(self, op: str, acc: Scalar, x: Scalar) -> Scalar:
        """Float max/min reductions use ``llvm.maximum``/``llvm.minimum``, which propagate nan as
        numpy does and which the vectorizer turns into a vector reduction (the compare-select of
        ``Semantics.max`` stays scalar without ``nnan``), with ``flags.EXTREMUM_REDUCTION`` (the
        sign of a zero result is left open, as in numpy); everything else is the shared step."""
        if op in ("max", "min") and acc.dtype.category == dt.FLOATING:
            name = "maximum" if op == "max" else "minimum"
            value = intrinsic(self.builder, name, acc.value, x.value, fastmath=flags.EXTREMUM_REDUCTION)
            return Scalar(value, acc.dtype)
        return super().combine(op, acc, x)

    def _pow_square(self, base: Scalar) -> Scalar:
        """The square behind a ``freeze``. LLVM's loop vectorizer asks whether a value is the same
        in every lane by walking its operands without remembering what it has seen: over the
        squaring chain of a base read from one address (a broadcast), ``x * x`` twice per step,
        that walk takes 2**63 steps and the compile never ends. ``freeze`` (the identity on a value
        that is not poison, and these are not) ends the walk at each step."""
        square = super()._pow_square(base)
        frozen = ir.instructions.Instruction(self.builder.block, square.value.type, "freeze", [square.value])
        self.builder._insert(frozen)
        return Scalar(frozen, base.dtype)
