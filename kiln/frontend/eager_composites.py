"""Composite eager ops (softmax, layer_norm, pooling...) on compiled programs, with their gradients.

A composite op is Python over primitives: eager runs each primitive's numpy kernel, one pass over
memory each, and so does its backward. ``@compiled_composite(name)`` on the op's function makes
its eager calls use ``eager_kernels``' cache: the key is the op's name, each tensor argument's
shape, dtype, strides and ``requires_grad``, the other arguments' values, the default dtype and
the grad mode. On a
miss the call runs as before while the worker thread compiles the op for that key: it calls
``kiln.compile(fn, fullgraph=True)`` -- the tracer, the same driver (and its disk cache), the
compiled backward -- once with clones of the arguments, running the backward too when an argument
requires grad, so that neither the forward nor the backward compiles in the caller's thread.
Later calls with the key run that compiled function: fused kernels forward and backward (softmax
and its gradient each one pass per row), one autograd node for the whole op.

Calls stay eager where a compiled function would not match the key's specialization: arguments
that are not dense CPU tensors (C order or a permutation of it; float32/64, int32/64, bool) or
plain values (numbers, strings, tuples of them, None), tensors under ``MIN_BYTES`` together, a
``kiln.compile`` trace running in this thread (it records the op itself), or an autocast region
(the worker compiles outside it). Like a primitive's, a key of calls
without grad keeps the compiled program only if its first ``eager_kernels.TRIALS`` calls beat the
eager calls timed while it compiled; calls with grad are not timed (their backward, which gains
most, runs later), and each op gained forward and backward at every size measured.

A compiled call runs the program on the caller's own tensors (``_run``: the key above stands for
``kiln.compile``'s own, which is not computed again), so its one ``CompiledBackward`` node has the
arguments' history as its edges. Where that gradient is itself differentiated
(``create_graph=True``, which a compiled backward is not) the node takes it from the eager op.
A trace that breaks (``fullgraph``) or a compile that fails leaves the key eager, said once.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import numpy as np

from ..compiler.options import CompileOptions
from ..ir import dtypes as _dtypes
from ..ir.types import CPU
from ..runtime import profiling as _profiling
from . import eager_kernels, eager_queue
from .autocast import state as _autocast
from .autograd.api import backward, grad
from .autograd.grad_mode import set_mode as set_grad_mode
from .autograd.grad_mode import state as _grad_state
from .jit import state as _jit
from .jit.backward import CompiledBackward
from .jit.layouts import memory_owner
from .jit.pytree import flatten, flatten_call
from .tensor import Tensor, make_tensor

#: Tensor dtypes a call may have (integer ones: class indices, as cross_entropy's target).
_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int64, np.int32, np.bool_))
_PLAIN = (bool, int, float, str)
#: Calls whose tensors hold fewer bytes than this stay eager. A composite op is several numpy ops
#: (cross_entropy of 64x10 logits: 218 us eager, 102 us compiled, forward and backward), so even
#: small calls may gain; each key's ``eager_kernels.trial`` keeps eager where it is faster.
MIN_BYTES = 1 << 10
#: Ops whose eager form is faster on small tensors, and the bytes below which their calls stay eager.
EAGER_BELOW: dict[str, int] = {}


def compiled_composite(name: str, eager_below: int = MIN_BYTES) -> Callable:
    """Decorate the composite op ``name``'s function (see the module docstring); calls whose
    tensors hold fewer than ``eager_below`` bytes together stay eager (an op whose eager form is
    faster on small tensors raises it: ``EAGER_BELOW``)."""
    if eager_below != MIN_BYTES:
        EAGER_BELOW[name] = eager_below

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if (
                name not in eager_kernels.ROUTED_COMPOSITES
                or (_jit.tracing and _jit.current.get() is not None)
                or _autocast.any  # the worker thread compiles outside the caller's autocast region
            ):
                return fn(*args, **kwargs)
            key = _key(name, args, kwargs, EAGER_BELOW.get(name, MIN_BYTES))
            if key is None:
                return fn(*args, **kwargs)
            make = functools.partial(_compile, fn, args, kwargs, key[-1])
            entry = eager_kernels.ready(name, key, make)
            if entry is None:  # its primitives compile after it, and not once it is compiled
                if eager_kernels.on_numpy(key):
                    return fn(*args, **kwargs)
                with eager_queue.covering(key):
                    return eager_kernels.timed_eager(key, lambda: fn(*args, **kwargs))
            program = entry.program
            assert program is not None
            if key[-1] and any(isinstance(a, Tensor) and a._requires_grad for a in (*args, *kwargs.values())):
                # not timed: the backward, where the compiled program gains most, runs later
                return _run(program, fn, args, kwargs, differentiable=True)
            run = functools.partial(_run, program, fn, args, kwargs)
            return run() if entry.trials >= eager_kernels.TRIALS else eager_kernels.trial(name, entry, run)

        return wrapper

    return decorate


def _run(program, fn: Callable, args: tuple, kwargs: dict, differentiable: bool = False):
    """The call on ``program``'s one specialization (``kiln.compile``'s cached program), run on the
    call's own tensors: ``_key`` has checked what its key checks, so the compiled function's own
    key is not computed again; its guards on globals are. Where the program cannot serve the call
    (tensors sharing memory, a changed global, ``KILN_JIT=0``) the eager op runs."""
    leaves, _ = flatten_call(args, kwargs)
    specs = program.state.specializations
    if len(specs) != 1 or not program.enabled or not _apart(leaves):
        return fn(*args, **kwargs)
    spec = specs[0]
    if spec.state_miss(program._globals, program._closure_values(), leaves) is not None:
        return fn(*args, **kwargs)
    if not differentiable:
        return _run_spec(fn, spec, leaves)
    versions = [(t._version, t._version[0]) for t in leaves if isinstance(t, Tensor)]
    result = _run_spec(fn, spec, leaves)
    node = None
    for output in result if isinstance(result, tuple) else (result,):
        if isinstance(output, Tensor) and output.grad_fn is not None:
            node = output.grad_fn
            break
    if isinstance(node, CompiledBackward):
        # The compiled backward checks the versions of what it reads itself, so an in-place change
        # of what it does not read (eval batch_norm's running statistics, whose normalized input it
        # saved; softmax's input) is no error, as in the numpy op. The eager op's backward
        # (create_graph) reruns it on every input: those changed since are errors there -- but for
        # the state the op itself updates, which a second call before the backward updates again.
        unchanged = [(counter, v) for counter, v in versions if counter[0] == v]
        node.eager = functools.partial(_eager_gradients, fn, args, kwargs, spec, leaves, unchanged)
    return result


def _run_spec(fn: Callable, spec, leaves: list):
    if _profiling.active:  # kiln.profiler records the call around its kernels
        return _profiling.timed(f"compiled {getattr(fn, '__name__', 'composite')}", "compiled", spec.run, leaves)
    return spec.run(leaves)


def _apart(leaves: list) -> bool:
    """Whether no two tensors of the call share memory (the program was compiled for tensors apart)."""
    owners = [id(memory_owner(t._data)) for t in leaves if isinstance(t, Tensor)]
    return len(owners) < 2 or len(set(owners)) == len(owners)


def _eager_gradients(fn: Callable, args: tuple, kwargs: dict, spec, leaves: list, versions: list,
                     grads: list) -> tuple:  # fmt: skip
    """The compiled call's gradients where they must be differentiable again (``create_graph=True``,
    which a compiled backward is not): the eager op run again on its inputs (which must be as they
    were: ``versions``) and differentiated, one gradient per tensor the compiled backward returns one
    for (``CompiledBackward.eager``)."""
    for counter, version in versions:
        if counter[0] != version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"a compiled composite op read it at version {version} and it is now at version {counter[0]}. "
                "Hint: clone it before the inplace operation."
            )
    plan = spec.backward
    externals = [spec.external(k, leaves) for k in plan.wrt]
    flat = flatten(fn(*map(_clone_state, args), **{k: _clone_state(v) for k, v in kwargs.items()}))[0]
    pairs = [(flat[p], g) for p, g in zip(plan.diff_results, grads, strict=True) if g is not None]
    pairs = [(o, g) for o, g in pairs if o.requires_grad]
    if not pairs:
        return (None,) * len(externals)
    return tuple(grad([o for o, _ in pairs], externals, [g for _, g in pairs], retain_graph=True,
                      create_graph=True, allow_unused=True))  # fmt: skip


def _clone_state(arg):
    """A tensor argument that does not require grad as a copy (the eager op run again must not
    update batch_norm's running statistics a second time); others as they are."""
    return _clone(arg) if isinstance(arg, Tensor) and not arg._requires_grad else arg


def _key(name: str, args: tuple, kwargs: dict, eager_below: int = MIN_BYTES) -> tuple | None:
    """The cache key of a call, or None where it stays eager (see the module docstring)."""
    parts: list = []
    nbytes = 0
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, Tensor):
            data = arg._data
            if arg._device is not CPU or data.dtype not in _DTYPES or not (data.flags.c_contiguous or _dense(data)):
                return None
            parts.append((data.shape, data.dtype.char, data.strides, arg._requires_grad))
            nbytes += data.nbytes
        elif (
            arg is None
            or isinstance(arg, _PLAIN)
            or (isinstance(arg, tuple) and all(isinstance(a, _PLAIN) for a in arg))
        ):
            parts.append((type(arg), arg))
        else:
            return None
    if nbytes < eager_below:
        return None
    return (name, tuple(parts), tuple(kwargs), _dtypes.get_default_dtype(), _grad_state.grad_enabled)


def _dense(data: np.ndarray) -> bool:
    """Whether ``data`` fills its memory without gaps in some order of its dims (a conv's output in
    channel-major memory) with the strides a copy in that order has: its clone then has its layout."""
    return data.ndim > 1 and data.strides == np.empty_like(data).strides and data.flags.writeable


def _clone(arg):
    """A tensor argument's copy (its own memory, same layout and ``requires_grad``); others as they are."""
    if not isinstance(arg, Tensor):
        return arg
    copy = make_tensor(arg._data.copy(order="K"), arg._device)
    return copy.requires_grad_() if arg._requires_grad else copy


@functools.cache
def _background_compile() -> type:
    """``kiln.compile``'s class, quiet about slow compiles: nobody waits for this one (the caller runs eagerly)."""
    from .jit.call_cache import CompiledFunction  # noqa: PLC0415 - the compiler loads only when first needed

    class BackgroundCompiledFunction(CompiledFunction):
        def _slow_compile_notice(self, *args, **kwargs):
            return _NoNotice()

    return BackgroundCompiledFunction


class _NoNotice:
    def cancel(self) -> None:
        pass


def _compile(fn: Callable, args: tuple, kwargs: dict, grad_enabled: bool) -> eager_kernels.Entry:
    """Compile ``fn`` for calls like this one by calling ``kiln.compile(fn)`` on clones, in the
    caller's grad mode, and its backward when an output requires grad; an entry that stays eager,
    with the reason, if that fails."""
    start = time.perf_counter()
    # this thread is the background: it waits for its own compile
    compiled = _background_compile()(fn, fullgraph=True, options=CompileOptions(wait=True))
    before = _grad_state.grad_enabled
    set_grad_mode(grad_enabled)  # thread-local: this worker's
    try:
        result = compiled(*map(_clone, args), **{k: _clone(v) for k, v in kwargs.items()})
        outputs = result if isinstance(result, tuple) else (result,)
        differentiable = [t for t in outputs if isinstance(t, Tensor) and t.requires_grad]
        if differentiable:
            backward(differentiable, [make_tensor(np.ones_like(t._data), t._device) for t in differentiable])
    except Exception as error:  # noqa: BLE001 - any failure leaves the op eager, said once
        return eager_kernels.Entry(reason=f"its compile failed ({type(error).__name__}: {error})", failed=True)
    finally:
        set_grad_mode(before)
    if len(compiled.state.specializations) != 1:
        return eager_kernels.Entry(reason="kiln.compile made no program for it", failed=True)
    return eager_kernels.Entry(program=compiled, seconds=time.perf_counter() - start)
