"""simplify: golden IR for each identity, and bitwise-equal results on inf/nan/-0.0 inputs; the
identities that are NOT exact must be left alone."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.ir.dtypes import bool_, float16, float32, float64, int8, int16, int32, int64, uint8
from kiln.ir.graph import GraphBuilder
from kiln.ir.interpreter import interpret
from kiln.ir.types import TensorType
from kiln.passes import eliminate_dead_code, simplify
from tests.passes import assert_same_results, check_pass, special

F23 = TensorType((2, 3), float32)


def with_constant(op: str, value: float, *, left: bool = False, dtype=float32, shape=(), x_shape=(2, 3)):
    """``op(x, c)`` (or ``op(c, x)``) with ``c`` a constant array full of ``value``."""
    b = GraphBuilder()
    x = b.input(TensorType(x_shape, dtype))
    c = b.constant(np.full(shape, value, dtype=dtype.np), TensorType(shape, dtype))
    y = b.node(op, [c, x] if left else [x, c])
    return b.build([y])  # y itself: an exp or a sum after it could hide the sign of a zero


def inputs_for(graph, shift: int = 0):
    """Special float values (or small ints, or bools) for each input of ``graph``."""
    out = []
    for i, v in enumerate(graph.inputs):
        dtype = v.type.dtype
        if dtype.is_floating_point:
            out.append(special(v.type.shape, dtype.np, shift + 5 * i))
        elif dtype is bool_:
            out.append(np.arange(np.prod(v.type.shape)).reshape(v.type.shape) % 3 == 0)
        else:
            info = np.iinfo(dtype.np)
            values = [info.min, -1, 0, 1, 7, info.max, -100, 100]
            out.append(np.resize(np.array(values, dtype=np.int64).astype(dtype.np), v.type.shape))
    return out


def several_inputs(graph):
    return [inputs_for(graph, shift) for shift in range(4)]


# ----------------------------------------------------------------------------- arithmetic identities
@pytest.mark.parametrize(
    "op, value, left",
    [("mul", 1.0, False), ("mul", 1.0, True), ("div", 1.0, False), ("add", -0.0, False), ("add", -0.0, True),
     ("sub", 0.0, False)],
)  # fmt: skip
def test_exact_identities_drop_the_constant(op, value, left):
    graph = with_constant(op, value, left=left)
    check_pass(simplify, graph, """
        graph(%0: f32[2,3]) {
          %1: f32[] = constant() {name="c0"}
          return (%0)
        }
    """, several_inputs(graph))  # fmt: skip


@pytest.mark.parametrize(
    "op, value, left",
    [
        ("add", 0.0, False),  # -0.0 + 0.0 is +0.0
        ("add", 0.0, True),
        ("sub", -0.0, False),  # -0.0 - (-0.0) is +0.0
        ("mul", 0.0, False),  # inf * 0 is nan
        ("mul", -1.0, False),
        ("mul", 2.0, False),
        ("div", 1.0, True),  # 1 / x
        ("sub", 0.0, True),  # 0 - x
        ("pow", 1.0, False),  # not a rule
    ],
)
def test_inexact_identities_are_left_alone(op, value, left):
    graph = with_constant(op, value, left=left)
    assert simplify(graph) is graph
    # ...and they really are inexact: folding them would have changed a result.
    x = special((2, 3))
    c = np.float32(value)
    with np.errstate(all="ignore"):
        y = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power}[op](
            *((c, x) if left else (x, c))
        )
    if op != "pow":
        assert not np.array_equal(y.view(np.uint32), x.view(np.uint32))


def test_a_constant_that_is_not_all_identity_is_kept():
    b = GraphBuilder()
    x = b.input(TensorType((3,), float32))
    c = b.constant(np.array([1.0, 1.0, 2.0], np.float32), TensorType((3,), float32))
    graph = b.build([b.node("mul", [x, c])])
    assert simplify(graph) is graph


def test_a_broadcasting_identity_becomes_an_expand_not_x():
    graph = with_constant("mul", 1.0, shape=(4, 2, 3), x_shape=(2, 1))
    check_pass(simplify, graph, """
        graph(%0: f32[2,1]) {
          %1: f32[4,2,3] = constant() {name="c0"}
          %2: f32[4,2,3] = expand(%0) {shape=(4, 2, 3)}
          return (%2)
        }
    """, several_inputs(graph))  # fmt: skip


@pytest.mark.parametrize("dtype", [int32, uint8, int64])
def test_integer_zero_has_no_sign(dtype):
    for op, left in [("add", False), ("add", True), ("sub", False)]:
        graph = with_constant(op, 0, left=left, dtype=dtype)
        after = simplify(graph)
        assert after.outputs == graph.inputs
        assert_same_results(graph, after, inputs_for(graph))
    graph = with_constant("mul", 1, dtype=dtype)
    assert simplify(graph).outputs == graph.inputs


def test_negation_and_logical_not_cancel_in_pairs():
    b = GraphBuilder()
    x, p = b.input(F23), b.input(TensorType((2, 3), bool_))
    n2 = b.node("neg", [b.node("neg", [x])])
    n3 = b.node("neg", [b.node("neg", [n2])])
    nn = b.node("logical_not", [b.node("logical_not", [p])])
    notnot_float = b.node("logical_not", [b.node("logical_not", [x])])  # bool(x): not x
    graph = b.build([n3, nn, notnot_float, b.node("neg", [n2])])
    check_pass(simplify, graph, """
        graph(%0: f32[2,3], %1: bool[2,3]) {
          %2: f32[2,3] = neg(%0)
          %4: f32[2,3] = neg(%0)
          %6: bool[2,3] = logical_not(%1)
          %8: bool[2,3] = logical_not(%0)
          %9: bool[2,3] = logical_not(%8)
          %10: f32[2,3] = neg(%0)
          return (%0, %1, %9, %10)
        }
    """, several_inputs(graph))  # fmt: skip


def test_same_operand_maximum_minimum_and_where():
    b = GraphBuilder()
    x, y = b.input(F23), b.input(TensorType((3,), float32))
    cond = b.node("gt", [x, y])
    graph = b.build([b.node("maximum", [x, x]), b.node("minimum", [y, y]), b.node("where", [cond, y, y]),
                     b.node("maximum", [x, y])])  # fmt: skip
    check_pass(simplify, graph, """
        graph(%0: f32[2,3], %1: f32[3]) {
          %2: bool[2,3] = gt(%0, %1)
          %5: f32[2,3] = expand(%1) {shape=(2, 3)}
          %6: f32[2,3] = maximum(%0, %1)
          return (%0, %1, %5, %6)
        }
    """, several_inputs(graph))  # fmt: skip


# ----------------------------------------------------------------------------- movement
def test_identity_movement_ops_disappear_and_chains_merge():
    b = GraphBuilder()
    x = b.input(TensorType((2, 3, 4), float32))
    same = b.node("reshape", [x], {"shape": (2, 3, 4)})
    flat = b.node("reshape", [b.node("reshape", [same], {"shape": (6, 4)})], {"shape": (24,)})
    back = b.node("reshape", [b.node("reshape", [x], {"shape": (4, 6)})], {"shape": (2, 3, 4)})
    ident = b.node("permute", [back], {"perm": (0, 1, 2)})
    twice = b.node("permute", [b.node("permute", [ident], {"perm": (2, 0, 1)})], {"perm": (2, 0, 1)})
    undo = b.node("permute", [b.node("permute", [x], {"perm": (1, 2, 0)})], {"perm": (2, 0, 1)})
    ex = b.node("expand", [b.node("expand", [x], {"shape": (1, 2, 3, 4)})], {"shape": (5, 2, 3, 4)})
    ex_same = b.node("expand", [x], {"shape": (2, 3, 4)})
    whole = b.node("slice", [x], {"starts": (0, 0, 0), "stops": (2, 3, 4), "steps": (1, 1, 1)})
    part = b.node("slice", [x], {"starts": (0, 0, 0), "stops": (2, 3, 4), "steps": (1, 2, 1)})
    shifted = b.node("slice", [x], {"starts": (0, 0, 1), "stops": (2, 3, 4), "steps": (1, 1, 1)})
    graph = b.build([flat, twice, undo, ex, ex_same, whole, part, shifted])
    check_pass(simplify, graph, """
        graph(%0: f32[2,3,4]) {
          %2: f32[6,4] = reshape(%0) {shape=(6, 4)}
          %3: f32[24] = reshape(%0) {shape=(24,)}
          %4: f32[4,6] = reshape(%0) {shape=(4, 6)}
          %7: f32[4,2,3] = permute(%0) {perm=(2, 0, 1)}
          %8: f32[3,4,2] = permute(%0) {perm=(1, 2, 0)}
          %9: f32[3,4,2] = permute(%0) {perm=(1, 2, 0)}
          %11: f32[1,2,3,4] = expand(%0) {shape=(1, 2, 3, 4)}
          %12: f32[5,2,3,4] = expand(%0) {shape=(5, 2, 3, 4)}
          %15: f32[2,2,4] = slice(%0) {starts=(0, 0, 0), stops=(2, 3, 4), steps=(1, 2, 1)}
          %16: f32[2,3,3] = slice(%0) {starts=(0, 0, 1), stops=(2, 3, 4), steps=(1, 1, 1)}
          return (%3, %8, %0, %12, %0, %0, %15, %16)
        }
    """, several_inputs(graph))  # fmt: skip


def test_a_slice_with_a_step_on_a_size_one_dim_is_whole():
    b = GraphBuilder()
    x = b.input(TensorType((1, 3), float32))
    graph = b.build([b.node("slice", [x], {"starts": (0, 0), "stops": (1, 3), "steps": (5, 1)})])
    after = simplify(graph)
    assert after.outputs == graph.inputs
    assert_same_results(graph, after, inputs_for(graph))


# ----------------------------------------------------------------------------- casts
def cast_chain(source, *dtypes, shape=(2, 4)):
    b = GraphBuilder()
    x = v = b.input(TensorType(shape, source))
    for dtype in dtypes:
        v = b.node("cast", [v], {"dtype": dtype})
    return b.build([v]), x


@pytest.mark.parametrize(
    "source, middle, target",
    [(float32, float64, float32), (float16, float32, float16), (float16, float64, float32), (float32, float64, float16),
     (float32, float64, int8), (int8, float32, uint8), (uint8, float16, int8), (int32, float64, float32),
     (int32, int64, int8), (bool_, float16, int64), (float32, float64, bool_), (int8, int32, bool_)],
)  # fmt: skip
def test_cast_through_an_exact_wider_type_is_one_cast(source, middle, target):
    graph, x = cast_chain(source, middle, target)
    after = simplify(graph)
    if source is target:
        assert after.outputs == (x,)
    else:
        assert [(n.op, n.inputs, n.attrs) for n in after.nodes[-1:]] == [("cast", (x,), {"dtype": target})]
    for args in several_inputs(graph):
        assert_same_results(graph, after, args)


@pytest.mark.parametrize(
    "source, middle, target",
    [(float32, float16, float32),  # rounds
     (float64, float32, float64),
     (int32, float32, int32),  # 2**24 + 1 has no float32
     (int64, float64, int64),  # numpy calls this cast "safe"; it is not exact
     (int16, float16, int16),
     (float32, int32, float32),  # truncates
     (int32, int8, int32),  # wraps
     (float32, bool_, float32)],
)  # fmt: skip
def test_cast_through_a_lossy_type_stays_two_casts(source, middle, target):
    graph, _ = cast_chain(source, middle, target)
    assert simplify(graph) is graph


def test_a_lossy_intermediate_really_loses():
    # The reason the rule above must not fire: int64 -> float64 -> int64 is not the identity.
    graph, _ = cast_chain(int64, float64, int64, shape=(1,))
    value = np.array([2**53 + 1])
    assert interpret(graph, [value])[0][0] != value[0]


def test_cast_to_its_own_dtype_is_x():
    graph, x = cast_chain(float32, float32)
    assert simplify(graph).outputs == (x,)


def test_nothing_to_simplify_returns_the_same_graph():
    b = GraphBuilder()
    x = b.input(F23)
    graph = b.build([b.node("exp", [b.node("add", [x, x])])])
    assert simplify(graph) is graph


# ----------------------------------------------------------------------------- matmul layouts
def weight_gradient(n: int, fan_in: int, fan_out: int):
    """A linear layer's weight gradient as the backward writes it: ``copy(permute(x^T @ g))``."""
    b = GraphBuilder()
    x = b.input(TensorType((n, fan_in), float32))
    g = b.input(TensorType((n, fan_out), float32))
    product = b.node("matmul", [b.node("permute", [x], {"perm": (1, 0)}), g])
    return b.build([b.node("copy", [b.node("permute", [product], {"perm": (1, 0)})])])


def random_inputs(graph, seed: int):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(v.type.shape).astype(v.type.dtype.np) for v in graph.inputs]


def test_a_weight_gradient_is_one_matmul_of_views_with_no_copy():
    graph = weight_gradient(3, 4, 5)
    check_pass(simplify, graph, """
        graph(%0: f32[3,4], %1: f32[3,5]) {
          %2: f32[4,3] = permute(%0) {perm=(1, 0)}
          %3: f32[4,5] = matmul(%2, %1)
          %6: f32[5,3] = permute(%1) {perm=(1, 0)}
          %4: f32[5,4] = matmul(%6, %0)
          return (%4)
        }
    """, several_inputs(graph))  # fmt: skip


@pytest.mark.parametrize("n, fan_in, fan_out", [(128, 784, 512), (128, 512, 512), (128, 512, 10), (1024, 256, 768)])
def test_the_transposed_product_is_equal_to_rounding_at_model_sizes(n, fan_in, fan_out):
    # Each element is the same dot product of the same terms; whether BLAS sums it in the same order
    # with the other operand transposed depends on its kernel (OpenBLAS's SkylakeX kernels: bit for
    # bit; its Haswell kernels, OPENBLAS_CORETYPE=Haswell: 7% of the elements differ in the last bits).
    # So the rewrite is checked to within float32 rounding of a sum of n products.
    graph = weight_gradient(n, fan_in, fan_out)
    after = simplify(graph)
    assert [node.op for node in after.nodes if node.op in ("copy", "matmul")] == ["matmul", "matmul"]
    for seed in range(2):
        inputs = random_inputs(graph, seed)
        for a, b in zip(interpret(graph, inputs), interpret(after, inputs), strict=True):
            scale = (np.abs(inputs[0]).T.astype(np.float64) @ np.abs(inputs[1]).astype(np.float64)).T  # |g|^T |x|
            assert a.shape == b.shape == scale.shape
            assert np.all(np.abs(b.astype(np.float64) - a) <= 2 * n * np.finfo(np.float32).eps * scale)


def test_a_batched_product_transposes_its_own_last_two_dims():
    b = GraphBuilder()
    a = b.input(TensorType((2, 3, 4), float32))
    w = b.input(TensorType((4, 5), float32))
    graph = b.build([b.node("permute", [b.node("matmul", [a, w])], {"perm": (0, 2, 1)})])
    check_pass(simplify, graph, """
        graph(%0: f32[2,3,4], %1: f32[4,5]) {
          %2: f32[2,3,5] = matmul(%0, %1)
          %4: f32[5,4] = permute(%1) {perm=(1, 0)}
          %5: f32[2,4,3] = permute(%0) {perm=(0, 2, 1)}
          %3: f32[2,5,3] = matmul(%4, %5)
          return (%3)
        }
    """, several_inputs(graph) + [random_inputs(graph, 0)])  # fmt: skip


def test_a_product_with_other_uses_is_neither_recomputed_nor_uncopied():
    b = GraphBuilder()
    x = b.input(TensorType((3, 4), float32))
    y = b.input(TensorType((4, 5), float32))
    product = b.node("matmul", [x, y])
    transposed = b.node("permute", [product], {"perm": (1, 0)})
    graph = b.build([transposed, b.node("copy", [product]), b.node("exp", [product])])
    assert simplify(graph) is graph


def test_copies_of_inputs_constants_views_and_shared_values_stay():
    b = GraphBuilder()
    x = b.input(TensorType((2, 3, 4), float32))
    y = b.input(TensorType((4, 4), float32))
    product = b.node("matmul", [x, y])
    batch_swapped = b.node("permute", [product], {"perm": (1, 0, 2)})  # moves a batch dim: not a transpose
    shared = b.node("exp", [x])
    zeros = b.constant(np.zeros((2, 3, 4), np.float32), TensorType((2, 3, 4), float32))
    graph = b.build([b.node("copy", [x]), b.node("copy", [batch_swapped]), b.node("copy", [shared]), shared,
                     b.node("copy", [zeros])])  # fmt: skip
    assert simplify(graph) is graph


def test_a_copy_of_a_fresh_result_is_that_result():
    # An embedding's gradient: copy(index_put(zeros, g, idx)); any non-view result is fresh memory.
    b = GraphBuilder()
    x = b.input(TensorType((4, 3), float32))
    g = b.input(TensorType((5, 3), float32))
    idx = b.input(TensorType((5,), int64))
    put = b.node("index_put", [x, g, idx], {"accumulate": True})
    bias_grad = b.node("reshape", [b.node("reduce_sum", [g], {"axes": (0,), "keepdim": True})], {"shape": (3,)})
    graph = b.build([b.node("copy", [put]), b.node("copy", [b.node("exp", [x])]), b.node("copy", [bias_grad])])
    after = simplify(graph)
    assert sorted(node.op for node in after.nodes) == ["exp", "index_put", "reduce_sum", "reshape"]
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(5, 3)).astype(np.float32),
              np.array([0, 3, 0, -1, 2])]  # fmt: skip
    assert_same_results(graph, after, inputs)


def test_a_copy_of_a_view_of_a_product_stays():
    # The view shares the product's memory with another output: the copy keeps them apart.
    b = GraphBuilder()
    x = b.input(TensorType((3, 3), float32))
    product = b.node("matmul", [x, x])
    view = b.node("reshape", [product], {"shape": (9,)})
    graph = b.build([view, b.node("copy", [b.node("reshape", [view], {"shape": (3, 3)})])])
    after = simplify(graph)
    assert "copy" in [node.op for node in after.nodes]
    assert_same_results(graph, after, random_inputs(graph, 0))


def test_a_sum_of_side_by_side_pads_is_one_concatenate():
    # the gradient of x.chunk(4, dim=1): four zero pads, summed left to right as autograd does
    b = GraphBuilder()
    pieces = [b.input(TensorType((3, 2), float32)) for _ in range(4)]
    pads = [b.node("pad", [p], {"low": (0, 2 * k), "high": (0, 6 - 2 * k), "interior": (0, 0), "value": 0.0})
            for k, p in enumerate(pieces)]  # fmt: skip
    total = pads[2]
    for k in (3, 1, 0):  # in an order where each next region is adjacent to those so far
        total = b.node("add", [total, pads[k]])
    graph = b.build([total])
    after = eliminate_dead_code(simplify(graph))
    ops = [node.op for node in after.nodes]
    assert ops.count("concatenate") == 1 and "pad" not in ops, ops
    inputs = random_inputs(graph, 0)
    inputs[1][0, 0] = -0.0  # the sum with the pads' zeros makes it +0.0: so must the rewrite
    assert_same_results(graph, after, inputs)
    (out,) = interpret(after, inputs)
    assert not np.signbit(out[0, 2])


def test_pads_that_overlap_or_are_used_elsewhere_stay_added():
    b = GraphBuilder()
    x, y = b.input(TensorType((3, 2), float32)), b.input(TensorType((3, 2), float32))
    left = b.node("pad", [x], {"low": (0, 0), "high": (0, 2), "interior": (0, 0), "value": 0.0})
    overlapping = b.node("pad", [y], {"low": (0, 1), "high": (0, 1), "interior": (0, 0), "value": 0.0})
    graph = b.build([b.node("add", [left, overlapping])])
    assert simplify(graph) is graph
    right = b.node("pad", [y], {"low": (0, 2), "high": (0, 0), "interior": (0, 0), "value": 0.0})
    graph = b.build([b.node("add", [left, right]), left])  # the pad is an output too
    assert simplify(graph) is graph


def _slices_of_a_pad():
    """A (2, 3) input padded to (2, 9) along dim 1 (columns 2..4 hold it) and sliced four ways."""
    b = GraphBuilder()
    x = b.input(F23)
    padded = b.node("pad", [x], {"low": (0, 2), "high": (0, 4), "interior": (0, 0), "value": 0.0})
    spans = {"exact": (2, 5), "within": (3, 5), "zeros": (6, 9), "straddling": (1, 3)}
    slices = [
        b.node("slice", [padded], {"starts": (0, a), "stops": (2, z), "steps": (1, 1)}) for a, z in spans.values()
    ]
    return b.build(slices)


def test_slices_of_a_zero_pad_read_its_input_or_zeros():
    # a recurrence's VJP reads its packed cotangent a part at a time: no full-width pad is written for it
    graph = _slices_of_a_pad()
    after = eliminate_dead_code(simplify(graph))
    exact, within, zeros, straddling = after.outputs
    producer = {v: n for n in after.nodes for v in n.outputs}
    assert exact is graph.inputs[0]
    assert producer[within].op == "slice" and producer[within].inputs == (graph.inputs[0],)
    assert producer[within].attrs["starts"] == (0, 1) and producer[within].attrs["stops"] == (2, 3)
    assert producer[zeros].op == "expand" and producer[producer[zeros].inputs[0]].op == "constant"
    assert producer[producer[straddling].inputs[0]].op == "pad"  # part data, part padding: kept
    inputs = random_inputs(graph, 0)
    inputs[0][0, 0] = -0.0
    assert_same_results(graph, after, inputs)
    assert_same_results(graph, after, inputs_for(graph))


def test_a_slice_of_one_piece_of_a_concatenate_is_that_piece():
    b = GraphBuilder()
    x, y = b.input(F23), b.input(TensorType((2, 4), float32))
    joined = b.node("concatenate", [x, y], {"axis": 1})
    piece = b.node("slice", [joined], {"starts": (0, 3), "stops": (2, 7), "steps": (1, 1)})
    part = b.node("slice", [joined], {"starts": (0, 2), "stops": (2, 4), "steps": (1, 1)})  # across both: kept
    graph = b.build([piece, part])
    after = simplify(graph)
    assert after.outputs[0] is y and after.outputs[1] is not x and after.outputs[1] is not y
    assert_same_results(graph, after, random_inputs(graph, 0))


# ----------------------------------------------------------------------------- one-hot scatters
def one_hot_scatter(shape, axis, fill, src_shape=None, dtype=float32, index_shape=None):
    """``scatter_add(full(shape, fill), index, src, axis)`` with one index per line along ``axis``."""
    b = GraphBuilder()
    line = tuple(1 if d == axis else n for d, n in enumerate(shape))
    index = b.input(TensorType(index_shape or line, int64))
    src = b.input(TensorType(src_shape or line, dtype))
    base = b.constant(np.full(shape, fill, dtype.np), TensorType(shape, dtype))
    return b.build([b.node("scatter_add", [base, index, src], {"axis": axis})])


@pytest.mark.parametrize(
    "shape, axis, fill, src_shape",
    [((5, 7), 1, 0.0, None), ((6, 4), 0, 2.5, None), ((3, 4, 5), 1, -0.0, (3, 2, 6)), ((4, 9), 1, np.nan, None)],
)
def test_a_one_hot_scatter_into_a_fill_is_a_where(shape, axis, fill, src_shape):
    graph = one_hot_scatter(shape, axis, fill, src_shape)
    after = eliminate_dead_code(simplify(graph))
    ops = [node.op for node in after.nodes]
    assert "scatter_add" not in ops and "where" in ops, ops
    rng = np.random.default_rng(0)
    index_type, src_type = (v.type for v in graph.inputs)
    for shift in range(3):  # special values in src: -0.0 + 0.0 is +0.0 in the scatter, and in the rewrite
        index = rng.integers(0, shape[axis], index_type.shape)
        assert_same_results(graph, after, [index, special(src_type.shape, np.float32, shift)])


def test_the_gradient_of_cross_entropy_scatters_nothing():
    import kiln  # noqa: PLC0415 - traced here, like the fusion tests' real programs

    logits = kiln.randn(6, 11, requires_grad=True)
    target = kiln.tensor([0, 10, 3, 3, 7, 1])

    def grad(x, t):
        (g,) = kiln.autograd.grad(kiln.nn.functional.cross_entropy(x, t), [x])
        return g

    compiled = kiln.compile(grad)
    for _ in range(3):
        expected = grad(logits, target)
        np.testing.assert_allclose(compiled(logits, target).numpy(), expected.numpy(), rtol=1e-6, atol=1e-7)
    (specialization,) = compiled.state.specializations
    assert "scatter_add" not in specialization.graph.op_counts()


def test_scatters_that_are_not_one_hot_into_a_fill_stay():
    assert simplify(g := one_hot_scatter((5, 7), 1, 0.0, (5, 2), index_shape=(5, 2))) is g  # two indices per line
    signed_zeros = one_hot_scatter((2, 3), 1, 0.0)
    signed_zeros.constants[next(iter(signed_zeros.constants))][0, 1] = -0.0
    assert simplify(signed_zeros) is signed_zeros  # 0.0 and -0.0: two values
    b = GraphBuilder()
    index, src = b.input(TensorType((5, 1), int64)), b.input(TensorType((5, 1), float32))
    base = b.constant(np.arange(35, dtype=np.float32).reshape(5, 7), TensorType((5, 7), float32))
    graph = b.build([b.node("scatter_add", [base, index, src], {"axis": 1})])
    assert simplify(graph) is graph  # a base that is not one value
    base_input = b.input(TensorType((5, 7), float32))
    graph = b.build([b.node("scatter_add", [base_input, index, src], {"axis": 1})])
    assert simplify(graph) is graph  # a base that is not a constant


# ----------------------------------------------------------------------------- outer products
def outer_product(a_shape, b_shape, dtype=float32):
    b = GraphBuilder()
    x, y = b.input(TensorType(a_shape, dtype)), b.input(TensorType(b_shape, dtype))
    return b.build([b.node("matmul", [x, y])])


@pytest.mark.parametrize(
    "a_shape, b_shape, dtype",
    [((6, 1), (1, 5), float32), ((2, 4, 1), (3, 1, 1, 3), float64), ((4, 1), (1, 4), int32), ((3, 1), (1, 2), float16)],
)
def test_a_product_over_one_term_is_an_elementwise_product(a_shape, b_shape, dtype):
    """Equal bit for bit to the product on numpy/BLAS, -0.0 (0.0 * -1.0: +0.0 from BLAS), inf and
    nan included; batch dims broadcast as the product's."""
    graph = outer_product(a_shape, b_shape, dtype)
    after = eliminate_dead_code(simplify(graph))
    ops = [node.op for node in after.nodes]
    assert "matmul" not in ops and "mul" in ops, ops
    assert after.outputs[0].type == graph.outputs[0].type
    for inputs in several_inputs(graph):
        assert_same_results(graph, after, inputs)


def test_products_over_more_terms_or_of_bools_stay():
    assert simplify(g := outer_product((6, 2), (2, 5))) is g
    assert simplify(g := outer_product((6, 1), (1, 5), bool_)) is g


# ----------------------------------------------------------------------------- sums of one term
def one_term_sum(shape, axes, keepdim=False, dtype=float32):
    b = GraphBuilder()
    x = b.input(TensorType(shape, dtype))
    return b.build([b.node("reduce_sum", [x], {"axes": axes, "keepdim": keepdim})])


@pytest.mark.parametrize(
    "shape, axes, keepdim, dtype",
    [((1, 4, 3), (0,), False, float32), ((2, 1, 3, 1), (1, 3), True, float64), ((1, 5), (0,), False, int32),
     ((3, 1), (1,), False, float16), ((1, 2), (0,), False, bool_)],
)  # fmt: skip
def test_a_sum_of_one_term_is_elementwise(shape, axes, keepdim, dtype):
    """Bit for bit the eager sum (-0.0 becomes +0.0; inf and nan included); no reduction left, and
    memory of its own (an add, or a copy for integers and bools), not a view of the input."""
    graph = one_term_sum(shape, axes, keepdim, dtype)
    after = eliminate_dead_code(simplify(graph))
    ops = [node.op for node in after.nodes if node.op not in ("constant", "reshape")]  # (keepdim: no reshape)
    assert ops == ["add" if dtype.is_floating_point else "copy"], ops
    assert after.outputs[0].type == graph.outputs[0].type
    for inputs in several_inputs(graph):
        assert_same_results(graph, after, inputs)


def test_sums_over_more_terms_stay():
    assert simplify(g := one_term_sum((2, 1, 3), (0, 1))) is g
    assert simplify(g := one_term_sum((2, 3), ())) is not g  # a sum over no axes has one term each


def _permuted_embedding(perm: tuple[int, ...], other_use: bool = False):
    """``copy(permute(take(table, idx)))``: an embedding's (B, T, H) rows read time-major."""
    b = GraphBuilder()
    table = b.input(TensorType((10, 4), float32))
    idx = b.input(TensorType((3, 5), int64))
    rows = b.node("take", [table, idx])
    outputs = [b.node("copy", [b.node("permute", [rows], {"perm": perm})])]
    return b.build(outputs + ([b.node("exp", [rows])] if other_use else []))


def _token_inputs(graph, seed: int):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((10, 4)).astype(np.float32), rng.integers(-10, 10, (3, 5))]


def test_a_permuted_copy_of_gathered_rows_gathers_them_in_that_order():
    graph = _permuted_embedding((1, 0, 2))
    check_pass(simplify, graph, """
        graph(%0: f32[10,4], %1: i64[3,5]) {
          %2: f32[3,5,4] = take(%0, %1)
          %3: f32[5,3,4] = permute(%2) {perm=(1, 0, 2)}
          %5: i64[5,3] = permute(%1) {perm=(1, 0)}
          %4: f32[5,3,4] = take(%0, %5)
          return (%4)
        }
    """, [_token_inputs(graph, seed) for seed in range(3)])  # fmt: skip


@pytest.mark.parametrize("perm, other_use", [((0, 2, 1), False), ((2, 1, 0), False), ((1, 0, 2), True)])
def test_a_permute_of_the_rows_own_dims_or_a_take_used_again_keeps_its_copy(perm, other_use):
    graph = _permuted_embedding(perm, other_use)
    after = eliminate_dead_code(simplify(graph))
    assert [node.op for node in after.nodes] == [node.op for node in graph.nodes]
    assert_same_results(graph, after, _token_inputs(graph, 0))
