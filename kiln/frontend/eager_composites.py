"""Composite eager ops (softmax, layer_norm, pooling...) on compiled programs, with their gradients.

A composite op is Python over primitives: eager runs each primitive's numpy kernel, one pass over
memory each, and so does its backward. ``@compiled_composite(name)`` on the op's function makes
its eager calls use ``eager_kernels``' cache: the key is the op's name, each tensor argument's
shape, dtype, strides and ``requires_grad``, the other arguments' values and the grad mode. On a
miss the call runs as before while the worker thread compiles the op for that key: it calls
``kiln.compile(fn, fullgraph=True)`` -- the tracer, the same driver (and its disk cache), the
compiled backward -- once with clones of the arguments, running the backward too when an argument
requires grad, so that neither the forward nor the backward compiles in the caller's thread.
Later calls with the key run that compiled function: fused kernels forward and backward (softmax
and its gradient each one pass per row), one autograd node for the whole op.

Calls stay eager where a compiled function would not match the key's specialization: arguments
that are not dense CPU tensors (C order or a permutation of it; float32/64, int32/64, bool) or
plain values (numbers, strings, tuples of them, None), tensors under ``MIN_BYTES`` together, or a ``kiln.compile``
trace running in this thread (it records the op itself). Like a primitive's, a key of calls
without grad keeps the compiled program only if its first ``eager_kernels.TRIALS`` calls beat the
eager calls timed while it compiled; calls with grad are not timed (their backward, which gains
most, runs later), and each op gained forward and backward at every size measured.

A call whose inputs require grad runs inside ``_CompiledCall`` (an autograd ``Function``): its
backward runs the compiled backward, or the eager op's where the gradient is itself
differentiated (``create_graph=True``), which a compiled backward is not.
A trace that breaks (``fullgraph``) or a compile that fails leaves the key eager, said once.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import numpy as np

from ..compiler.options import CompileOptions
from ..ir.types import CPU
from . import eager_kernels
from .autograd.api import backward, grad
from .autograd.function import Function
from .autograd.grad_mode import enable_grad
from .autograd.grad_mode import state as _grad_state
from .autograd.graph import AccumulateGrad
from .jit import state as _jit
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
            if name not in eager_kernels.ROUTED_COMPOSITES or (_jit.tracing and _jit.current.get() is not None):
                return fn(*args, **kwargs)
            key = _key(name, args, kwargs, EAGER_BELOW.get(name, MIN_BYTES))
            if key is None:
                return fn(*args, **kwargs)
            make = functools.partial(_compile, fn, args, kwargs, key[-1])
            entry = eager_kernels.ready(name, key, make)
            if entry is None:
                return eager_kernels.timed_eager(key, lambda: fn(*args, **kwargs))
            program = entry.program
            assert program is not None
            if key[-1] and any(isinstance(a, Tensor) and a._requires_grad for a in (*args, *kwargs.values())):
                # not timed: the backward, where the compiled program gains most, runs later
                return _CompiledCall.apply(program, fn, len(args), tuple(kwargs), *args, *kwargs.values())
            if entry.trials >= eager_kernels.TRIALS:
                return program(*args, **kwargs)
            return eager_kernels.trial(name, entry, functools.partial(program, *args, **kwargs))

        return wrapper

    return decorate


class _CompiledCall(Function):
    """A composite op's compiled call with its compiled backward -- or, when the backward is itself
    differentiated (``create_graph=True``, which a compiled backward is not), the eager op's."""

    @staticmethod
    def forward(ctx, program, fn, n_args: int, names: tuple, *values):
        inner = [v.detach().requires_grad_() if isinstance(v, Tensor) and v._requires_grad else v for v in values]
        tensors = [v for v in values if isinstance(v, Tensor)]
        versions = [t._version[0] for t in tensors]
        with enable_grad():  # Function.apply runs forward without grad: the compiled call records its backward node
            result = program(*inner[:n_args], **dict(zip(names, inner[n_args:], strict=True)))
        ctx.fn, ctx.n_args, ctx.names, ctx.values, ctx.inner = fn, n_args, names, values, inner
        ctx.outputs = result if isinstance(result, tuple) else (result,)
        # The compiled backward checks the versions of what it reads itself (``CompiledBackward``),
        # so an in-place change of what it does not read (eval batch_norm's running statistics,
        # whose normalized input it saved) is no error, as in the numpy op. The eager op's backward
        # (create_graph) recomputes from every input: those changed since are errors there -- but for
        # the state the op itself updates, which a second call before the backward updates again.
        ctx.versions = [(t._version, v) for t, v in zip(tensors, versions, strict=True) if t._version[0] == v]
        detached = tuple(o.detach() if isinstance(o, Tensor) else o for o in ctx.outputs)
        return detached if isinstance(result, tuple) else detached[0]

    @staticmethod
    def backward(ctx, *grads):
        wrt = [i for i, v in enumerate(ctx.values) if isinstance(v, Tensor) and v._requires_grad]
        found = None
        if _grad_state.grad_enabled:  # create_graph: the eager op's backward, differentiable again
            _check_unchanged(ctx.versions)
            values = [v if i in wrt else _clone(v) for i, v in enumerate(ctx.values)]  # no second running-stat update
            result = ctx.fn(*values[: ctx.n_args], **dict(zip(ctx.names, values[ctx.n_args :], strict=True)))
            outputs, inputs = result if isinstance(result, tuple) else (result,), [ctx.values[i] for i in wrt]
        else:
            outputs, inputs = ctx.outputs, [ctx.inner[i] for i in wrt]
            found = _one_node_backward(outputs, grads, inputs)
        if found is None:
            pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if isinstance(o, Tensor) and o.requires_grad]
            found = grad([o for o, _ in pairs], inputs, [g for _, g in pairs], retain_graph=True,
                         create_graph=_grad_state.grad_enabled, allow_unused=True)  # fmt: skip
        by_position = dict(zip(wrt, found, strict=True))
        return (None, None, None, None, *(by_position.get(i) for i in range(len(ctx.values))))


def _check_unchanged(versions: list) -> None:
    for counter, version in versions:
        if counter[0] != version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"a compiled composite op read it at version {version} and it is now at version {counter[0]}. "
                "Hint: clone it before the inplace operation."
            )


def _one_node_backward(outputs: tuple, grads: tuple, inputs: list) -> list | None:
    """What ``autograd.grad(outputs, inputs, grads, retain_graph=True, allow_unused=True)`` returns,
    found by applying the compiled call's one backward node directly: the outputs' common
    ``grad_fn``, whose edges lead straight to the ``inputs`` (the detached leaves the call ran on).
    None where the graph is not that (then ``grad`` runs the engine), or in anomaly mode (whose
    checks the engine makes). A nested engine run costs ~25 us of a small composite's backward."""
    if _grad_state.anomaly:
        return None
    node = seeds = None
    for output, g in zip(outputs, grads, strict=True):
        if not isinstance(output, Tensor) or not output._requires_grad:
            continue
        if node is None:
            node = output.grad_fn
            seeds = [None] * node.num_outputs
        elif output.grad_fn is not node:
            return None
        seeds[output._output_nr] = g  # type: ignore[index]
    position = {id(t): i for i, t in enumerate(inputs)}
    if (
        node is None
        or node.pre_hooks
        or node.hooks
        or not all(
            e is None or (e[0].__class__ is AccumulateGrad and id(e[0].variable) in position) for e in node.next_edges
        )
    ):
        return None
    found: list = [None] * len(inputs)
    if all(s is None for s in seeds):  # type: ignore[union-attr]
        return found
    for edge, g in zip(node.next_edges, node.apply(seeds), strict=True):
        if edge is not None and g is not None:
            i = position[id(edge[0].variable)]
            found[i] = g if found[i] is None else found[i] + g
    return found


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
    return (name, tuple(parts), tuple(kwargs), _grad_state.grad_enabled)


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
    _grad_state.grad_enabled = grad_enabled  # thread-local: this worker's
    try:
        result = compiled(*map(_clone, args), **{k: _clone(v) for k, v in kwargs.items()})
        outputs = result if isinstance(result, tuple) else (result,)
        differentiable = [t for t in outputs if isinstance(t, Tensor) and t.requires_grad]
        if differentiable:
            backward(differentiable, [make_tensor(np.ones_like(t._data), t._device) for t in differentiable])
    except Exception as error:  # noqa: BLE001 - any failure leaves the op eager, said once
        return eager_kernels.Entry(reason=f"its compile failed ({type(error).__name__}: {error})", failed=True)
    finally:
        _grad_state.grad_enabled = before
    if len(compiled.state.specializations) != 1:
        return eager_kernels.Entry(reason="kiln.compile made no program for it", failed=True)
    return eager_kernels.Entry(program=compiled, seconds=time.perf_counter() - start)
