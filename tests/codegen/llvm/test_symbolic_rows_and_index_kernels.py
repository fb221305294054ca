"""Two kinds of kernel over symbolic sizes, compiled once and called through ctypes at several sizes:

- rows of a symbolic length (``kiln.codegen.llvm.symbolic_rows``): an elementwise or row-reducing
  ``(R, N)`` domain whose row length ``N`` is read from the table after ``R``;
- take and index_put over symbolic index positions (``kiln.codegen.llvm.gather_scatter``): ``P``
  read from the table after the pointers, the status word after it.

Each is compared with numpy at every size, its units split over two calls.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kiln.codegen.llvm import Unsupported, engine
from kiln.codegen.llvm.kernels import KernelModule
from kiln.ir import dtypes as dt
from kiln.ir.graph import GraphBuilder, Node
from kiln.ir.types import Sym, TensorType
from tests.codegen.llvm.test_kernels import _LIBRARIES, _SIGNATURE, kernel
from tests.conftest import assert_close

R, N, P = Sym("R"), Sym("N"), Sym("P")
rng = np.random.default_rng(3)


def T(*shape, dtype=dt.float32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def compiled(node: Node, layouts):
    module = KernelModule()
    info = module.add(node, layouts)
    library = engine.Library([engine.compile_ir(module.ir())])
    _LIBRARIES.append(library)
    return info, _SIGNATURE(library.address(info.symbol))


def call(fn, info, pointers: list, sizes: dict, status: bool = False) -> int:
    """Call ``fn`` over its units in two pieces; the status word's value (0 without one)."""
    word = ctypes.c_int64(0)
    slots = [p.ctypes.data for p in pointers] + [sizes[s] for s in info.symbols]
    slots += [ctypes.addressof(word)] if status else []
    table = (ctypes.c_void_p * len(slots))(*slots)
    units = info.units(sizes)
    for begin, end in ((0, units // 2), (units // 2, units)):
        fn(table, begin, end)
    return word.value


def _rows_body():
    b = GraphBuilder()
    x, row, column = b.input(T(R, N)), b.input(T(R, 1)), b.input(T(N))
    return b.build([b.node("mul", [b.node("exp", [b.node("sub", [x, row])]), column])])


def test_a_kernel_over_rows_of_a_symbolic_length_runs_at_every_size():
    node = kernel("elementwise", _rows_body())
    # the layouts the code is made at (a probe's): the row stride of x is not read, n is
    info, fn = compiled(node, [(2, 1), (1, 1), (1,)])
    assert info.symbols == (R, N)
    for rows, n in [(1, 1), (5, 3), (7, 40), (3, 1000), (0, 4)]:
        x, row, column = rng.normal(size=(rows, n)), rng.normal(size=(rows, 1)), rng.normal(size=n)
        x, row, column = (a.astype(np.float32) for a in (x, row, column))
        out = np.full((rows, n), np.nan, np.float32)
        call(fn, info, [x, row, column, out], {R: rows, N: n})
        assert_close(out, np.exp(x - row) * column, rtol=1e-5, atol=1e-6)
        assert info.work({R: rows, N: n}) == 4 * (2 * rows * n + rows + n)  # x and the output, a row value, a column


def test_a_softmax_over_rows_of_a_symbolic_length_with_its_row_max_runs_at_every_size():
    b = GraphBuilder()
    x, column = b.input(T(R, N)), b.input(T(N))
    scaled = b.node("mul", [x, column])
    top = b.node("reduce_max", [scaled], {"axes": (1,), "keepdim": True})
    e = b.node("exp", [b.node("sub", [scaled, top])])
    total = b.node("reduce_sum", [e], {"axes": (1,), "keepdim": True})
    node = kernel("reduction", b.build([b.node("div", [e, total]), top]))
    info, fn = compiled(node, [(2, 1), (1,)])
    assert info.symbols == (R, N)
    for rows, n in [(1, 1), (5, 3), (7, 40), (3, 3000), (0, 4)]:
        x, column = rng.normal(size=(rows, n)).astype(np.float32), rng.normal(size=n).astype(np.float32)
        out, row_max = np.full((rows, n), np.nan, np.float32), np.full((rows, 1), np.nan, np.float32)
        call(fn, info, [x, column, out, row_max], {R: rows, N: n})
        s = (x * column).astype(np.float64)
        expected = np.exp(s - s.max(1, keepdims=True))
        assert_close(out, expected / expected.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
        assert_close(row_max, s.max(1, keepdims=True), rtol=1e-6, atol=1e-6)


def test_a_row_input_not_walked_with_stride_1_is_declined():
    with pytest.raises(Unsupported, match="element strides"):
        KernelModule().add(kernel("elementwise", _rows_body()), [(2, 1), (1, 1), (2,)])


def test_take_over_symbolic_positions_runs_at_every_size_and_sets_the_status_out_of_range():
    b = GraphBuilder()
    table, idx = b.input(T(9, 5)), b.input(T(P, dtype=dt.int64))
    node = b.build([b.node("take", [table, idx])]).nodes[0]
    info, fn = compiled(node, [(5, 1), (1,)])
    assert info.symbols == (P,)
    x = rng.normal(size=(9, 5)).astype(np.float32)
    for n in [1, 6, 3000, 0]:
        i = rng.integers(-9, 9, n)
        out = np.full((n, 5), np.nan, np.float32)
        assert call(fn, info, [x, i, out], {P: n}, status=True) == 0
        assert np.array_equal(out, x[i])
    out = np.zeros((4, 5), np.float32)
    assert call(fn, info, [x, np.array([0, 9, 1, 2]), out], {P: 4}, status=True) == 1


def test_index_put_accumulating_over_symbolic_positions_runs_at_every_size():
    b = GraphBuilder()
    x, values, idx = b.input(T(7, 3)), b.input(T(P, 3)), b.input(T(P, dtype=dt.int64))
    node = b.build([b.node("index_put", [x, values, idx], {"accumulate": True})]).nodes[0]
    info, fn = compiled(node, [(3, 1), (3, 1), (1,)])
    assert info.symbols == (P,) and info.units({P: 2}) == info.units({P: 2000})  # units: columns
    for n in [1, 5, 2000]:
        base, v, i = (
            rng.normal(size=(7, 3)).astype(np.float32),
            rng.normal(size=(n, 3)).astype(np.float32),
            rng.integers(0, 7, n),
        )
        out = np.full((7, 3), np.nan, np.float32)
        assert call(fn, info, [base, v, i, out], {P: n}, status=True) == 0
        expected = base.copy()
        np.add.at(expected, i, v)
        assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_a_static_number_of_rows_of_a_symbolic_length_reads_only_the_length():
    b = GraphBuilder()
    x = b.input(T(4, N))
    node = kernel("reduction", b.build([b.node("reduce_sum", [b.node("exp", [x])], {"axes": (1,), "keepdim": True})]))
    info, fn = compiled(node, [(2, 1)])
    assert info.symbols == (N,) and info.units({N: 3}) == info.units({N: 300}) == 4  # a unit a row
    for n in (1, 7, 500):
        x = rng.normal(size=(4, n)).astype(np.float32)
        out = np.full((4, 1), np.nan, np.float32)
        call(fn, info, [x, out], {N: n})
        assert_close(out, np.exp(x.astype(np.float64)).sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
