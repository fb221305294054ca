"""``kiln.fft``: the real-valued part of ``torch.fft``.

kiln has no complex dtype yet, so it provides what is real in and real out: the sample
frequencies (``fftfreq``, ``rfftfreq``) and the shifts (``fftshift``, ``ifftshift``, which are
rolls, differentiable and compiled like any other op). The transforms themselves (``fft``,
``rfft``, ``irfft``, ``fftn``...) return or take complex tensors; they exist with PyTorch's
signatures and raise ``NotImplementedError`` saying so, rather than return something a PyTorch
program would misread (a real view of the complex result, for one).

Why not complex now: a complex dtype reaches the type-promotion tables, the tensor printer,
autograd (every VJP needs its conjugate form, or gradients are silently wrong) and the code
generators (which must decline it); that is its own piece of work, not a side effect of fft.

>>> import kiln
>>> kiln.fft.fftfreq(4)
tensor([ 0.0000,  0.2500, -0.5000, -0.2500])
"""

from __future__ import annotations

import math

from . import frontend  # noqa: F401 - binds the Tensor methods used below
from .frontend import ops
from .ir import dtypes as dt

__all__ = [
    "fftfreq", "rfftfreq", "fftshift", "ifftshift", "fft", "ifft", "rfft", "irfft", "fft2", "ifft2", "rfft2",
    "irfft2", "fftn", "ifftn", "rfftn", "irfftn", "hfft", "ihfft",
]  # fmt: skip


def fftfreq(n: int, d: float = 1.0, *, dtype=None, device=None, requires_grad: bool = False, **_):
    """The sample frequencies of an n-point transform with sample spacing d:
    ``[0, 1, ..., ceil(n/2) - 1, -floor(n/2), ..., -1] / (d n)``."""
    dtype = dt.get_default_dtype() if dtype is None else dt.as_dtype(dtype)
    _check_length(n, "fftfreq")
    indices = ops.arange(n, dtype=dt.int64, device=device)
    wrapped = ops.where(indices < (n + 1) // 2, indices, indices - n)
    out = ops.cast(wrapped, dtype) * (1.0 / (d * n) if n else math.nan)  # 0 / 0, as torch
    return out.requires_grad_(True) if requires_grad else out


def rfftfreq(n: int, d: float = 1.0, *, dtype=None, device=None, requires_grad: bool = False, **_):
    """The sample frequencies of ``rfft`` of n points: ``[0, 1, ..., n // 2] / (d n)``."""
    dtype = dt.get_default_dtype() if dtype is None else dt.as_dtype(dtype)
    _check_length(n, "rfftfreq")
    out = ops.arange(n // 2 + 1, dtype=dtype, device=device) * (1.0 / (d * n) if n else math.nan)  # 0 / 0, as torch
    return out.requires_grad_(True) if requires_grad else out


def _check_length(n, op: str) -> None:
    if not isinstance(n, int) or n < 0:
        raise RuntimeError(f"{op}: n must be a non-negative integer, got {n!r}")


def _shift_dims(input, dim) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(input.ndim))
    return (dim,) if isinstance(dim, int) else tuple(dim)


def fftshift(input, dim=None):
    """Move the zero-frequency term to the centre: a roll by ``size // 2`` along each of ``dim``."""
    dims = _shift_dims(input, dim)
    return ops.roll(input, tuple(input.shape[d] // 2 for d in dims), dims)


def ifftshift(input, dim=None):
    """The inverse of ``fftshift``: a roll by ``-(size // 2)``."""
    dims = _shift_dims(input, dim)
    return ops.roll(input, tuple(-(input.shape[d] // 2) for d in dims), dims)


def _complex_transform(name: str):
    def transform(input, *args, **kwargs):
        raise NotImplementedError(
            f"kiln.fft.{name}: this transform {'takes' if name in _TAKES_COMPLEX else 'returns'} complex tensors, and "
            "kiln has no complex dtype yet. kiln.fft offers fftfreq, rfftfreq, fftshift and ifftshift; for the "
            "transform itself, compute it with numpy.fft on tensor.numpy() outside kiln's autograd and compile."
        )

    transform.__name__ = transform.__qualname__ = name
    transform.__doc__ = (
        f"``torch.fft.{name}``: not available (kiln has no complex dtype yet); raises NotImplementedError."
    )
    return transform


_TAKES_COMPLEX = {"ifft", "irfft", "ifft2", "irfft2", "ifftn", "irfftn", "hfft"}
fft = _complex_transform("fft")
ifft = _complex_transform("ifft")
rfft = _complex_transform("rfft")
irfft = _complex_transform("irfft")
fft2 = _complex_transform("fft2")
ifft2 = _complex_transform("ifft2")
rfft2 = _complex_transform("rfft2")
irfft2 = _complex_transform("irfft2")
fftn = _complex_transform("fftn")
ifftn = _complex_transform("ifftn")
rfftn = _complex_transform("rfftn")
irfftn = _complex_transform("irfftn")
hfft = _complex_transform("hfft")
ihfft = _complex_transform("ihfft")
