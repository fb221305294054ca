"""kiln's tracing JIT, public side: ``kiln.compile`` and the helpers compiled code may call.

    @kiln.compile
    def step(x, y):
        ...

The function runs eagerly on the first call of each specialization while it is traced into
kiln's IR; later calls whose guards match run the compiled program. See DESIGN.md, "Tracing and
compile", for the rules: what is guarded, what is read at each call, what stops a trace.

What a trace cannot see: Python side effects (``print``, appending to a list) happen only on
the traced call; Python values computed from shapes or read from globals are baked in (the
objects the function's globals and closure name are guarded, module attributes other than
parameters, buffers and ``training`` are not). ``KILN_JIT=0`` in the environment turns every
``kiln.compile`` into plain eager execution: debug eagerly, then compile.
"""

from __future__ import annotations

import functools

from .frontend.jit.check import CompileCheckError
from .frontend.jit.compiler import CompiledFunction, CompileOptions
from .frontend.jit.explain import ExplainReport, explain
from .frontend.jit.export import ExportedProgram, ExportError, export, load_exported
from .frontend.jit.state import before_each_call
from .frontend.jit.trace import TraceBreakError

__all__ = [
    "compile", "CompileOptions", "CompiledFunction", "TraceBreakError", "CompileCheckError", "before_each_call",
    "any_set", "explain", "ExplainReport", "export", "ExportedProgram", "ExportError", "load_exported",
]  # fmt: skip


def any_set(bad) -> bool:
    """Whether any element of the bool tensor ``bad`` is set: for input checks that raise.

    Unlike ``bool(bad.any())`` this does not stop a trace: the check runs on the traced call
    (which runs eagerly), and compiled calls do not repeat it (kernels still refuse indices
    outside the tensor). Use it only to raise an error, never to choose a computation.
    """
    return bool(bad._host().any())


def compile(fn=None, *, fullgraph: bool = False, check: bool = False, options: CompileOptions | None = None):  # noqa: A001
    """Compile ``fn`` (a function, a method or an ``nn.Module``) by tracing it.

    Usable as ``@kiln.compile`` or ``@kiln.compile(fullgraph=True, ...)``. ``fullgraph=True``
    raises ``TraceBreakError`` where the trace would stop; ``check=True`` runs each compiled
    call eagerly as well and raises on the first difference; ``options`` is a ``CompileOptions``.
    A compiled module behaves like the module (same parameters, state dict, train/eval).
    """
    if fn is None:
        return functools.partial(compile, fullgraph=fullgraph, check=check, options=options)
    from .nn.modules.module import Module  # noqa: PLC0415 - nn imports kiln

    if isinstance(fn, Module):
        from .nn.modules.compiled import CompiledModule  # noqa: PLC0415

        return CompiledModule(fn, fullgraph=fullgraph, check=check, options=options)
    return CompiledFunction(fn, fullgraph=fullgraph, check=check, options=options)
