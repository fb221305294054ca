"""Kernels over rows of a symbolic length: a domain ``(R, n)`` whose last size ``n`` is symbolic too
(attention's ``(B*H*T, T)`` scores, flattened by ``frontend/jit/symbolic_kernels.py``), elementwise
or reducing each row (softmax: the row's max, its sum of exponentials, then the outputs, with the
reduction generator's passes: ``reduction.accumulate``, ``output_pass``).

The kernels of kiln/codegen/llvm/symbolic.py take a symbolic leading size only: every stride is a
static immediate. Here the row stride of a ``(R, n)`` value is ``n`` itself, so the index algebra
(integer coefficients) cannot express the offset ``row * n + j``. The kernel splits it instead: the
algebra addresses each value within a row (its row stride taken as 0), and the row's base
``row * n`` is added to the address of every value that has a row of its own (the outputs, and the
``(R, n)`` inputs). A ``(R, 1)`` row value keeps its static stride 1; a ``(n,)`` or ``(1, n)`` value
is the same row for every row. Every value is C-contiguous (``SymbolicProgram`` loads the kernel
only at sizes where they are).

A unit is a row; the argument table holds ``R`` (when it is symbolic) then ``n`` after the
pointers (``KernelInfo.symbols``); the kernel reads ``n``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from llvmlite import ir

from ...ir.graph import Graph, Node
from ...ir.types import Dim, Sym
from .. import index as ix
from ..core import Unsupported
from ..kernel_dag import REDUCES, DagBuilder, Load, Rows
from ..plans import KernelOutput, ReductionPlan, check_row_values, checked_bodies
from .body import KernelBody, Scope, element_pointer, operand_pointers
from .loops import VarEnv, for_range
from .reduction import accumulate, kept_in_output, output_pass
from .symbolic import symbol_size

__all__ = ["row_domain", "emit_rows", "row_work_terms"]


def row_domain(node: Node) -> tuple[Dim, Sym] | None:
    """``(R, n)`` when ``node`` is an elementwise kernel over a 2-d domain whose row length ``n`` is
    symbolic, or a reduction kernel over the rows of one (None otherwise: the other generators take
    it or decline it)."""
    kind, bodies = node.attrs.get("kind"), node.attrs.get("bodies", ())
    if kind not in ("elementwise", "reduction") or len(bodies) != 1 or not node.outputs:
        return None
    shape = node.outputs[0].type.shape
    if kind == "reduction":
        reduces = [n for n in bodies[0].nodes if n.op in REDUCES]
        if not reduces or any(tuple(n.attrs["axes"]) != (1,) for n in reduces):
            return None
        shape = reduces[0].inputs[0].type.shape
    rows, n = shape if len(shape) == 2 else (None, None)
    return (rows, n) if isinstance(rows, Sym | int) and isinstance(n, Sym) else None


def _row_strides(shape: Sequence[Dim], layout: Sequence[int], domain: tuple[Dim, Sym]) -> tuple[tuple[int, ...], bool]:
    """An input's element strides within a row (the row stride ``n`` as 0) and whether it has a row of
    its own at ``row * n``; ``Unsupported`` for a shape that does not broadcast to ``domain`` (numpy's
    rule) or a ``layout`` (element strides at the sizes the code is made at) not in C order."""
    rows, n = domain
    padded = (1,) * (2 - len(shape)) + tuple(shape)
    if len(shape) > 2 or any(d not in (1, want) for d, want in zip(padded, domain, strict=True)):
        raise Unsupported(f"an input of shape {list(map(str, shape))} in a kernel over {[str(rows), str(n)]}")
    own_row = padded == (rows, n)
    row_stride = 0 if own_row else 1  # 1: a (R, 1) row value; a (1, ...) value reads index 0 there
    strides = (row_stride, 1 if padded[1] == n else 0)
    for d, given, want in zip(shape, layout, strides[2 - len(shape) :], strict=True):
        if d != 1 and want and given != want:  # (the row stride of a (R, n) value is n: not checked here)
            raise Unsupported(f"an input of shape {list(map(str, shape))} laid out with element strides {list(layout)}")
    return strides[2 - len(shape) :], own_row


class _RowBody(KernelBody):
    """A ``KernelBody`` that adds the row's base to the addresses of the values with rows of their own."""

    def __init__(self, builder: ir.IRBuilder, pointers: list[ir.Value], env: VarEnv, own_row: Sequence[bool]) -> None:
        super().__init__(builder, pointers, env)
        self.own_row = own_row
        self.base: ir.Value | None = None  # row * n, set per row

    def _address(self, operand: int, offset: ix.Lin, dtype) -> ir.Value:
        index = self.env.materialize(self.builder, offset)
        if self.own_row[operand]:
            assert self.base is not None
            index = self.builder.add(self.base, index, flags=("nsw",))
        return element_pointer(self.builder, self.pointers[operand], index, dtype)

    def load_pointer(self, node: Load) -> ir.Value:
        return self._address(node.operand, node.offset, node.dtype)

    def store_pointer(self, out: KernelOutput, k: int) -> ir.Value:
        return self._address(out.operand, out.at, out.root.dtype)


def emit_rows(builder: ir.IRBuilder, args, node: Node, layouts) -> tuple[int, int]:
    """The kernel's function body (see the module docstring); ``(1, 1)``: one unit a row of ``R``."""
    domain = row_domain(node)
    assert domain is not None, "emit_rows is for kernels row_domain accepts"
    (body,) = checked_bodies(node)
    pairs = [_row_strides(v.type.shape, layout, domain) for v, layout in zip(body.inputs, layouts, strict=True)]
    strides, own = [p[0] for p in pairs], [p[1] for p in pairs]
    space = ix.Space(domain)
    reduction = node.attrs["kind"] == "reduction"
    dag = DagBuilder(body, space, strides, Rows(1, (1,)) if reduction else None)
    full, per_row = _outputs(body, dag, domain)
    args_ptr, begin, end = args
    env = VarEnv()
    operands = len(body.inputs) + len(body.outputs)
    own_outputs = [True] * len(body.outputs)
    for out in per_row:
        own_outputs[out.operand - len(body.inputs)] = False
    target = _RowBody(builder, operand_pointers(builder, args_ptr, operands), env, [*own, *own_outputs])
    n = symbol_size(builder, args_ptr, operands + isinstance(domain[0], Sym))  # after R's slot, if R is one
    with for_range(builder, begin, end, name="row", vectorize=False) as row:
        env.values[0] = row
        target.base = builder.mul(row, n, flags=("nsw",))
        if reduction:
            sizes = cast(list[int], [n])  # the row's loop bound, read at run time
            plan = ReductionPlan(domain, Rows(1, (1,)), list(dag.reduces), full, per_row, _J, [[1]], sizes)
            kept = kept_in_output(
                plan, frozenset(k for k, v in enumerate(body.inputs) if tuple(v.type.shape) == domain)
            )
            row_scope = accumulate(builder, env, target, plan, kept)
            if per_row:
                target.compute_then_store(per_row, row_scope)
            if full:
                output_pass(builder, env, target, plan, kept, row_scope)
        else:
            with for_range(builder, 0, n, name="j", parallel=True) as j:
                env.values[1] = j
                target.compute_then_store(full, Scope())
    builder.ret_void()
    return 1, 1


#: A value's element within its row (the row's base is added for values with rows of their own).
_J = ix.Lin(0, ((1, 1),))


def _outputs(body: Graph, dag: DagBuilder, domain: tuple[Dim, Sym]) -> tuple[list[KernelOutput], list[KernelOutput]]:
    """The kernel's full ``(R, n)`` outputs and its row values (``(R, 1)`` or ``(R,)``: a reduction's)."""
    full, per_row = [], []
    first = len(body.inputs)
    for k, v in enumerate(body.outputs):
        shape = tuple(v.type.shape)
        if shape == domain:
            full.append(KernelOutput(first + k, dag.element(v, dag.space.identity()), _J))
        elif dag.rows is not None and shape in ((domain[0],), (domain[0], 1)):
            index = (dag.space.var(0),) + (ix.ZERO,) * (len(shape) - 1)
            per_row.append(KernelOutput(first + k, dag.element(v, index), ix.Lin(0, ((0, 1),))))
        else:
            raise Unsupported(f"an output of shape {list(map(str, shape))} in a kernel over {list(map(str, domain))}")
    check_row_values([out.root for out in per_row], 1)
    return full, per_row


def row_work_terms(node: Node) -> tuple[tuple[tuple[Dim, ...], int], ...]:
    """Each value's bytes as ``(dims, itemsize)``: ``itemsize`` times the product of ``dims``' sizes."""
    return tuple((tuple(v.type.shape), v.type.dtype.itemsize) for v in (*node.inputs, *node.outputs))
