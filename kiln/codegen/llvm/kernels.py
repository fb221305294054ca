"""Kernel nodes compiled to LLVM IR: ``KernelModule.add(node, layouts) -> KernelInfo``.

Every kernel is one function ``void @sym(ptr args, i64 begin, i64 end)``: ``args`` holds the data
pointers of ``node.inputs`` then ``node.outputs`` (element [0, ..., 0] of each), and the call does
the parallel units ``[begin, end)`` of ``range(info.extent)``. Code is specialized on the static
shapes and on the inputs' strides (``layouts``, in elements; 0 broadcasts, negative runs
backwards); outputs are C-contiguous. A kernel's kind picks its generator from the table in ``kinds``
(a kind without one is declined); the built-in kinds':

- elementwise: the domain's loop dimensions that every operand addresses as one are collapsed
  (kiln/codegen/index.py: collapse), so a contiguous chain is one long unit-stride loop that vectorizes.
  A unit is a chunk of about ``CHUNK`` elements: a piece of a long inner loop, or several rows.
- reduction: a unit is one row (the flattened outer index). Per row, one pass over the row per
  reduction level computes that level's reductions together (softmax: the max, then the sum of
  exponentials), then one pass writes the full-shape outputs; row-valued outputs are stored once.
  A division by a row value there (softmax's by its sum) multiplies by the row's reciprocal when
  that is within 1.5 ulp (``_with_reciprocals``).
- horizontal: see kernels_horizontal (a unit is a chunk of about ``CHUNK`` elements of one member).
- over a symbolic leading (batch) dimension: see kernels_symbolic (its size follows the pointers
  in ``args``; ``info.units(sizes)`` is then the number of units).

In-place safety: the executor may give an output the buffer of an input read at the same index.
Each element's loads are emitted before its stores, and the innermost loops are declared parallel
(``llvm.loop.parallel_accesses``) instead of marking pointers ``noalias``: no iteration reads what
another iteration writes, which holds for in-place buffers too, so no ``noalias`` promise is ever
broken and the vectorizer needs no runtime overlap check (which in-place buffers would fail).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import TypeAlias, cast

import numpy as np
from llvmlite import ir

from ...ir import dtypes as dt
from ...ir.graph import KERNEL, Graph, Node, body_inputs_outputs, structure_key
from ...ir.kernel_kinds import kernel_kind
from ...ir.primitives import Cost, ops_of_cost
from ...ir.types import Dim, Sym
from .. import index as ix
from ..kernel_dag import VIEWS, Apply, Const, DagBuilder, Load, Reduce, loads, walk
from ..kernel_dag import Node as DagNode
from ..kernel_plan import check_row_values as _check_row_values
from ..kernel_plan import elementwise_plan, same_size
from ..kernel_plan import reduction_rows as _reduction_rows
from . import Unsupported
from .emitter import load, register_type, store
from .kernel_info import NATIVE_OPS, KernelInfo, moved_bytes, native_code
from .kernels_emit import POINTER, Accumulator, DagEmitter, Scope, VarEnv, element_pointer, operand_pointers
from .kinds import kind_generator
from .loops import I64, for_range, i64, minimum, product

__all__ = ["CHUNK", "KernelInfo", "KernelModule", "Unsupported"]

#: Elements per parallel unit of an elementwise kernel: big enough that a unit's loop amortizes
#: its setup and a thread's dispatch, small enough that a few million elements split evenly.
CHUNK = 16384

_Builder: TypeAlias = ir.IRBuilder


class KernelModule:
    """Collects kernels into one LLVM module; ``ir()`` is its text for ``engine.compile_ir``."""

    def __init__(self, name: str = "kiln_kernels") -> None:
        self.module = ir.Module(name)
        self._symbols: set[str] = set()
        self._known: dict[tuple, KernelInfo] = {}  # kernel key -> the function already made for it

    def add(self, node: Node, layouts: Sequence[tuple[int, ...]]) -> KernelInfo:
        """Compile kernel ``node`` for inputs with element strides ``layouts``; ``Unsupported`` when
        the code generator declines (the module is left as it was)."""
        if node.op in NATIVE_OPS:
            return self._add_native(node, layouts)
        kind, bodies = node.attrs.get("kind"), tuple(node.attrs.get("bodies", ()))
        _check_layouts(node, layouts)
        generator = kind_generator(kind)
        if generator is None or not isinstance(kind, str):
            raise Unsupported(f"the LLVM backend has no generator for kernel kind {kind!r}")
        rule = kernel_kind(kind)
        if (rule is None or not rule.members) and len(bodies) != 1:
            raise Unsupported(f"a {kind} kernel with {len(bodies)} bodies")
        for body in bodies:
            for value in body.values():
                register_type(value.type.dtype)  # raises Unsupported for float16 and friends
        from .kernels_symbolic import symbolic_dimension, symbolic_work_bytes  # noqa: PLC0415

        sym = symbolic_dimension(node, layouts, None if generator.symbolic else kind)
        key = _kernel_key(kind, bodies, layouts)
        if key in self._known:  # the same code (an unrolled loop's steps, repeated blocks): one function
            return self._known[key]
        symbol = self._symbol(str(node.attrs.get("name", "kernel")))
        existing = set(self.module.globals)
        try:
            builder, args = self._function(symbol)
            extent = generator.emit(builder, args, node, layouts)
        except BaseException:
            self._drop_new_functions(existing)
            raise
        if isinstance(extent, int):
            info = KernelInfo(symbol, extent, _work_bytes(node))
        else:  # (rows per unit of the size, rows per unit) of a kernel over ``sym``
            assert sym is not None
            fixed, per_size = symbolic_work_bytes(node, sym)
            info = KernelInfo(symbol, 0, fixed, (sym,), extent[0], extent[1], per_size)
        self._known[key] = info
        return info

    def _add_native(self, node: Node, layouts: Sequence[tuple[int, ...]]) -> KernelInfo:
        """A primitive compiled as a function of its own by its family's module (``NativeFamily``): a
        window node (unfold, fold: ``kernels_window``), an index node (take, index_put:
        ``kernels_index``), a direct convolution (conv, conv_weight: ``kernels_conv``) or a sum of
        rows (reduce_sum keeping the last axis: ``kernels_reduce``)."""
        _check_layouts(node, layouts)
        if node.op != "reduce_sum" and any(v.type.symbols for v in (*node.inputs, *node.outputs)):
            raise Unsupported(f"{node.op} over a symbolic dimension runs on its eager kernel")
        emit = native_code(node.op).emit
        key = ("native", node.op, node.attr_key(), tuple(v.type for v in (*node.inputs, *node.outputs)),
               tuple(map(tuple, layouts)))  # fmt: skip
        if key in self._known:
            return self._known[key]
        symbol = self._symbol(node.op)
        existing = set(self.module.globals)
        try:
            builder, args = self._function(symbol)
            extent = emit(builder, args, node, layouts)
        except BaseException:
            self._drop_new_functions(existing)
            raise
        symbols = node.inputs[0].type.symbols if node.inputs else ()
        if symbols:  # a sum over a symbolic leading size (kernels_reduce): its units do not depend on it
            from .kernels_symbolic import symbolic_work_bytes  # noqa: PLC0415

            fixed, per_size = symbolic_work_bytes(node, symbols[0])
            info = self._known[key] = KernelInfo(symbol, extent, fixed, symbols[:1], 0, 1, per_size)
            return info
        info = self._known[key] = KernelInfo(symbol, extent, _work_bytes(node))
        return info

    def _drop_new_functions(self, existing: set[str]) -> None:
        """Leave the module as it was before a kernel that failed: a half-built function would make
        the whole module invalid. The declarations it added (intrinsics, libm) stay: they are valid
        alone, and their names stay taken in the module's scope, so a later kernel reuses them."""
        for name in set(self.module.globals) - existing:
            value = self.module.globals[name]
            if not (isinstance(value, ir.Function) and value.is_declaration):
                del self.module.globals[name]

    def ir(self) -> str:
        """The module's LLVM IR text (every kernel added so far)."""
        return str(self.module)

    def _symbol(self, name: str) -> str:
        base = "kiln_" + re.sub(r"\W", "_", name)
        symbol, k = base, 1
        while symbol in self._symbols or self.module.scope.is_used(symbol):  # declined kernels keep their name
            symbol, k = f"{base}_{k}", k + 1
        self._symbols.add(symbol)
        return symbol

    def _function(self, symbol: str) -> tuple[_Builder, tuple]:  # (in this class, ``ir`` is the method)
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [POINTER, I64, I64]), symbol)
        fn.attributes.add("nounwind")
        for arg, name in zip(fn.args, ("args", "begin", "end"), strict=True):
            arg.name = name
        return ir.IRBuilder(fn.append_basic_block("entry")), fn.args


def _kernel_key(kind: str, bodies: Sequence[Graph], layouts: Sequence[tuple[int, ...]]) -> tuple:
    """What decides a kernel's code: its bodies' structure, every value's shape, the view
    attributes (which ``structure_key`` leaves out) and the inputs' layouts."""
    parts = tuple(
        (
            structure_key(b),
            tuple(v.type.shape for v in b.values()),
            tuple(n.attr_key() for n in b.nodes if n.op in VIEWS),
        )
        for b in bodies
    )
    return kind, parts, tuple(tuple(s) for s in layouts)


def _check_layouts(node: Node, layouts: Sequence[tuple[int, ...]]) -> None:
    if len(layouts) != len(node.inputs):
        raise ValueError(f"expected one layout per kernel input ({len(node.inputs)}), got {len(layouts)}")
    for k, (v, strides) in enumerate(zip(node.inputs, layouts, strict=True)):
        if len(strides) != len(v.type.shape):
            raise ValueError(f"input {k} has shape {list(v.type.shape)} but layout {tuple(strides)}")


def _work_bytes(node: Node) -> int:
    """Bytes read and written (what decides whether the thread pool is worth its dispatch). An
    input that the body reads only through a smaller view (an LSTM step's slice of the whole
    sequence's input projection) counts that view's size, not the whole array's."""
    if node.op != KERNEL:
        own = getattr(native_code(node.op), "work_bytes", None)  # take, conv: their own count
        if own is not None:
            return own(node)
        return moved_bytes(node)
    total = sum(v.type.numel * v.type.dtype.itemsize for v in node.outputs)
    generator = kind_generator(node.attrs["kind"])
    if generator is not None and generator.arithmetic is not None:
        total += generator.arithmetic(node)
    for body, outer, _ in body_inputs_outputs(node):
        uses = body.uses()
        for inner, value in zip(body.inputs, outer, strict=True):
            readers = uses.get(inner, [])
            read = value.type.numel
            if readers and all(n.op in VIEWS for n in readers):
                read = min(read, sum(n.output.type.numel for n in readers))
            total += read * value.type.dtype.itemsize
    return total


@contextlib.contextmanager
def nest(
    builder: ir.IRBuilder,
    env: VarEnv,
    groups: Sequence[Sequence[int]],
    sizes: Sequence,
    interleave: int | None = None,
) -> Iterator[None]:
    """Nested loops over collapsed groups (outermost first); the innermost is declared parallel,
    and vectorized ``interleave`` vectors an iteration where that is given (``for_range``)."""
    with contextlib.ExitStack() as stack:
        for k, (group, size) in enumerate(zip(groups, sizes, strict=True)):
            innermost = k == len(groups) - 1
            loop = for_range(
                builder, 0, size, name=f"j{k}", parallel=innermost, interleave=interleave if innermost else None
            )
            env.bind_group(group, stack.enter_context(loop))
        yield


def bind_rows(builder: ir.IRBuilder, env: VarEnv, groups: Sequence[Sequence[int]], sizes: Sequence[Dim], row) -> None:
    """Bind the loop values of ``groups`` from a flat row index over them (row-major; only the first
    size may be symbolic)."""
    for k, group in enumerate(groups):
        divisor = product(ix.static(n) for n in sizes[k + 1 :])
        value = builder.sdiv(row, i64(divisor)) if divisor > 1 else row
        if k:  # the first group's quotient is already in range
            value = builder.srem(value, i64(ix.static(sizes[k])))
        env.bind_group(group, value)


class _Body:
    """One body's DAG roots and where each output goes: ``(operand, root, store offset)``."""

    def __init__(self, builder: ir.IRBuilder, pointers: list[ir.Value], env: VarEnv) -> None:
        self.builder, self.pointers, self.env = builder, pointers, env
        self.emitter = DagEmitter(builder, self._load_pointer)

    def _load_pointer(self, node: Load) -> ir.Value:
        offset = self.env.materialize(self.builder, node.offset)
        return element_pointer(self.builder, self.pointers[node.operand], offset, node.dtype)

    def load_output(self, operand: int, node: DagNode, where: ix.Lin) -> ir.Value:
        """The value stored at ``where`` in output ``operand`` (a node kept there by an earlier pass)."""
        offset = self.env.materialize(self.builder, where)
        return load(self.builder, element_pointer(self.builder, self.pointers[operand], offset, node.dtype), node.dtype)

    def compute_then_store(self, outputs: Sequence[tuple[int, DagNode, ix.Lin]], scope: Scope) -> None:
        """Every output's value first (so every load of this element precedes its stores), then the stores."""
        values = [self.emitter.emit(root, scope) for _, root, _ in outputs]
        for (operand, _, where), value in zip(outputs, values, strict=True):
            offset = self.env.materialize(self.builder, where)
            store(self.builder, value, element_pointer(self.builder, self.pointers[operand], offset, value.dtype))


# ----------------------------------------------------------------------------- elementwise


def _elementwise(builder: ir.IRBuilder, args, body: Graph, layouts) -> int | tuple[int, int]:
    domain, outputs, groups = elementwise_plan(body, layouts)
    if domain and isinstance(domain[0], Sym):
        from .kernels_symbolic import elementwise_symbolic  # noqa: PLC0415 - it builds on this module

        return elementwise_symbolic(builder, args, body, domain, outputs, groups)
    if product(domain) == 0:
        builder.ret_void()
        return 0
    sizes = [product(domain[j] for j in g) for g in groups]
    tiny = _tiny_innermost(sizes)
    loops = groups[:-1] if tiny else groups  # a tiny innermost group is unrolled in the loop around it
    loop_sizes = sizes[: len(loops)]
    inner = loop_sizes[-1] if loops else 1
    rows = product(loop_sizes[:-1])
    args_ptr, begin, end = args
    env = VarEnv()
    target = _Body(builder, operand_pointers(builder, args_ptr, len(body.inputs) + len(body.outputs)), env)

    def inner_loop(lo, hi) -> None:
        with for_range(builder, lo, hi, name="i", parallel=True) as i:
            if loops:
                env.bind_group(loops[-1], i)
            for t in range(tiny or 1):
                if tiny:
                    env.bind_group(groups[-1], i64(t))
                target.compute_then_store(outputs, Scope())

    split = unit_loops(builder, env, loops, loop_sizes, inner, rows, begin, end, inner_loop)
    extent = rows * split if inner >= CHUNK else -(-rows // split)  # pieces per row, or rows per unit
    builder.ret_void()
    return extent


def _tiny_innermost(sizes: Sequence[Dim]) -> int:
    """The size of an innermost loop too short to vectorize (2 to 4: pooling's window offsets)
    inside a longer one, which is then unrolled in the longer loop's body; 0 where there is none.
    A loop of 2 spends as much on its own control as on its body, and unrolled, the values the
    offsets share (the window's maximum, its gradient) load once. LLVM still does not vectorize
    the loop around it when that is short (14), but LeNet's max pooling forward and backward,
    compiled together on one thread, go from 1.41 to 0.74 ms (64 x 6 x 28 x 28)."""
    if len(sizes) < 2 or not all(isinstance(n, int) for n in sizes[-2:]):
        return 0
    last, around = cast(int, sizes[-1]), cast(int, sizes[-2])
    return last if 2 <= last <= 4 and around >= 8 else 0


def unit_loops(builder: ir.IRBuilder, env: VarEnv, groups, sizes: Sequence[Dim], inner: int, rows,
               begin: ir.Value, end: ir.Value, inner_loop) -> int:  # fmt: skip
    """The loop over parallel units ``[begin, end)`` of an elementwise kernel whose collapsed loops
    are ``groups`` of ``sizes`` (the last, of ``inner`` elements, innermost; ``rows`` the number of
    outer rows, an int or an i64 value). A unit is a piece of ``CHUNK`` elements of one long row, or
    a block of whole rows; ``inner_loop(lo, hi)`` emits the innermost loop. Returns the pieces per
    row (long rows) or the rows per unit (blocks)."""
    if inner >= CHUNK:  # a unit is a piece of one long row
        pieces = -(-inner // CHUNK)
        with for_range(builder, begin, end, name="unit") as unit:
            row = builder.sdiv(unit, i64(pieces)) if pieces > 1 else unit
            piece = builder.srem(unit, i64(pieces)) if pieces > 1 else i64(0)
            bind_rows(builder, env, groups[:-1], sizes[:-1], row)
            lo = builder.mul(piece, i64(CHUNK), flags=("nsw",))
            inner_loop(lo, minimum(builder, builder.add(lo, i64(CHUNK)), i64(inner)))
        return pieces
    per_unit = max(1, CHUNK // inner)  # a unit is a block of whole rows
    with for_range(builder, begin, end, name="unit") as unit:
        first = builder.mul(unit, i64(per_unit), flags=("nsw",))
        last = minimum(builder, builder.add(first, i64(per_unit)), i64(rows) if isinstance(rows, int) else rows)
        with for_range(builder, first, last, name="row") as row:
            bind_rows(builder, env, groups[:-1], sizes[:-1], row)
            inner_loop(0, inner)
    return per_unit


# ----------------------------------------------------------------------------- reduction


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
_COSTLY = ops_of_cost(Cost.ROUTINE)
#: Operations on every element of a row that make a kept value pay for its store and load without a
#: costly one: LayerNorm's ``(x - mean) - drift``, two subtractions on the vector adder, which its
#: four passes keep busier than memory (one thread: 277 ns a row of 1024 floats, ~720 cycles).
_KEEP_OPS = 2
#: The longest row (bytes of output) whose kept values are still in cache when the last pass reads them.
_KEEP_ROW_BYTES = 256 << 10


def _kept_in_output(full: list, reduces: list, row_elements: int, outer: int,
                    aliased: frozenset[int]) -> tuple[int, DagNode] | None:  # fmt: skip
    """``(operand, node)``: a value the last accumulation pass computes anyway, stored into the
    single full output during that pass and loaded back by the output pass, instead of being
    computed again -- softmax's ``exp(x - max)``, which its sum needs and its output divides;
    LayerNorm's centered value, which its variance squares and its output scales.

    Only where it pays and cannot go wrong: the node contains a costly routine or ``_KEEP_OPS``
    operations on each element of the row (``outer``: the number of row dims), the row fits in
    cache, there is one full output, and once the kept node is loaded the output's formula reads
    no input that may share the output's memory (``aliased``: those of the output's shape; the last
    pass has already written the output). LayerNorm's weight and bias, of the row's shape, may be read."""
    if len(full) != 1 or not reduces:
        return None
    operand, root, _ = full[0]
    if row_elements * root.dtype.itemsize > _KEEP_ROW_BYTES:
        return None
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
    costly = any(isinstance(n, Apply) and n.op in _COSTLY for n in walk([kept]))
    per_element = sum(1 for n in walk([kept]) if isinstance(n, Apply) and varies.get(id(n), False))
    if not costly and per_element < _KEEP_OPS:
        return None
    return operand, kept


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
            varies[id(node)] = any(var >= outer for var in _variables(node.offset))
        elif not isinstance(node, Apply):
            varies[id(node)] = False
        elif ready:
            varies[id(node)] = any(varies[id(a)] for a in node.args)
        else:
            pending.append((node, True))
            pending.extend((a, False) for a in node.args)
    return varies


def _reduction(builder: ir.IRBuilder, args, body: Graph, layouts) -> int | tuple[int, int]:
    domain, rows = _reduction_rows(body)
    symbolic = isinstance(domain[0], Sym)
    if symbolic and rows.outer == 0:
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
            full.append((n_in + j, dag.element(v, space.identity()), full_at))
        elif same_size(v.type.shape, outer_shape):
            root = dag.element(v, ix.reshape(space, row_index, outer_shape, v.type.shape))
            per_row.append((n_in + j, root, row_at))
        else:
            raise Unsupported(f"an output of shape {list(v.type.shape)} is neither full {list(domain)} nor one per row")
    _check_row_values([root for _, root, _ in per_row], rows.outer)
    leaves = [load.offset for load in loads([root for _, root, _ in full + per_row])] + [full_at]
    groups = ix.collapse(domain, range(rows.outer, len(domain)), leaves)
    sizes = [product(domain[j] for j in g) for g in groups]
    # Rows are the outer index flattened; the symbolic leading size only counts them (units).
    extent = product(outer_shape[1:] if symbolic else outer_shape)
    if extent == 0:
        builder.ret_void()
        return (0, 1) if symbolic else 0
    args_ptr, begin, end = args
    env = VarEnv()
    target = _Body(builder, operand_pointers(builder, args_ptr, n_in + len(body.outputs)), env)
    interleave = _row_interleave(sizes[-1]) if sizes else None
    same_shape = frozenset(i for i, v in enumerate(body.inputs) if v.type.shape == domain)
    kept = _kept_in_output(full, dag.reduces, product(sizes), rows.outer, same_shape)
    # The row loop is never vectorized: its lanes would be rows, and it is innermost only when the
    # reduction is one element long, where LLVM's loop vectorizer spent minutes on a row body it
    # could not hoist (a broadcast input read at one address, outputs that may alias it).
    with for_range(builder, begin, end, name="row", vectorize=False) as row:
        bind_rows(builder, env, [[j] for j in range(rows.outer)], outer_shape, row)
        row_scope = Scope()
        levels = sorted({r.level for r in dag.reduces})
        for level in levels:
            accumulators = [Accumulator(builder, r) for r in dag.reduces if r.level == level]
            for acc in accumulators:
                acc.init()
            with nest(builder, env, groups, sizes, interleave=interleave):
                scope = row_scope.child()
                for acc in accumulators:
                    acc.update(target.emitter.emit(acc.reduce.arg, scope))
                if kept is not None and level == levels[-1]:
                    target.compute_then_store([(kept[0], kept[1], full_at)], scope)
            for acc in accumulators:
                row_scope.values[id(acc.reduce)] = acc.result()
        if per_row:
            target.compute_then_store(per_row, row_scope)
        if full:

            def output_pass() -> None:
                with nest(builder, env, groups, sizes, interleave=interleave):
                    scope = row_scope.child()
                    if kept is not None:
                        scope.values[id(kept[1])] = target.load_output(kept[0], kept[1], full_at)
                    target.compute_then_store(full, scope)

            divisors = _row_divisors([root for _, root, _ in full], rows.outer)
            if divisors:
                _with_reciprocals(builder, target.emitter, divisors, row_scope, output_pass)
            else:
                output_pass()
    builder.ret_void()
    return (extent, 1) if symbolic else extent


def _row_divisors(roots: Sequence[DagNode], outer: int) -> list[DagNode]:
    """The float divisors, one value per row, of the divisions in ``roots`` whose numerators are
    not (softmax's ``exp(x - max) / sum``): each is one per row, so a reciprocal can serve the row."""
    invariant: dict[int, bool] = {}
    for node in walk(roots):
        if isinstance(node, Reduce | Const):
            invariant[id(node)] = True
        elif isinstance(node, Load):
            invariant[id(node)] = all(var < outer for var in _variables(node.offset))
        elif isinstance(node, Apply):
            invariant[id(node)] = all(invariant[id(a)] for a in node.args)
    found: dict[int, DagNode] = {}
    for node in walk(roots):
        if (isinstance(node, Apply) and node.op == "div" and node.dtype.category == dt.FLOATING
                and node.args[1].dtype is node.dtype and invariant[id(node.args[1])] and not invariant[id(node)]):  # fmt: skip
            found[id(node.args[1])] = node.args[1]
    return list(found.values())


def _variables(e: ix.Lin) -> Iterator[int]:
    for atom, _ in e.terms:
        if isinstance(atom, int):
            yield atom
        else:
            yield from _variables(atom.expr)


def _with_reciprocals(builder: ir.IRBuilder, emitter: DagEmitter, divisors, row_scope: Scope, output_pass) -> None:
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


# ----------------------------------------------------------------------------- the generators of the kinds (``kinds``)
def emit_elementwise(builder: ir.IRBuilder, args, node: Node, layouts) -> int | tuple[int, int]:
    """An elementwise kernel's function body (see the module docstring)."""
    return _elementwise(builder, args, node.attrs["bodies"][0], layouts)


def emit_reduction(builder: ir.IRBuilder, args, node: Node, layouts) -> int | tuple[int, int]:
    """A reduction kernel's function body (see the module docstring)."""
    return _reduction(builder, args, node.attrs["bodies"][0], layouts)
