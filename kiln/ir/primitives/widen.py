"""bfloat16 kernels: compute in float32, round the result back once, as PyTorch's CPU kernels do.

numpy computes on ml_dtypes' bfloat16 arrays through ufuncs that widen each element to float32 and
round each result, which matches PyTorch for one-step ops (add, exp) but not for the rest: a sum
would round after every addition, a sigmoid after each of its steps, a matmul returns float32, and
erf refuses the dtype. So when bfloat16 is first used (``dtypes.bfloat16_dtype``) each computing
primitive's eager kernel is wrapped: bfloat16 arrays in are widened to float32, float32 results out
are rounded to bfloat16. Every consumer of ``prim.eager`` (eager dispatch, the interpreter, the
compiled program's extern calls, constant folding) then sees the same kernel. Before that nothing is
wrapped, so programs that never use bfloat16 pay nothing.

Cast, movement, indexing, creation and random primitives move or make values without arithmetic
(or take their dtype from an attribute): they stay as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import PRIMITIVES, Kind, Primitive

__all__ = ["widen_kernels"]

_COMPUTING = frozenset({Kind.UNARY, Kind.BINARY, Kind.TERNARY, Kind.REDUCE, Kind.SCAN, Kind.MATMUL, Kind.WINDOW})
_widened = False


def widen_kernels(bfloat16: np.dtype) -> None:
    """Wrap every computing primitive's eager kernel for ``bfloat16`` (once; later calls do nothing)."""
    global _widened
    if _widened:
        return
    _widened = True
    from . import elementwise, indexing, linalg, movement, reductions, windows  # noqa: F401, PLC0415 - all registered

    for prim in PRIMITIVES.values():
        if prim.kind in _COMPUTING:
            _wrap(prim, bfloat16)


def _wrap(prim: Primitive, bf16: np.dtype) -> None:
    eager, into = prim.eager, prim.eager_into
    f32 = np.dtype(np.float32)

    def widened(xp, *arrays, **attrs):
        # After promotion an op's operands share one dtype, so the first tells; where a bfloat16 operand
        # comes later (where's condition is first), the op selects values and computes nothing.
        if arrays[0].dtype is not bf16:
            return eager(xp, *arrays, **attrs)
        wide = [a.astype(f32) if getattr(a, "dtype", None) is bf16 else a for a in arrays]
        return _narrow(eager(xp, *wide, **attrs), bf16)

    def widened_into(xp, *arrays, out, **attrs):
        if out.dtype is not bf16:
            return into(xp, *arrays, out=out, **attrs)
        out[...] = widened(xp, *arrays, **attrs)
        return out

    # Primitive is frozen so that rules are not changed by accident; this is the one deliberate change, made
    # in place because ops hold the primitive objects themselves.
    object.__setattr__(prim, "eager", widened)
    if into is not None:
        object.__setattr__(prim, "eager_into", widened_into)


def _narrow(result: Any, bf16: np.dtype) -> Any:
    if isinstance(result, tuple):
        return tuple(_narrow(r, bf16) for r in result)
    if getattr(result, "dtype", None) == np.float32:
        return np.asarray(result).astype(bf16)
    return result
