"""The native LSTM and GRU recurrences (``kiln/codegen/llvm/recurrence*.py``) behind the numpy kernels.

Importing this installs the provider of ``kiln.ir.primitives.recurrence_native``: the eager layers
(``nn/_rnn.py``) and compiled programs' ``rnn_scan``/``rnn_scan_backward`` call
``recurrence_numpy``'s ``lstm_*``/``gru_*`` kernels, which ask it for the native kernels of their
mode, dtype and hidden size. It compiles them once per (mode, dtype, hidden) -- the steps and the
batch are arguments -- in ``eager_kernels``' background thread (so under its switch:
``KILN_EAGER_KERNELS=0`` keeps numpy, ``=sync`` compiles in the caller's thread), kept in its
in-memory cache and in the disk cache of compiled kernels; numpy runs until they are ready. A
compile that fails leaves that key on numpy, said once (``eager_kernels``). It also lends the numpy
kernels (an Elman RNN's; an LSTM's or GRU's while theirs compile) ``threads.SmallProducts``: their
per-step products on one BLAS thread.

Measured (LSTM, H=128, B=16, T=35, float32, one thread, medians over 300 calls on the shared 2-core
machine): forward 0.41-0.45 ms (numpy kernel: 1.39 ms), backward 0.32-0.34 ms (1.49 ms).

``matmul`` runs an eager layer's large products (the input projection, the weights' and the input's
gradients) on kiln's own product kernel (``codegen/llvm/product_call.py``), compiled once per dtype,
column count and bias in the same background thread and cache (eager kernels off: numpy's). float32,
one thread, medians: 560x128 @ 128x512 289 us against numpy's OpenBLAS 570 us (its AVX2 kernels,
which ``OPENBLAS_CORETYPE=Haswell`` picks on this machine); 512x560 @ 560x128 (A transposed) 285-291
us against 560-572 us. On 2 threads OpenBLAS takes 275-300 us when both cores are free and 16 ms when
another process holds one; kiln's pool hands its row tiles out as threads come, so a late thread
costs no more than running on one.
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
NAMES = {"LSTM": "lstm recurrence", "GRU": "gru recurrence"}
#: ... and of the layers' large products (``product``).
PRODUCT = "rnn product"


def _compile(mode: str, dtype: np.dtype, hidden: int) -> eager_kernels.Entry:
    from ..codegen.core import Unsupported  # noqa: PLC0415 - the code generator loads only when first needed
    from ..codegen.llvm.recurrence_call import GRUKernels, LSTMKernels  # noqa: PLC0415

    start = time.perf_counter()
    try:
        kernels = (LSTMKernels if mode == "LSTM" else GRUKernels).build(dtype, hidden)
    except Unsupported as error:
        return eager_kernels.Entry(reason=str(error))
    except Exception as error:  # noqa: BLE001 - any failure leaves the recurrence on numpy, said once
        return eager_kernels.Entry(reason=f"its compile failed ({type(error).__name__}: {error})", failed=True)
    # The cache's entries hold programs; this one holds the kernels object (``native`` reads it back).
    return eager_kernels.Entry(program=cast(Callable[[list], list], kernels), seconds=time.perf_counter() - start)


def native(mode: str, dtype: np.dtype, hidden: int) -> recurrence_native.Kernels | None:
    """The native kernels of ``mode``, ``dtype`` and ``hidden`` when ready; None (numpy runs) while they
    compile, when they failed, for another mode or dtype, or with eager kernels off."""
    name = NAMES.get(mode)
    if name is None or not eager_kernels.enabled() or dtype.char not in "fd":
        return None
    entry = eager_kernels.ready(name, (name, dtype.char, hidden), functools.partial(_compile, mode, dtype, hidden))
    return None if entry is None else cast(recurrence_native.Kernels, entry.program)


def _compile_product(dtype: np.dtype, n: int, accumulate: bool) -> eager_kernels.Entry:
    from ..codegen.core import Unsupported  # noqa: PLC0415 - the code generator loads only when first needed
    from ..codegen.llvm.product_call import Product  # noqa: PLC0415

    start = time.perf_counter()
    try:
        kernel = Product.build(dtype, n, accumulate)
    except Unsupported as error:
        return eager_kernels.Entry(reason=str(error))
    except Exception as error:  # noqa: BLE001 - any failure leaves the products on numpy, said once
        return eager_kernels.Entry(reason=f"its compile failed ({type(error).__name__}: {error})", failed=True)
    return eager_kernels.Entry(program=cast(Callable[[list], list], kernel), seconds=time.perf_counter() - start)


def matmul(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` (plus ``bias``, broadcast over its rows) as a new array, 2-d operands: on kiln's own
    product kernel (``codegen/llvm/product_call.py``) where it is compiled and takes the arrays
    (``b`` is copied C-contiguous for it), else numpy's -- while it compiles, where it failed, with
    eager kernels off."""
    kernel = None
    if eager_kernels.enabled() and a.dtype.char in "fd" and a.dtype == b.dtype:
        n, accumulate = b.shape[1], bias is not None
        entry = eager_kernels.ready(PRODUCT, (PRODUCT, a.dtype.char, n, accumulate),
                                    functools.partial(_compile_product, a.dtype, n, accumulate))  # fmt: skip
        kernel = None if entry is None else cast(Callable[..., bool], entry.program)
    if kernel is not None:
        out = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
        if bias is not None:
            out[...] = bias
        if kernel(a, np.ascontiguousarray(b), out):
            return out
    out = a @ b
    if bias is not None:
        out += bias
    return out


# with the BLAS thread rule for the numpy kernels' per-step products (eager kernels on or off)
recurrence_native.install(native, SmallProducts)
