"""The kernel plans both code generators start from (kiln/codegen/plans.py): domains, loop groups,
outputs, rows and levels of reductions, horizontal members' padded tables -- each checked against
values worked out by hand -- and the refusals, with their reasons. The last tests check that the
LLVM and CUDA generators lay their kernels out as the plan says."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from kiln.codegen import index as ix
from kiln.codegen import plans
from kiln.codegen.core import Unsupported
from kiln.codegen.cuda import kernels as cuda_kernels
from kiln.codegen.cuda.core import CudaModule
from kiln.codegen.index import Space
from kiln.codegen.kernel_dag import DagBuilder, loads
from kiln.codegen.plans import checked_bodies, elementwise_plan, horizontal_plan, reduction_plan
from kiln.ir import dtypes as dt
from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.types import Sym, TensorType


def T(shape, dtype=dt.float32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def kernel(kind: str, *bodies: Graph) -> Node:
    inputs = tuple(v for body in bodies for v in body.inputs)
    outputs = tuple(v for body in bodies for v in body.outputs)
    return Node("kernel", inputs, {"name": "k0", "kind": kind, "bodies": tuple(bodies)}, outputs)


def test_the_module_example_runs():
    result = doctest.testmod(plans)
    assert result.attempted >= 6 and result.failed == 0


# ----------------------------------------------------------------------------- elementwise


def _add_body(shape=(4, 8)) -> Graph:
    b = GraphBuilder()
    x, y = b.input(T(shape)), b.input(T(shape))
    return b.build([b.node("add", [x, y]), b.node("mul", [x, y])])


def test_a_contiguous_elementwise_body_is_one_loop():
    plan = elementwise_plan(_add_body(), [(8, 1), (8, 1)])
    assert plan.domain == (4, 8) and not plan.symbolic
    assert plan.groups == [[0, 1]] and plan.sizes == [32]
    assert [out.operand for out in plan.outputs] == [2, 3]  # after the two inputs
    at = plan.outputs[0].at
    assert (at.const, at.coef(0), at.coef(1)) == (0, 8, 1)  # outputs are C-contiguous


def test_a_transposed_input_keeps_the_loops_apart():
    plan = elementwise_plan(_add_body(), [(8, 1), (1, 4)])  # y column-major
    assert plan.groups == [[0], [1]] and plan.sizes == [4, 8]


def test_a_symbolic_leading_dimension_is_a_loop_of_its_own():
    B = Sym("B")
    plan = elementwise_plan(_add_body((B, 4, 8)), [(32, 8, 1), (32, 8, 1)])
    assert plan.symbolic and plan.groups == [[0], [1, 2]] and plan.sizes == [B, 32]


def test_an_outputs_plan_loops_over_the_dims_its_generator_does_not_bind():
    """A conv kernel binds the sample and channel itself: its epilogue's loops start at dim 2."""
    body = _add_body((2, 3, 4, 5))
    dag = DagBuilder(body, Space((2, 3, 4, 5)), [(60, 20, 5, 1)] * 2)
    plan = plans.outputs_plan(dag, [(7, body.outputs[1])], loops_from=2)
    assert plan.groups == [[2, 3]] and plan.sizes == [20]
    assert [out.operand for out in plan.outputs] == [7]
    assert plans.outputs_plan(dag, [(7, body.outputs[1])]).groups == [[0, 1, 2, 3]]


def test_elementwise_outputs_of_different_shapes_are_declined():
    b = GraphBuilder()
    x = b.input(T((4, 8)))
    body = b.build([b.node("neg", [x]), b.node("reduce_sum", [x], {"axes": (1,), "keepdim": False})])
    with pytest.raises(Unsupported, match=r"elementwise outputs of shapes \[4, 8\] and \[4\]"):
        elementwise_plan(body, [(8, 1)])


def _window_gradient_body(n=2, c=3, h=7, k=2) -> Graph:
    """Max pooling's backward then ReLU's, as a CNN's training step fuses them: each window's gradient
    ``g`` goes to the offset ``idx`` names (``win`` numbers the offsets), the result is read as the
    (n, c, h*k, h*k) input's shape and masked."""
    b = GraphBuilder()
    g, idx = b.input(T((n, c, h, h))), b.input(T((n, c, h, h), dt.int32))
    win, mask = b.input(T((1, 1, 1, k, 1, k), dt.int32)), b.input(T((n, c, h * k, h * k), dt.bool_))
    window = (n, c, h, 1, h, 1)
    hit = b.node("eq", [win, b.node("reshape", [idx], {"shape": window})])
    zero = b.constant(np.zeros((), np.float32), T(()))
    spread = b.node("where", [hit, b.node("reshape", [g], {"shape": window}), zero])
    up = b.node("reshape", [spread], {"shape": (n, c, h * k, h * k)})
    return b.build([b.node("where", [mask, zero, up])])


def _contiguous(body: Graph) -> list[tuple[int, ...]]:
    return [ix.contiguous_strides(v.type.shape) for v in body.inputs]


def _affine(plan) -> bool:
    offsets = [load.offset for load in loads(plan.roots)] + [out.at for out in plan.outputs]
    return all(offset.is_affine for offset in offsets)


def test_a_reshape_that_splits_a_domain_dim_refines_the_domain():
    """Read at ``h // 2``, the window's gradient needed a division per element and a gather: over
    ``h = 2*i + a`` every offset is affine (kiln/codegen/llvm/elementwise.py vectorizes it)."""
    body = _window_gradient_body()
    plan = elementwise_plan(body, _contiguous(body))
    assert plan.domain == (2, 3, 7, 2, 7, 2) and _affine(plan)
    assert plan.outputs[0].at == ix.offset(Space(plan.domain).identity(), ix.contiguous_strides(plan.domain))
    assert plan.sizes[-2:] == [7, 2]  # the window's last offset innermost, the row's windows around it


def test_a_chain_of_divisions_refines_a_dim_into_several():
    """A flatten of (4, 3, 5, 5) read over its (4, 75) output divides by 25 and 5 (nested): the dim
    splits into 3 x 5 x 5, and a contiguous input is one loop again."""
    b = GraphBuilder()
    x, y = b.input(T((4, 3, 5, 5))), b.input(T((4, 75)))
    body = b.build([b.node("mul", [b.node("reshape", [x], {"shape": (4, 75)}), y])])
    plan = elementwise_plan(body, _contiguous(body))
    assert _affine(plan) and plan.domain == (4, 3, 5, 5) and plan.sizes == [300]


def test_a_division_that_does_not_divide_the_size_leaves_the_domain():
    b = GraphBuilder()
    x = b.input(T((3, 4)))
    body = b.build([b.node("reshape", [b.node("permute", [x], {"perm": (1, 0)})], {"shape": (12,)})])
    plan = elementwise_plan(body, _contiguous(body))  # (j % 3, j // 3) over 12: splits into 4 x 3
    assert _affine(plan) and plan.domain == (4, 3)
    b = GraphBuilder()
    x = b.input(T((2, 5)))
    body = b.build([b.node("reshape", [b.node("permute", [x], {"perm": (1, 0)})], {"shape": (2, 5)})])
    plan = elementwise_plan(body, _contiguous(body))  # a flat 5*i + j read as (5, 2): 10 is not split
    assert plan.domain == (2, 5) and not _affine(plan)


def test_a_symbolic_leading_dimension_stays_whole_when_the_domain_is_refined():
    B = Sym("B")
    b = GraphBuilder()
    g, mask = b.input(T((B, 3, 4))), b.input(T((B, 3, 8), dt.bool_))
    up = b.node("reshape", [b.node("expand", [b.node("reshape", [g], {"shape": (B, 3, 4, 1)})],
                                   {"shape": (B, 3, 4, 2)})], {"shape": (B, 3, 8)})  # fmt: skip
    body = b.build([b.node("where", [mask, up, b.constant(np.zeros((), np.float32), T(()))])])
    plan = elementwise_plan(body, [(12, 4, 1), (24, 8, 1)])
    assert plan.symbolic and plan.domain == (B, 3, 4, 2) and _affine(plan) and plan.groups[0] == [0]


# ----------------------------------------------------------------------------- reduction


def _softmax_body(rows: int = 16, n: int = 64) -> Graph:
    b = GraphBuilder()
    x = b.input(T((rows, n)))
    e = b.node("exp", [b.node("sub", [x, b.node("reduce_max", [x], {"axes": (1,), "keepdim": True})])])
    return b.build([b.node("div", [e, b.node("reduce_sum", [e], {"axes": (1,), "keepdim": True})])])


def test_softmax_is_two_levels_over_rows_then_one_full_output():
    plan = reduction_plan(_softmax_body(), [(64, 1)])
    assert plan.outer_shape == (16,) and plan.groups == [[1]] and plan.sizes == [64] and plan.row_elements == 64
    assert [[r.op for r in level] for level in plan.levels] == [["reduce_max"], ["reduce_sum"]]
    assert [out.operand for out in plan.full] == [1] and plan.per_row == []
    assert plan.full[0].at == plan.full_at


def test_row_valued_outputs_are_stored_once_a_row():
    n, c = 6, 10
    b = GraphBuilder()
    x, w = b.input(T((n, c))), b.input(T((c,)))
    mean = b.node("reduce_sum", [x], {"axes": (1,), "keepdim": False})  # [n]
    centered = b.node("sub", [x, b.node("reshape", [mean], {"shape": (n, 1)})])
    var = b.node("reduce_sum", [b.node("mul", [centered, centered])], {"axes": (1,), "keepdim": True})  # [n, 1]
    body = b.build([b.node("mul", [centered, w]), mean, var])
    plan = reduction_plan(body, [(c, 1), (1,)])
    assert [out.operand for out in plan.full] == [2]
    assert [out.operand for out in plan.per_row] == [3, 4]
    assert all(out.at.coef(0) == 1 and out.at.coef(1) == 0 for out in plan.per_row)  # one element a row
    assert [len(level) for level in plan.levels] == [1, 1]  # the variance reads the mean: a pass later


def test_the_reduced_axes_collapse_as_the_layouts_allow():
    b = GraphBuilder()
    x = b.input(T((2, 3, 4, 5)))
    body = b.build([b.node("reduce_sum", [x], {"axes": (2, 3), "keepdim": False})])
    plan = reduction_plan(body, [(60, 20, 5, 1)])
    assert plan.outer_shape == (2, 3) and plan.groups == [[2, 3]] and plan.sizes == [20]
    plan = reduction_plan(body, [(60, 20, 1, 4)])  # the last two axes transposed
    assert plan.groups == [[2], [3]] and plan.sizes == [4, 5]


def _sum_body(shape, axes) -> Graph:
    b = GraphBuilder()
    x = b.input(T(shape))
    return b.build([b.node("reduce_sum", [x], {"axes": axes, "keepdim": False})])


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (_sum_body((4, 8), (0,)), r"reduction axes \(0,\) of \[4, 8\] are not the trailing axes"),
        (_sum_body((Sym("B"),), (0,)), "a reduction over the symbolic dimension B"),
        (_add_body(), "a reduction kernel without a reduction"),
    ],
)
def test_reductions_a_plan_declines_say_why(body, why):
    with pytest.raises(Unsupported, match=why):
        reduction_plan(body, [(8, 1)] * len(body.inputs))


def test_reductions_over_different_axes_and_odd_outputs_are_declined():
    b = GraphBuilder()
    x = b.input(T((4, 8)))
    rows = b.node("reduce_sum", [x], {"axes": (1,), "keepdim": False})
    everything = b.node("reduce_sum", [x], {"axes": (0, 1), "keepdim": False})
    with pytest.raises(Unsupported, match="reductions over different shapes or axes"):
        reduction_plan(b.build([rows, everything]), [(8, 1)])
    b = GraphBuilder()
    x = b.input(T((4, 8)))
    column = b.node("reshape", [b.node("reduce_sum", [x], {"axes": (1,), "keepdim": False})], {"shape": (2, 2)})
    body = b.build([b.node("neg", [x]), b.node("expand", [column], {"shape": (2, 2)})])
    plans_ok = reduction_plan(body, [(8, 1)])  # [2, 2] has as many elements as rows: row-valued
    assert len(plans_ok.per_row) == 1
    b = GraphBuilder()
    x = b.input(T((4, 8)))
    odd = b.node("reshape", [x], {"shape": (8, 4)})
    body = b.build([odd, b.node("reduce_sum", [x], {"axes": (1,), "keepdim": False})])
    with pytest.raises(Unsupported, match=r"an output of shape \[8, 4\] is neither full \[4, 8\] nor one per row"):
        reduction_plan(body, [(8, 1)])


# ----------------------------------------------------------------------------- horizontal


def _adam_like(shape, op: str = "sub") -> Graph:
    b = GraphBuilder()
    p, g, lr = b.input(T(shape)), b.input(T(shape)), b.input(T(()))
    new = b.node(op, [p, b.node("mul", [lr, g])])
    return b.build([new, b.node("mul", [g, g])])


def _leaf_table(member) -> dict[str, list[list[int]]]:
    """A member's padded leaf coefficients, by what the leaf addresses (input k, or the stores); a
    value loaded twice at one index is one load."""
    _, coefs = member.padded(2)
    width = 3  # the constant, then one coefficient for each of the 2 loops
    rows = [coefs[k * width : (k + 1) * width] for k in range(len(member.leaves))]
    table: dict[str, list[list[int]]] = {}
    for load, row in zip(member.loads, rows, strict=False):
        table.setdefault(f"in{load.operand}", []).append(row)
    table["stores"] = rows[len(member.loads) :]
    return table


def test_horizontal_members_are_padded_to_one_depth():
    bodies = [_adam_like((5, 7)), _adam_like((1000,))]
    layouts = [(1, 5), (7, 1), (), (1,), (1,), ()]  # member 0's p column-major: two loops
    plan = horizontal_plan(bodies, layouts)
    assert (plan.n_in, plan.n_out, plan.depth) == (3, 2, 2)
    first, second = plan.members
    assert first.padded(2)[0] == [5, 7] and second.padded(2)[0] == [1, 1000]
    assert _leaf_table(first) == {"in0": [[0, 1, 5]], "in1": [[0, 7, 1]], "in2": [[0, 0, 0]],
                                  "stores": [[0, 7, 1], [0, 7, 1]]}  # fmt: skip
    assert _leaf_table(second) == {"in0": [[0, 0, 1]], "in1": [[0, 0, 1]], "in2": [[0, 0, 0]],
                                   "stores": [[0, 0, 1], [0, 0, 1]]}  # fmt: skip
    # node.inputs then node.outputs list member after member: 2 members x 3 inputs, then outputs
    assert plan.operands(0) == [0, 1, 2, 6, 7] and plan.operands(1) == [3, 4, 5, 8, 9]


def test_horizontal_members_that_do_not_share_a_structure_are_declined():
    with pytest.raises(Unsupported, match="horizontal members of different structure"):
        horizontal_plan([_adam_like((4,)), _adam_like((4,), op="add")], [(1,), (1,), ()] * 2)
    with pytest.raises(Unsupported, match="different numbers of inputs or outputs"):
        horizontal_plan([_adam_like((4,)), _add_body((4,))], [(1,), (1,), (), (1,), (1,)])
    with pytest.raises(Unsupported, match="no members"):
        horizontal_plan([], [])


# ----------------------------------------------------------------------------- the kernel node


def test_a_kernel_takes_one_body_unless_its_kind_has_members():
    body = _add_body()
    with pytest.raises(Unsupported, match="a elementwise kernel with 2 bodies"):
        checked_bodies(kernel("elementwise", body, _add_body()))
    bodies = (body, _add_body())
    assert checked_bodies(kernel("horizontal", *bodies)) == bodies
    with pytest.raises(Unsupported, match="a horizontal kernel with 0 bodies"):
        checked_bodies(kernel("horizontal"))


def test_layouts_are_checked_against_the_inputs():
    node = kernel("elementwise", _add_body())
    with pytest.raises(ValueError, match=r"expected one layout per kernel input \(2\), got 1"):
        plans.check_layouts(node, [(8, 1)])
    with pytest.raises(ValueError, match=r"input 1 has shape \[4, 8\] but layout \(1,\)"):
        plans.check_layouts(node, [(8, 1), (1,)])


# ----------------------------------------------------------------------------- the generators follow it


def test_the_cuda_generator_launches_what_the_plans_say():
    node = kernel("reduction", _softmax_body(rows=12, n=40))
    (launch,) = cuda_kernels.generate(CudaModule(), "k", node, [(40, 1)], cuda_kernels.Config())
    assert launch.grid == ("rows", 12)  # a block a row of the plan
    bodies = [_adam_like((5, 7)), _adam_like((1000,))]
    layouts = [(1, 5), (7, 1), (), (1,), (1,), ()]
    (launch,) = cuda_kernels.generate(CudaModule(), "h", kernel("horizontal", *bodies), layouts, cuda_kernels.Config())
    plan = horizontal_plan(bodies, layouts)
    assert launch.operands == tuple(plan.operands(0) + plan.operands(1))
    assert launch.grid == ("members", 1000, 2)


def test_the_llvm_generator_runs_a_unit_a_row_of_the_plan():
    from kiln.codegen.llvm.kernels import KernelModule  # noqa: PLC0415 - llvmlite only here

    info = KernelModule().add(kernel("reduction", _softmax_body(rows=12, n=40)), [(40, 1)])
    assert info.extent == 12
