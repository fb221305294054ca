"""Vector code along contiguous rows, shared by the native ops that run over them (``conv``,
``leading_sums``, ``window``, ``gather_scatter``): explicit vector loads at any element offset, the
last partial vector of a row loaded and stored under a lane mask, ``llvm.fmuladd``, stack-slot
accumulators (``Rows``), and a row copied or added elsewhere (``transfer_row``).
"""

from __future__ import annotations

from llvmlite import ir

from ...ir.dtypes import DType
from .body import element_pointer
from .emitter import memory_type
from .loops import for_range, i64

#: Bytes of a vector of row positions (an AVX-512 register; two on AVX2).
VECTOR_BYTES = 64


class Rows:
    """Vector code over rows of ``width`` elements of ``dtype``: ``lanes`` a vector (the fewest
    powers of two covering a short row), ``full`` whole vectors a row and a masked ``tail``."""

    def __init__(self, dtype, width: int) -> None:
        self.dtype, self.kind = dtype, memory_type(dtype)
        lanes = VECTOR_BYTES // dtype.itemsize
        while lanes // 2 >= width:
            lanes //= 2
        self.lanes = lanes
        self.full, self.tail = divmod(width, lanes)
        self.vector = ir.VectorType(self.kind, lanes)
        self.mask = ir.Constant(ir.VectorType(ir.IntType(1), lanes), [k < self.tail for k in range(lanes)])

    def _intrinsic(self, builder, name: str, returns, params):
        name = f"llvm.{name}.v{self.lanes}f{self.dtype.itemsize * 8}" + (".p0" if "masked" in name else "")
        function = builder.module.globals.get(name)
        if function is None:
            function = ir.Function(builder.module, ir.FunctionType(returns, params), name)
        return function

    def load(self, builder, base, offset, masked: bool = False):
        """The vector at element ``offset`` of ``base``; ``masked``: its ``tail`` lanes, zeros after."""
        pointer = element_pointer(builder, base, offset, self.dtype)
        if not masked:
            return builder.load(pointer, typ=self.vector, align=self.dtype.itemsize)
        function = self._intrinsic(builder, "masked.load", self.vector,
                                   [ir.PointerType(), ir.IntType(32), self.mask.type, self.vector])  # fmt: skip
        return builder.call(function, [pointer, ir.IntType(32)(self.dtype.itemsize), self.mask, self.zero()])

    def store(self, builder, value, base, offset, masked: bool = False) -> None:
        pointer = element_pointer(builder, base, offset, self.dtype)
        if not masked:
            builder.store(value, pointer, align=self.dtype.itemsize)
            return
        function = self._intrinsic(builder, "masked.store", ir.VoidType(),
                                   [self.vector, ir.PointerType(), ir.IntType(32), self.mask.type])  # fmt: skip
        builder.call(function, [value, pointer, ir.IntType(32)(self.dtype.itemsize), self.mask])

    def fma(self, builder, a, b, c):
        """``a * b + c`` on vectors: ``llvm.fmuladd``, one FMA instruction where the CPU has them and a
        multiply and an add where not (``llvm.fma`` would call libm's ``fmaf`` there)."""
        return builder.call(self._intrinsic(builder, "fmuladd", self.vector, [self.vector] * 3), [a, b, c])

    def splat(self, builder, scalar):
        one = builder.insert_element(ir.Constant(ir.VectorType(self.kind, 1), None), scalar, i64(0))
        mask = ir.Constant(ir.VectorType(ir.IntType(32), self.lanes), [0] * self.lanes)
        return builder.shuffle_vector(one, ir.Constant(ir.VectorType(self.kind, 1), None), mask)

    def zero(self):
        return ir.Constant(self.vector, [0.0] * self.lanes)

    def slots(self, builder, count: int) -> list:
        """``count`` vector accumulators on the stack (registers once SROA has run)."""
        with builder.goto_entry_block():
            return [builder.alloca(self.vector) for _ in range(count)]

    def chunks(self, builder, body) -> None:
        """``body(column, masked)`` for each vector of a row: a loop over the whole vectors, then the tail."""
        if self.full:
            with for_range(builder, 0, self.full, name="vec", vectorize=False) as k:
                body(builder.mul(k, i64(self.lanes), flags=("nsw",)), False)
        if self.tail:
            body(i64(self.full * self.lanes), True)


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
