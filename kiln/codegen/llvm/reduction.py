"""The ``reduction`` kernel kind compiled: reductions over a row's trailing axes and what reads them.

A parallel unit is one row (the flattened outer index; kiln/codegen/plans.py: ``reduction_plan``).
Per row, one pass over the row per reduction level computes that level's reductions together
(softmax: the max, then the sum of exponentials), then one pass writes the full-shape outputs;
row-valued outputs are stored once. A value the last accumulation pass computes and the output
pass needs again may be kept in the output (``_kept_in_output``), and a division by a row value
there (softmax's by its sum) multiplies by the row's reciprocal when that is within 1.5 ulp
(``with_reciprocals``). Over a symbolic leading dimension only the number of rows follows the
size (kiln/codegen/llvm/symbolic.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod as product

import numpy as np
from llvmlite import ir

from ...ir import dtypes as dt
from ...ir.graph import Node
from ...ir.primitives import Cost, ops_of_cost
from ...ir.types import Dim, Sym
from ..index import static
from ..kernel_dag import Apply, Const, Load, Reduce, walk
from ..kernel_dag import Node as DagNode
from ..plans import KernelOutput, ReductionPlan, checked_bodies, reduction_plan
from .body import Accumulator, DagEmitter, KernelBody, Scope, operand_pointers
from .loops import VarEnv, bind_rows, for_range, nest

__all__ = ["COSTLY", "accumulate", "emit_reduction", "kept_in_output", "output_pass", "with_reciprocals"]


def _row_interleave(inner: Dim) -> int | None:
    """How many vectors an iteration the loops within a row take: as many 16-lane vectors as the
    inner stretch holds, 1 to 4 (None: the vectorizer's choice, for a symbolic stretch). Given,
    it also keeps the row's loops from being unrolled. Unrolled, the passes over a row (a sum,
    then a variance, then the outputs: LayerNorm) reuse each other's loads of the whole row: 64
    vectors for a row of 1024 floats, live across passes and spilled to the stack (LayerNorm
    4096x1024, one thread: 130 -> 102 us). The vectorizer's own interleave of 4 would leave a
    short stretch (64 floats) to the scalar remainder (rows of 64: 323 -> 55 us)."""
    if not isinstance(inner, int):
        return None
    return max(1, min(4, inner // 16))


#: Operations whose value is worth keeping in the output rather than computing twice: the math
#: library's routines (``Primitive.cost``). A division's is not: one vector instruction, and in a row
#: kernel often on the row's values only (a mean), which no pass computes per element.
COSTLY = ops_of_cost(Cost.ROUTINE)
#: Operations on every element of a row that make a kept value pay for its store and load without a
#: costly one: LayerNorm's ``(x - mean) - drift``, two subtractions on the vector adder, which its
#: four passes keep busier than memory (one thread: 277 ns a row of 1024 floats, ~720 cycles).
KEEP_OPS = 2
#: The longest row (bytes of output) whose kept values are still in cache when the last pass reads them.
KEEP_ROW_BYTES = 256 << 10


def kept_in_output(plan: ReductionPlan, aliased: frozenset[int]) -> KernelOutput | None:
    """The output ``(operand, node, offset)`` of a value the last accumulation pass computes anyway,
    stored into the single full output during that pass and loaded back by the output pass, instead
    of being computed again -- softmax's ``exp(x - max)``, which its sum needs and its output
    divides; LayerNorm's centered value, which its variance squares and its output scales.

    Only where it pays and cannot go wrong: the node contains a costly routine or ``KEEP_OPS``
    operations on each element of the row, the row fits in cache, there is one full output, and
    once the kept node is loaded the output's formula reads no input that may share the output's
    memory (``aliased``: those of the output's shape; the last pass has already written the
    output). LayerNorm's weight and bias, of the row's shape, may be read."""
    full, reduces, outer = plan.full, plan.reduces, plan.rows.outer
    if len(full) != 1 or not reduces:
        return None
    operand, root, at = full[0]
    if all(isinstance(n, int) for n in plan.sizes) and plan.row_elements * root.dtype.itemsize > KEEP_ROW_BYTES:
        return None  # (a row of a symbolic length is kept: attention's rows are short)
    last = max(r.level for r in reduces)
    computed = {id(n) for n in walk([r.arg for r in reduces if r.level == last])}
    varies = _varying(root, outer)
    frontier, pending, seen = [], [root], set()
    while pending:  # the output's formula down to the first values along the row the last pass computes
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if id(node) in computed and node.after < last and varies[id(node)]:
            frontier.append(node)
        elif isinstance(node, Load) and node.operand in aliased:
            return None
        elif isinstance(node, Apply):
            pending.extend(node.args)
    if len(frontier) != 1 or frontier[0] is root or frontier[0].dtype is not root.dtype:
        return None
    kept = frontier[0]
    costly = any(isinstance(n, Apply) and n.op in COSTLY for n in walk([kept]))
    per_element = sum(1 for n in walk([kept]) if isinstance(n, Apply) and varies.get(id(n), False))
    if not costly and per_element < KEEP_OPS:
        return None
    return KernelOutput(operand, kept, at)


def _varying(root: DagNode, outer: int) -> dict[int, bool]:
    """For each node under ``root`` (by id): whether its value varies along the row. Reductions,
    constants and what is computed from them alone are row values, computed once a row."""
    varies: dict[int, bool] = {}
    pending = [(root, False)]
    while pending:  # operands first, then the node (no recursion: a chain may be long)
        node, ready = pending.pop()
        if id(node) in varies:
            continue
        if isinstance(node, Load):
            varies[id(node)] = any(var >= outer for var in node.offset.variables())
        elif not isinstance(node, Apply):
            varies[id(node)] = False
        elif ready:
            varies[id(node)] = any(varies[id(a)] for a in node.args)
        else:
            pending.append((node, True))
            pending.extend((a, False) for a in node.args)
    return varies


def emit_reduction(builder: ir.IRBuilder, args, node: Node, layouts) -> int | tuple[int, int]:
    """A reduction kernel's function body (see the module docstring); its number of parallel units
    (rows), or over a symbolic dimension ``(1, 1)``: a unit a row (``KernelInfo.units``)."""
    (body,) = checked_bodies(node)
    plan = reduction_plan(body, layouts)
    symbolic = isinstance(plan.domain[0], Sym)
    # Rows are the outer index flattened; the symbolic leading size only counts them (units).
    extent = product(static(n) for n in (plan.outer_shape[1:] if symbolic else plan.outer_shape))
    if extent == 0:
        builder.ret_void()
        return (0, 1) if symbolic else 0
    args_ptr, begin, end = args
    env = VarEnv()
    target = KernelBody(builder, operand_pointers(builder, args_ptr, len(body.inputs) + len(body.outputs)), env)
    same_shape = frozenset(i for i, v in enumerate(body.inputs) if v.type.shape == plan.domain)
    kept = kept_in_output(plan, same_shape)
    # The row loop is never vectorized: its lanes would be rows, and it is innermost only when the
    # reduction is one element long, where LLVM's loop vectorizer spent minutes on a row body it
    # could not hoist (a broadcast input read at one address, outputs that may alias it).
    with for_range(builder, begin, end, name="row", vectorize=False) as row:
        bind_rows(builder, env, [[j] for j in range(plan.rows.outer)], plan.outer_shape, row)
        row_scope = accumulate(builder, env, target, plan, kept)
        if plan.per_row:
            target.compute_then_store(plan.per_row, row_scope)
        if plan.full:
            output_pass(builder, env, target, plan, kept, row_scope)
    builder.ret_void()
    return (extent, 1) if symbolic else extent


def accumulate(builder: ir.IRBuilder, env: VarEnv, target: KernelBody, plan: ReductionPlan,
                kept: KernelOutput | None) -> Scope:  # fmt: skip
    """One pass over the row per level, computing that level's reductions together; the last pass
    also stores ``kept``. Returns the row's scope, holding every reduction's value."""
    row_scope = Scope()
    interleave = _row_interleave(plan.sizes[-1]) if plan.sizes else None
    levels = plan.levels
    for k, reduces in enumerate(levels):
        accumulators = [Accumulator(builder, r) for r in reduces]
        for acc in accumulators:
            acc.init()
        with nest(builder, env, plan.groups, plan.sizes, interleave=interleave):
            scope = row_scope.child()
            for acc in accumulators:
                acc.update(target.emitter.emit(acc.reduce.arg, scope))
            if kept is not None and k == len(levels) - 1:
                target.compute_then_store([kept], scope)
        for acc in accumulators:
            row_scope.values[id(acc.reduce)] = acc.result()
    return row_scope


def output_pass(builder: ir.IRBuilder, env: VarEnv, target: KernelBody, plan: ReductionPlan,
                 kept: KernelOutput | None, row_scope: Scope) -> None:  # fmt: skip
    """The pass over the row that stores the full outputs, reading ``kept`` back where there is
    one; its divisions by row values by reciprocals where that is exact enough."""
    interleave = _row_interleave(plan.sizes[-1]) if plan.sizes else None

    def output_pass() -> None:
        with nest(builder, env, plan.groups, plan.sizes, interleave=interleave):
            scope = row_scope.child()
            if kept is not None:
                scope.values[id(kept.root)] = target.load_output(kept)
            target.compute_then_store(plan.full, scope)

    divisors = _row_divisors([out.root for out in plan.full], plan.rows.outer, plan.reduces)
    if divisors:
        with_reciprocals(builder, target.emitter, divisors, row_scope, output_pass)
    else:
        output_pass()


def _row_divisors(roots: Sequence[DagNode], outer: int, reduces: Sequence[Reduce]) -> list[DagNode]:
    """The float divisors, one value per row, of the divisions in ``roots`` whose numerators are
    not (softmax's ``exp(x - max) / sum``): each is one per row, so a reciprocal can serve the row.
    A division a reduction also reads (``amax(x.mean(0))`` stores the means and reduces them) is
    none of them: the stored quotients must be the very values the pass before reduced, or the max
    is none of them and amax's backward, which looks for it among them, divides by zero."""
    reduced = {id(node) for r in reduces for node in walk([r.arg])}
    invariant: dict[int, bool] = {}
    for node in walk(roots):
        if isinstance(node, Reduce | Const):
            invariant[id(node)] = True
        elif isinstance(node, Load):
            invariant[id(node)] = all(var < outer for var in node.offset.variables())
        elif isinstance(node, Apply):
            invariant[id(node)] = all(invariant[id(a)] for a in node.args)
    found: dict[int, DagNode] = {}
    for node in walk(roots):
        if (isinstance(node, Apply) and node.op == "div" and node.dtype.category == dt.FLOATING
                and node.args[1].dtype is node.dtype and invariant[id(node.args[1])] and not invariant[id(node)]
                and id(node) not in reduced):  # fmt: skip
            found[id(node.args[1])] = node.args[1]
    return list(found.values())


def with_reciprocals(builder: ir.IRBuilder, emitter: DagEmitter, divisors, row_scope: Scope, output_pass) -> None:
    """The row's output pass, its divisions by the row values ``divisors`` made multiplications by
    their reciprocals where every divisor and its reciprocal are normal numbers: ``x * (1 / d)``
    rounds twice, so it is within 1.5 ulp of ``x / d`` there (a float32 division a vector costs ~10
    cycles: softmax 4096 x 1024 on 2 threads took 0.87-0.93x the time). A row with a
    zero, subnormal, huge, infinite or nan divisor, whose reciprocal would overflow or lose digits,
    takes the pass with the divisions: both passes are emitted, one runs per row."""
    em = emitter.em
    normal = None
    reciprocals = {}
    for d in divisors:
        value = emitter.emit(d, row_scope)
        info = np.finfo(d.dtype.np)
        magnitude = em.abs(value)
        low = em.ge(magnitude, em.constant(float(info.tiny), d.dtype))  # false for nan
        high = em.le(magnitude, em.constant(float(info.max) / 4, d.dtype))  # 1/d >= tiny: normal
        both = em.logical_and(low, high)
        normal = both if normal is None else em.logical_and(normal, both)
        reciprocals[id(d)] = em.div(em.constant(1.0, d.dtype), value)
    assert normal is not None
    with builder.if_else(normal.value) as (fast, exact):
        with fast:
            emitter.reciprocals = reciprocals
            try:
                output_pass()
            finally:
                emitter.reciprocals = {}
        with exact:
            output_pass()
