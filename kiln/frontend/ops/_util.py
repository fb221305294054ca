"""Helpers every op module uses: turning arguments into tensors and promoting dtypes."""

from __future__ import annotations

import numpy as np

from ...ir import dtypes as dt
from ...ir.primitives import P
from ...ir.types import CPU, Device
from ...runtime.devices import to_device
from .. import dispatch
from ..autograd import grad_mode
from ..autograd.api import grad
from ..dispatch import apply
from ..jit import state as _jit
from ..tensor import Tensor, make_tensor

Number = bool | int | float
_FLOATS = frozenset((np.dtype(np.float32), np.dtype(np.float64)))


def scalar_tensor(value, dtype: dt.DType, device: Device = CPU) -> Tensor:
    """A 0-d tensor holding a Python number, as a constant operand of an op -- or, while a trace reads
    the number as an argument of the call (``jit/scalar_args.py``), that input cast to ``dtype``."""
    if _jit.tracing and dtype.is_floating_point and device is CPU:
        trace = _jit.current.get()
        if trace is not None and trace.scalar_args:
            from ..jit.scalar_args import operand  # noqa: PLC0415 - loaded with the compiler

            number = operand(trace, value)
            if number is not None:
                return cast(number, dtype)
    try:
        array = np.asarray(value, dtype=dtype.np)
    except OverflowError:  # int8_tensor + 300: the number wraps into the dtype, as in PyTorch
        array = np.asarray(value).astype(dtype.np)
    if device is not CPU:
        array = to_device(array, device)
    return make_tensor(array, device, dtype)


def cast(x: Tensor, dtype: dt.DType) -> Tensor:
    """``x`` converted to ``dtype`` (the same tensor when it already is)."""
    if x._dtype is dtype:
        return x
    return apply(P["cast"], x, dtype=dtype)


def check_tensor(x, name: str, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}(): argument '{name}' must be a Tensor, not {type(x).__name__}")
    return x


def promote(*args, op: str = "op", floating: bool = False) -> tuple[Tensor, ...]:
    """Tensors and Python numbers made into tensors of one dtype (PyTorch's promotion).

    ``floating=True`` lifts an integer or bool result to the default float dtype (``div``,
    ``exp``). The device is the tensors' (they must agree, which ``apply`` checks).
    """
    device = None
    for a in args:
        if isinstance(a, Tensor):
            device = a._device
            break
        if not isinstance(a, Number | np.number | np.bool_):
            raise TypeError(f"{op}(): expected Tensors or numbers, got {type(a).__name__}")
    if device is None:
        raise TypeError(f"{op}(): expected at least one Tensor argument")
    dtype = dt.result_type(*args)
    if floating and not dtype.is_floating_point:
        dtype = dt.get_default_dtype()
    return tuple(cast(a, dtype) if isinstance(a, Tensor) else scalar_tensor(a, dtype, device) for a in args)


def as_tensor_arg(x, like: Tensor) -> Tensor:
    """A tensor argument, or a number made into a 0-d tensor of ``like``'s dtype and device."""
    if isinstance(x, Tensor):
        return x
    return scalar_tensor(x, like._dtype, like._device)


def plain_arrays(*tensors) -> bool:
    """Whether an op may run on the arrays of ``tensors`` (None skipped) as one autograd node of its
    own: plain float32/64 CPU tensors of one dtype (Parameters included; no sparse or other kind),
    outside traces and profiles (which record the ops), none an inference tensor (whose saving the
    ops refuse with their error). A trace in another thread (eager kernels' composites are traced in
    the background while a fresh process's first steps run) records nothing of this one's."""
    if (_jit.tracing and _jit.current.get() is not None) or dispatch.profiling_ops:
        return False
    dtype = None
    for t in tensors:
        if t is None:
            continue
        if not isinstance(t, Tensor) or t._device is not CPU or getattr(t, "is_sparse", False):
            return False
        if dtype is None:
            dtype = t._dtype
        elif t._dtype is not dtype:
            return False
        if grad_mode.inference_used and t._inference:
            return False
    return dtype is not None and dtype.np in _FLOATS


def recomputed_gradients(composite, inputs: tuple, wanted: tuple, g: Tensor) -> tuple:
    """The gradients, for ``g``, of ``composite(*inputs)`` recomputed with ops, with respect to each
    input whose ``wanted`` flag is set (None for the others): an on-the-arrays node's backward where a
    trace, a profile or create_graph must see ops. Under create_graph the gradients are differentiable
    through the inputs' own history; otherwise the recomputation starts from detached inputs, so that
    the inner backward never runs (and frees) the nodes of the graph the caller's backward walks."""
    create_graph = grad_mode.state.grad_enabled
    if not create_graph:
        inputs = tuple(None if t is None else t.detach().requires_grad_(w) for t, w in zip(inputs, wanted, strict=True))
    else:
        # Each input through a view of its own, which only the composite reads: the gradient reaching it
        # is the partial derivative through that input, as the node's; taken at the input itself it
        # was the total one, wrong where one input is made from another (``stack([x, x * x])``).
        inputs = tuple(t if t is None or not w else t.view_as(t) for t, w in zip(inputs, wanted, strict=True))
    targets = [t for t, w in zip(inputs, wanted, strict=True) if w and t is not None]
    with grad_mode.enable_grad():
        y = composite(*inputs)
    found = iter(grad([y], targets, [g], create_graph=create_graph, allow_unused=True))
    return tuple(next(found) if w and t is not None else None for t, w in zip(inputs, wanted, strict=True))
