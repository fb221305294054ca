"""The default pass pipeline and the function that runs a pipeline, verifying and recording."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..ir.graph import Graph
from .eliminate_common_subexpressions import eliminate_common_subexpressions
from .eliminate_dead_code import eliminate_dead_code
from .fold_constants import fold_constants
from .simplify import simplify

Pass = Callable[[Graph], Graph]

#: Folding first exposes constants to ``simplify``; CSE then merges what simplification made
#: equal; DCE last removes everything the others left unused.
DEFAULT_PIPELINE: tuple[Pass, ...] = (fold_constants, simplify, eliminate_common_subexpressions, eliminate_dead_code)


class PassError(ValueError):
    """A pass produced a graph that does not verify."""


def run_pipeline(
    graph: Graph,
    passes: Sequence[Pass] = DEFAULT_PIPELINE,
    *,
    verify: bool = False,
    record: list[tuple[str, Graph]] | None = None,
) -> Graph:
    """Run ``passes`` in order on ``graph`` and return the result.

    ``verify=True`` runs the verifier after each pass and raises ``PassError`` naming the pass
    whose output is broken; ``record`` (a list) receives ``(pass_name, graph_after)`` per pass,
    to show the IR before and after each one.

    >>> from kiln.ir.graph import GraphBuilder
    >>> from kiln.ir.types import TensorType
    >>> from kiln.ir.dtypes import float32
    >>> b = GraphBuilder()
    >>> x = b.input(TensorType((2,), float32))
    >>> y = b.node("neg", [b.node("neg", [x])])
    >>> steps = []
    >>> print(run_pipeline(b.build([b.node("exp", [y])]), verify=True, record=steps), end="")
    graph(%0: f32[2]) {
      %3: f32[2] = exp(%0)
      return (%3)
    }
    >>> [name for name, _ in steps]
    ['fold_constants', 'simplify', 'eliminate_common_subexpressions', 'eliminate_dead_code']
    """
    if verify:
        from ..ir.verifier import VerificationError  # noqa: PLC0415 - only needed when verifying
        from ..ir.verifier import verify as verify_graph  # noqa: PLC0415
    for step in passes:
        name = getattr(step, "__name__", repr(step))
        graph = step(graph)
        if verify:
            try:
                verify_graph(graph)
            except VerificationError as error:
                raise PassError(f"the graph after pass {name} does not verify: {error}") from error
        if record is not None:
            record.append((name, graph))
    return graph
