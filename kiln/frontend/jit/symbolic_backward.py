"""The compiled backward of a dynamic specialization: one backward program for every size.

A compiled call whose results need gradients outside it (``loss = model(x); loss.backward()``)
has a backward graph of its own (``backward.py``). For a dynamic specialization it is compared
with the earlier trace's backward graph as the forward graphs are (``dynamic.symbolize``, the same
symbols), and lowered once over symbolic sizes (``symbolic_program.lower_symbolic``): a
``SymbolicProgram`` reads the sizes off the seeds and saved values of each call. A trace whose
backward differs otherwise (the partition saved other values at the other size) stays static and
says why.

The ``BackwardPlan`` from the partition keeps its backward graph unlowered (``traced``) until the
specialization is compiled: ``lower_plan`` then lowers it for the traced sizes, or symbolically.
"""

from __future__ import annotations

from dataclasses import replace

from ...compiler.driver import compile_graph
from ...ir.graph import Graph
from ...ir.types import Sym
from ...ir.verifier import VerificationError, verify
from .backward import BackwardPlan
from .dynamic import NotDynamic, symbolize
from .signature import Captured, Saved
from .symbolic_program import Unlowered, lower_symbolic

__all__ = ["symbolic_backward", "lower_plan"]


def symbolic_backward(
    plan: BackwardPlan, earlier, sizes: dict[Sym, tuple[int, int]], forward: Graph | None = None
) -> tuple[Graph | None, str | None]:
    """``(the backward graph over symbolic sizes, None)``, or ``(None, why not)``. ``earlier``: the
    earlier trace's ``sizes_source``, ``(forward, backward)`` when it had a backward; ``sizes``: each
    symbol's ``(size now, size then)``; ``forward``: the symbolic forward graph, whose outputs give
    the saved values their types (a size two traces alone could spell two ways: ``s0`` and
    ``2*((s0+1)//2)`` agree at even sizes)."""
    if not isinstance(earlier, tuple) or plan.traced is None:
        return None, "a result needs gradients outside the call and the earlier trace's did not"
    known = {}
    if forward is not None:
        known = {k: forward.outputs[plan.saved_outputs[kind.index]].type
                 for k, kind in enumerate(plan.signature.inputs) if isinstance(kind, Saved)}  # fmt: skip
    try:
        graph = symbolize(plan.traced, earlier[1], sizes, known)
        verify(graph)
    except (NotDynamic, VerificationError) as why:
        return None, f"the backward graphs at the two sizes differ otherwise: {why}"
    for value, kind in zip(graph.inputs, plan.signature.inputs, strict=True):
        if value.type.symbols and isinstance(kind, Captured):
            return (
                None,
                f"the backward reads a tensor besides the call's whose size follows the dynamic size ({value.type})",
            )
    return graph, None


def lower_plan(options, plan: BackwardPlan, symbolic: Graph | None = None) -> tuple[BackwardPlan, str | None]:
    """``plan`` with its program: the backward lowered over ``symbolic`` sizes when given and the
    backend generates code once for every size, else for the traced sizes (and why not symbolic)."""
    if symbolic is not None:
        try:
            fused, program, _ = lower_symbolic(symbolic, options, [None] * len(symbolic.inputs), ())
        except Unlowered as why:
            return lower_plan(options, plan)[0], f"the backward is lowered per size: {why}"
        return replace(plan, graph=fused, program=program, traced=symbolic), None
    assert plan.traced is not None, "a backward plan lowered twice"
    lowered = compile_graph(plan.traced, options)
    return replace(plan, graph=lowered.graph, program=lowered.program), None
