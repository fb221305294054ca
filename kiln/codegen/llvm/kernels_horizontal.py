"""Horizontal kernels: several elementwise members of one structure in one function.

The members (an optimizer's per-parameter updates...) compute the same DAG over different shapes
and strides. One loop nest serves them all: a parallel unit is a member, whose loop sizes, leaf
strides and offsets come from constant tables in the module (a number that is the same for every
member is an immediate instead, so a unit stride stays visible to the vectorizer). Each member's
dimensions are collapsed on their own, then padded in front with size-1 loops to a common depth.

Member ``m``'s inputs are ``args[m * n_in : (m + 1) * n_in]`` and its outputs
``args[M * n_in + m * n_out : ...]``: node.inputs and node.outputs list member after member.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from llvmlite import ir

from ...ir.graph import Graph
from ..kernel_dag import Load, loads, signature
from . import Unsupported
from .emitter import store
from .kernels import _Body, elementwise_plan, operand_pointers
from .kernels_emit import Scope, element_pointer
from .loops import I64, for_range, i64, product


class _Table:
    """Per-member rows of i64 numbers: a column equal for every member becomes an immediate."""

    def __init__(self, builder: ir.IRBuilder, name: str, rows: list[list[int]]) -> None:
        self.rows = rows
        self.width = len(rows[0]) if rows else 0
        self.uniform = [len({row[c] for row in rows}) == 1 for c in range(self.width)]
        self.global_ = None
        if not all(self.uniform):
            flat = [v for row in rows for v in row]
            array = ir.ArrayType(I64, len(flat))
            self.global_ = ir.GlobalVariable(builder.module, array, name=f"{builder.function.name}.{name}")
            self.global_.global_constant = True
            self.global_.linkage = "internal"
            self.global_.initializer = ir.Constant(array, flat)

    def column(self, builder: ir.IRBuilder, member: ir.Value, c: int) -> ir.Value:
        """Entry ``c`` of member ``member``'s row."""
        if self.uniform[c]:
            return i64(self.rows[0][c])
        index = builder.add(builder.mul(member, i64(self.width), flags=("nsw",)), i64(c), flags=("nsw",))
        return builder.load(builder.gep(self.global_, [index], inbounds=True, source_etype=I64), typ=I64)


def _member_rows(domain, groups, leaves, depth: int) -> tuple[list[int], list[int]]:
    """One member's loop sizes and, per leaf, its constant then one coefficient per loop."""
    if product(domain) == 0:
        return [0] * depth, [0] * (len(leaves) * (depth + 1))
    pad = depth - len(groups)
    sizes = [1] * pad + [product(domain[j] for j in g) for g in groups]
    coefs: list[int] = []
    for leaf in leaves:
        coefs += [leaf.const] + [0] * pad + [leaf.coef(g[-1]) for g in groups]
    return sizes, coefs


def horizontal(builder: ir.IRBuilder, args, bodies: Sequence[Graph], layouts) -> int:
    """Emit the member loop; returns the extent (the number of members)."""
    if not bodies:
        raise Unsupported("a horizontal kernel with no members")
    n_in, n_out = len(bodies[0].inputs), len(bodies[0].outputs)
    plans, leaf_lists, sig = [], [], None
    for m, body in enumerate(bodies):
        if (len(body.inputs), len(body.outputs)) != (n_in, n_out):
            raise Unsupported("horizontal members with different numbers of inputs or outputs")
        domain, outputs, groups = elementwise_plan(body, layouts[m * n_in : (m + 1) * n_in])
        roots = [root for _, root, _ in outputs]
        this = signature(roots)
        if sig is not None and this != sig:
            raise Unsupported("horizontal members of different structure")
        sig = this
        member_loads = loads(roots)
        leaves = [load.offset for load in member_loads] + [where for _, _, where in outputs]
        if not all(leaf.is_affine for leaf in leaves):
            raise Unsupported("a horizontal member whose reshapes need division")
        plans.append((domain, outputs, groups, member_loads))
        leaf_lists.append(leaves)
    depth = max(1, *(len(p[2]) for p in plans))
    rows = [_member_rows(p[0], p[2], leaves, depth) for p, leaves in zip(plans, leaf_lists, strict=True)]
    sizes = _Table(builder, "sizes", [r[0] for r in rows])
    coefs = _Table(builder, "strides", [r[1] for r in rows])
    _emit(builder, args, plans[0], sizes, coefs, depth, len(bodies), n_in, n_out)
    builder.ret_void()
    return len(bodies)


def _emit(builder, args, plan, sizes: _Table, coefs: _Table, depth: int, members: int, n_in: int, n_out: int):
    _, outputs, _, member_loads = plan
    leaf_of = {id(load): k for k, load in enumerate(member_loads)}
    args_ptr, begin, end = args
    with for_range(builder, begin, end, name="member") as m:
        first_out = builder.add(i64(members * n_in), builder.mul(m, i64(n_out)))
        pointers = operand_pointers(builder, args_ptr, n_in, builder.mul(m, i64(n_in))) + operand_pointers(
            builder, args_ptr, n_out, first_out
        )
        loop_sizes = [sizes.column(builder, m, g) for g in range(depth)]
        n_leaves = len(member_loads) + len(outputs)
        leaf_coefs = [
            [coefs.column(builder, m, k * (depth + 1) + c) for c in range(depth + 1)] for k in range(n_leaves)
        ]
        with contextlib.ExitStack() as stack:
            loop_vars = [
                stack.enter_context(for_range(builder, 0, n, name=f"j{g}", parallel=g == depth - 1))
                for g, n in enumerate(loop_sizes)
            ]

            def offset(k: int) -> ir.Value:
                total = leaf_coefs[k][0]
                for coef, var in zip(leaf_coefs[k][1:], loop_vars, strict=True):
                    if not (isinstance(coef, ir.Constant) and coef.constant == 0):
                        total = builder.add(total, builder.mul(var, coef, flags=("nsw",)), flags=("nsw",))
                return total

            target = _TableBody(builder, pointers, offset, leaf_of)
            target.store_all(outputs, len(member_loads))


class _TableBody(_Body):
    """A member body whose element offsets come from the tables rather than from ``Lin``s."""

    def __init__(self, builder, pointers, offset, leaf_of) -> None:
        super().__init__(builder, pointers, env=None)  # type: ignore[arg-type]
        self.offset, self.leaf_of = offset, leaf_of

    def _load_pointer(self, node: Load) -> ir.Value:
        where = self.offset(self.leaf_of[id(node)])
        return element_pointer(self.builder, self.pointers[node.operand], where, node.dtype)

    def store_all(self, outputs, first_store_leaf: int) -> None:
        """Every output's value, then the stores (each element's loads precede its stores)."""
        scope = Scope()
        values = [self.emitter.emit(root, scope) for _, root, _ in outputs]
        for k, ((operand, _, _), value) in enumerate(zip(outputs, values, strict=True)):
            where = self.offset(first_store_leaf + k)
            store(self.builder, value, element_pointer(self.builder, self.pointers[operand], where, value.dtype))
