"""The LLVM IR of kiln's own matrix product kernels (``product_call.py`` compiles, caches and calls them).

``product_ir(dtype, n, accumulate)`` is ``C (+)= A @ B`` for ``n`` columns over row tiles, with the compiled
kernels' ABI ``void f(ptr args, i64 begin, i64 end)`` (``SLOTS``' args); ``batched_product_ir(dtype, n)``
the same over stacks of matrices (``BATCHED_SLOTS``). A module of its own, imported only where a product
kernel is not in the disk cache: the IR builders (llvmlite's ``ir``, ``body``, ``small_gemm``) took 40-60 ms
of a warm process's first eager product, which now loads its object code without them.
"""

from __future__ import annotations

from llvmlite import ir

from ...ir.dtypes import DType
from .body import element_pointer
from .host import tile_rows
from .loops import I64, for_range, i64
from .small_gemm import emit_product

#: The i64 slots of ``args``: sizes, addresses, strides in elements.
SLOTS = ("m", "k", "a", "lda", "a_step", "b", "ldb", "c", "ldc")


def product_ir(dtype: DType, n: int, accumulate: bool, name: str) -> str:
    """LLVM IR of ``C (+)= A @ B`` over the row tiles ``[begin, end)`` (``SLOTS``' args), the function
    named ``name`` (``product_call.symbol``: the caller's, so that this module imports nothing of it)."""
    module, builder, value, begin, end = _function(dtype, n, "kiln_product", name, SLOTS)
    pointer = ir.PointerType()
    rows = tile_rows()
    first = builder.mul(begin, i64(rows), flags=("nsw",))
    stop = builder.mul(end, i64(rows), flags=("nsw",))
    stop = builder.select(builder.icmp_signed("<", stop, value["m"]), stop, value["m"])
    address = {name: builder.inttoptr(value[name], pointer) for name in ("a", "b", "c")}
    emit_product(builder, dtype, stop, n, value["k"], address["a"], value["lda"], address["b"], address["c"],
                 value["ldc"], accumulate, rows=rows, a_step=value["a_step"], first=first, ldb=value["ldb"])  # fmt: skip
    builder.ret_void()
    return str(module)


def _function(dtype: DType, n: int, module_name: str, name: str, slots: tuple[str, ...]):
    """A product kernel's module and its function ``void name(ptr args, i64 begin, i64 end)``, begun:
    ``(module, builder, {slot: its value loaded from args}, begin, end)``."""
    if dtype.name not in ("float32", "float64") or n < 1:
        raise ValueError(f"a native product takes float32/float64 and n >= 1, got {dtype.name}, n {n}")
    module = ir.Module(name=module_name)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType(), I64, I64]), name)
    fn.attributes.add("nounwind")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    params, begin, end = fn.args
    value = {slot: builder.load(builder.gep(params, [i64(k)], inbounds=True, source_etype=I64), typ=I64, name=slot)
             for k, slot in enumerate(slots)}  # fmt: skip
    return module, builder, value, begin, end


#: The i64 slots of a batched product's ``args``: ``SLOTS``' (per matrix) with B's row stride, then the
#: row tiles of a matrix, the inner batch dim's size and the two batch dims' strides of A, B and C.
BATCHED_SLOTS = ("m", "k", "a", "lda", "a_step", "b", "ldb", "c", "ldc", "tiles", "inner",
                 "a_outer", "a_inner", "b_outer", "b_inner", "c_outer", "c_inner")  # fmt: skip


def batched_product_ir(dtype: DType, n: int, name: str) -> str:
    """LLVM IR of ``C = A @ B`` over a stack of matrices (up to two batch dims, ``outer`` x ``inner``),
    each unit of ``[begin, end)`` one row tile of one matrix (``BATCHED_SLOTS``' args): a GPT's
    attention products, (8, 4, 64, 32) @ (8, 4, 32, 64), which numpy runs as one small BLAS call a
    matrix. The function is named ``name`` (``product_call.batched_symbol``)."""
    module, builder, value, begin, end = _function(dtype, n, "kiln_batched_product", name, BATCHED_SLOTS)
    pointer = ir.PointerType()
    rows = tile_rows()
    address = {name: builder.inttoptr(value[name], pointer) for name in ("a", "b", "c")}
    with for_range(builder, begin, end, name="unit", vectorize=False) as unit:
        matrix = builder.sdiv(unit, value["tiles"])
        tile = builder.srem(unit, value["tiles"])
        outer, inner = builder.sdiv(matrix, value["inner"]), builder.srem(matrix, value["inner"])

        def at(name: str) -> ir.Value:
            offset = builder.add(builder.mul(outer, value[f"{name}_outer"], flags=("nsw",)),
                                 builder.mul(inner, value[f"{name}_inner"], flags=("nsw",)), flags=("nsw",))  # fmt: skip
            return element_pointer(builder, address[name], offset, dtype)

        first = builder.mul(tile, i64(rows), flags=("nsw",))
        stop = builder.add(first, i64(rows), flags=("nsw",))
        stop = builder.select(builder.icmp_signed("<", stop, value["m"]), stop, value["m"])
        emit_product(builder, dtype, stop, n, value["k"], at("a"), value["lda"], at("b"), at("c"), value["ldc"],
                     False, rows=rows, a_step=value["a_step"], first=first, ldb=value["ldb"])  # fmt: skip
    builder.ret_void()
    return str(module)
