"""Kernel nodes as ``numba.cuda.jit`` source: ``CudaModule`` text plus a ``Launch`` per kernel.

Every kernel parameter is a one-dimensional array: an operand's memory from its element [0, ..., 0]
on (the executor passes that flat view; a load is ``p[offset]`` with the ``Lin`` offset of the
index algebra). Inputs keep the strides they were compiled for (``layouts``, in elements; none
negative here), outputs are C-contiguous.

- elementwise: a grid-stride loop over the domain's elements; the flat element index is split
  into the collapsed loop groups (kiln/codegen/index.py: collapse) by division.
- reduction: one block of ``config.block`` threads per row. Per reduction level the threads stride
  over the row, each accumulating its elements; the block then combines its threads' values
  (shuffles down within each warp, the warps' results through shared memory, shuffles again) and
  every thread gets the row's value. Row-valued outputs are stored by thread 0; full outputs in a
  last strided pass.
- conv: none (declined: the convolution runs on the interpreter, as does any kind without a
  generator registered here, ``register_cuda_kernel_generator``).
- horizontal: the members (an optimizer's per-parameter updates) share one device function of the
  element; ``blockIdx.y`` picks the member, whose loop sizes and leaf coefficients are its
  arguments. Members are launched ``MEMBERS_PER_LAUNCH`` at a time (a CUDA launch's parameters
  are limited to a few kilobytes).

In place: each thread reads an element's inputs before it writes that element's outputs, and a
full output of a reduction is written only after the block's last barrier: an output may share an
input's buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod as product

from ...ir.graph import Graph, Node
from ...ir.kernel_kinds import ELEMENTWISE, HORIZONTAL, REDUCTION
from ...ir.primitives import PRIMITIVES
from ...ir.types import Sym
from ..core import Scalar, Unsupported
from ..index import Div, Lin, static
from ..kernel_dag import Apply, Const, Load, evaluate
from ..kernel_dag import Node as DagNode
from ..plans import (
    HorizontalMember,
    KernelOutput,
    check_layouts,
    checked_bodies,
    elementwise_plan,
    horizontal_plan,
    reduction_plan,
)
from ..semantics import Semantics
from .core import CudaModule, Source, SourceCore, literal, np_type

MEMBERS_PER_LAUNCH = 16


@dataclass(frozen=True)
class Config:
    """Launch geometry: threads per block of elementwise kernels (``threads``) and of reductions
    (``block``, a multiple of 32), and the most blocks a grid-stride loop gets (``max_blocks``)."""

    threads: int = 256
    block: int = 256
    max_blocks: int = 1024


@dataclass(frozen=True)
class Launch:
    """One CUDA kernel of a kernel node: its function, its parameters (indices into the node's
    ``inputs + outputs``) and its grid: ``("elements", n)``, ``("rows", n)`` or ``("members", n, m)``
    (up to ``n`` elements in each of ``m`` members)."""

    function: str
    operands: tuple[int, ...]
    grid: tuple


class _Body:
    """Emits one body's DAG into ``source``; ``offset(load)`` gives a load's index expression."""

    def __init__(self, source: Source, module: CudaModule, offset) -> None:
        self.source = source
        self.core = SourceCore(source, module)
        self.em = Semantics(self.core)
        self.offset = offset

    def emit(self, node: DagNode, scope: dict) -> Scalar:
        """``node``'s scalar, emitting what it needs first (operands left to right)."""

        def compute(top: DagNode) -> None:
            scope[id(top)] = self._one(top, scope)

        evaluate(node, lambda n: id(n) in scope, compute)
        return scope[id(node)]

    def _one(self, node: DagNode, scope: dict) -> Scalar:
        if isinstance(node, Load):
            name = self.source.fresh("x")
            self.source.emit(f"{name} = p{node.operand}[{self.offset(node)}]")
            return Scalar(name, node.dtype)
        if isinstance(node, Const):
            return self.core.constant(node.value, node.dtype)
        if isinstance(node, Apply):
            formula = PRIMITIVES[node.op].scalar
            assert formula is not None, f"{node.op} has no scalar formula"
            result = formula(self.em, *[scope[id(a)] for a in node.args], **node.attrs)
            return result if result.dtype is node.dtype else self.em.cast(result, node.dtype)
        raise AssertionError(f"{node.op}'s row value is used before its pass over the row")

    def store(self, outputs: Sequence[KernelOutput], scope: dict, where) -> None:
        """Every output's value first (the element's loads precede its stores), then the stores;
        ``where(k, out)``: the index expression output ``out``, the ``k``-th, is stored at."""
        values = [self.emit(out.root, scope) for out in outputs]
        for k, (out, value) in enumerate(zip(outputs, values, strict=True)):
            self.source.emit(f"p{out.operand}[{where(k, out)}] = {value.value}")


def materialize(e: Lin, names: dict[int, str | None]) -> str:
    """``e`` as an integer expression over the loop variables ``names`` (None: folded into a
    collapsed group's variable, see ``bind``)."""
    parts = [str(e.const)] if e.const else []
    for atom, coef in e.terms:
        if isinstance(atom, int):
            name = names[atom]
            if name is None:
                continue
        else:
            name = f"(({materialize(atom.expr, names)}) {'//' if isinstance(atom, Div) else '%'} {atom.divisor})"
        parts.append(name if coef == 1 else f"{name} * {coef}")
    return " + ".join(parts) or "0"


def bind(source: Source, flat: str, groups: Sequence[Sequence[int]], sizes: Sequence) -> dict[int, str | None]:
    """Split the flat index ``flat`` over the collapsed ``groups`` (row-major); the group's value
    stands for its last variable, whose coefficient scales it in every leaf."""
    names: dict[int, str | None] = {}
    rest = flat
    for k in range(len(groups) - 1, -1, -1):
        name = f"{flat}_{k}"
        if k:
            source.emit(f"{name} = {rest} % {sizes[k]}")
            source.emit(f"{flat}_r{k} = {rest} // {sizes[k]}")
            rest = f"{flat}_r{k}"
        else:
            source.emit(f"{name} = {rest}")
        for var in groups[k][:-1]:
            names[var] = None
        names[groups[k][-1]] = name
    return names


def _static(shape) -> None:
    if any(isinstance(d, Sym) for d in shape):
        raise Unsupported("a symbolic dimension (the CUDA kernels are compiled for static shapes)")


def _check(node: Node, layouts) -> None:
    check_layouts(node, layouts)
    for value, strides in zip(node.inputs, layouts, strict=True):
        _static(value.type.shape)
        if any(s < 0 for s in strides):
            raise Unsupported("an input with negative strides")
    for value in (*node.inputs, *node.outputs):
        np_type(value.type.dtype)  # Unsupported for dtypes without CUDA kernels


def generate(module: CudaModule, name: str, node: Node, layouts, config: Config) -> list[Launch]:
    """Write kernel ``node`` (inputs with element strides ``layouts``) into ``module`` with its kind's
    generator; ``Unsupported`` for a kind this backend has none for."""
    kind = node.attrs.get("kind")
    _check(node, layouts)
    emit = cuda_kernel_generator(kind)
    if emit is None:
        raise Unsupported(f"the CUDA backend has no generator for kernel kind {kind!r}")
    checked_bodies(node)
    return emit(module, name, node, layouts, config)


#: ``emit(module, name, node, layouts, config) -> launches``: one kernel kind's generator.
CudaEmit = Callable[[CudaModule, str, Node, Sequence[tuple[int, ...]], "Config"], list["Launch"]]
_GENERATORS: dict[str, CudaEmit] = {}


def register_cuda_kernel_generator(kind: str, emit: CudaEmit) -> None:
    """Compile kernels of ``kind`` (``kiln.ir.kernel_kinds``) with ``emit`` on the CUDA backend."""
    if kind in _GENERATORS:
        raise ValueError(f"the CUDA backend already has a generator for kernel kind {kind!r}")
    _GENERATORS[kind] = emit


def cuda_kernel_generator(kind: object) -> CudaEmit | None:
    """The CUDA generator of ``kind``; None when there is none (the kernel is then declined)."""
    return _GENERATORS.get(kind) if isinstance(kind, str) else None


def unregister_cuda_kernel_generator(kind: str) -> None:
    """Forget the CUDA generator of ``kind`` (one a test registered)."""
    if _GENERATORS.pop(kind, None) is None:
        raise KeyError(f"the CUDA backend has no generator for kernel kind {kind!r}")


def _operands(body: Graph) -> tuple[int, ...]:
    return tuple(range(len(body.inputs) + len(body.outputs)))


def _header(source: Source, name: str, count: int) -> None:
    source.lines.insert(0, f"def {name}({', '.join(f'p{k}' for k in range(count))}):")
    source.lines.insert(0, "@cuda.jit")


# ----------------------------------------------------------------------------- elementwise
def _elementwise(module: CudaModule, name: str, body: Graph, layouts) -> Launch:
    plan = elementwise_plan(body, layouts)
    sizes = [static(n) for n in plan.sizes]  # ``_check`` declined symbolic shapes
    total = product(sizes)
    source = Source()
    with source.block(f"for i in range(cuda.grid(1), {total}, cuda.gridsize(1))"):
        names = bind(source, "i", plan.groups, sizes)
        target = _Body(source, module, lambda load: materialize(load.offset, names))
        target.store(plan.outputs, {}, lambda _, out: materialize(out.at, names))
    _header(source, name, len(body.inputs) + len(body.outputs))
    module.kernels.append("\n".join(source.lines))
    return Launch(name, _operands(body), ("elements", total))


# ----------------------------------------------------------------------------- reduction
def _reduction(module: CudaModule, name: str, body: Graph, layouts, config: Config) -> Launch:
    plan = reduction_plan(body, layouts)
    groups, sizes, inner = plan.groups, plan.sizes, plan.row_elements
    source = Source()
    block = config.block
    dtypes = sorted({r.dtype.name: r.dtype for r in plan.reduces}.items())
    for dname, dtype in dtypes:
        if dtype.itemsize < 4 or dname == "bool":
            raise Unsupported(f"a {dname} reduction (warp shuffles move 32- and 64-bit values)")
        source.emit(f"scratch_{dname} = cuda.shared.array({block}, {np_type(dtype)})")
    source.emit("tid = cuda.threadIdx.x")
    source.emit("row = cuda.blockIdx.x")
    row_names = bind(source, "row", [[j] for j in range(plan.rows.outer)], plan.outer_shape)
    row_scope: dict = {}
    for members in plan.levels:
        accumulators = []
        for r in members:
            prim = PRIMITIVES[r.op]
            if not prim.combine or prim.identity is None:
                raise Unsupported(f"{r.op} is not compiled (it has no combine op)")
            acc = source.fresh("acc")
            source.emit(f"{acc} = {literal(prim.identity(r.dtype), r.dtype)}")
            accumulators.append((r, prim.combine, acc))
        with source.block(f"for e in range(tid, {inner}, {block})"):
            names = {**row_names, **bind(source, "e", groups, sizes)}
            target = _Body(source, module, lambda load, names=names: materialize(load.offset, names))
            scope = dict(row_scope)
            for r, combine, acc in accumulators:
                x = target.emit(r.arg, scope)
                combined = target.em.combine(combine, Scalar(acc, r.dtype), x)
                source.emit(f"{acc} = {combined.value}")
        for r, combine, acc in accumulators:
            reducer = _block_reducer(module, r.op, combine, r.dtype, block)
            source.emit(f"{acc} = {reducer}({acc}, scratch_{r.dtype.name})")
            row_scope[id(r)] = Scalar(acc, r.dtype)
    if plan.per_row:
        with source.block("if tid == 0"):
            target = _Body(source, module, lambda load: materialize(load.offset, row_names))
            target.store(plan.per_row, dict(row_scope), lambda _, out: materialize(out.at, row_names))
    if plan.full:
        with source.block(f"for e in range(tid, {inner}, {block})"):
            names = {**row_names, **bind(source, "e", groups, sizes)}
            target = _Body(source, module, lambda load: materialize(load.offset, names))
            target.store(plan.full, dict(row_scope), lambda _, out: materialize(out.at, names))
    _header(source, name, len(body.inputs) + len(body.outputs))
    module.kernels.append("\n".join(source.lines))
    return Launch(name, _operands(body), ("rows", product(plan.outer_shape)))


def _block_reducer(module: CudaModule, op: str, combine: str, dtype, block: int) -> str:
    """The device function combining one value per thread into the block's value, every thread
    returning it; written once per module for each (combine op, dtype)."""
    function = f"block_{combine}_{dtype.name}"
    if any(f"def {function}(" in f for f in module.functions):
        return function
    source = Source(indent="        ")
    em = Semantics(SourceCore(source, module))
    step = em.combine(combine, Scalar("value", dtype), Scalar("other", dtype))
    combine_lines = [*source.lines, f"        value = {step.value}"]
    identity_of = PRIMITIVES[op].identity
    assert identity_of is not None, f"{op} has no identity"  # checked before the accumulators
    identity = literal(identity_of(dtype), dtype)
    warps = -(-block // 32)
    shuffle = ["    offset = 16", "    while offset > 0:", "        other = shfl_down(value, offset, scratch)",
               *combine_lines, "        offset //= 2"]  # fmt: skip
    lines = [
        "@cuda.jit(device=True)",
        f"def {function}(value, scratch):",
        "    tid = cuda.threadIdx.x",
        "    lane = tid % 32",
        *shuffle,
        "    cuda.syncthreads()",
        "    if lane == 0:",
        "        scratch[tid // 32] = value",
        "    cuda.syncthreads()",
        f"    value = scratch[lane] if lane < {warps} else {identity}",
        *shuffle,
        "    cuda.syncthreads()",
        "    if tid == 0:",
        "        scratch[0] = value",
        "    cuda.syncthreads()",
        "    value = scratch[0]",
        "    cuda.syncthreads()",
        "    return value",
    ]
    module.functions.append("\n".join(lines))
    return function


# ----------------------------------------------------------------------------- horizontal
def _horizontal(module: CudaModule, name: str, bodies: Sequence[Graph], layouts) -> list[Launch]:
    plan = horizontal_plan(bodies, layouts)
    member = _member_function(module, name, plan.members[0], plan.depth, plan.n_in + plan.n_out)
    launches = []
    for start in range(0, len(bodies), MEMBERS_PER_LAUNCH):
        chunk = range(start, min(start + MEMBERS_PER_LAUNCH, len(bodies)))
        source = Source()
        source.emit("m = cuda.blockIdx.y")
        params: list[int] = []
        counts: list[int] = []
        for k, m in enumerate(chunk):
            sizes, coefs = plan.members[m].padded(plan.depth)
            operands = [f"p{len(params) + j}" for j in range(plan.n_in + plan.n_out)]
            params += plan.operands(m)
            counts.append(product(sizes))
            with source.block(f"{'if' if k == 0 else 'elif'} m == {k}"):
                with source.block(f"for i in range(cuda.grid(1), {counts[-1]}, cuda.gridsize(1))"):
                    source.emit(f"{member}(i, {', '.join(map(str, sizes + coefs))}, {', '.join(operands)})")
        function = f"{name}_{start // MEMBERS_PER_LAUNCH}"
        _header(source, function, len(params))
        module.kernels.append("\n".join(source.lines))
        launches.append(Launch(function, tuple(params), ("members", max(counts), len(chunk))))
    return launches


def _member_function(module: CudaModule, name: str, first: HorizontalMember, depth: int, operands: int) -> str:
    """The device function of one element of a member (``first``'s DAG, every member's): its loop
    sizes and leaf coefficients are arguments, so every member of one structure shares it."""
    outputs, leaves = first.plan.outputs, first.leaves
    source = Source()
    sizes = [f"s{k}" for k in range(depth)]
    coefs = [[f"c{leaf}_{k}" for k in range(depth + 1)] for leaf in range(len(leaves))]
    index = bind(source, "i", [[k] for k in range(depth)], sizes)

    def at(leaf: int) -> str:
        return " + ".join([coefs[leaf][0]] + [f"{coefs[leaf][k + 1]} * {index[k]}" for k in range(depth)])

    position = {id(load): k for k, load in enumerate(first.loads)}
    target = _Body(source, module, lambda load: at(position[id(load)]))
    target.store(outputs, {}, lambda k, _: at(len(position) + k))
    function = f"{name}_member"
    params = ["i", *sizes, *(c for row in coefs for c in row), *(f"p{k}" for k in range(operands))]
    source.lines.insert(0, f"def {function}({', '.join(params)}):")
    source.lines.insert(0, "@cuda.jit(device=True)")
    module.functions.append("\n".join(source.lines))
    return function


def _emit_elementwise(module: CudaModule, name: str, node: Node, layouts, config: Config) -> list[Launch]:
    return [_elementwise(module, name, node.attrs["bodies"][0], layouts)]


def _emit_reduction(module: CudaModule, name: str, node: Node, layouts, config: Config) -> list[Launch]:
    return [_reduction(module, name, node.attrs["bodies"][0], layouts, config)]


def _emit_horizontal(module: CudaModule, name: str, node: Node, layouts, config: Config) -> list[Launch]:
    return _horizontal(module, name, node.attrs["bodies"], layouts)


register_cuda_kernel_generator(ELEMENTWISE.name, _emit_elementwise)
register_cuda_kernel_generator(REDUCTION.name, _emit_reduction)
register_cuda_kernel_generator(HORIZONTAL.name, _emit_horizontal)
