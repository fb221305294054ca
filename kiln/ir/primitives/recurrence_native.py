"""What the layers above lend the numpy recurrence kernels: native kernels, and the BLAS thread rule.

``recurrence_numpy.lstm_forward``/``lstm_backward`` (``gru_*``) ask ``native(mode, dtype, hidden, steps)``
first (one LSTM step on the packed layout asks for mode "LSTM_STEP": ``_lstm_scan_step``'s and
``_lstm_backward_step``'s arrays); what it returns (the code generator's ``LSTMKernels``/``GRUKernels``, compiled for that
dtype and hidden size) runs the whole recurrence in one native call and says whether it took the
arrays. ``None`` -- nothing
installed, native kernels off, a compile still running or failed -- leaves the numpy kernel to
run. The frontend installs the provider (``kiln/frontend/eager_recurrence.py``), which compiles
in the background and caches; this layer imports nothing above it, so it only holds the slot.

``small_products(macs)`` is a context in which the per-step products (``macs`` multiply-adds each)
run on as many BLAS threads as they gain from: one for a product as small as an LSTM LM's
(``runtime.threads.SmallProducts``, which the frontend installs), where numpy's OpenBLAS would
split each step's product over every core and wait for a busy one. Without it, a plain block.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from .linalg import padded_rows


class Kernels(Protocol):
    """What a provider hands out: the numpy kernel's work (``lstm_forward``'s arguments for an LSTM's
    ``forward``, ``gru_backward``'s for a GRU's ``backward``...), or False/None for arrays it does
    not take (the numpy kernel then runs)."""

    def forward(self, *arrays) -> bool: ...

    def backward(self, *arrays) -> Any: ...


#: ``provider(mode, dtype, hidden, steps)``: the kernels for a recurrence of ``steps`` steps (a long one
#: may be worth waiting for while they compile).
Provider = Callable[[str, np.dtype, int, int], Kernels | None]
_provider: list[Provider] = []


Rule = Callable[[int], AbstractContextManager]
_rule: list[Rule] = []


def install(provider: Provider | None, rule: Rule | None = None) -> None:
    """Let the numpy kernels ask ``provider(mode, dtype, hidden, steps)`` for native kernels (None: none) and run
    their per-step products in ``rule(macs)`` (None: as they are)."""
    _provider[:] = [] if provider is None else [provider]
    _rule[:] = [] if rule is None else [rule]


def small_products(macs: int) -> AbstractContextManager:
    """The context for a recurrence whose per-step products have ``macs`` multiply-adds each."""
    return _rule[0](macs) if _rule else contextlib.nullcontext()


_held = threading.local()


@contextlib.contextmanager
def unchanging(arrays: list) -> Iterator[None]:
    """A context in which ``arrays`` are not written (a compiled loop's invariant inputs over its trips:
    ``runtime.loop_call``), so that what the kernels derive from one of them (``transposed``) is kept
    until it ends rather than made again at every step. Per thread; an inner context replaces an outer."""
    outer = getattr(_held, "arrays", None)
    _held.arrays = {id(a): [a, None] for a in arrays}
    try:
        yield
    finally:
        _held.arrays = outer


def with_transposed(w: np.ndarray, w_t: np.ndarray, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` with ``transposed(w)`` answered by ``w_t``, ``w.T`` in C order made
    earlier by a caller that knows ``w`` unchanged since (a trace's cell steps: the weight's version
    is the same, ``nn._rnn_scan_step``), rather than copied again (31 us of each traced LSTM cell step,
    57 ms of a 1,000-step trace of two cells). Per thread; replaces any ``unchanging`` context meanwhile."""
    outer = getattr(_held, "arrays", None)
    _held.arrays = {id(w): [w, w_t]}
    try:
        return fn(*args, **kwargs)
    finally:
        _held.arrays = outer


def transposed(w: np.ndarray) -> np.ndarray:
    """``w.T`` with rows as the kernels read them (``padded_rows``; a recurrent weight as the step
    product's B): made once per ``unchanging``
    context that holds ``w`` (a 204 x 51 float32 copy takes 2.7 us, a one-step LSTM kernel 5), else
    at every call."""
    held = getattr(_held, "arrays", None)
    entry = held.get(id(w)) if held else None
    if entry is None or entry[0] is not w:
        return padded_rows(w.T)
    if entry[1] is None:
        entry[1] = padded_rows(w.T)
    return entry[1]


def step_macs(batch: int, w_hh) -> int:
    """The multiply-adds of one step's product ``h @ W_hh^T`` (or ``dz @ W_hh``): batch x gates x hidden x hidden."""
    return batch * w_hh.shape[0] * w_hh.shape[1]


#: Fewer steps than this run on numpy. One step runs native too (an ``nn.LSTMCell``'s, eager or a compiled
#: loop's trip): with the arrays' addresses read where numpy keeps them (0.1 us each, not ``ndarray.ctypes``'
#: 0.9 us), an LSTM step (hidden 51, batch 16, float32, packed rows) took 17 us forward against numpy's 19-23
#: and 18 us backward against 27; a GRU's forward and backward 76 us against 92.
MIN_STEPS = 1


def native(mode: str, dtype: np.dtype, hidden: int, steps: int) -> Kernels | None:
    """The native kernels of ``mode`` ("LSTM", "GRU"), ``dtype`` and ``hidden`` ready now for a
    recurrence of ``steps`` steps, or None."""
    return _provider[0](mode, dtype, hidden, steps) if _provider and steps >= MIN_STEPS else None
