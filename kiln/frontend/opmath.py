"""``in_float32``: a composite op on bfloat16 computes in float32 and rounds its result once.

PyTorch's CPU kernels for softmax, gelu, norms and reductions read bfloat16, compute in float32 (their
"opmath" type) and round only the result. kiln's composites are chains of primitives, each rounding
to the tensor's dtype, so on bfloat16 a gelu near 0 (``1 + erf(x)`` cancels) or a variance lost most
of their bits. Decorating a composite with ``in_float32`` widens a bfloat16 first argument to float32
and rounds the result back; other dtypes pass straight through (one attribute test). Gradients flow
through the two casts, so the backward computes in float32 too, as PyTorch's does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from ..ir import dtypes as dt
from .ops._util import cast

F = TypeVar("F", bound=Callable)


def in_float32(fn: F) -> F:
    @functools.wraps(fn)
    def composite(input, *args, **kwargs):
        low = dt._bfloat16  # None until bfloat16 is first used
        if low is None or getattr(input, "_dtype", None) is not low:
            return fn(input, *args, **kwargs)
        if kwargs.get("dtype") is not None or any(isinstance(a, dt.DType) for a in args):
            return fn(input, *args, **kwargs)  # softmax(x, dim, dtype): the caller chose the dtype
        return cast(fn(cast(input, dt.float32), *args, **kwargs), input._dtype)

    return composite  # type: ignore[return-value]
