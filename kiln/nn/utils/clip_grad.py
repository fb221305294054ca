"""Gradient clipping (``clip_grad_norm_``, ``clip_grad_value_``) and parameters as one vector."""

from __future__ import annotations

import math

import numpy as np

import kiln
from kiln.frontend import dispatch
from kiln.frontend.jit import state as _jit
from kiln.frontend.tensor import Tensor
from kiln.ir.types import CPU

__all__ = ["clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "get_total_norm", "clip_grads_with_norm_",
           "parameters_to_vector", "vector_to_parameters"]  # fmt: skip


def _as_list(parameters) -> list[Tensor]:
    return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None) -> Tensor:  # fmt: skip
    """Scale all gradients so their joint ``norm_type`` norm is at most ``max_norm``; returns the norm before."""
    grads = [p.grad for p in _as_list(parameters) if p.grad is not None]
    if not grads:
        return kiln.tensor(0.0)
    norm_type = float(norm_type)
    if norm_type == 2.0 and not error_if_nonfinite and _plain(grads):
        return _clip_2_eager(grads, max_norm)
    with kiln.no_grad():
        if norm_type == math.inf:
            norms = [g.abs().max() for g in grads]
            total = kiln.stack(norms).max()
        else:
            norms = [(g.abs() ** norm_type).sum() for g in grads]
            total = kiln.stack(norms).sum() ** (1.0 / norm_type)
        if error_if_nonfinite:  # a check, not .item(): a compiled training step keeps it without a trace break
            kiln.jit.check_values(kiln.isfinite(total), RuntimeError,
                f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot "
                "be clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
                "`error_if_nonfinite=False`"
            )  # fmt: skip
        coef = kiln.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
    return total


def _plain(grads: list[Tensor]) -> bool:
    """Eager, plain CPU float32/float64 gradients of one dtype (not traced, not profiled per op)."""
    if _jit.tracing or dispatch.profiling_ops:
        return False
    dtype = grads[0]._data.dtype if isinstance(grads[0], Tensor) else None
    return (
        dtype is not None
        and dtype.char in "fd"
        and all(
            type(g) is Tensor and g._device is CPU and isinstance(g._data, np.ndarray) and g._data.dtype == dtype
            for g in grads
        )
    )


def _clip_2_eager(grads: list[Tensor], max_norm: float) -> Tensor:
    """``clip_grad_norm_``'s 2-norm on the gradients' arrays: one BLAS dot per gradient and one in-place
    scale each, where the op-by-op path dispatches about six ops a gradient (abs, pow, sum, stack, ...):
    an LSTM LM's 11 gradients 0.38-0.45 -> 0.20-0.22 ms (PyTorch: 0.27-0.42), one thread, busy machine."""
    dtype = grads[0]._data.dtype
    squares = [np.dot(a, a) for a in (np.ravel(g._data) for g in grads)]
    total = np.sqrt(np.sum(np.array(squares, dtype=dtype)), dtype=dtype)
    coef = min(float(max_norm) / (float(total) + 1e-6), 1.0)
    with kiln.no_grad():
        for g in grads:
            g.mul_(coef)  # (in place through the op: version counters and views as ever)
    return kiln.from_numpy(np.asarray(total, dtype=dtype))


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    """Clamp every gradient elementwise to [-clip_value, clip_value]."""
    with kiln.no_grad():
        for p in _as_list(parameters):
            if p.grad is not None:
                p.grad.copy_(kiln.clamp(p.grad, -clip_value, clip_value))


def parameters_to_vector(parameters) -> Tensor:
    """All parameters flattened and concatenated into one vector."""
    return kiln.cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec: Tensor, parameters) -> None:
    """Copy consecutive slices of ``vec`` into ``parameters`` (replacing their data)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected vec to be a Tensor, but got: {type(vec).__name__}")
    offset = 0
    for p in parameters:
        n = p.numel()
        p.data = vec[offset : offset + n].reshape(p.shape).detach()
        offset += n
    if offset != vec.numel():
        raise ValueError(f"vector_to_parameters: vec has {vec.numel()} elements, parameters need {offset}")


def clip_grad_norm(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach=None) -> Tensor:  # fmt: skip
    """Deprecated spelling of :func:`clip_grad_norm_` (PyTorch warns; kiln too)."""
    import warnings  # noqa: PLC0415

    warnings.warn("`torch.nn.utils.clip_grad_norm` is now deprecated in favor of `torch.nn.utils.clip_grad_norm_`.",
                  FutureWarning, stacklevel=2)  # fmt: skip
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def get_total_norm(tensors, norm_type: float = 2.0, error_if_nonfinite: bool = False, foreach=None) -> Tensor:
    """The ``norm_type`` norm of all ``tensors`` together (as if concatenated)."""
    tensors = _as_list(tensors)
    if not tensors:
        return kiln.tensor(0.0)
    norm_type = float(norm_type)
    with kiln.no_grad():
        if norm_type == math.inf:
            total = kiln.stack([t.abs().max() for t in tensors]).max()
        else:
            total = kiln.stack([kiln.norm(t.reshape(-1), norm_type) for t in tensors]).norm(norm_type)
        if error_if_nonfinite:
            kiln.jit.check_values(kiln.isfinite(total), RuntimeError,
                f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot "
                "be clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
                "`error_if_nonfinite=False`"
            )  # fmt: skip
    return total


def clip_grads_with_norm_(parameters, max_norm: float, total_norm: Tensor, foreach=None) -> None:
    """Scale the gradients by ``max_norm / (total_norm + 1e-6)`` when that is below 1."""
    grads = [p.grad for p in _as_list(parameters) if p.grad is not None]
    with kiln.no_grad():
        coef = kiln.clamp(max_norm / (total_norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
