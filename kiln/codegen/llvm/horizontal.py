"""The ``horizontal`` kernel kind compiled: several elementwise members of one structure in one function.

The members (an optimizer's per-parameter updates...) compute the same DAG over different shapes
and strides. One loop nest serves them all; the loop sizes, leaf strides and offsets of a member
come from constant tables in the module (a number that is the same for every member is an
immediate instead, so a unit stride stays visible to the vectorizer). Each member's dimensions are
collapsed on their own, then padded in front with size-1 loops to a common depth
(kiln/codegen/plans.py: ``horizontal_plan``): a member is ``rows`` rows (the outer loops,
flattened) of ``inner`` elements (the innermost loop).

A parallel unit is a chunk of about ``CHUNK`` elements of one member, as in an elementwise kernel:
a piece of one long row, or a block of short rows. Members of very different sizes then split
evenly over threads (a unit per member gave one thread the big members). The table ``first``
holds each member's first unit (prefix sums, ``first[M]`` is the extent); a unit finds its member
by a binary search there, then its rows and its element range inside them.

Member ``m``'s inputs are ``args[m * n_in : (m + 1) * n_in]`` and its outputs
``args[M * n_in + m * n_out : ...]``: node.inputs and node.outputs list member after member.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod as product

from llvmlite import ir

from ...ir.graph import Node
from ..kernel_dag import Load
from ..plans import HorizontalMember, KernelOutput, checked_bodies, horizontal_plan
from .body import KernelBody, Scope, element_pointer, operand_pointers
from .loops import CHUNK, I64, add, for_range, i64, minimum, mul

__all__ = ["emit_horizontal"]


def _constant_array(builder: ir.IRBuilder, name: str, values: list[int]) -> ir.GlobalVariable:
    array = ir.ArrayType(I64, len(values))
    table = ir.GlobalVariable(builder.module, array, name=f"{builder.function.name}.{name}")
    table.global_constant = True
    table.linkage = "internal"
    table.initializer = ir.Constant(array, values)
    return table


def _load(builder: ir.IRBuilder, table: ir.GlobalVariable, index: ir.Value) -> ir.Value:
    return builder.load(builder.gep(table, [index], inbounds=True, source_etype=I64), typ=I64)


class _Table:
    """Per-member rows of i64 numbers: a column equal for every member becomes an immediate."""

    def __init__(self, builder: ir.IRBuilder, name: str, rows: list[list[int]]) -> None:
        self.rows = rows
        self.width = len(rows[0]) if rows else 0
        self.uniform = [len({row[c] for row in rows}) == 1 for c in range(self.width)]
        self.global_ = None
        if not all(self.uniform):
            self.global_ = _constant_array(builder, name, [v for row in rows for v in row])

    def column(self, builder: ir.IRBuilder, member: ir.Value, c: int) -> ir.Value:
        """Entry ``c`` of member ``member``'s row."""
        if self.uniform[c]:
            return i64(self.rows[0][c])
        index = builder.add(builder.mul(member, i64(self.width), flags=("nsw",)), i64(c), flags=("nsw",))
        return _load(builder, self.global_, index)


@dataclass(frozen=True)
class _Split:
    """How one member's elements are cut into units: ``pieces`` units per row when a row is long,
    else ``rows_per_unit`` whole rows per unit."""

    rows: int
    inner: int
    pieces: int
    rows_per_unit: int

    @classmethod
    def of(cls, sizes: Sequence[int]) -> _Split:
        rows, inner = product(sizes[:-1]), sizes[-1]
        pieces = -(-inner // CHUNK)
        rows_per_unit = 1 if pieces > 1 else min(rows, max(1, CHUNK // inner))
        return cls(rows, inner, pieces, rows_per_unit)

    @property
    def units(self) -> int:
        return self.pieces * -(-self.rows // self.rows_per_unit)


def emit_horizontal(builder: ir.IRBuilder, args, node: Node, layouts) -> int:
    """A horizontal kernel's function body: the unit loop; returns the extent (the number of units
    over all members)."""
    plan = horizontal_plan(checked_bodies(node), layouts)
    members = plan.members
    nonempty = [m for m, member in enumerate(members) if member.elements > 0]
    if not nonempty:
        builder.ret_void()
        return 0
    rows = {m: members[m].padded(plan.depth) for m in nonempty}
    splits = {m: _Split.of(rows[m][0]) for m in nonempty}
    # An empty member runs no unit: it copies a non-empty member's rows, so that a column which is
    # the same for every member that runs stays an immediate.
    stand_in = nonempty[0]
    row_of = [rows.get(m, rows[stand_in]) for m in range(len(members))]
    split_of = [splits.get(m, splits[stand_in]) for m in range(len(members))]
    first = [0]
    for m in range(len(members)):
        first.append(first[-1] + (splits[m].units if m in splits else 0))
    tables = _Tables(
        sizes=_Table(builder, "sizes", [r[0] for r in row_of]),
        coefs=_Table(builder, "strides", [r[1] for r in row_of]),
        split=_Table(builder, "split", [[s.rows, s.inner, s.pieces, s.rows_per_unit] for s in split_of]),
        first=first,
        depth=plan.depth,
    )
    _emit(builder, args, members[0], tables, plan.n_in, plan.n_out)
    builder.ret_void()
    return first[-1]


@dataclass
class _Tables:
    sizes: _Table
    coefs: _Table
    split: _Table  # rows, inner, pieces, rows_per_unit
    first: list[int]  # each member's first unit, then the extent
    depth: int


def _find_member(builder: ir.IRBuilder, first: ir.GlobalVariable, members: int, unit: ir.Value) -> ir.Value:
    """The member ``m`` with ``first[m] <= unit < first[m + 1]`` (a binary search over ``first``)."""
    function, before = builder.function, builder.block
    header = function.append_basic_block("search.header")
    step = function.append_basic_block("search.step")
    done = function.append_basic_block("search.done")
    builder.branch(header)
    builder.position_at_end(header)
    lo, hi = builder.phi(I64, name="lo"), builder.phi(I64, name="hi")
    lo.add_incoming(i64(0), before)
    hi.add_incoming(i64(members), before)
    # Invariant first[lo] <= unit < first[hi]; empty members (first[m] == first[m + 1]) never satisfy it.
    builder.cbranch(builder.icmp_signed(">", builder.sub(hi, lo), i64(1)), step, done)
    builder.position_at_end(step)
    mid = builder.ashr(builder.add(lo, hi), i64(1))
    below = builder.icmp_signed("<=", _load(builder, first, mid), unit)
    lo.add_incoming(builder.select(below, mid, lo), step)
    hi.add_incoming(builder.select(below, hi, mid), step)
    builder.branch(header)
    builder.position_at_end(done)
    return lo


def _divide(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(a // b, a % b)`` for ``a >= 0``, ``b > 0``; no instruction for an immediate 1."""
    if isinstance(b, ir.Constant) and b.constant == 1:
        return a, i64(0)
    return builder.sdiv(a, b), builder.srem(a, b)


def _emit(builder, args, member: HorizontalMember, tables: _Tables, n_in: int, n_out: int) -> None:
    """The unit loop: each unit finds its member, then its rows and elements, and runs ``member``'s
    DAG (every member's) with that member's pointers and offsets."""
    outputs, member_loads = member.plan.outputs, member.loads
    depth, members = tables.depth, len(tables.first) - 1
    leaf_of = {id(load): k for k, load in enumerate(member_loads)}
    n_leaves = len(member_loads) + len(outputs)
    args_ptr, begin, end = args
    first = _constant_array(builder, "first", tables.first) if members > 1 else None
    with for_range(builder, begin, end, name="unit", vectorize=False) as unit:
        m = _find_member(builder, first, members, unit) if first is not None else i64(0)
        local = builder.sub(unit, _load(builder, first, m)) if first is not None else unit
        rows, inner, pieces, rows_per_unit = (tables.split.column(builder, m, c) for c in range(4))
        block, piece = _divide(builder, local, pieces)
        # add, mul, minimum fold constants: a table's column is a constant where every member agrees
        lo = mul(builder, piece, i64(CHUNK))
        hi = minimum(builder, add(builder, lo, i64(CHUNK)), inner)
        row_lo = mul(builder, block, rows_per_unit)
        row_hi = minimum(builder, add(builder, row_lo, rows_per_unit), rows)
        first_out = add(builder, i64(members * n_in), mul(builder, m, i64(n_out)))
        pointers = operand_pointers(builder, args_ptr, n_in, mul(builder, m, i64(n_in))) + operand_pointers(
            builder, args_ptr, n_out, first_out
        )
        coefs = [
            [tables.coefs.column(builder, m, k * (depth + 1) + c) for c in range(depth + 1)] for k in range(n_leaves)
        ]
        outer_sizes = [tables.sizes.column(builder, m, g) for g in range(depth - 1)]
        with for_range(builder, row_lo, row_hi, name="row", vectorize=False) as row:
            # The row's outer loop indices (row-major), then each leaf's offset at the row's start.
            index: list[ir.Value] = []
            rest = row
            for size in reversed(outer_sizes):
                rest, j = _divide(builder, rest, size)
                index.insert(0, j)
            bases = [_affine(builder, c[0], zip(c[1:-1], index, strict=True)) for c in coefs]
            with for_range(builder, lo, hi, name="i", parallel=True) as i:

                def offset(k: int, i=i) -> ir.Value:
                    return _affine(builder, bases[k], [(coefs[k][-1], i)])

                _TableBody(builder, pointers, offset, leaf_of, len(member_loads)).compute_then_store(outputs, Scope())


def _affine(builder: ir.IRBuilder, total: ir.Value, terms) -> ir.Value:
    """``total + sum(coef * var)``, leaving out the terms whose coefficient is an immediate 0."""
    for coef, var in terms:
        total = add(builder, total, mul(builder, var, coef))
    return total


class _TableBody(KernelBody):
    """A member body whose element offsets come from the tables rather than from ``Lin``s:
    ``offset(k)`` is leaf ``k``'s (the loads', then the stores' from ``first_store_leaf``)."""

    def __init__(self, builder, pointers, offset, leaf_of, first_store_leaf: int) -> None:
        super().__init__(builder, pointers, env=None)  # type: ignore[arg-type]
        self.offset, self.leaf_of, self.first_store_leaf = offset, leaf_of, first_store_leaf

    def load_pointer(self, node: Load) -> ir.Value:
        where = self.offset(self.leaf_of[id(node)])
        return element_pointer(self.builder, self.pointers[node.operand], where, node.dtype)

    def store_pointer(self, out: KernelOutput, k: int) -> ir.Value:
        where = self.offset(self.first_store_leaf + k)
        return element_pointer(self.builder, self.pointers[out.operand], where, out.root.dtype)
