"""Kernel plans shared by every code generator: what a kernel node computes, decided once from its
bodies and its inputs' layouts, before any code is written.

A plan says, for each kind a generator lowers, the domain, each output's DAG root and store offset
(``KernelOutput``) and the loops over the domain (collapsed groups, kiln/codegen/index.py:
collapse); a generator then only decides how to map those loops onto its machine (the LLVM
backend: parallel units of rows or chunks, kiln/codegen/llvm/; the CUDA backend: threads, blocks
and grid-stride loops, kiln/codegen/cuda/kernels.py).

- ``elementwise_plan``: one domain (every output's shape, with a dim that a reshape reads divided
  split into the pieces it is read by, so every offset stays affine), loops over all of it.
- ``reduction_plan``: rows. Every reduce of the body reduces the same trailing axes of one shape;
  the leading (kept) dims index rows, the trailing (reduced) dims are the loops within a row. An
  output is full (the domain's shape, written in a last pass over the row) or row-valued (one
  element a row, written once the row's reductions are done).
- ``horizontal_plan``: members of one structure, each an elementwise plan, whose loops are padded
  to a common depth so that one loop nest (or one device function) with per-member sizes and
  offset coefficients serves them all.

Each raises ``Unsupported`` with the reason when the kernel is not of the form its generator takes.

    >>> from kiln.ir import dtypes as dt
    >>> from kiln.ir.graph import GraphBuilder
    >>> from kiln.ir.types import TensorType
    >>> g = GraphBuilder()
    >>> x = g.input(TensorType((4, 8), dt.float32))
    >>> body = g.build([g.node("reduce_sum", [x], {"axes": (1,), "keepdim": False})])
    >>> plan = reduction_plan(body, [(8, 1)])
    >>> plan.outer_shape, plan.sizes, len(plan.full), len(plan.per_row)
    ((4,), [8], 0, 1)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod as product
from typing import NamedTuple, cast

from ..ir.graph import Graph, Node, Value
from ..ir.kernel_kinds import kernel_kind
from ..ir.types import Dim, Sym
from . import index as ix
from .core import Unsupported
from .kernel_dag import REDUCES, Apply, DagBuilder, Load, Reduce, Rows, loads, signature
from .kernel_dag import Node as DagNode

__all__ = [
    "ElementwisePlan",
    "HorizontalMember",
    "HorizontalPlan",
    "KernelOutput",
    "ReductionPlan",
    "check_layouts",
    "checked_bodies",
    "elementwise_plan",
    "group_size",
    "horizontal_plan",
    "outputs_plan",
    "reduction_plan",
    "same_size",
]


def same_size(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    """Whether two shapes have the same number of elements for every value of their symbols."""

    def split(shape: Sequence[Dim]) -> tuple[Counter, int]:
        return Counter(d for d in shape if isinstance(d, Sym)), product(d for d in shape if isinstance(d, int))

    return split(a) == split(b)


def group_size(domain: Sequence[Dim], group: Sequence[int]) -> Dim:
    """The trip count of the collapsed loop over ``group``: a symbolic dimension's loop is its own."""
    if len(group) == 1:
        return domain[group[0]]
    return product(ix.static(domain[j]) for j in group)


# ----------------------------------------------------------------------------- the kernel node


def check_layouts(node: Node, layouts: Sequence[Sequence[int]]) -> None:
    """``ValueError`` unless ``layouts`` gives one stride per dim of each of ``node``'s inputs."""
    if len(layouts) != len(node.inputs):
        raise ValueError(f"expected one layout per kernel input ({len(node.inputs)}), got {len(layouts)}")
    for k, (v, strides) in enumerate(zip(node.inputs, layouts, strict=True)):
        if len(strides) != len(v.type.shape):
            raise ValueError(f"input {k} has shape {list(v.type.shape)} but layout {tuple(strides)}")


def checked_bodies(node: Node) -> tuple[Graph, ...]:
    """The bodies of kernel ``node``; ``Unsupported`` unless there is one, or, for a kind whose
    kernels have members (``KernelKind.members``: horizontal), at least one."""
    kind, bodies = node.attrs.get("kind"), tuple(node.attrs.get("bodies", ()))
    rule = kernel_kind(kind) if isinstance(kind, str) else None
    if not bodies or ((rule is None or not rule.members) and len(bodies) != 1):
        raise Unsupported(f"a {kind} kernel with {len(bodies)} bodies")
    return bodies


class KernelOutput(NamedTuple):
    """One output of a planned kernel: kernel operand ``operand`` (an index into the kernel's
    inputs then outputs) gets ``root`` (a DAG node) at element offset ``at``."""

    operand: int
    root: DagNode
    at: ix.Lin


# ----------------------------------------------------------------------------- elementwise


@dataclass(frozen=True)
class ElementwisePlan:
    """An elementwise body over ``domain``: its outputs and the collapsed loop ``groups``
    (outermost first; a symbolic leading dimension is a group ``[0]`` of its own)."""

    domain: tuple[Dim, ...]
    outputs: list[KernelOutput]
    groups: list[list[int]]

    @property
    def sizes(self) -> list[Dim]:
        """Each group's trip count."""
        return [group_size(self.domain, g) for g in self.groups]

    @property
    def roots(self) -> list[DagNode]:
        """The outputs' DAG roots, in output order."""
        return [out.root for out in self.outputs]

    @property
    def symbolic(self) -> bool:
        """Whether the leading dimension is symbolic (a loop of its own, bound at run time)."""
        return bool(self.domain) and isinstance(self.domain[0], Sym)


def elementwise_plan(body: Graph, layouts: Sequence[Sequence[int]]) -> ElementwisePlan:
    """The plan of an elementwise body whose inputs have element strides ``layouts``."""
    if not body.outputs:
        raise Unsupported("a kernel with no outputs")
    domain = tuple(body.outputs[0].type.shape)
    for v in body.outputs:
        if v.type.shape != domain:
            raise Unsupported(f"elementwise outputs of shapes {list(domain)} and {list(v.type.shape)}")
    values = [(len(body.inputs) + j, v) for j, v in enumerate(body.outputs)]
    symbolic = bool(domain) and isinstance(domain[0], Sym)
    plan = _plan_over(body, layouts, values, domain, domain, symbolic)
    for _ in range(_REFINE_ROUNDS):
        finer = _refined(plan.domain, _leaves(plan), first=int(symbolic))
        if finer is None:
            break
        candidate = _plan_over(body, layouts, values, domain, finer, symbolic)
        if _divisions(candidate) >= _divisions(plan):
            break
        plan = candidate
    return plan


#: Rounds of domain refinement: a division nested in another (``(j // 7) % 7``) is split in the next.
_REFINE_ROUNDS = 3


def _plan_over(body: Graph, layouts, values, shape: tuple[Dim, ...], domain: tuple[Dim, ...], symbolic: bool):
    """The elementwise plan of ``values`` (of ``shape``) over ``domain``, a refinement of ``shape``
    (each dim of ``shape`` split into consecutive dims of ``domain`` whose sizes multiply to it)."""
    dag = DagBuilder(body, ix.Space(domain), layouts)
    index = _unsplit(shape, domain, dag.space)
    store_at = ix.offset(index, ix.contiguous_strides(shape))  # == C-contiguous over ``domain``
    outputs = [KernelOutput(operand, dag.element(v, index), store_at) for operand, v in values]
    leaves = [load.offset for load in loads([out.root for out in outputs])] + [store_at]
    first = int(symbolic)
    groups = ix.collapse(domain, range(first, len(domain)), leaves)
    return ElementwisePlan(domain, outputs, [[0], *groups] if symbolic else groups)


def _unsplit(shape: Sequence[Dim], domain: Sequence[Dim], space: ix.Space) -> tuple[ix.Lin, ...]:
    """The index into ``shape`` of domain element ``(v0, v1, ...)`` where ``domain`` splits each
    dim of ``shape`` into consecutive dims: a split dim's index is ``sum(v_k * stride_k)``."""
    index: list[ix.Lin] = []
    k = 0
    for n in shape:
        e, covered = space.var(k), domain[k]
        k += 1
        while covered != n:  # a symbolic dim is never split: it is covered at once
            piece = cast(int, domain[k])
            e, covered = ix.add(ix.scale(e, piece), space.var(k)), cast(int, covered) * piece
            k += 1
        index.append(e)
    assert k == len(domain), f"{list(domain)} does not refine {list(shape)}"
    return tuple(index)


def _leaves(plan: ElementwisePlan) -> list[ix.Lin]:
    return [load.offset for load in loads(plan.roots)] + [out.at for out in plan.outputs]


def _divisions(plan: ElementwisePlan) -> int:
    """How many Div/Mod atoms the plan's loads and stores compute per element."""
    return sum(1 for leaf in _leaves(plan) for atom, _ in leaf.terms if not isinstance(atom, int))


def _refined(domain: tuple[Dim, ...], leaves: Sequence[ix.Lin], first: int) -> tuple[Dim, ...] | None:
    """``domain`` with each dim ``j`` (from ``first`` on) that a leaf divides by ``d`` (``j // d`` or
    ``j % d``, ``d`` dividing its size) split into ``(n / d, d)``; None when there is none.

    Reading ``x[h // 2]`` over a domain of ``h`` is a division per element and a gather the vectorizer
    gives up on (max pooling's backward: the window's gradient broadcast back to the 2 x 2 window,
    then masked by ReLU's backward on the full shape). Over ``(i, a)`` with ``h = 2*i + a`` the same
    read is ``x[i]``, every offset is affine, the loops collapse again where the operands allow, and
    a window of 2 is an unrolled innermost loop (kiln/codegen/llvm/elementwise.py). Stores do not
    change: C order over the split domain is C order over the domain."""
    divisors: dict[int, set[int]] = {}
    for leaf in leaves:
        for atom, _ in leaf.terms:
            if isinstance(atom, int) or len(atom.expr.terms) != 1 or atom.expr.const:
                continue
            var, coef = atom.expr.terms[0]
            if not isinstance(var, int) or coef != 1 or var < first:
                continue
            n = domain[var]
            if isinstance(n, int) and n % atom.divisor == 0:
                divisors.setdefault(var, set()).add(atom.divisor)
    if not divisors:
        return None
    out: list[Dim] = []
    for j, n in enumerate(domain):
        pieces, covered = [], 1
        for d in sorted(divisors.get(j, ())):  # a chain of divisors (7, 49) splits 784 into 16 x 7 x 7
            if d % covered == 0 and d < cast(int, n):
                pieces.append(d // covered)
                covered = d
        out += [cast(int, n) // covered, *reversed(pieces)] if pieces else [n]
    return tuple(out) if len(out) > len(domain) else None


def outputs_plan(dag: DagBuilder, values: Sequence[tuple[int, Value]], loops_from: int = 0) -> ElementwisePlan:
    """The plan of body ``values`` (each a kernel operand and a body value of ``dag``'s domain's
    shape), stored C-contiguous: each computed at its own index, over collapsed loops of the
    domain's dims from ``loops_from`` on (the dims before are bound by the generator: a conv
    kernel's sample and channel)."""
    domain = tuple(dag.space.sizes)
    store_at = ix.offset(dag.space.identity(), ix.contiguous_strides(domain))
    outputs = [KernelOutput(operand, dag.element(v, dag.space.identity()), store_at) for operand, v in values]
    leaves = [load.offset for load in loads([out.root for out in outputs])] + [store_at]
    return ElementwisePlan(domain, outputs, ix.collapse(domain, range(loops_from, len(domain)), leaves))


# ----------------------------------------------------------------------------- reduction


@dataclass(frozen=True)
class ReductionPlan:
    """A row reduction over ``domain``: the first ``rows.outer`` dims (``outer_shape``) index rows,
    the loops ``groups`` of trip counts ``sizes`` run within a row. ``reduces``: the DAG's
    reductions, computed one level a pass (``levels``); ``full``: outputs of the domain's shape at
    ``full_at``; ``per_row``: row-valued outputs, one element a row."""

    domain: tuple[Dim, ...]
    rows: Rows
    reduces: list[Reduce]
    full: list[KernelOutput]
    per_row: list[KernelOutput]
    full_at: ix.Lin
    groups: list[list[int]]
    sizes: list[int]

    @property
    def outer_shape(self) -> tuple[Dim, ...]:
        """The shape of the rows (the kept dims)."""
        return self.domain[: self.rows.outer]

    @property
    def row_elements(self) -> int:
        """The elements of one row (the product of ``sizes``)."""
        return product(self.sizes)

    @property
    def levels(self) -> list[list[Reduce]]:
        """The reductions by pass over the row, in order: a level reads only the levels before it
        (softmax: the max, then the sum of exponentials)."""
        by_level: dict[int, list[Reduce]] = {}
        for r in self.reduces:
            by_level.setdefault(r.level, []).append(r)
        return [by_level[level] for level in sorted(by_level)]


def reduction_plan(body: Graph, layouts: Sequence[Sequence[int]]) -> ReductionPlan:
    """The plan of a row-reduction body whose inputs have element strides ``layouts``."""
    domain, rows = _reduction_rows(body)
    if isinstance(domain[0], Sym) and rows.outer == 0:
        raise Unsupported(f"a reduction over the symbolic dimension {domain[0]}")
    space = ix.Space(domain)
    dag = DagBuilder(body, space, layouts, rows)
    outer_shape = domain[: rows.outer]
    row_index = tuple(space.var(j) for j in range(rows.outer))
    row_at = ix.offset(row_index, ix.contiguous_strides(outer_shape))
    full_at = ix.offset(space.identity(), ix.contiguous_strides(domain))
    n_in = len(body.inputs)
    full, per_row = [], []
    for j, v in enumerate(body.outputs):
        if v.type.shape == domain:
            full.append(KernelOutput(n_in + j, dag.element(v, space.identity()), full_at))
        elif same_size(v.type.shape, outer_shape):
            root = dag.element(v, ix.reshape(space, row_index, outer_shape, v.type.shape))
            per_row.append(KernelOutput(n_in + j, root, row_at))
        else:
            raise Unsupported(f"an output of shape {list(v.type.shape)} is neither full {list(domain)} nor one per row")
    check_row_values([out.root for out in per_row], rows.outer)
    leaves = [load.offset for load in loads([out.root for out in full + per_row])] + [full_at]
    groups = ix.collapse(domain, range(rows.outer, len(domain)), leaves)
    sizes = [product(ix.static(domain[j]) for j in g) for g in groups]
    return ReductionPlan(tuple(domain), rows, list(dag.reduces), full, per_row, full_at, groups, sizes)


def _reduction_rows(body: Graph) -> tuple[tuple[Dim, ...], Rows]:
    """The domain and the rows: every reduce reduces the same trailing axes of the same shape."""
    reduces = [n for n in body.nodes if n.op in REDUCES]
    if not reduces:
        raise Unsupported("a reduction kernel without a reduction")
    domain = tuple(reduces[0].inputs[0].type.shape)
    axes = tuple(reduces[0].attrs["axes"])
    for n in reduces:
        if n.inputs[0].type.shape != domain or tuple(n.attrs["axes"]) != axes:
            raise Unsupported(f"reductions over different shapes or axes: {axes} of {list(domain)} and "
                              f"{n.attrs['axes']} of {list(n.inputs[0].type.shape)}")  # fmt: skip
    outer = len(domain) - len(axes)
    if axes != tuple(range(outer, len(domain))):
        raise Unsupported(f"reduction axes {axes} of {list(domain)} are not the trailing axes")
    return domain, Rows(outer, axes)


def check_row_values(roots: Sequence[DagNode], outer: int) -> None:
    """A row-valued output may read only row values and elements at the row's own index."""
    pending, seen = list(roots), set()
    while pending:
        node = pending.pop()
        if id(node) in seen or isinstance(node, Reduce):
            continue
        seen.add(id(node))
        if isinstance(node, Load) and any(v >= outer for v in node.offset.variables()):
            raise Unsupported("a row-valued output reads the elements of the row")
        if isinstance(node, Apply):
            pending.extend(node.args)


# ----------------------------------------------------------------------------- horizontal


@dataclass(frozen=True)
class HorizontalMember:
    """One member of a horizontal kernel: its elementwise ``plan``, its DAG's ``loads`` (in the
    order of ``kernel_dag.loads``) and its ``leaves``: the loads' offsets, then the outputs' store
    offsets, each affine in the domain's variables."""

    plan: ElementwisePlan
    loads: list[Load]
    leaves: list[ix.Lin]

    @property
    def elements(self) -> int:
        """The member's number of elements (0: it runs no unit)."""
        return product(ix.static(n) for n in self.plan.domain)

    def padded(self, depth: int) -> tuple[list[int], list[int]]:
        """The member's loop sizes padded in front with size-1 loops to ``depth`` loops, and for
        each leaf its constant then its coefficient of each of those loops (0 for a padding loop)."""
        groups = self.plan.groups
        pad = depth - len(groups)
        sizes = [1] * pad + [ix.static(n) for n in self.plan.sizes]
        coefs: list[int] = []
        for leaf in self.leaves:
            coefs += [leaf.const] + [0] * pad + [leaf.coef(g[-1]) for g in groups]
        return sizes, coefs


@dataclass(frozen=True)
class HorizontalPlan:
    """The members of a horizontal kernel, each ``n_in`` inputs and ``n_out`` outputs, computing
    one DAG structure; ``depth``: the most loops any member has (at least 1)."""

    members: list[HorizontalMember]
    n_in: int
    n_out: int
    depth: int

    def operands(self, m: int) -> list[int]:
        """Member ``m``'s kernel operands: node.inputs and node.outputs list member after member."""
        first_out = len(self.members) * self.n_in + m * self.n_out
        return [m * self.n_in + j for j in range(self.n_in)] + [first_out + j for j in range(self.n_out)]


def horizontal_plan(bodies: Sequence[Graph], layouts: Sequence[Sequence[int]]) -> HorizontalPlan:
    """The plan of a horizontal kernel's member ``bodies``; ``layouts`` holds every member's
    inputs' strides, member after member. ``Unsupported`` unless the members have the same numbers
    of inputs and outputs and the same structure, and every leaf is affine (no reshape that needs
    a division: a member's offsets are then a constant and one coefficient a loop)."""
    if not bodies:
        raise Unsupported("a horizontal kernel with no members")
    n_in, n_out = len(bodies[0].inputs), len(bodies[0].outputs)
    members: list[HorizontalMember] = []
    structure = None
    for m, body in enumerate(bodies):
        if (len(body.inputs), len(body.outputs)) != (n_in, n_out):
            raise Unsupported("horizontal members with different numbers of inputs or outputs")
        plan = elementwise_plan(body, layouts[m * n_in : (m + 1) * n_in])
        if plan.symbolic:
            raise Unsupported("a horizontal member over a symbolic dimension")
        this = signature(plan.roots)
        if structure is not None and this != structure:
            raise Unsupported("horizontal members of different structure")
        structure = this
        member_loads = loads(plan.roots)
        leaves = [load.offset for load in member_loads] + [out.at for out in plan.outputs]
        if not all(leaf.is_affine for leaf in leaves):
            raise Unsupported("a horizontal member whose reshapes need division")
        members.append(HorizontalMember(plan, member_loads, leaves))
    depth = max(1, *(len(member.plan.groups) for member in members))
    return HorizontalPlan(members, n_in, n_out, depth)
