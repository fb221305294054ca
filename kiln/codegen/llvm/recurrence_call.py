"""The native LSTM recurrence (``recurrence.py``) compiled, cached and called on numpy arrays.

``LSTMKernels.build(dtype, hidden)`` compiles the forward and backward functions for one dtype and
hidden size -- or loads them from the disk cache of compiled kernels, keyed on their IR, the host
and kiln's code generator -- and its ``forward``/``backward`` take the arrays of
``recurrence_numpy.lstm_forward``/``lstm_backward``. They return None (and write nothing) for
arrays they do not take: another dtype or hidden size, a row that is not one contiguous block,
rows that overlap; the caller runs numpy then.

Each call hands the native function this process's ``cblas_?gemm`` and runs on one BLAS thread
(``threads.run_blas_product``): a step's product (16 x 128 @ 128 x 512 in an LSTM LM) is too small
to gain from a second.
"""

from __future__ import annotations

import ctypes
import logging

import numpy as np

from ...ir.dtypes import from_numpy_dtype
from ...ir.primitives.recurrence_numpy import scratch
from ...runtime import threads
from ...runtime.cache import cache_key, source_digest
from ..core import Unsupported
from . import engine, host, kernel_cache
from .recurrence import BACKWARD, FORWARD, backward_ir, forward_ir, symbol

logger = logging.getLogger("kiln")

_KERNEL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
#: Bump when the functions' signature or slots change.
FORMAT = 1


def _objects(texts: list[str]) -> list[bytes]:
    """Object code of each LLVM module, from the disk cache of compiled kernels where it is there."""
    cache = kernel_cache.kernel_cache()
    keys = [cache_key("kiln lstm", str(FORMAT), source_digest("ir", "codegen", "runtime"), host.signature(),
                      f"O{engine.OPT_LEVEL}", text) for text in texts]  # fmt: skip
    found = [cache.get(key) if cache.enabled else None for key in keys]
    missing = [k for k, code in enumerate(found) if code is None]
    compiled = engine.compile_many([texts[k] for k in missing]) if missing else []
    for k, code in zip(missing, compiled, strict=True):
        found[k] = code
        if cache.enabled:
            cache.put(keys[k], code)
    return [code for code in found if code is not None]


def _rows(a: np.ndarray, lead: int, width: int) -> tuple[int, int, int] | None:
    """(address, step stride, row stride) in elements of ``a``, whose first ``lead`` axes (1: rows;
    2: steps and rows) index rows of ``width`` contiguous elements; None where they are not, or
    where rows overlap (a product reads a row block with the row stride as its leading dimension)."""
    item = a.itemsize
    expected = item
    for size, stride in zip(reversed(a.shape[lead:]), reversed(a.strides[lead:]), strict=True):
        if size != 1 and stride != expected:
            return None
        expected *= size
    if a.ctypes.data % item or any(s % item for s in a.strides[:lead]):
        return None
    rows = a.shape[lead - 1]
    row_stride = a.strides[lead - 1] // item if rows > 1 else width
    if row_stride < width:
        return None
    step_stride = a.strides[0] // item if lead == 2 and a.shape[0] > 1 else 0
    return a.ctypes.data, step_stride, row_stride


class LSTMKernels:
    """The forward and backward recurrences of one dtype and hidden size, loaded (see the module docs)."""

    def __init__(self, dtype: np.dtype, hidden: int, library: engine.Library, gemm: int, bits: int) -> None:
        self.dtype, self.hidden, self.gemm = dtype, hidden, gemm
        self._library = library  # the functions live while it does
        kiln_dtype = from_numpy_dtype(dtype)
        self._forward, self._backward, self._backward_tangents = (
            _KERNEL(library.address(symbol(direction, kiln_dtype, hidden, bits)))
            for direction in ("forward", "backward", "backward_tangents")
        )

    @classmethod
    def build(cls, dtype, hidden: int) -> LSTMKernels:
        """Compile (or load) the kernels; ``Unsupported`` where numpy's BLAS is not an OpenBLAS kiln finds."""
        dtype = np.dtype(dtype)
        found = threads.blas_gemm(dtype.char)
        if found is None:
            raise Unsupported(f"no cblas gemm for {dtype} in numpy's BLAS (the numpy kernel runs)")
        gemm, bits = found
        kiln_dtype = from_numpy_dtype(dtype)
        texts = [forward_ir(kiln_dtype, hidden, bits), backward_ir(kiln_dtype, hidden, bits, False),
                 backward_ir(kiln_dtype, hidden, bits, True)]  # fmt: skip
        return cls(dtype, hidden, engine.Library(_objects(texts)), gemm, bits)

    def _takes(self, *arrays: np.ndarray | None) -> bool:
        return all(a is None or a.dtype == self.dtype for a in arrays)

    def _run(self, kernel, slots: list[int], batch: int) -> None:
        params = np.array(slots, dtype=np.int64)
        macs = batch * 4 * self.hidden * self.hidden  # of each step's product
        threads.run_blas_product(kernel, macs, params.ctypes.data, self.gemm)

    def forward(self, A, h0, c0, hs, cs, tanh_c, w_hh_t) -> bool:
        """``lstm_forward``'s work (True), or nothing (False: arrays this kernel does not take)."""
        steps, batch, _, hidden = A.shape
        if hidden != self.hidden or not self._takes(A, h0, c0, hs, cs, tanh_c, w_hh_t):
            return False
        width = 4 * hidden
        w_hh = w_hh_t.T if w_hh_t.T.flags.c_contiguous else np.ascontiguousarray(w_hh_t.T)
        found = [_rows(A, 2, width), _rows(h0, 1, hidden), _rows(c0, 1, hidden), _rows(hs, 2, hidden),
                 _rows(cs, 2, hidden), _rows(tanh_c, 2, hidden)]  # fmt: skip
        if any(f is None for f in found) or steps == 0:
            return steps == 0
        a, h, c, h_s, c_s, t_c = found
        step = scratch("lstm.native_step", (batch, width), A.dtype)
        slots = [steps, batch, *a, *h, *c, *h_s, *c_s, *t_c, w_hh.ctypes.data, step.ctypes.data]  # type: ignore[misc]
        assert len(slots) == len(FORWARD)
        self._run(self._forward, slots, batch)
        return True

    def backward(self, A, c_prev, tanh_c, w_hh, dH, dC, eA, dz):
        """``lstm_backward``'s (dh0, dc0) with ``dz`` filled, or None (arrays this kernel does not take)."""
        steps, batch, _, hidden = A.shape
        if hidden != self.hidden or steps == 0 or not self._takes(A, c_prev, tanh_c, w_hh, dH, dC, eA, dz):
            return None
        width = 4 * hidden
        w_hh = w_hh if w_hh.flags.c_contiguous else np.ascontiguousarray(w_hh)
        arrays = [(A, width), (c_prev, hidden), (tanh_c, hidden), (dH, hidden), (dC, hidden),
                  (eA if eA is not None else A, width), (dz, width)]  # fmt: skip
        found = [_rows(a, 2, n) for a, n in arrays]
        if any(f is None for f in found):
            return None
        dh, dc = np.array(dH[-1], order="C"), np.array(dC[-1], order="C")
        slots = [steps, batch, *(value for f in found for value in f), w_hh.ctypes.data,  # type: ignore[union-attr]
                 dh.ctypes.data, dc.ctypes.data]  # fmt: skip
        assert len(slots) == len(BACKWARD)
        self._run(self._backward if eA is None else self._backward_tangents, slots, batch)
        return dh, dc
