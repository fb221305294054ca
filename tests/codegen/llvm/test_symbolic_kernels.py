"""Kernels over a symbolic batch dimension, compiled once and called at several sizes.

Each kernel node has a leading ``Sym("B")`` in its shapes; it is compiled once, then called
through ctypes with the size in the argument slot after the pointers, for every batch size, over
``KernelInfo.units(sizes)`` units (also split into two calls), and compared with the interpreter
running the kernel's body on the same arrays.
"""

from __future__ import annotations

import ctypes
import platform

import numpy as np
import pytest

from kiln.codegen.llvm import Unsupported, engine
from kiln.codegen.llvm.kernels import KernelModule
from kiln.codegen.llvm.loops import CHUNK
from kiln.ir import dtypes as dt
from kiln.ir.graph import GraphBuilder, Node
from kiln.ir.interpreter import interpret
from kiln.ir.types import Sym, SymbolicShapeError, TensorType
from tests.codegen.llvm.test_kernels import _LIBRARIES, _SIGNATURE, kernel
from tests.conftest import assert_close

B = Sym("B")
rng = np.random.default_rng(0)


def T(*shape, dtype=dt.float32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def contiguous(shape) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape`` (the leading size does not matter)."""
    strides, step = [], 1
    for n in reversed(shape[1:]):
        strides.append(step)
        step *= n
    return (step, *reversed(strides)) if shape else ()


def compile_symbolic(node: Node):
    module = KernelModule()
    info = module.add(node, [contiguous(v.type.shape) for v in node.inputs])
    library = engine.Library([engine.compile_ir(module.ir())])
    _LIBRARIES.append(library)
    return info, _SIGNATURE(library.address(info.symbol))


def check_sizes(body, make_inputs, sizes, kind="elementwise", rtol=1e-6, atol=1e-6):
    """Compile ``body`` once; for each batch size, call it (in two pieces of its units) and compare."""
    node = kernel(kind, body)
    info, fn = compile_symbolic(node)
    assert info.symbols == (B,)
    with pytest.raises(SymbolicShapeError, match="symbolic dimension B"):
        _ = info.extent
    for n in sizes:
        arrays = make_inputs(n)
        outputs = [np.full(v.type.bind({B: n}).shape, np.nan, v.type.dtype.np) for v in node.outputs]
        table = (ctypes.c_void_p * (len(arrays) + len(outputs) + 1))(*(a.ctypes.data for a in (*arrays, *outputs)), n)
        units = info.units({B: n})
        half = units // 2
        for begin, end in ((0, half), (half, units)):
            fn(table, begin, end)
        expected = interpret(body, arrays)
        for a, e in zip(outputs, expected, strict=True):
            assert a.shape == e.shape
            assert_close(a, e, rtol=rtol, atol=atol)
    return info


def f32(*shape) -> np.ndarray:
    return rng.normal(size=shape).astype(np.float32)


def test_elementwise_with_broadcasts_and_a_reshape():
    b = GraphBuilder()
    x, w, c = b.input(T(B, 4, 8)), b.input(T(8)), b.input(T(B, 1, 1))
    y = b.node("add", [b.node("mul", [x, w]), c])
    z = b.node("reshape", [b.node("exp", [y])], {"shape": (B, 32)})
    out = b.node("reshape", [b.node("neg", [z])], {"shape": (B, 4, 8)})
    body = b.build([y, out])
    w_array = f32(8)
    info = check_sizes(body, lambda n: [f32(n, 4, 8), w_array, f32(n, 1, 1)], [0, 1, 7, 33, 700, 3])
    assert info.rows_per_size == 4 and info.rows_per_unit == CHUNK // 8
    assert info.units({B: 0}) == 0 and info.units({B: 700}) == -(-700 * 4 // (CHUNK // 8))
    assert info.work({B: 10}) == 8 * 4 + 10 * (32 + 1 + 32 + 32) * 4


def test_elementwise_over_the_symbolic_loop_alone_is_split_in_chunks():
    b = GraphBuilder()
    x, s = b.input(T(B)), b.input(T())
    body = b.build([b.node("mul", [x, s])])
    scale = np.array(3.0, np.float32)
    info = check_sizes(body, lambda n: [f32(n), scale], [1, 5, CHUNK, 2 * CHUNK + 17])
    assert info.units({B: 2 * CHUNK + 17}) == 3


def test_elementwise_with_a_row_longer_than_a_chunk_is_split_in_pieces():
    b = GraphBuilder()
    x = b.input(T(B, CHUNK + 100))
    body = b.build([b.node("sqrt", [b.node("abs", [x])])])
    info = check_sizes(body, lambda n: [f32(n, CHUNK + 100)], [1, 3])
    assert info.units({B: 3}) == 3 * 2


def test_reduction_log_softmax_rows():
    b = GraphBuilder()
    x = b.input(T(B, 10))
    m = b.node("reduce_max", [x], {"axes": (1,), "keepdim": True})
    shifted = b.node("sub", [x, m])
    total = b.node("reduce_sum", [b.node("exp", [shifted])], {"axes": (1,), "keepdim": True})
    out = b.node("sub", [shifted, b.node("log", [total])])
    body = b.build([out, m])
    info = check_sizes(body, lambda n: [f32(n, 10)], [0, 1, 7, 32, 129], kind="reduction", rtol=1e-5, atol=1e-5)
    assert info.units({B: 129}) == 129


def test_reduction_with_static_outer_dims_after_the_symbol():
    b = GraphBuilder()
    x, bias = b.input(T(B, 3, 5)), b.input(T(5))
    s = b.node("reduce_sum", [b.node("add", [x, bias])], {"axes": (2,), "keepdim": False})
    body = b.build([s])
    bias_array = f32(5)
    info = check_sizes(body, lambda n: [f32(n, 3, 5), bias_array], [1, 4, 9], kind="reduction", rtol=1e-5)
    assert info.units({B: 4}) == 12


def test_symbolic_kernels_that_are_declined():
    b = GraphBuilder()
    x = b.input(T(B, 4))
    body = b.build([b.node("reduce_sum", [x], {"axes": (0, 1), "keepdim": False})])
    with pytest.raises(Unsupported, match="reduction over the symbolic dimension"):
        KernelModule().add(kernel("reduction", body), [(4, 1)])
    b = GraphBuilder()
    x = b.input(T(B, 4))
    body = b.build([b.node("permute", [b.node("exp", [x])], {"perm": (1, 0)})])
    # rows of the symbolic length B (symbolic_rows) read each input along its rows, not transposed
    with pytest.raises(Unsupported, match=r"an input of shape \['B', '4'\] in a kernel over \['4', 'B'\]"):
        KernelModule().add(kernel("elementwise", body), [(4, 1)])
    b = GraphBuilder()
    x = b.input(T(B, 4))
    body = b.build([b.node("exp", [x])])
    with pytest.raises(Unsupported, match="horizontal"):
        KernelModule().add(kernel("horizontal", body, body), [(4, 1), (4, 1)])


def test_static_kernels_keep_their_static_info():
    b = GraphBuilder()
    x = b.input(T(6, 4))
    info = KernelModule().add(kernel("elementwise", b.build([b.node("exp", [x])])), [(4, 1)])
    assert info.symbols == () and info.extent == info.units() == 1 and info.work_bytes == info.work() == 192


def test_a_fused_symbolic_mlp_compiled_once_runs_at_every_batch_size():
    """fuse() on the symbolic MLP of tests/ir/test_symbolic.py; its kernels compiled into one
    library once, then the fused graph run at batch 1, 7 and 32 (kernels through ctypes, the
    rest with the eager kernels) against the interpreter on the unfused graph."""
    from kiln.ir.graph import CONSTANT, KERNEL  # noqa: PLC0415
    from kiln.ir.primitives import PRIMITIVES  # noqa: PLC0415
    from kiln.passes.fusion import fuse  # noqa: PLC0415
    from tests.ir.test_symbolic import _mlp  # noqa: PLC0415

    graph = _mlp(B)
    fused = fuse(graph)
    kernels = [node for node in fused.nodes if node.op == KERNEL]
    assert len(kernels) == 2  # bias + relu; bias + log_softmax
    module = KernelModule()
    infos = {node: module.add(node, [contiguous(v.type.shape) for v in node.inputs]) for node in kernels}
    library = engine.Library([engine.compile_ir(module.ir())])
    _LIBRARIES.append(library)
    functions = {node: _SIGNATURE(library.address(info.symbol)) for node, info in infos.items()}
    weights = [f32(16, 32), f32(32), f32(32, 10), f32(10)]
    for n in (1, 7, 32):
        sizes = {B: n}
        env = dict(zip(fused.inputs, [f32(n, 16), *weights], strict=True))
        for node in fused.nodes:
            if node.op == KERNEL:
                outputs = [np.empty(v.type.bind(sizes).shape, v.type.dtype.np) for v in node.outputs]
                arrays = [np.ascontiguousarray(env[v]) for v in node.inputs]  # held until the call returns
                table = (ctypes.c_void_p * (len(arrays) + len(outputs) + 1))(
                    *(a.ctypes.data for a in (*arrays, *outputs)), n
                )
                functions[node](table, 0, infos[node].units(sizes))
                env.update(zip(node.outputs, outputs, strict=True))
            elif node.op == CONSTANT:
                env[node.output] = fused.constants[node.attrs["name"]]
            else:
                env[node.output] = PRIMITIVES[node.op].eager(np, *(env[v] for v in node.inputs), **node.attrs)
        expected = interpret(graph, [env[v] for v in fused.inputs])
        for value, e in zip(fused.outputs, expected, strict=True):
            assert_close(env[value], e, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="looks for x86-64 vector registers")
def test_the_inner_loop_vectorizes_as_in_the_static_kernel():
    """The symbolic size bounds only the outer loop: the inner loop's vector code is the static one's."""
    import re  # noqa: PLC0415

    if "avx" not in engine.host_signature():
        pytest.skip("the host has no AVX")
    counts = []
    for lead in (B, 64):
        b = GraphBuilder()
        x, y = b.input(T(lead, 1024)), b.input(T(1024))
        body = b.build([b.node("add", [b.node("mul", [x, y]), y])])
        module = KernelModule()
        module.add(kernel("elementwise", body), [(1024, 1), (1,)])
        counts.append(len(re.findall(r"%[yz]mm\d+", engine.assembly(module.ir()))))  # 256/512-bit vectors
    assert counts[0] > 0 and counts[0] == counts[1]


@pytest.mark.parametrize(("shape", "axes"), [((B, 37), (0,)), ((B, 5, 300), (0, 1)), ((B, 4, 9), (0,))])
def test_a_sum_over_the_symbolic_leading_axis_is_compiled_once(shape, axes):
    b = GraphBuilder()
    x = b.input(T(*shape))
    node = b.build([b.node("reduce_sum", [x], {"axes": axes, "keepdim": False})]).nodes[0]
    info, fn = compile_symbolic(node)
    assert info.symbols == (B,) and info.units({B: 5}) == info.units({B: 500}) > 0  # units: output columns
    for n in (0, 1, 63, 64, 65, 200):  # RUN_ROWS = 64: a partial run, one, one and a row, several
        a = f32(n, *shape[1:])
        out = np.full(node.output.type.shape, np.nan, np.float32)
        table = (ctypes.c_void_p * 3)(a.ctypes.data, out.ctypes.data, n)
        fn(table, 0, info.units({B: n}))
        assert_close(out, a.astype(np.float64).sum(axis=axes), rtol=1e-5, atol=1e-4)  # float32 rounding of 1000 terms
