"""Loop nests over llvmlite's IRBuilder, in the canonical form LLVM's vectorizer wants.

``for_range(builder, start, stop)`` is a context manager: the code built inside its ``with``
block is the loop body, and the yielded value is the i64 induction variable. Every loop has one
preheader edge, one header with the phi, one latch that increments by 1 and branches back, and
one exit: the shape loop rotation, LICM and the loop vectorizer recognize. Loops nest by nesting
``with`` blocks.

``parallel=True`` marks the loop as free of loop-carried memory dependencies among its loads and
stores (``llvm.loop.parallel_accesses`` over an access group). The vectorizer then needs no
runtime alias checks, which matters for in-place kernels: an output that is the same buffer as
an input read at the same index would fail LLVM's overlap check and run the scalar loop, yet it
carries no dependency from one iteration to the next.

Beside the loops, the i64 index arithmetic that every kernel generator shares: ``VarEnv`` (each
domain variable's loop value, and ``Lin`` offsets materialized from them), ``nest`` (loops over
collapsed groups of the domain), ``bind_rows`` and ``row_major_indices`` (a flat index split into
dims), ``dot`` (an offset from indices and strides), and ``CHUNK``, the size of a parallel unit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from math import prod as product
from typing import cast

from llvmlite import ir

from ...ir.types import Dim
from ..index import Div, Lin, static

I64 = ir.IntType(64)
_NSW = ("nsw",)

#: Elements per parallel unit (of an elementwise kernel, a horizontal member, a window or index
#: node): big enough that a unit's loop amortizes its setup and a thread's dispatch, small enough
#: that a few million elements split evenly.
CHUNK = 16384


def i64(value: int) -> ir.Constant:
    """An i64 constant."""
    return ir.Constant(I64, int(value))


class _DistinctMD(ir.values.MDValue):
    """A ``distinct !{...}`` metadata node (llvmlite only writes uniqued ones). Loop IDs and access
    groups must be distinct, and a loop ID refers to itself as its first operand."""

    def __init__(self, module: ir.Module, operands: list) -> None:
        super().__init__(module, operands, name=str(len(module.metadata)))

    def descr(self, buf: list) -> None:
        buf.append("distinct ")
        super().descr(buf)

    # A distinct node is equal only to itself. llvmlite's MDValue compares operands, and
    # ``Module.add_metadata`` reuses an equal node: every kernel's ``parallel_accesses`` then named
    # the module's first access group, so only the first parallel loop of a module was parallel.
    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


def _parallel_properties(module: ir.Module, blocks: list[ir.Block]) -> list:
    """Put every load and store of ``blocks`` in a fresh access group; the loop properties that
    declare the loop parallel over it.

    Stack slots (accumulators threaded through memory until SROA makes them registers) do carry a
    dependency from one iteration to the next, so their loads and stores stay out of the group."""
    group = _DistinctMD(module, [])
    for block in blocks:
        for instr in block.instructions:
            if isinstance(instr, ir.LoadInstr | ir.StoreInstr) and not isinstance(instr.operands[-1], ir.AllocaInstr):
                instr.set_metadata("llvm.access.group", group)
    parallel = module.add_metadata([ir.MetaDataString(module, "llvm.loop.parallel_accesses"), group])
    progress = module.add_metadata([ir.MetaDataString(module, "llvm.loop.mustprogress")])
    return [parallel, progress]


#: A loop around a loop of this many trips or more (or of a number not known when the code is made)
#: is kept from the unroller: fully unrolled, it copies the whole inner loop -- its vector body,
#: remainder and checks -- once per trip, for no speed (the inner loop's work dominates) and much
#: compile time. A CNN's sum over a [32, 8, 784] tensor's first and last axes took 108 ms of LLVM
#: unrolled 32 times over, 7 ms not; the CNN's 42 kernels 0.75 s -> 0.51 s of LLVM, the steps of
#: the CNN, DCGAN, GPT and LSTM LM as fast (0.99-1.02x, one process, interleaved). Loops around
#: shorter loops stay unrollable: the LSTM LM's step took 1.1-1.6x as long with every outer loop kept.
LONG_INNER = 64
_UNKNOWN = 1 << 62  # the trips of a loop whose bounds are not constants


@contextlib.contextmanager
def for_range(
    builder: ir.IRBuilder, start: ir.Value | int, stop: ir.Value | int, *, name: str = "i", parallel: bool = False,
    vectorize: bool = True, interleave: int | None = None, width: int | None = None, force: bool = False,
) -> Iterator[ir.Value]:  # fmt: skip
    """``for (i64 i = start; i < stop; ++i) { <with-block> }``; yields ``i``.

    After the ``with`` block the builder is positioned in the loop's exit block. ``parallel``
    declares that no iteration's loads or stores depend on another iteration's (see the module
    docstring); give it only to loops where that is true. ``vectorize=False`` keeps LLVM's loop
    vectorizer off this loop (``llvm.loop.vectorize.enable`` false). ``interleave=k`` has the
    vectorizer interleave k vectors an iteration and keeps the unroller off the loop
    (``llvm.loop.interleave.count``, ``llvm.loop.unroll.disable``: LLVM reads an unroll hint
    alone as interleave count 1, so both are given). ``width=w`` asks for vectors of ``w`` lanes
    (``llvm.loop.vectorize.width``) and keeps the unroller off it: a loop of few iterations then
    runs vector code, where LLVM would fully unroll it first (and its SLP vectorizer seldom packs
    what that leaves) or leave it all to the vector loop's scalar remainder. ``force`` tells the
    vectorizer to vectorize (``llvm.loop.vectorize.enable`` true): with a ``width``, a loop LLVM
    knows to run fewer than 16 times is then one vector pass and a scalar remainder, where unforced
    LLVM leaves it scalar. A loop around a loop of ``LONG_INNER`` trips or more is kept from the
    unroller too.
    """
    start = i64(start) if isinstance(start, int) else start
    stop = i64(stop) if isinstance(stop, int) else stop
    function = builder.function
    preheader = builder.block
    header = function.append_basic_block(f"{name}.header")
    body = function.append_basic_block(f"{name}.body")
    exit_block = function.append_basic_block(f"{name}.exit")
    first_body_index = len(function.blocks) - 2  # blocks appended inside the body land after exit
    builder.branch(header)

    builder.position_at_end(header)
    index = builder.phi(I64, name=name)
    index.add_incoming(start, preheader)
    builder.cbranch(builder.icmp_signed("<", index, stop), body, exit_block)

    builder.position_at_end(body)
    # The longest loop opened inside this one's body, kept on the builder (loops nest on one builder)
    enclosing = getattr(builder, "_kiln_longest_inner", 0)
    builder._kiln_longest_inner = 0  # type: ignore[attr-defined]
    yield index
    longest_inner = builder._kiln_longest_inner  # type: ignore[attr-defined]
    constant = isinstance(start, ir.Constant) and isinstance(stop, ir.Constant)
    trips = stop.constant - start.constant if constant else _UNKNOWN  # type: ignore[attr-defined]
    builder._kiln_longest_inner = max(enclosing, longest_inner, trips)  # type: ignore[attr-defined]
    # The latch is whatever block the body ended in: a single back edge from there.
    latch = builder.block
    following = builder.add(index, i64(1), name=f"{name}.next", flags=("nsw",))
    back = builder.branch(header)
    index.add_incoming(following, latch)
    module = builder.module
    properties = []
    if parallel:
        inner = [b for b in function.blocks[first_body_index:] if b is not exit_block]
        properties += _parallel_properties(module, inner)
    elif not vectorize:
        properties.append(
            module.add_metadata([ir.MetaDataString(module, "llvm.loop.vectorize.enable"), ir.IntType(1)(0)])
        )
    if force:
        properties.append(
            module.add_metadata([ir.MetaDataString(module, "llvm.loop.vectorize.enable"), ir.IntType(1)(1)])
        )
    if width is not None:
        properties.append(
            module.add_metadata([ir.MetaDataString(module, "llvm.loop.vectorize.width"), ir.IntType(32)(width)])
        )
    if interleave is not None or width is not None or longest_inner >= LONG_INNER:
        properties.append(module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")]))
    if interleave is not None:
        count = ir.IntType(32)(interleave)
        properties.append(module.add_metadata([ir.MetaDataString(module, "llvm.loop.interleave.count"), count]))
    if properties:
        loop_id = _DistinctMD(module, [])
        loop_id.operands = (loop_id, *properties)
        back.set_metadata("llvm.loop", loop_id)
    builder.position_at_end(exit_block)


def _constant(value: ir.Value) -> int | None:
    return value.constant if isinstance(value, ir.Constant) and isinstance(value.constant, int) else None


def add(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """``a + b`` in i64 (nsw), folded where an operand is a constant 0 or both are constants: LLVM
    would fold them too, but only after the generator printed them and LLVM parsed them."""
    x, y = _constant(a), _constant(b)
    if x is not None and y is not None:
        return i64(x + y)
    if x == 0 or y == 0:
        return b if x == 0 else a
    return builder.add(a, b, flags=_NSW)


def mul(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """``a * b`` in i64 (nsw), folded where an operand is a constant 0 or 1 or both are constants."""
    x, y = _constant(a), _constant(b)
    if x is not None and y is not None:
        return i64(x * y)
    if x == 0 or y == 0:
        return i64(0)
    if x == 1 or y == 1:
        return b if x == 1 else a
    return builder.mul(a, b, flags=_NSW)


def minimum(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """Signed i64 minimum (a constant where both are)."""
    x, y = _constant(a), _constant(b)
    if x is not None and y is not None:
        return i64(min(x, y))
    return builder.select(builder.icmp_signed("<", a, b), a, b)


def static_shape(value) -> tuple[int, ...]:
    """The shape of IR value ``value``, which the caller has checked is static."""
    return cast(tuple[int, ...], tuple(value.type.shape))


# ----------------------------------------------------------------------------- index arithmetic


class VarEnv:
    """Domain variable -> its i64 value; ``None`` marks a variable folded into a collapsed loop."""

    def __init__(self) -> None:
        self.values: dict[int, ir.Value | None] = {}

    def bind_group(self, group: Sequence[int], value: ir.Value) -> None:
        """A collapsed loop over ``group``'s variables: the loop value stands in for the last one,
        whose coefficient every leaf scales the loop value by (the collapse condition)."""
        for var in group[:-1]:
            self.values[var] = None
        self.values[group[-1]] = value

    def materialize(self, builder: ir.IRBuilder, e: Lin) -> ir.Value:
        """``e`` as an i64 value."""
        total: ir.Value | None = None
        for atom, coef in e.terms:
            if isinstance(atom, int):
                value = self.values.get(atom)
                if value is None:
                    if atom not in self.values:
                        raise AssertionError(f"domain variable {atom} has no loop here")
                    continue
            else:
                inner = self.materialize(builder, atom.expr)
                op = builder.sdiv if isinstance(atom, Div) else builder.srem  # indices are never negative
                value = op(inner, i64(atom.divisor))
            term = value if coef == 1 else builder.mul(value, i64(coef), flags=_NSW)
            total = term if total is None else builder.add(total, term, flags=_NSW)
        if total is None:
            return i64(e.const)
        return total if e.const == 0 else builder.add(total, i64(e.const), flags=_NSW)


@contextlib.contextmanager
def nest(
    builder: ir.IRBuilder,
    env: VarEnv,
    groups: Sequence[Sequence[int]],
    sizes: Sequence,
    interleave: int | None = None,
) -> Iterator[None]:
    """Nested loops over collapsed groups (outermost first), each binding its group in ``env``; the
    innermost is declared parallel, and vectorized ``interleave`` vectors an iteration where that
    is given (``for_range``)."""
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
        divisor = product(static(n) for n in sizes[k + 1 :])
        value = builder.sdiv(row, i64(divisor)) if divisor > 1 else row
        if k:  # the first group's quotient is already in range
            value = builder.srem(value, i64(static(sizes[k])))
        env.bind_group(group, value)


def row_major_indices(builder: ir.IRBuilder, flat: ir.Value, sizes: Sequence[int]) -> list[ir.Value]:
    """The row-major indices of the non-negative flat index ``flat`` over ``sizes``."""
    out = []
    for k in range(len(sizes)):
        inner = product(sizes[k + 1 :])
        value = builder.udiv(flat, i64(inner)) if inner > 1 else flat
        out.append(builder.urem(value, i64(sizes[k])) if k else value)
    return out


def dot(builder: ir.IRBuilder, terms: Sequence[tuple[ir.Value, int]]) -> ir.Value:
    """``sum(index * coefficient)`` in i64 over ``(index, coefficient)`` pairs; 0 for none. No
    ``add 0, x`` nor ``mul x, 1``: LLVM would remove them, but each costs the generator's printing
    and LLVM's parsing first (a window kernel's addresses hold dozens)."""
    total: ir.Value | None = None
    for value, coefficient in terms:
        if coefficient:
            term = value if coefficient == 1 else builder.mul(value, i64(coefficient), flags=_NSW)
            total = term if total is None else builder.add(total, term, flags=_NSW)
    return i64(0) if total is None else total
