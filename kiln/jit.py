"""kiln's tracing JIT, public side: ``kiln.compile`` and the helpers compiled code may call.

    @kiln.compile
    def step(x, y):
        ...

The function runs eagerly on the first call of each specialization while it is traced into
kiln's IR; its program compiles in the background meanwhile (``wait=True`` waits for it), and
later calls whose guards match run the compiled program once it is ready. See DESIGN.md, "Tracing and
compile", for the rules: what is guarded, what is read at each call, what stops a trace.

What a trace cannot see: Python side effects (``print``, appending to a list) happen only on
the traced call; Python values computed from shapes or read from globals are baked in (the
objects the function's globals and closure name are guarded, module attributes other than
parameters, buffers and ``training`` are not). kiln's optimizers read the numbers in ``param_groups``
at each call and guard their flags (``kiln.jit.guard``), so schedules never retrace and a changed
flag traces again; ``kiln.explain`` lists which. A second size of any dimension of an argument (a
batch, a sequence length, both) makes that size dynamic: one program then serves every size >= 2
(``frontend/jit/dynamic.py``: two traces compared; a branch on the size keeps the call static). ``KILN_JIT=0`` in the environment turns every
``kiln.compile`` into plain eager execution: debug eagerly, then compile.
"""

from __future__ import annotations

import dataclasses
import functools

from .compiler.options import CompileOptions
from .frontend.jit import background as _background
from .frontend.jit import call_cache as _call_cache
from .frontend.jit import state as _state
from .frontend.jit.call_cache import CompiledFunction
from .frontend.jit.check import CompileCheckError
from .frontend.jit.dynamic import mark_dynamic
from .frontend.jit.explain import ExplainReport, explain
from .frontend.jit.export import ExportedProgram, ExportError, export, load_exported
from .frontend.jit.outcomes import CompileWarning, TraceBreakError
from .frontend.jit.regions import Region, composite
from .frontend.jit.state import before_each_call, guard, make_state
from .frontend.jit.state import unsafe as _unsafe
from .frontend.ops.checks import check as _check
from .frontend.ops.checks import check_range as _check_range

__all__ = [
    "compile", "CompileOptions", "CompiledFunction", "TraceBreakError", "CompileCheckError", "before_each_call",
    "stop_trace", "CompileWarning", "make_state",
    "guard", "check_values", "check_range", "explain", "ExplainReport", "export", "ExportedProgram", "ExportError",
    "load_exported", "composite", "Region", "wait_compiled", "mark_dynamic",
]  # fmt: skip


def wait_compiled(timeout: float | None = None) -> bool:
    """Wait for every compile running in the background (``kiln.compile`` compiles a traced call's
    program there while calls run eagerly); whether they all finished within ``timeout`` seconds
    (None: as long as they take). ``fn.wait_compiled()`` waits for one compiled function's.

    >>> import kiln
    >>> f = kiln.compile(lambda x: x + 1)
    >>> _ = f(kiln.ones(2))  # traced while it ran eagerly; its program compiles in the background
    >>> wait_compiled()
    True
    >>> f(kiln.ones(2)).tolist()  # the compiled program
    [2.0, 2.0]
    """
    return _background.wait(timeout=timeout)


def stop_trace(reason: str) -> None:
    """Stop a running ``kiln.compile`` trace here: the call finishes eagerly and ``reason`` is said
    with the user's line (``fullgraph=True`` raises it), as ``torch._dynamo.graph_break`` does. For
    library code that changes Python state a compiled call would not change again. Outside a trace
    it does nothing.

    >>> stop_trace("not traced: nothing happens")
    """
    _unsafe(reason)


def check_values(ok, error: type[Exception], message: str, shown=None) -> None:
    """Raise ``error(message)`` unless every element of the bool tensor ``ok`` is true: for the
    checks eager code makes on values (index ranges, class targets).

    It does not stop a trace: the check becomes a node of the compiled program, so every compiled
    call raises what the eager call raises. ``error`` is IndexError, ValueError, RuntimeError or
    ZeroDivisionError; ``{value}`` in ``message`` is replaced by the element of ``shown`` (a tensor
    of ``ok``'s shape) where ``ok`` first fails.

    >>> import kiln
    >>> t = kiln.tensor([2, 7])
    >>> check_values(t < 5, IndexError, "index {value} is out of range", shown=t)
    Traceback (most recent call last):
      ...
    IndexError: index 7 is out of range
    """
    _check(ok, error, message, shown)


def check_range(index, low: int | None, high: int | None, error: type[Exception], message: str) -> None:
    """Raise ``error(message)`` unless every element of the integer tensor ``index`` is in
    ``[low, high)`` (None: no bound), eagerly and on every compiled call, like ``check_values``
    (``{value}`` in ``message``: the first element out of range).

    Index ops check their indices this way, so a check of the same index and bounds made before
    such an op is merged with the op's own by the compiler: the first one made raises.

    >>> import kiln
    >>> check_range(kiln.tensor([0, -1]), 0, 4, IndexError, "index {value} is out of bounds")
    Traceback (most recent call last):
      ...
    IndexError: index -1 is out of bounds
    """
    _check_range(index, low, high, error, message)


#: ``torch.compile``'s modes: kiln compiles every one alike (its one pipeline; no CUDA graphs, no autotuning)
TORCH_MODES = ("default", "lite", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
#: ``torch.compile``'s backends by name: kiln's compiler, or the function as it is (``eager``, ``aot_eager``:
#: torch runs the captured graph eagerly, the same results)
TORCH_BACKENDS = {"inductor": True, "cudagraphs": True, "eager": False, "aot_eager": False}


def compile(fn=None, *, fullgraph: bool = False, check: bool = False, options: CompileOptions | dict | None = None,  # noqa: A001
            wait: bool | None = None, dynamic: bool | None = None, backend: str | None = None, mode: str | None = None,
            disable: bool = False, recompile_limit: int | None = None, name: str | None = None):  # fmt: skip
    """Compile ``fn`` (a function, a method or an ``nn.Module``) by tracing it.

    Usable as ``@kiln.compile`` or ``@kiln.compile(fullgraph=True, ...)``. ``fullgraph=True``
    raises ``TraceBreakError`` where the trace would stop; ``check=True`` runs each compiled
    call eagerly as well and raises on the first difference; ``options`` is a ``CompileOptions``.
    ``wait=True`` makes a traced call wait for its program (``CompileOptions.wait``; by default
    it compiles in the background while calls run eagerly). ``dynamic`` (as in ``torch.compile``):
    None makes an argument's size dynamic once a second size is seen (any dimension), True makes the
    leading sizes dynamic from the first call (``kiln.mark_dynamic(t, dim)`` marks any one), False
    never (``CompileOptions.dynamic``). A compiled module behaves like the module (same parameters,
    state dict, train/eval).

    ``torch.compile``'s other arguments are taken as a PyTorch program passes them: ``mode`` (any of
    ``TORCH_MODES``: kiln compiles each alike), ``options`` as a dict of inductor's settings (ignored:
    they tune a compiler kiln does not have; a dict of ``CompileOptions``' fields is a TypeError), ``backend`` by name (``TORCH_BACKENDS``: ``"eager"`` and
    ``"aot_eager"`` return ``fn`` as it is), ``disable=True`` (``fn`` as it is), ``recompile_limit``
    (``CompileOptions.recompile_limit``) and ``name``. A backend given as a callable compiles torch.fx
    graphs, which kiln does not make: a TypeError says so.
    """
    if mode is not None and mode not in TORCH_MODES:
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: {', '.join(TORCH_MODES)}")
    if isinstance(options, dict):  # torch.compile's inductor settings (kiln's own in a dict: a mistake to say)
        ours = sorted(set(options) & {f.name for f in dataclasses.fields(CompileOptions)})
        if ours:
            raise TypeError(f"kiln.compile: options must be a kiln.CompileOptions, got a dict with {', '.join(ours)}: "
                            f"pass kiln.CompileOptions({ours[0]}=...)")  # fmt: skip
        if mode is not None:
            raise RuntimeError("Either mode or options can be specified, but both can't be specified at the same time.")
        options = None
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"kiln.compile: backend={backend!r} is a torch.compile backend, which compiles torch.fx graphs; "
                        "kiln compiles with its own (leave backend out, or name one of "
                        f"{', '.join(map(repr, TORCH_BACKENDS))})")  # fmt: skip
    if backend is not None and backend not in TORCH_BACKENDS:
        raise RuntimeError(f"Invalid backend: {backend!r}; kiln takes {', '.join(map(repr, TORCH_BACKENDS))}")
    if disable or (backend is not None and not TORCH_BACKENDS[backend]):
        return fn if fn is not None else (lambda f: f)
    if getattr(fn, "_kiln_disabled", False):  # ``kiln.compiler.disable``'s
        return fn
    if options is not None and not isinstance(options, CompileOptions):
        raise TypeError(f"kiln.compile: options must be a kiln.CompileOptions, got {type(options).__name__}")
    if recompile_limit is not None:
        options = dataclasses.replace(options or CompileOptions(), recompile_limit=recompile_limit)
    if wait is not None:
        if not isinstance(wait, bool):
            raise TypeError(f"kiln.compile: wait must be True or False, got {wait!r}")
        options = dataclasses.replace(options or CompileOptions(), wait=wait)
    if dynamic is not None:
        if options is not None and options.dynamic is not None and options.dynamic != dynamic:
            raise ValueError(f"kiln.compile: dynamic={dynamic} and options.dynamic={options.dynamic} disagree")
        options = dataclasses.replace(options or CompileOptions(), dynamic=dynamic)
    if fn is None:
        return functools.partial(compile, fullgraph=fullgraph, check=check, options=options)
    from .nn.modules.module import Module  # noqa: PLC0415 - nn imports kiln

    if isinstance(fn, Module):
        from .nn.modules.compiled import CompiledModule  # noqa: PLC0415

        return CompiledModule(fn, fullgraph=fullgraph, check=check, options=options)
    return CompiledFunction(fn, fullgraph=fullgraph, check=check, options=options)


# ---------------------------------------------------------------------- TorchScript's names, for ported code
# kiln has no TorchScript. These keep programs that decorate or query for it running: the decorators
# return the function unchanged, the queries say no script or trace is running.
def ignore(drop=False, **kwargs):
    """``@torch.jit.ignore`` / ``@torch.jit.ignore(drop=True)``: the function, unchanged."""
    if callable(drop):
        return drop
    return lambda fn: fn


def unused(fn):
    """``@torch.jit.unused``: the function, unchanged."""
    return fn


def is_scripting() -> bool:
    return False


def is_tracing() -> bool:
    """``torch.jit.is_tracing``: whether this code runs inside a trace (``kiln.jit.trace`` is
    ``kiln.compile``, so inside either), for code that must take another path while traced."""
    return _state.active()


def script(obj, *args, **kwargs):
    """``torch.jit.script``: the function or module unchanged (kiln runs it eagerly; decorate it with
    ``kiln.compile`` for speed)."""
    return obj


def trace(func, example_inputs=None, *args, **kwargs):
    """``torch.jit.trace``: ``kiln.compile(func)`` (kiln traces on the first call itself; unlike
    torch.jit.trace, it guards what the trace assumed and retraces or runs eagerly when that changes)."""
    return compile(func)


# ---------------------------------------------------------------------- torch.compiler's names
# ``kiln.compiler`` is the compiler layer; kiln/__init__.py puts these there too, so that
# ``torch.compiler.disable`` and the others port by changing the import.
TORCH_COMPILER_NAMES = ("compile", "reset", "disable", "is_compiling", "is_dynamo_compiling", "allow_in_graph",
                        "assume_constant_result", "cudagraph_mark_step_begin")  # fmt: skip


def reset() -> None:
    """``torch.compiler.reset``: every compiled function forgets its specializations; each traces
    again at its next call.

    >>> import kiln
    >>> f = kiln.compile(lambda x: x * 2, wait=True)
    >>> _ = f(kiln.ones(2)); reset(); len(f.state.specializations)
    0
    """
    for fn in list(_call_cache.LIVE):
        fn.reset()


def disable(fn=None, recursive: bool = True, *, reason: str | None = None):
    """``torch.compiler.disable``: ``fn`` always runs eagerly. A compiled call that reaches it stops
    its trace there, saying so with ``reason`` (the call runs eagerly: kiln does not split a trace
    around it, as ``torch.compile``'s graph break does), and ``kiln.compile(fn)`` returns it as it is.
    ``recursive`` is taken for torch's signature: kiln never compiles what ``fn`` calls apart from it.

    >>> import kiln
    >>> @disable(reason="logs to a file")
    ... def log_stats(x):
    ...     return x
    >>> f = kiln.compile(lambda x: log_stats(x * 2), wait=True)
    >>> f(kiln.ones(2)).tolist(), f.state.events[-1].kind
    ([2.0, 2.0], 'break')
    """
    if fn is None:
        return functools.partial(disable, recursive=recursive, reason=reason)
    said = f"{getattr(fn, '__qualname__', type(fn).__name__)} is marked torch.compiler.disable"
    said += f" ({reason})" if reason else ""

    @functools.wraps(fn)
    def eagerly(*args, **kwargs):
        _unsafe(said)
        return fn(*args, **kwargs)

    eagerly._kiln_disabled = True  # type: ignore[attr-defined]
    return eagerly


def is_compiling() -> bool:
    """``torch.compiler.is_compiling``: whether this code runs inside a ``kiln.compile`` trace (its
    compiled calls then replay what the trace recorded on this branch)."""
    return _state.active()


is_dynamo_compiling = is_compiling


def allow_in_graph(fn):
    """``torch.compiler.allow_in_graph``: ``fn`` as it is (a trace records the ops ``fn`` runs)."""
    return fn


def assume_constant_result(fn):
    """``torch.compiler.assume_constant_result``: ``fn`` as it is. kiln's trace runs it and guards the
    Python state it reads, so its result is never a stale constant (torch's promise is weaker)."""
    return fn


def cudagraph_mark_step_begin() -> None:
    """``torch.compiler.cudagraph_mark_step_begin``: nothing to mark (kiln records no CUDA graphs)."""
