"""One dispatch path for every primitive call: check, run, record.

``apply(prim, *tensors, **attrs)`` checks devices, runs the primitive's eager kernel on the
tensors' arrays, wraps the result (a view of input 0 for view primitives, sharing its version
counter), and attaches the backward node when grad mode is on and an input requires grad.
The shape/dtype rule runs only when a kernel fails, to turn the array library's message into
one that names the op, the expected shapes and the given ones; on success the kernel's result
is the rule's answer (``tests/ir/test_registry.py`` checks that they agree).
"""

from __future__ import annotations

import logging
import warnings

import numpy as np

from ..ir.primitives import ELEMENTWISE, NOT_DIFFERENTIABLE, Primitive
from ..ir.types import CPU, Device, TensorType
from ..runtime import profiling as _profiling
from ..runtime.devices import array_namespace
from .autograd import grad_mode as _grad_mode
from .autograd import graph as _graph
from .autograd.grad_mode import state as _grad_state
from .eager_kernels import ROUTES as _compiled_routes
from .jit import state as _jit
from .tensor import _NP_TO_DTYPE, Tensor

logger = logging.getLogger("kiln")

# Floating-point exceptions (overflow to inf, 0/0 -> nan) are values in PyTorch, not warnings.
# Ignoring numpy's RuntimeWarnings raised inside kiln's kernels costs nothing per op, where
# numpy.errstate would cost about a microsecond.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"kiln\.")

_NAMESPACES = {CPU: np}
#: Set by ``kiln.profiler`` while a profile records: a global of this module, so that the check each
#: op makes when no profile records is one global lookup.
profiling_ops = False
_ndarray = np.ndarray
_new_tensor = object.__new__
# The compiled kernel routed for a primitive, or None. Bound once: Python 3.11 compiles
# ``name.method()`` on a name bound by an import as an attribute load and a call of the bound
# method it makes, where a dict's method is no specializable load (~30 ns of every op).
_compiled_route = _compiled_routes.get


def apply(prim: Primitive, *inputs: Tensor, **attrs) -> Tensor:
    if profiling_ops:  # kiln.profiler records: it times this call (its nested call runs the body)
        recorded = _profiling.eager_op(apply, prim, inputs, attrs)
        if recorded is not None:
            return recorded
    if _jit.watch_hooks:  # a traced call's hazard watch is on: an op runs kiln's code only, unwatched
        hook = _jit.watch_here()
        if hook is not None:
            return _jit.unwatched(hook, apply, prim, *inputs, **attrs)
    first = inputs[0]
    device = first._device
    arity = len(inputs)
    if arity == 2:  # unrolled for binary ops, the most common call (a loop costs ~30 ns)
        if inputs[1]._device is not device:
            inputs, device = _on_one_device(prim, inputs)
            first = inputs[0]
    elif arity > 2:
        for t in inputs:
            if t._device is not device:
                inputs, device = _on_one_device(prim, inputs)
                first = inputs[0]
                break
    try:
        xp = _NAMESPACES[device]  # (a subscript: dict.get's method call costs ~20 ns more)
    except KeyError:
        xp = _namespace(device)
    # a heavy op may run kiln's compiled kernel for it (eager_kernels.py); every other op its numpy kernel
    kernel = _compiled_route(prim) or prim.eager
    try:
        # Called with the arrays spelled out where it can be: a call with *args and **kwargs
        # (and the list of arrays it needs) costs ~0.15 us of the ~0.8 us a one-element add takes.
        if arity == 2:
            out = (
                kernel(xp, first._data, inputs[1]._data, **attrs) if attrs else kernel(xp, first._data, inputs[1]._data)
            )
        elif arity == 1:
            out = kernel(xp, first._data, **attrs) if attrs else kernel(xp, first._data)
        else:
            out = kernel(xp, *[t._data for t in inputs], **attrs)
    except (RuntimeWarning, FloatingPointError):
        # The caller made floating-point warnings errors (warnings.simplefilter("error") or
        # numpy.seterr(all="raise")); inf and nan are values in kiln, so run again without them.
        with np.errstate(all="ignore"):
            out = prim.eager(xp, *[t._data for t in inputs], **attrs)
    except Exception as error:
        raise _kernel_error(prim, inputs, attrs, error) from error
    if out.__class__ is not _ndarray and device is CPU:
        out = np.asarray(out)  # numpy returns scalars for 0-d results; a tensor needs an array
    # make_tensor's body, inlined: its call is ~6% of a one-element add (keep the two alike)
    result = _new_tensor(Tensor)
    result._data = out
    result._device = device
    result._dtype = _NP_TO_DTYPE[out.dtype]
    result._requires_grad = False
    result.grad_fn = None
    result._output_nr = 0
    result._grad = None
    result._version = [0]
    result._base = None
    result._hooks = None
    result._retains_grad = False
    result._grad_acc = None
    result._inference = _grad_mode.inference_used and _grad_state.inference
    result._trace = None
    result._post_accumulate_hooks = None
    if prim.is_view:
        result._base = first._base if first._base is not None else first
        result._version = first._version
    if _jit.tracing:  # first: a backward node that saves the result saves its IR value too
        trace = _jit.current.get()
        if trace is not None:
            trace.record(prim, inputs, attrs, result)  # (which also marks the result born in the trace)
    # Whether an input requires grad first, then grad mode: on in every thread while no thread has
    # turned it off (one module attribute), else the thread-local state (~35 ns to read).
    if arity == 2:
        needs_grad = first._requires_grad or inputs[1]._requires_grad
    elif arity == 1:
        needs_grad = first._requires_grad
    else:
        needs_grad = any([t._requires_grad for t in inputs])
    if (
        needs_grad
        and (not _grad_mode.threads_without_grad or _grad_state.grad_enabled)
        and prim.vjp is not NOT_DIFFERENTIABLE
    ):
        _graph.record(prim, inputs, attrs, result)
    return result


def _namespace(device):
    xp = array_namespace(device)
    _NAMESPACES[device] = xp
    return xp


def types_of(inputs) -> tuple[TensorType, ...]:
    return tuple(TensorType(tuple(t._data.shape), t._dtype, t._device) for t in inputs)


def _on_one_device(prim: Primitive, inputs: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], Device]:
    """The inputs of an elementwise op on one device, and that device: as in PyTorch, a 0-d CPU tensor
    (a scalar: an optimizer's step size, a captured constant) goes with tensors of one other device
    and is moved there (differentiably). Any other mix of devices is an error."""
    others = {t._device for t in inputs if t._device is not CPU}
    scalars_only = all(t._device is not CPU or t._data.ndim == 0 for t in inputs)
    if len(others) != 1 or not scalars_only or prim.kind not in ELEMENTWISE:
        raise _device_error(prim, inputs)
    from .ops.creation import to  # noqa: PLC0415 - the ops import this module

    (device,) = others
    return tuple(t if t._device is device else to(t, device) for t in inputs), device


def _device_error(prim: Primitive, inputs) -> RuntimeError:
    devices = list(dict.fromkeys(str(t._device) for t in inputs))  # PyTorch's words, then kiln's hint
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {devices[0]} and "
        f"{devices[1]}! (in {prim.name}; move them with .to(device) first)"
    )


def _kernel_error(prim: Primitive, inputs, attrs, error: Exception) -> Exception:
    """The shape rule's error if it has one (it names expected and given), else the kernel's."""
    types = types_of(inputs)
    try:
        prim.infer(*types, **attrs)
    except (TypeError, ValueError, IndexError, RuntimeError) as rule_error:
        return type(rule_error)(str(rule_error))
    given = ", ".join(str(t) for t in types)
    message = f"{prim.name}({given}{', ' if attrs else ''}{_attrs_text(attrs)}): {error}"
    try:
        return type(error)(message)
    except Exception:  # noqa: BLE001 - an exception type with a constructor of its own
        return RuntimeError(message)


def _attrs_text(attrs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in attrs.items())
