"""The primitives the LLVM backend compiles as functions of their own, by family (``NativeFamily``):
each family's module has the entry points the backend calls, and the bytes a native kernel is
said to move (what the thread pool decides by) are counted by hand here (issue 37: one table
instead of the op family dispatched in three places plus ``_work_bytes``)."""

from __future__ import annotations

from kiln.codegen.llvm.kernel_info import NATIVE_FAMILIES, NATIVE_OPS, STATUS_OPS, native_code
from kiln.codegen.llvm.kernels import KernelModule
from kiln.ir import dtypes as dt
from kiln.ir.graph import GraphBuilder, Node
from kiln.ir.types import TensorType


def test_every_family_module_has_the_entry_points_the_backend_calls():
    seen: set[str] = set()
    for family in NATIVE_FAMILIES:
        assert seen.isdisjoint(family.ops), f"{sorted(seen & family.ops)} in two families"
        seen |= family.ops
        for op in family.ops:
            module = native_code(op)
            assert module.__name__ == f"kiln.codegen.llvm.{family.module}"
            assert callable(module.compilable) and callable(module.emit), family.module
    assert seen == NATIVE_OPS and STATUS_OPS == {"take", "index_put"}


def _node(op: str, types: list[TensorType], attrs: dict) -> Node:
    b = GraphBuilder()
    out = b.node(op, [b.input(t) for t in types], attrs)
    (node,) = b.build([out]).nodes
    return node


def test_a_take_moves_the_rows_it_takes_and_a_conv_its_multiply_adds():
    take = _node("take", [TensorType((1000, 8), dt.float32), TensorType((5,), dt.int64)], {})
    info = KernelModule().add(take, [(8, 1), (1,)])
    assert info.work_bytes == 5 * 8 + 2 * (5 * 8 * 4)  # the indices, then the 5 rows read and written
    x, w = TensorType((2, 3, 6, 6), dt.float32), TensorType((4, 3, 3, 3), dt.float32)
    conv = _node("conv", [x, w], {"stride": (1, 1), "dilation": (1, 1)})
    info = KernelModule().add(conv, [(108, 36, 6, 1), (27, 9, 3, 1)])
    out = 2 * 4 * 4 * 4  # (2, 4, 4, 4)
    assert info.work_bytes == 4 * (2 * 3 * 36 + 4 * 27 + out) + 2 * out * 27  # operands, then 2 per multiply-add
