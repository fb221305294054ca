"""The registry of kernel kinds: what a ``kernel`` node's ``attrs["kind"]`` may name, and each kind's rule.

A kind is one ``KernelKind`` record: its name, how many bodies its nodes hold, whether each output
element reads only the same element of its inputs (what in-place buffers need), and the verifier's
rule for its bodies. The verifier, the memory planner and the fusion passes read the records; each
backend keeps its own table of generators, filled by registration as JAX's ``register_lowering``
(``kiln.codegen.llvm.kinds.register_kernel_generator``, ``kiln.codegen.cuda.kernels``), and
declines a kernel whose kind it has no generator for (the node then runs on the interpreter, which
runs any kind's bodies as ordinary graphs).

Adding a kind is ``register_kernel_kind(KernelKind(...))`` plus a generator per backend that should
compile it (``tests/ir/test_kernel_kinds.py`` adds one from the test itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .analysis import kernel_legality
from .graph import Graph, conv_epilogue

__all__ = [
    "CONV",
    "ELEMENTWISE",
    "HORIZONTAL",
    "REDUCTION",
    "BodyRuleError",
    "GraphCheck",
    "KernelKind",
    "kernel_kind",
    "kernel_kind_names",
    "register_kernel_kind",
    "unregister_kernel_kind",
]

#: The verifier's check of one graph, given to a kind's rule: ``check(graph, ops)`` verifies ``graph``
#: allowing only the ops of an ``"elementwise"`` or a ``"reduction"`` body (``None``: any op).
GraphCheck = Callable[[Graph, "str | None"], None]


class BodyRuleError(ValueError):
    """A body breaks its kernel kind's rule (the verifier adds which node and body)."""


@dataclass(frozen=True)
class KernelKind:
    """One kind of kernel node.

    ``verify_body(body, check)`` raises ``BodyRuleError`` (or lets ``check``'s error through) unless
    ``body`` is a legal body of this kind. ``members``: the node holds one or more structurally
    identical bodies (a horizontal kernel) rather than exactly one. ``pointwise``: each output element
    reads its inputs only at its own index, so an output may take a dead input's buffer."""

    name: str
    verify_body: Callable[[Graph, GraphCheck], None]
    doc: str
    members: bool = False
    pointwise: bool = False


_KINDS: dict[str, KernelKind] = {}


def register_kernel_kind(kind: KernelKind) -> KernelKind:
    """Add ``kind`` to the registry (its name must be new); returns it."""
    if not isinstance(kind, KernelKind):
        raise TypeError(f"register_kernel_kind expects a KernelKind, got {type(kind).__name__}")
    if kind.name in _KINDS:
        raise ValueError(f"kernel kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def unregister_kernel_kind(name: str) -> None:
    """Remove the kind ``name`` (a kind a test registered); the built-in kinds stay."""
    if name in _BUILTIN:
        raise ValueError(f"kernel kind {name!r} is built in and cannot be removed")
    if _KINDS.pop(name, None) is None:
        raise KeyError(f"kernel kind {name!r} is not registered")


def kernel_kind(name: object) -> KernelKind | None:
    """The registered kind called ``name``; None when there is none."""
    return _KINDS.get(name) if isinstance(name, str) else None


def kernel_kind_names() -> tuple[str, ...]:
    """The names of the registered kinds, in the order they were registered."""
    return tuple(_KINDS)


# ----------------------------------------------------------------------------- the built-in kinds
def _legal(body: Graph) -> str | None:
    """The kind of kernel ``body`` forms by the rules fusion forms kernels by (``analysis.kernel_legality``)."""
    legality = kernel_legality(body.nodes, body.outputs, body.uses(), lambda node: True)
    if legality.problem is not None:
        raise BodyRuleError(legality.problem)
    return legality.kind


def _elementwise_body(body: Graph, check: GraphCheck) -> None:
    check(body, "elementwise")
    _legal(body)


def _reduction_body(body: Graph, check: GraphCheck) -> None:
    check(body, "reduction")
    if _legal(body) != "reduction":
        raise BodyRuleError("a reduction body holds at least one reduce node")


def _conv_body(body: Graph, check: GraphCheck) -> None:
    """The whole body as a graph, then its epilogue as an elementwise body, and the outputs' shapes:
    each has the convolution's rank, sample and channel dims (the code computes each unit's sample
    and channels of every output from the unit's block of the convolution; the outputs' other dims
    may differ: a pooled output's)."""
    check(body, None)
    first = body.nodes[0] if body.nodes else None
    if first is None or first.op != "conv" or first.inputs != body.inputs[:2]:
        raise BodyRuleError("a conv kernel's body starts with a conv node of body inputs 0 and 1")
    check(conv_epilogue(body)[1], "elementwise")
    result = first.outputs[0].type.shape
    for i, v in enumerate(body.outputs):
        shape = v.type.shape
        if len(shape) != len(result) or tuple(shape[:2]) != tuple(result[:2]):
            raise BodyRuleError(
                f"output {i} has shape {list(shape)}; a conv kernel's outputs have the sample and channel "
                f"dims of its convolution's result {list(result)}"
            )


ELEMENTWISE = register_kernel_kind(
    KernelKind("elementwise", _elementwise_body, "elementwise ops and views over one domain", pointwise=True)
)
REDUCTION = register_kernel_kind(
    KernelKind("reduction", _reduction_body, "reductions of the same trailing axes, the row values and the full values")
)
HORIZONTAL = register_kernel_kind(
    KernelKind(
        "horizontal",
        _elementwise_body,
        "structurally identical elementwise bodies of different shapes, one launch",
        members=True,
        pointwise=True,
    )
)
CONV = register_kernel_kind(
    KernelKind("conv", _conv_body, "a convolution of body inputs 0 and 1, then an elementwise epilogue on its result")
)
_BUILTIN = frozenset(_KINDS)
