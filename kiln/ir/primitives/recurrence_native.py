"""Where the numpy recurrence kernels find native ones: a slot that a layer above fills.

``recurrence_numpy.lstm_forward``/``lstm_backward`` ask ``lstm_kernels(dtype, hidden)`` first; what
it returns (the code generator's ``LSTMKernels``, compiled for that dtype and hidden size) runs
the whole recurrence in one native call and says whether it took the arrays. ``None`` -- nothing
installed, native kernels off, a compile still running or failed -- leaves the numpy kernel to
run. The frontend installs the provider (``kiln/frontend/eager_recurrence.py``), which compiles
in the background and caches; this layer imports nothing above it, so it only holds the slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np


class LSTMKernels(Protocol):
    """What a provider hands out: ``lstm_forward``'s and ``lstm_backward``'s work, or False/None
    for arrays it does not take (the numpy kernel then runs)."""

    def forward(self, A, h0, c0, hs, cs, tanh_c, w_hh_t) -> bool: ...

    def backward(self, A, c_prev, tanh_c, w_hh, dH, dC, eA, dz) -> Any: ...


Provider = Callable[[np.dtype, int], LSTMKernels | None]
_provider: list[Provider] = []


def install(provider: Provider | None) -> None:
    """Let the numpy kernels ask ``provider(dtype, hidden)`` for native kernels (None: none)."""
    _provider[:] = [] if provider is None else [provider]


def lstm_kernels(dtype: np.dtype, hidden: int) -> LSTMKernels | None:
    """The native LSTM kernels of ``dtype`` and ``hidden`` ready now, or None."""
    return _provider[0](dtype, hidden) if _provider else None
