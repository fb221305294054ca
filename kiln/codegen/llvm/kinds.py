"""The LLVM backend's generator per kernel kind, filled by registration (as JAX's ``register_lowering``).

``KernelModule.add`` looks a kernel node's kind up here; a kind with no generator is declined
(``Unsupported``), so the node runs on the interpreter and ``kiln.explain`` says why. The built-in
kinds' generators are registered below (their code lives in ``elementwise``, ``reduction``,
``conv_epilogue`` and ``horizontal``, imported when a kernel is generated); a new kind
(``kiln.ir.kernel_kinds``) registers its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...ir.graph import Node, conv_epilogue
from ...ir.kernel_kinds import CONV, ELEMENTWISE, HORIZONTAL, REDUCTION

__all__ = ["KindGenerator", "kind_generator", "register_kernel_generator", "unregister_kernel_generator"]

#: ``emit(builder, args, node, layouts)``: writes the kernel's function body (see ``kernels``) and
#: returns its number of parallel units, or over a symbolic dimension (rows per unit of the size, rows per unit).
Emit = Callable[[Any, Any, Node, Sequence[tuple[int, ...]]], "int | tuple[int, int]"]


@dataclass(frozen=True)
class KindGenerator:
    """How the LLVM backend compiles one kernel kind. ``symbolic``: the generator handles a leading
    symbolic (batch) dimension. ``arithmetic(node)``: the kernel's arithmetic as bytes moved (for the
    thread pool's decision), beyond what it reads and writes; None where memory traffic decides."""

    emit: Emit
    symbolic: bool = True
    arithmetic: Callable[[Node], int] | None = None


_GENERATORS: dict[str, KindGenerator] = {}


def register_kernel_generator(kind: str, generator: KindGenerator) -> None:
    """Compile kernels of ``kind`` with ``generator`` (one per kind)."""
    if not isinstance(generator, KindGenerator):
        raise TypeError(f"a kernel kind's generator is a KindGenerator, got {type(generator).__name__}")
    if kind in _GENERATORS:
        raise ValueError(f"the LLVM backend already has a generator for kernel kind {kind!r}")
    _GENERATORS[kind] = generator


def unregister_kernel_generator(kind: str) -> None:
    """Forget the generator of ``kind`` (one a test registered)."""
    if _GENERATORS.pop(kind, None) is None:
        raise KeyError(f"the LLVM backend has no generator for kernel kind {kind!r}")


def kind_generator(kind: object) -> KindGenerator | None:
    """The generator of ``kind``; None when the backend has none (the kernel is then declined)."""
    return _GENERATORS.get(kind) if isinstance(kind, str) else None


# ----------------------------------------------------------------------------- the built-in kinds
# (the emitters import the code generator when called: loading a cached program needs none of it)
def _elementwise(builder, args, node: Node, layouts) -> int | tuple[int, int]:
    from .elementwise import emit_elementwise  # noqa: PLC0415

    return emit_elementwise(builder, args, node, layouts)


def _reduction(builder, args, node: Node, layouts) -> int | tuple[int, int]:
    from .reduction import emit_reduction  # noqa: PLC0415

    return emit_reduction(builder, args, node, layouts)


def _conv(builder, args, node: Node, layouts) -> int | tuple[int, int]:
    from .conv_epilogue import emit_conv_kernel  # noqa: PLC0415

    return emit_conv_kernel(builder, args, node, layouts)


def _conv_arithmetic(node: Node) -> int:
    """The convolution's multiply-adds, each as the time of moving 2 bytes (as for a conv node)."""
    from .conv import multiply_adds  # noqa: PLC0415

    return 2 * multiply_adds(conv_epilogue(node.attrs["bodies"][0])[0])


def _horizontal(builder, args, node: Node, layouts) -> int | tuple[int, int]:
    from .horizontal import emit_horizontal  # noqa: PLC0415

    return emit_horizontal(builder, args, node, layouts)


register_kernel_generator(ELEMENTWISE.name, KindGenerator(_elementwise))
register_kernel_generator(REDUCTION.name, KindGenerator(_reduction))
register_kernel_generator(CONV.name, KindGenerator(_conv, arithmetic=_conv_arithmetic))
register_kernel_generator(HORIZONTAL.name, KindGenerator(_horizontal, symbolic=False))
