"""Compiled kernel nodes against the interpreter (kiln.ir.interpreter.interpret of the body).

Each test builds a body with GraphBuilder, wraps it in a kernel node, compiles it with
KernelModule and runs it through ctypes on numpy arrays (with the inputs' real strides as the
layouts). Float results are compared with rtol+atol stated per test; discrete results exactly.
"""

from __future__ import annotations

import ctypes
import platform

import numpy as np
import pytest

from kiln.codegen import index as ix
from kiln.codegen.llvm import Unsupported, engine
from kiln.codegen.llvm.kernels import KernelModule
from kiln.codegen.llvm.loops import CHUNK
from kiln.ir import dtypes as dt
from kiln.ir.graph import GraphBuilder, Node
from kiln.ir.interpreter import interpret
from kiln.ir.types import TensorType
from tests.conftest import assert_close

_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
rng = np.random.default_rng(0)
# engine.Library hands the cached host TargetMachine to MCJIT, which takes ownership and frees it
# with the library; a later compile then uses freed memory. Until engine.py makes a machine per
# library, the libraries of this test session are kept alive.
_LIBRARIES: list = []


def T(shape, dtype=dt.float32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def kernel(kind: str, *bodies) -> Node:
    inputs = tuple(v for body in bodies for v in body.inputs)
    outputs = tuple(v for body in bodies for v in body.outputs)
    return Node("kernel", inputs, {"name": "k0", "kind": kind, "bodies": tuple(bodies)}, outputs)


def layout(array: np.ndarray) -> tuple[int, ...]:
    return tuple(s // array.itemsize for s in array.strides)


def compile_kernel(node: Node, arrays):
    module = KernelModule()
    info = module.add(node, [layout(a) for a in arrays])
    library = engine.Library([engine.compile_ir(module.ir())])
    _LIBRARIES.append(library)
    return info, library, _SIGNATURE(library.address(info.symbol))


def run(node: Node, arrays, ranges=None, outputs=None):
    """Compile ``node``, call it on ``arrays`` over ``ranges`` (default: everything); the outputs."""
    info, library, fn = compile_kernel(node, arrays)
    if outputs is None:
        outputs = [np.empty(v.type.shape, v.type.dtype.np) for v in node.outputs]
    pointers = (ctypes.c_void_p * (len(arrays) + len(outputs)))(*(a.ctypes.data for a in (*arrays, *outputs)))
    for begin, end in ranges or [(0, info.extent)]:
        fn(pointers, begin, end)
    return outputs


def check(body, arrays, kind="elementwise", rtol=1e-6, atol=1e-6, ranges=None):
    """Compiled kernel vs the interpreter: floats within rtol+atol, everything else exactly."""
    actual = run(kernel(kind, body), arrays, ranges)
    expected = interpret(body, arrays)
    for a, e in zip(actual, expected, strict=True):
        e = np.asarray(e)
        assert a.shape == e.shape and a.dtype == e.dtype
        if a.dtype.kind == "f":
            assert_close(a, e, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(a, e)
    return actual


def _has_mathlib() -> bool:
    try:
        from kiln.codegen import mathlib  # noqa: PLC0415
    except ImportError:
        return False
    return hasattr(mathlib, "call")


needs_mathlib = pytest.mark.skipif(not _has_mathlib(), reason="kiln.codegen.mathlib (exp, tanh) is not there yet")


# ----------------------------------------------------------------------------- index algebra


def test_reshape_index_stays_linear_when_the_ranges_allow():
    space = ix.Space((2, 3))
    # [2, 3] read as [6]: flat index 3*i + j, no division left
    assert ix.reshape(space, space.identity(), (2, 3), (6,)) == (ix.Lin(0, ((0, 3), (1, 1))),)
    # unsqueeze and back: identity
    assert ix.reshape(space, space.identity(), (2, 3), (2, 1, 3)) == (space.var(0), ix.ZERO, space.var(1))
    # [6] read as [2, 3]: needs a division, and a contiguous input folds it back to the flat index
    flat = ix.Space((6,))
    index = ix.reshape(flat, flat.identity(), (6,), (2, 3))
    assert not index[0].is_affine
    assert ix.offset(index, (3, 1)) == flat.var(0)


def test_collapse_groups_dims_that_every_leaf_addresses_as_one():
    leaves = [ix.Lin(0, ((0, 20), (1, 5), (2, 1))), ix.Lin(0, ((1, 1),))]  # contiguous; broadcast over 0 and 2
    assert ix.collapse((4, 4, 5), range(3), leaves[:1]) == [[0, 1, 2]]
    assert ix.collapse((4, 4, 5), range(3), leaves) == [[0], [1], [2]]
    assert ix.collapse((4, 0, 5), range(3), leaves) == [[0], [1], [2]]  # empty: nothing merged


# ----------------------------------------------------------------------------- elementwise


def test_chain_with_broadcasting_float32_and_float64():
    for dtype in (dt.float32, dt.float64):
        b = GraphBuilder()
        x, y, z = b.input(T((3, 4, 5), dtype)), b.input(T((4, 1), dtype)), b.input(T((5,), dtype))
        s = b.node("add", [b.node("mul", [x, y]), z])
        out = b.node("div", [b.node("maximum", [s, b.node("neg", [z])]), b.node("add", [b.node("abs", [y]), y])])
        out = b.node("sqrt", [b.node("abs", [out])])
        arrays = [rng.normal(size=s_).astype(dtype.np) for s_ in ((3, 4, 5), (4, 1), (5,))]
        check(b.build([out]), arrays, rtol=1e-6, atol=1e-7)


def test_casts_ints_and_bools_are_exact():
    b = GraphBuilder()
    x, k = b.input(T((6, 7), dt.float32)), b.input(T((6, 7), dt.int32))
    xi = b.node("cast", [b.node("mul", [x, x])], {"dtype": dt.int32})
    q = b.node("floor_divide", [xi, k])
    r = b.node("remainder", [xi, k])
    flag = b.node("logical_and", [b.node("gt", [x, b.node("cast", [k], {"dtype": dt.float32})]), b.node("lt", [q, r])])
    picked = b.node(
        "where", [flag, b.node("cast", [q], {"dtype": dt.float64}), b.node("cast", [x], {"dtype": dt.float64})]
    )
    wide = b.node(
        "cast",
        [
            b.node("add", [q, r]),
        ],
        {"dtype": dt.int64},
    )
    arrays = [rng.normal(size=(6, 7)).astype(np.float32) * 20, rng.integers(-5, 6, size=(6, 7)).astype(np.int32)]
    arrays[1][arrays[1] == 0] = 3
    arrays[0][0, :3] = [np.nan, 1e30, -1e30]  # float -> int: nan -> 0, saturation
    check(b.build([q, r, flag, picked, wide]), arrays)


def test_uint8_and_bool_inputs():
    b = GraphBuilder()
    u, m = b.input(T((9,), dt.uint8)), b.input(T((9,), dt.bool_))
    out = b.node("where", [m, b.node("add", [u, u]), b.node("sub", [u, b.node("cast", [m], {"dtype": dt.uint8})])])
    arrays = [rng.integers(0, 256, size=9).astype(np.uint8), rng.random(9) > 0.5]
    check(b.build([out, b.node("logical_not", [m])]), arrays)


def test_zero_d_and_size_zero_shapes():
    b = GraphBuilder()
    x, y = b.input(T(())), b.input(T(()))
    check(b.build([b.node("mul", [b.node("add", [x, y]), x])]), [np.array(1.5, np.float32), np.array(-2.0, np.float32)])
    b = GraphBuilder()
    x, y = b.input(T((0, 3))), b.input(T((3,)))
    node = kernel("elementwise", b.build([b.node("add", [x, y])]))
    info, _, _ = compile_kernel(node, [np.zeros((0, 3), np.float32), np.zeros(3, np.float32)])
    assert info.extent == 0


def test_constants_become_immediates():
    b = GraphBuilder()
    x = b.input(T((5,)))
    two = b.constant(np.array(2.0, np.float32), T(()))
    check(b.build([b.node("mul", [x, two])]), [rng.normal(size=5).astype(np.float32)])


def test_non_contiguous_layouts_transposed_flipped_and_broadcast():
    base = rng.normal(size=(40, 30)).astype(np.float32)
    transposed = base.T  # strides (1, 30)
    flipped = base[::-1, ::-1].T  # negative strides
    zero = np.broadcast_to(rng.normal(size=(1, 40)).astype(np.float32), (30, 40))  # stride 0
    b = GraphBuilder()
    x, y, z = (b.input(T((30, 40))) for _ in range(3))
    out = b.node("add", [b.node("mul", [x, y]), z])
    check(b.build([out]), [transposed, flipped, zero])


def test_view_nodes_inside_a_body():
    b = GraphBuilder()
    x = b.input(T((4, 6)))
    p = b.node("permute", [b.node("neg", [x])], {"perm": (1, 0)})  # [6, 4]
    s = b.node("slice", [p], {"starts": (1, 0), "stops": (6, 4), "steps": (2, 1)})  # [3, 4]
    r = b.node("reshape", [s], {"shape": (12,)})
    split = b.node("reshape", [b.node("reshape", [x], {"shape": (24,)})], {"shape": (2, 12)})
    e = b.node("expand", [b.node("reshape", [r], {"shape": (1, 12)})], {"shape": (2, 12)})
    out = b.node("add", [split, e])
    back = b.node("permute", [b.node("reshape", [b.node("mul", [out, out])], {"shape": (12, 2)})], {"perm": (1, 0)})
    check(b.build([out, back]), [rng.normal(size=(4, 6)).astype(np.float32)])


def test_reshape_that_splits_the_domain_uses_division():
    b = GraphBuilder()
    x = b.input(T((3, 4)))
    y = b.node("reshape", [b.node("permute", [x], {"perm": (1, 0)})], {"shape": (12,)})
    check(b.build([y]), [rng.normal(size=(3, 4)).astype(np.float32)])


def test_multi_output_and_split_ranges():
    n = 3 * CHUNK + 123  # several units, the last one partial
    b = GraphBuilder()
    x, y = b.input(T((n,))), b.input(T((n,)))
    s = b.node("add", [x, y])
    body = b.build([s, b.node("mul", [s, s]), b.node("gt", [s, y])])
    arrays = [rng.normal(size=n).astype(np.float32) for _ in range(2)]
    node = kernel("elementwise", body)
    info, _, _ = compile_kernel(node, arrays)
    assert info.extent == 4
    expected = interpret(body, arrays)
    for k in (1, 3):
        actual = run(node, arrays, ranges=[(0, k), (k, info.extent)])
        for a, e in zip(actual, expected, strict=True):
            np.testing.assert_array_equal(a, e)  # same operations, FMA cannot apply: exact


def test_small_rows_are_grouped_into_units():
    b = GraphBuilder()
    x = b.input(T((5000, 3)))
    body = b.build([b.node("mul", [x, x])])
    arrays = [rng.normal(size=(5000, 6)).astype(np.float32)[:, ::2]]  # not collapsible: rows of 3
    info, _, _ = compile_kernel(kernel("elementwise", body), arrays)
    assert info.extent == -(-5000 // (CHUNK // 3))
    check(body, arrays, ranges=[(0, 1), (1, info.extent)])


def test_in_place_output_sharing_an_input_buffer():
    b = GraphBuilder()
    x, y = b.input(T((10_000,))), b.input(T((10_000,)))
    body = b.build([b.node("add", [b.node("mul", [x, y]), x])])
    xs, ys = rng.normal(size=10_000).astype(np.float32), rng.normal(size=10_000).astype(np.float32)
    expected = interpret(body, [xs, ys])[0]
    run(kernel("elementwise", body), [xs, ys], outputs=[xs])  # the output IS x's buffer
    assert_close(xs, expected, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- reductions


def _row_sum_body(shape, op="reduce_sum", keepdim=False):
    b = GraphBuilder()
    x = b.input(T(shape))
    axes = tuple(range(1, len(shape)))
    return b.build([b.node(op, [x], {"axes": axes, "keepdim": keepdim})])


def test_row_sum_and_empty_rows():
    check(_row_sum_body((64, 300)), [rng.normal(size=(64, 300)).astype(np.float32)], "reduction", rtol=1e-5, atol=1e-5)
    check(_row_sum_body((5, 0)), [np.zeros((5, 0), np.float32)], "reduction")  # sum of nothing is 0
    check(_row_sum_body((5, 0), "reduce_prod", True), [np.zeros((5, 0), np.float32)], "reduction")


def test_row_max_and_min_propagate_nan():
    x = rng.normal(size=(6, 50)).astype(np.float32)
    x[1, 7] = np.nan
    x[3, 0] = np.nan
    x[4] = -np.inf
    for op in ("reduce_max", "reduce_min"):
        check(_row_sum_body((6, 50), op, keepdim=True), [x], "reduction")


@pytest.mark.parametrize("op", ["reduce_max", "reduce_min"])
def test_row_max_and_min_of_signed_zeros_are_zero_of_either_sign(op):
    # nsz: a row holding 0.0 and -0.0 (and nothing beyond them in the reduction's direction)
    # reduces to a zero of either sign, as numpy's does by the order it meets them.
    x = np.zeros((4, 40), np.float32)
    x[0, ::2] = -0.0
    x[1] = -0.0
    x[2, 5] = -0.0
    x[3, :5] = -1.0 if op == "reduce_max" else 1.0
    x[3, 30:] = -0.0
    body = _row_sum_body((4, 40), op)
    (actual,) = run(kernel("reduction", body), [x])
    np.testing.assert_array_equal(actual, np.zeros(4, np.float32))
    module = KernelModule()
    module.add(kernel("reduction", body), [layout(x)])
    assert 'call nsz float @"llvm.' + ("maximum" if op == "reduce_max" else "minimum") in module.ir()


def test_integer_and_bool_reductions_are_exact():
    for dtype, op in (
        (dt.int32, "reduce_sum"),
        (dt.int64, "reduce_max"),
        (dt.int8, "reduce_min"),
        (dt.bool_, "reduce_sum"),
    ):
        b = GraphBuilder()
        x = b.input(T((7, 3, 5), dtype))
        body = b.build([b.node(op, [x], {"axes": (1, 2), "keepdim": False})])
        array = rng.integers(-100, 100, size=(7, 3, 5)).astype(dtype.np)
        check(body, [array], "reduction")


@needs_mathlib
def test_softmax_body():
    b = GraphBuilder()
    x = b.input(T((32, 100)))
    m = b.node("reduce_max", [x], {"axes": (1,), "keepdim": True})
    e = b.node("exp", [b.node("sub", [x, m])])
    s = b.node("reduce_sum", [e], {"axes": (1,), "keepdim": True})
    body = b.build([b.node("div", [e, s])])
    check(body, [rng.normal(size=(32, 100)).astype(np.float32) * 5], "reduction", rtol=1e-5, atol=1e-7)


def test_layer_norm_body_with_row_outputs():
    n, c = 16, 48
    b = GraphBuilder()
    x, w = b.input(T((n, c))), b.input(T((c,)))
    count = b.constant(np.array(c, np.float32), T(()))
    eps = b.constant(np.array(1e-5, np.float32), T(()))
    mean = b.node("div", [b.node("reduce_sum", [x], {"axes": (1,), "keepdim": False}), count])  # [n]
    centered = b.node("sub", [x, b.node("reshape", [mean], {"shape": (n, 1)})])
    var = b.node(
        "div", [b.node("reduce_sum", [b.node("mul", [centered, centered])], {"axes": (1,), "keepdim": True}), count]
    )
    rstd = b.node("rsqrt", [b.node("add", [var, eps])])  # [n, 1]
    y = b.node("mul", [b.node("mul", [centered, rstd]), w])
    body = b.build([y, mean, rstd])
    arrays = [rng.normal(size=(n, c)).astype(np.float32) * 3 + 1, rng.normal(size=c).astype(np.float32)]
    check(body, arrays, "reduction", rtol=1e-5, atol=1e-5)


def test_sum_over_all_axes_and_split_rows():
    check(_row_sum_body((8, 9), "reduce_sum"), [rng.normal(size=(8, 9)).astype(np.float32)], "reduction", 1e-5, 1e-5)
    b = GraphBuilder()
    x = b.input(T((8, 9)))
    body = b.build([b.node("reduce_sum", [x], {"axes": (0, 1), "keepdim": False})])
    check(body, [rng.normal(size=(8, 9)).astype(np.float32)], "reduction", rtol=1e-5, atol=1e-5)
    body = _row_sum_body((10, 4, 5))
    check(body, [rng.normal(size=(10, 5, 4)).astype(np.float32).transpose(0, 2, 1)], "reduction", 1e-5, 1e-5,
          ranges=[(0, 3), (3, 10)])  # fmt: skip


# ----------------------------------------------------------------------------- horizontal


def _adam_like(shape, dtype=dt.float32):
    b = GraphBuilder()
    p, g, lr = b.input(T(shape, dtype)), b.input(T(shape, dtype)), b.input(T((), dtype))
    half = b.constant(np.array(0.5, dtype.np), T((), dtype))
    new = b.node("sub", [p, b.node("mul", [lr, b.node("mul", [g, half])])])
    return b.build([new, b.node("mul", [g, g])])


def test_horizontal_members_of_different_shapes():
    shapes = [(5, 7), (1000,), (3, 1, 4)]
    bodies = [_adam_like(s) for s in shapes]
    arrays = []
    for s in shapes:
        arrays += [
            rng.normal(size=s).astype(np.float32),
            rng.normal(size=s).astype(np.float32),
            np.array(0.1, np.float32),
        ]
    arrays[0] = np.asfortranarray(arrays[0])  # one member with a transposed layout
    node = kernel("horizontal", *bodies)
    info, _, _ = compile_kernel(node, arrays)
    assert info.extent == 3
    actual = run(node, arrays, ranges=[(0, 2), (2, 3)])
    expected = [e for m, body in enumerate(bodies) for e in interpret(body, arrays[3 * m : 3 * m + 3])]
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e, rtol=1e-6, atol=1e-7)


def test_horizontal_members_must_share_their_structure():
    b = GraphBuilder()
    x = b.input(T((3,)))
    other = b.build([b.node("neg", [x]), b.node("mul", [x, x])])
    with pytest.raises(Unsupported, match="different"):
        KernelModule().add(kernel("horizontal", _adam_like((3,)), other), [(1,), (1,), (), (1,)])


# ----------------------------------------------------------------------------- declined kernels, assembly


def test_unsupported_kernels_leave_the_module_valid():
    module = KernelModule()
    b = GraphBuilder()
    x = b.input(T((4,), dt.float16))
    with pytest.raises(Unsupported, match="float16"):
        module.add(kernel("elementwise", b.build([b.node("add", [x, x])])), [(1,)])
    b = GraphBuilder()
    x, y = b.input(T((4, 4))), b.input(T((4, 4)))
    with pytest.raises(Unsupported, match="matmul"):
        module.add(kernel("elementwise", b.build([b.node("exp", [b.node("matmul", [x, y])])])), [(4, 1), (4, 1)])
    b = GraphBuilder()
    x = b.input(T((4,), dt.bool_))
    with pytest.raises(Unsupported, match="neg of bool"):  # declined while emitting: rolled back
        module.add(kernel("elementwise", b.build([b.node("neg", [x])])), [(1,)])
    b = GraphBuilder()
    x = b.input(T((4,)))
    info = module.add(kernel("elementwise", b.build([b.node("neg", [x])])), [(1,)])
    library = engine.Library([engine.compile_ir(module.ir())])
    _LIBRARIES.append(library)
    assert library.address(info.symbol)


def test_reduction_over_leading_axes_is_declined():
    b = GraphBuilder()
    x = b.input(T((4, 5)))
    body = b.build([b.node("reduce_sum", [x], {"axes": (0,), "keepdim": False})])
    with pytest.raises(Unsupported, match="trailing"):
        KernelModule().add(kernel("reduction", body), [(5, 1)])


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="looks for x86-64 vector registers")
def test_float32_elementwise_kernel_uses_packed_vector_instructions():
    b = GraphBuilder()
    x, y = b.input(T((1 << 16,))), b.input(T((1 << 16,)))
    module = KernelModule()
    module.add(kernel("elementwise", b.build([b.node("add", [b.node("mul", [x, y]), x])])), [(1,), (1,)])
    assembly = engine.assembly(module.ir())
    packed = [line for line in assembly.splitlines() if "ps\t" in line and ("%ymm" in line or "%zmm" in line)]
    if "avx" not in engine.host_signature():
        pytest.skip("the host has no AVX")
    assert packed, "no packed single-precision instruction on ymm/zmm registers"


def _layer_norm_body(n: int):
    """A LayerNorm-like reduction body over rows of ``n`` floats: a sum, a sum of squares of the
    row minus it, then the full output -- three passes over each row."""
    b = GraphBuilder()
    x = b.input(T((64, n)))
    centred = b.node("sub", [x, b.node("reduce_sum", [x], {"axes": (1,), "keepdim": True})])
    var = b.node("reduce_sum", [b.node("mul", [centred, centred])], {"axes": (1,), "keepdim": True})
    return b.build([b.node("div", [centred, b.node("sqrt", [var])])])


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="reads x86-64 assembly")
def test_the_passes_over_a_row_do_not_keep_the_row_in_registers():
    # Unrolled, the row's second and third passes reused the first pass's 64 vector loads of a row
    # of 1024 floats, which then lived across the passes and spilled to the stack.
    module = KernelModule()
    module.add(kernel("reduction", _layer_norm_body(1024)), [(1024, 1)])
    assembly = engine.assembly(module.ir())
    spills = [line for line in assembly.splitlines() if "(%rsp)" in line and "mm" in line]
    assert not spills, f"vector spills to the stack: {spills[:3]}"


@pytest.mark.parametrize("n", [1, 10, 32, 64, 1000, 1024])
def test_row_passes_of_every_length_match_the_interpreter(n):
    # Interleave counts 1 (n < 32), 2, 4, with and without a remainder
    x = np.random.default_rng(n).standard_normal((64, n)).astype(np.float32)
    check(_layer_norm_body(n), [x], kind="reduction", rtol=2e-5, atol=1e-6)


def _window_gradient_body(tiny: int):
    """where(x == m, g, 0) over (8, 3, 14, k, 14, k) with m, g one per window (max pooling's
    gradient): the innermost loop is the window's last offset, ``tiny`` long."""
    b = GraphBuilder()
    x = b.input(T((8, 3, 14, tiny, 14, tiny)))
    m, g = b.input(T((8, 3, 14, 1, 14, 1))), b.input(T((8, 3, 14, 1, 14, 1)))
    zero = b.node("sub", [g, g])
    return b.build([b.node("where", [b.node("eq", [x, m]), g, zero])])


@pytest.mark.parametrize("tiny", [2, 3, 4, 5])
def test_a_tiny_innermost_loop_is_unrolled_and_right(tiny):
    x = rng.standard_normal((8, 3, 14, tiny, 14, tiny)).astype(np.float32)
    m = x.max(axis=(3, 5), keepdims=True)
    g = rng.standard_normal(m.shape).astype(np.float32)
    (out,) = check(_window_gradient_body(tiny), [x, m, g])
    assert (out != 0).sum() == m.size  # one position per window (no ties in random data)
