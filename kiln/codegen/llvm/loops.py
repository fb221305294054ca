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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from llvmlite import ir

I64 = ir.IntType(64)


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


@contextlib.contextmanager
def for_range(
    builder: ir.IRBuilder, start: ir.Value | int, stop: ir.Value | int, *, name: str = "i", parallel: bool = False,
    vectorize: bool = True, interleave: int | None = None, width: int | None = None,
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
    what that leaves) or leave it all to the vector loop's scalar remainder.
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
    yield index
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
    if width is not None:
        properties.append(
            module.add_metadata([ir.MetaDataString(module, "llvm.loop.vectorize.width"), ir.IntType(32)(width)])
        )
    if interleave is not None or width is not None:
        properties.append(module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")]))
    if interleave is not None:
        count = ir.IntType(32)(interleave)
        properties.append(module.add_metadata([ir.MetaDataString(module, "llvm.loop.interleave.count"), count]))
    if properties:
        loop_id = _DistinctMD(module, [])
        loop_id.operands = (loop_id, *properties)
        back.set_metadata("llvm.loop", loop_id)
    builder.position_at_end(exit_block)


def minimum(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """Signed i64 minimum."""
    return builder.select(builder.icmp_signed("<", a, b), a, b)


def product(values) -> int:
    """The product of ints (1 for none)."""
    out = 1
    for v in values:
        out *= v
    return out
