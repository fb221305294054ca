"""``kiln.signal.windows``: PyTorch's ``torch.signal.windows`` (scipy's window functions): ``hann``,
``hamming``, ``blackman``, ``bartlett``, ``kaiser``, ``cosine``, ``exponential``, ``gaussian``,
``nuttall``, ``general_cosine`` and ``general_hamming``.

Each takes the length ``M`` and ``sym`` (True: the symmetric window; False: the periodic one, the
symmetric window one longer with its last point dropped, as ``torch.hann_window``'s default). The
values are computed in float64 and given in ``dtype`` (the default float dtype unless said).

>>> import kiln
>>> kiln.signal.windows.hann(5)
tensor([0.0000, 0.5000, 1.0000, 0.5000, 0.0000])
"""

from __future__ import annotations

import numpy as np

from .._torch_names_math import _cosines, _window
from ..frontend.tensor import Tensor

__all__ = ["bartlett", "blackman", "cosine", "exponential", "gaussian", "general_cosine", "general_hamming", "hamming",
           "hann", "kaiser", "nuttall"]  # fmt: skip

_NUTTALL = (0.3635819, 0.4891775, 0.1365995, 0.0106411)


def _make(name: str, M: int, sym: bool, dtype, device, requires_grad: bool, formula) -> Tensor:
    return _window(name, M, not sym, dtype, device, requires_grad, formula)


def general_cosine(M: int, *, a, sym: bool = True, dtype=None, layout=None, device=None,
                   requires_grad: bool = False) -> Tensor:  # fmt: skip
    """``sum_k (-1)^k a_k cos(2 pi k n / (M - 1))``."""
    coefficients = tuple(float(c) for c in a)
    if not coefficients:
        raise ValueError("Coefficients cannot be empty")
    return _make("general_cosine", M, sym, dtype, device, requires_grad, _cosines(*coefficients))


def general_hamming(M: int, *, alpha: float = 0.54, sym: bool = True, dtype=None, layout=None, device=None,
                    requires_grad: bool = False) -> Tensor:  # fmt: skip
    return general_cosine(M, a=(alpha, 1.0 - alpha), sym=sym, dtype=dtype, device=device, requires_grad=requires_grad)


def hann(M: int, *, sym: bool = True, dtype=None, layout=None, device=None, requires_grad: bool = False) -> Tensor:
    return general_hamming(M, alpha=0.5, sym=sym, dtype=dtype, device=device, requires_grad=requires_grad)


def hamming(M: int, *, sym: bool = True, dtype=None, layout=None, device=None, requires_grad: bool = False) -> Tensor:
    return general_hamming(M, sym=sym, dtype=dtype, device=device, requires_grad=requires_grad)


def blackman(M: int, *, sym: bool = True, dtype=None, layout=None, device=None, requires_grad: bool = False) -> Tensor:
    return general_cosine(M, a=(0.42, 0.5, 0.08), sym=sym, dtype=dtype, device=device, requires_grad=requires_grad)


def nuttall(M: int, *, sym: bool = True, dtype=None, layout=None, device=None, requires_grad: bool = False) -> Tensor:
    return general_cosine(M, a=_NUTTALL, sym=sym, dtype=dtype, device=device, requires_grad=requires_grad)


def bartlett(M: int, *, sym: bool = True, dtype=None, layout=None, device=None, requires_grad: bool = False) -> Tensor:
    return _make("bartlett", M, sym, dtype, device, requires_grad,
                 lambda n, size: 1 - np.abs(2 * n / (size - 1) - 1))  # fmt: skip


def kaiser(M: int, *, beta: float = 12.0, sym: bool = True, dtype=None, layout=None, device=None,
           requires_grad: bool = False) -> Tensor:  # fmt: skip
    if beta < 0:
        raise ValueError(f"beta must be non-negative, got: {beta} instead.")
    return _make("kaiser", M, sym, dtype, device, requires_grad,
                 lambda n, size: np.i0(beta * np.sqrt(1 - (2 * n / (size - 1) - 1) ** 2)) / np.i0(beta))  # fmt: skip


def cosine(M: int, *, sym: bool = True, dtype=None, layout=None, device=None, requires_grad: bool = False) -> Tensor:
    """``sin(pi (n + 1/2) / M)``."""
    return _make("cosine", M, sym, dtype, device, requires_grad, lambda n, size: np.sin(np.pi * (n + 0.5) / size))


def exponential(M: int, *, center: float | None = None, tau: float = 1.0, sym: bool = True, dtype=None, layout=None,
                device=None, requires_grad: bool = False) -> Tensor:  # fmt: skip
    """``exp(-|n - center| / tau)``, centered by default."""
    if sym and center is not None:
        raise ValueError("Center must be None for symmetric windows")
    if tau <= 0:
        raise ValueError(f"Tau must be positive, got: {tau} instead.")

    def formula(n, size):
        return np.exp(-np.abs(n - ((size - 1) / 2 if center is None else center)) / tau)

    return _make("exponential", M, sym, dtype, device, requires_grad, formula)


def gaussian(M: int, *, std: float = 1.0, sym: bool = True, dtype=None, layout=None, device=None,
             requires_grad: bool = False) -> Tensor:  # fmt: skip
    """``exp(-((n - (M - 1) / 2) / std)^2 / 2)``."""
    if std <= 0:
        raise ValueError(f"Standard deviation must be positive, got: {std} instead.")
    return _make("gaussian", M, sym, dtype, device, requires_grad,
                 lambda n, size: np.exp(-(((n - (size - 1) / 2) / std) ** 2) / 2))  # fmt: skip
