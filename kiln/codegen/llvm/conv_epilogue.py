"""The ``conv`` kernel kind compiled: a direct convolution (``conv.forward``) and its
elementwise epilogue (``kiln.ir.graph.conv_epilogue``: bias, activation, pooling) in one function.

A unit of the convolution is one sample and a block of output channels. It writes that block,
``(block, OH, OW)`` in C order, to a slab on its thread's stack instead of an array; then the
epilogue computes, for the same sample and channels, every output of the kernel from the slab
and the kernel's other inputs, while the slab is in cache. An output may have another shape than
the convolution's (a max pooling's), with the same sample and channel dims: its elements for
the unit's sample and channels read the slab alone. ``plan`` checks this on the index algebra
(every load of the convolution's result lies in the slab of its element's sample and channel);
fusion proposes such kernels only where it holds (``takes_epilogue``).

Each output of the epilogue is a DAG (``kiln.codegen.kernel_dag``) over its own domain, built from
the whole epilogue body: what another output also computes (the bias and activation a pooled
output reads) is computed again there, from the slab, rather than stored and loaded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llvmlite import ir

from ...ir.graph import Node, conv_epilogue
from .. import index as ix
from ..core import Unsupported
from ..kernel_dag import DagBuilder, Load, loads
from ..plans import ElementwisePlan, checked_bodies, outputs_plan
from .body import POINTER, KernelBody, Scope, element_pointer, operand_pointers
from .conv import channel_block, compilable, forward
from .emitter import memory_type
from .loops import VarEnv, for_range, i64, nest, static_shape

__all__ = ["SLAB_BYTES", "emit_conv_kernel", "plan", "takes_epilogue"]

#: The largest stack slab (a unit's block of output channels) an epilogue runs on.
SLAB_BYTES = 128 << 10


def takes_epilogue(node: Node) -> bool:
    """Whether the conv kernel ``node`` that fusion proposes compiles (``plan``, for inputs in C order).
    Not over symbolic sizes (an image of any size): its conv runs on the eager kernel there."""
    if not all(v.type.is_static for v in node.inputs):
        return False
    try:
        plan(node, [ix.contiguous_strides(v.type.shape) for v in node.inputs])
    except Unsupported:
        return False
    return True


def plan(node: Node, layouts: Sequence[Sequence[int]]) -> tuple[Node, list[ElementwisePlan]]:
    """The convolution of conv kernel ``node`` and its epilogue's outputs by domain (each a plan
    whose loops run over the dims after the sample and channel dims); ``Unsupported``
    when the convolution is not compiled, the slab is too large, or an output is not made from the
    slab of its own sample and channel."""
    (body,) = checked_bodies(node)
    conv, epilogue = conv_epilogue(body)
    why = compilable(conv)
    if why is not None:
        raise Unsupported(why)
    result = static_shape(conv.output)
    n_size, o_size, *spatial = result
    if channel_block(o_size) * math.prod(spatial) * conv.output.type.dtype.itemsize > SLAB_BYTES:
        raise Unsupported(
            f"a conv kernel whose block of {channel_block(o_size)} output channels exceeds the stack slab"
        )
    strides = [ix.contiguous_strides(result), *(tuple(s) for s in layouts[2:])]
    n_in = len(epilogue.inputs)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for j, v in enumerate(epilogue.outputs):
        by_shape.setdefault(static_shape(v), []).append(j)
    domains = []
    for shape, members in by_shape.items():
        if len(shape) != len(result) or shape[:2] != (n_size, o_size):
            raise Unsupported(f"an epilogue output of shape {list(shape)}; the convolution's is {list(result)}")
        dag = DagBuilder(epilogue, ix.Space(shape), strides)
        domain = outputs_plan(dag, [(n_in + j, epilogue.outputs[j]) for j in members], loops_from=2)
        for load in loads(domain.roots):
            if load.operand == 0 and not _in_slab(dag.space, load.offset, result):
                raise Unsupported("an epilogue output reads the convolution's result outside its sample and channel")
        domains.append(domain)
    return conv, domains


def _in_slab(space: ix.Space, offset: ix.Lin, result: Sequence[int]) -> bool:
    """Whether ``offset`` into the convolution's result (C order) lies in the block of its own
    sample and channel (domain variables 0 and 1) for every element of ``space``."""
    plane = math.prod(result[2:])
    expected = {0: result[1] * plane, 1: plane}
    found = {atom: c for atom, c in offset.terms if isinstance(atom, int) and atom in expected}
    if any(found.get(j, 0) != expected[j] for j in expected if space.sizes[j] != 1):
        return False  # another sample's or channel's block (a broadcast of one of them reads no variable)
    rest: list[tuple[ix.Atom, int]] = []
    for atom, coefficient in offset.terms:
        if isinstance(atom, int):
            if atom not in found:
                rest.append((atom, coefficient))
        elif not {0, 1}.isdisjoint(atom.expr.variables()):
            return False
        else:
            rest.append((atom, coefficient))
    lo, hi = space.bounds(ix.Lin(offset.const, tuple(rest)))
    return 0 <= lo and hi < plane


def emit_conv_kernel(builder: ir.IRBuilder, params: Sequence[ir.Value], node: Node, layouts) -> int:
    """Emit the function body of conv kernel ``node``; return its number of parallel units (the
    convolution's)."""
    conv, domains = plan(node, layouts)
    if conv.output.type.numel == 0:
        builder.ret_void()
        return 0
    args, begin, end = params
    pointers = operand_pointers(builder, args, len(node.inputs) + len(node.outputs))
    epilogue = _Epilogue(builder, conv, domains, pointers[2:])
    extent = forward(builder, (*pointers[:2], None), begin, end, conv, [tuple(s) for s in layouts], epilogue)
    builder.ret_void()
    assert isinstance(extent, int), "a conv kernel over a symbolic batch (takes_epilogue declines it)"
    return extent


class _Epilogue:
    """The epilogue's code for one unit; ``pointers``: the kernel's data pointers after the
    convolution's two operands (its other inputs, then its outputs)."""

    def __init__(
        self, builder: ir.IRBuilder, conv: Node, domains: list[ElementwisePlan], pointers: list[ir.Value]
    ) -> None:
        shape = static_shape(conv.output)
        self.builder, self.domains = builder, domains
        self.channels, self.block, self.plane = shape[1], channel_block(shape[1]), math.prod(shape[2:])
        with builder.goto_entry_block():
            slab = builder.alloca(memory_type(conv.output.type.dtype), size=i64(self.block * self.plane))
            # An opaque pointer that LLVM cannot trace to the alloca: as for the kernel's arrays, a
            # store to it may change the filter, so the filter's taps are loaded where they are used.
            # Known apart, all of them were hoisted out of the loops, into more registers than exist
            # (LeNet's first convolution: 310 us a call against 180 into an array).
            launder = ir.FunctionType(POINTER, [POINTER])
            self.slab = builder.asm(launder, "", "=r,0", [builder.bitcast(slab, POINTER)], False)
        self.targets = [_SlabBody(builder, [self.slab, *pointers], VarEnv()) for _ in domains]

    def emit(self, n: ir.Value, o0: ir.Value) -> None:
        """The epilogue's outputs for sample ``n``, channels ``o0 .. o0 + block``."""
        builder = self.builder
        slab_at = builder.mul(builder.add(builder.mul(n, i64(self.channels)), o0), i64(self.plane))
        for target in self.targets:
            target.slab_at = slab_at
            target.env.bind_group([0], n)
        with for_range(builder, 0, self.block, name="b", vectorize=False) as b:
            o = builder.add(o0, b, flags=("nsw",))
            for domain, target in zip(self.domains, self.targets, strict=True):
                target.env.bind_group([1], o)
                with nest(builder, target.env, domain.groups, domain.sizes):
                    target.compute_then_store(domain.outputs, Scope())


class _SlabBody(KernelBody):
    """Loads of operand 0, the convolution's result, read the slab, which holds the result's
    elements from ``slab_at`` on."""

    slab_at: ir.Value

    def load_pointer(self, node: Load) -> ir.Value:
        if node.operand != 0:
            return super().load_pointer(node)
        offset = self.builder.sub(self.env.materialize(self.builder, node.offset), self.slab_at)
        return element_pointer(self.builder, self.pointers[0], offset, node.dtype)
