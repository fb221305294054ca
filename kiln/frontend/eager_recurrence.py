"""The native LSTM and GRU recurrences (``kiln/codegen/llvm/recurrence*.py``) behind the numpy kernels.

Importing this installs the provider of ``kiln.ir.primitives.recurrence_native``: the eager layers
(``nn/_rnn.py``) and compiled programs' ``rnn_scan``/``rnn_scan_backward`` call
``recurrence_numpy``'s ``lstm_*``/``gru_*`` kernels, which ask it for the native kernels of their
mode, dtype and hidden size. It compiles them once per (mode, dtype, hidden) -- the steps and the
batch are arguments -- in ``eager_kernels``' background thread (so under its switch:
``KILN_EAGER_KERNELS=0`` keeps numpy, ``=sync`` compiles in the caller's thread), kept in its
in-memory cache and in the disk cache of compiled kernels; numpy runs until they are ready (a
recurrence of ``WAIT_STEPS`` steps or more waits for them instead). A
compile that fails leaves that key on numpy, said once (``eager_kernels``). It also lends the numpy
kernels (an Elman RNN's; an LSTM's or GRU's while theirs compile) ``threads.SmallProducts``: their
per-step products on one BLAS thread.

Measured (LSTM, H=128, B=16, T=35, float32, one thread, medians over 300 calls on the shared 2-core
machine): forward 0.41-0.45 ms (numpy kernel: 1.39 ms), backward 0.32-0.34 ms (1.49 ms).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import cast

import numpy as np

from ..ir.primitives import recurrence_native
from ..runtime.threads import SmallProducts
from . import eager_kernels

#: The eager-kernel cache's name of each mode's kernels (its warnings say it).
#: "LSTM_STEP": one LSTM step on rnn_scan's packed layout (a compiled loop's trip over an ``nn.LSTMCell``),
#: its own functions, compiled only where such a step runs.
NAMES = {"LSTM": "lstm recurrence", "GRU": "gru recurrence", "LSTM_STEP": "lstm step"}


def _compile(mode: str, dtype: np.dtype, hidden: int) -> eager_kernels.Entry:
    from ..codegen.core import Unsupported  # noqa: PLC0415 - the code generator loads only when first needed
    from ..codegen.llvm.recurrence_call import GRUKernels, LSTMKernels, LSTMStepKernels  # noqa: PLC0415

    start = time.perf_counter()
    try:
        kernels = {"LSTM": LSTMKernels, "GRU": GRUKernels, "LSTM_STEP": LSTMStepKernels}[mode].build(dtype, hidden)
    except Unsupported as error:
        return eager_kernels.Entry(reason=str(error))
    except Exception as error:  # noqa: BLE001 - any failure leaves the recurrence on numpy, said once
        return eager_kernels.Entry(reason=f"its compile failed ({type(error).__name__}: {error})", failed=True)
    # The cache's entries hold programs; this one holds the kernels object (``native`` reads it back).
    return eager_kernels.Entry(program=cast(Callable[[list], list], kernels), seconds=time.perf_counter() - start)


#: A recurrence of this many steps or more waits for its native kernels (compiles them in the caller's
#: thread, or waits for the worker's compile) rather than run numpy meanwhile. The first call of a
#: ``kiln.compile``'d LSTM LM (2 layers, H=128, B=16) at T=350 ran three of its four recurrences on
#: numpy: 41, 35 and 179 ms, against 4-10 ms native, its Python loops slowed several times by the
#: compile that the worker thread ran beside them (the interpreter's lock); the compile (0.1-0.2 s,
#: once per process and hidden size, then from the disk cache) is paid before the program's first
#: call in any case. At T=35 the loops cost a few ms: numpy runs while the kernels compile.
WAIT_STEPS = 128


def native(mode: str, dtype: np.dtype, hidden: int, steps: int) -> recurrence_native.Kernels | None:
    """The native kernels of ``mode``, ``dtype`` and ``hidden`` when ready -- or, for a recurrence of
    ``WAIT_STEPS`` steps or more, once compiled; None (numpy runs) while they compile, when they failed,
    for another mode or dtype, or with eager kernels off."""
    name = NAMES.get(mode)
    if name is None or not eager_kernels.enabled() or dtype.char not in "fd":
        return None
    make = functools.partial(_compile, mode, dtype, hidden)
    # shared: compiled programs' rnn_scan runs these kernels too, so a trace compiles them as well
    entry = eager_kernels.ready(name, (name, dtype.char, hidden), make, shared=True, now=steps >= WAIT_STEPS)
    return None if entry is None else cast(recurrence_native.Kernels, entry.program)


# with the BLAS thread rule for the numpy kernels' per-step products (eager kernels on or off)
recurrence_native.install(native, SmallProducts)
