"""A kernel kind's LLVM generator written outside kiln, on the public kernel-building core alone
(issue 37): the plan (kiln.codegen.plans), the body emitter (kiln.codegen.llvm.body) and the loop
nests (kiln.codegen.llvm.loops) -- no private name of kiln, no file of kiln touched.

The test's kind, ``one_unit``: an elementwise body run as one parallel unit, the whole domain in one
loop nest. Its kernels equal the interpreter's results, for inputs in C order and transposed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from kiln.codegen.llvm import kinds
from kiln.codegen.llvm.body import KernelBody, Scope, operand_pointers
from kiln.codegen.llvm.loops import VarEnv, for_range, nest
from kiln.codegen.plans import checked_bodies, elementwise_plan
from kiln.ir.graph import GraphBuilder
from kiln.ir.interpreter import interpret
from kiln.ir.kernel_kinds import ELEMENTWISE, KernelKind, register_kernel_kind, unregister_kernel_kind
from tests.codegen.llvm.test_kernels import T, compile_kernel, kernel, layout, run
from tests.conftest import assert_close

ONE_UNIT = KernelKind("one_unit", ELEMENTWISE.verify_body, "an elementwise body as one parallel unit (a test's kind)",
                      pointwise=True)  # fmt: skip


def emit_one_unit(builder, args, node, layouts) -> int:
    """The whole domain in one unit: the plan's collapsed loops, nested, store every output."""
    (body,) = checked_bodies(node)
    plan = elementwise_plan(body, layouts)
    args_ptr, begin, end = args
    env = VarEnv()
    target = KernelBody(builder, operand_pointers(builder, args_ptr, len(body.inputs) + len(body.outputs)), env)
    with for_range(builder, begin, end, name="unit"), nest(builder, env, plan.groups, plan.sizes):
        target.compute_then_store(plan.outputs, Scope())
    builder.ret_void()
    return 1


@contextlib.contextmanager
def one_unit_kind() -> Iterator[None]:
    register_kernel_kind(ONE_UNIT)
    kinds.register_kernel_generator(ONE_UNIT.name, kinds.KindGenerator(emit_one_unit, symbolic=False))
    try:
        yield
    finally:
        kinds.unregister_kernel_generator(ONE_UNIT.name)
        unregister_kernel_kind(ONE_UNIT.name)


def _body(shape):
    b = GraphBuilder()
    x, y = b.input(T(shape)), b.input(T(shape))
    s = b.node("add", [b.node("mul", [x, y]), x])
    return b.build([s, b.node("exp", [b.node("neg", [s])])])


def test_a_kind_written_on_the_public_core_compiles_and_equals_the_interpreter():
    rng = np.random.default_rng(3)
    body = _body((5, 6, 7))
    x = rng.normal(size=(5, 6, 7)).astype(np.float32)
    y = np.asfortranarray(rng.normal(size=(5, 6, 7)).astype(np.float32))  # its loops stay apart
    with one_unit_kind():
        node = kernel(ONE_UNIT.name, body)
        info, _, _ = compile_kernel(node, [x, y])
        assert info.extent == 1
        for arrays in ([x, y], [x, np.ascontiguousarray(y)]):
            assert elementwise_plan(body, [layout(a) for a in arrays]).groups in ([[0, 1, 2]], [[0], [1], [2]])
            for ours, theirs in zip(run(node, arrays), interpret(body, arrays), strict=True):
                assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    assert kinds.kind_generator(ONE_UNIT.name) is None
