"""The native LSTM and GRU recurrences (``recurrence.py``, ``recurrence_gru.py``) compiled, cached
and called on numpy arrays.

``LSTMKernels.build(dtype, hidden)`` (``GRUKernels``) compiles the forward and backward functions
for one dtype and hidden size -- or loads them from the disk cache of compiled kernels, keyed on
their names (function, dtype, hidden size), the host and kiln's code generator's source, so that a
hit generates no IR -- and its ``forward``/``backward`` take the arrays
of ``recurrence_numpy.lstm_forward``/``lstm_backward`` (``gru_forward``/``gru_backward``). They
return False/None (and write nothing) for arrays they do not take: another dtype or hidden size,
a row that is not one contiguous block, rows that overlap; the caller runs numpy then.

``LSTMStepKernels`` (``recurrence_step.py``) take one LSTM step on ``rnn_scan``'s packed layout
(``recurrence_numpy._lstm_scan_step``/``_lstm_backward_step``'s arrays): a compiled loop's trip over
an ``nn.LSTMCell``, built only where such a step runs.

A step's product (16 x 128 @ 128 x 512 in an LSTM LM) is too small to split, and it is kiln's own
kernel (``small_gemm.py``), not the BLAS's; a whole recurrence of enough work runs as blocks of the
batch's rows instead (``_row_blocks``), one call of the function each, on the native pool
(``recurrence.rows_symbol``: the compiled kernels' ABI). On the Python pool, as before, each
recurrence woke a sleeping worker through a lock (7-75 us on the shared VM), and the executor
parked the native pool's workers before it, so the product after it woke those from sleep too.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable

import numpy as np

from ...ir.dtypes import DType, from_numpy_dtype
from ...ir.primitives.linalg import padded_rows
from ...ir.primitives.recurrence_layout import ScanLayout
from ...ir.primitives.recurrence_native import transposed
from ...ir.primitives.recurrence_numpy import packed_rows, scratch
from ...runtime import threads
from ...runtime.cache import cache_key, source_digest
from ...runtime.frames import data_pointer
from ..core import Unsupported
from . import engine, host, kernel_cache
from .recurrence import BACKWARD, FORWARD, PACKED, backward_ir, forward_ir, rows_symbol, symbol
from .recurrence_gru import GRU_BACKWARD, GRU_FORWARD, gru_backward_ir, gru_forward_ir
from .recurrence_step import STEP_BACKWARD, STEP_FORWARD, step_backward_ir, step_forward_ir

_KERNEL = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
#: A function's blocks of rows (``recurrence.rows_symbol``): the compiled kernels' ABI.
_ROWS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
#: Bump when the functions' signature or slots change.
FORMAT = 5


def cached_objects(texts: list[str]) -> list[bytes]:
    """Object code of each LLVM module, from the disk cache of compiled kernels where it is there."""
    return _cached([(text, functools.partial(str, text)) for text in texts])


def _cached(entries: list[tuple[str, Callable[[], str]]]) -> list[bytes]:
    """Object code of each ``(name, make)``: keyed on ``name`` (with kiln's code generator's source, the
    host and the optimization level), compiled from ``make()``'s LLVM IR where the cache misses."""
    cache = kernel_cache.kernel_cache()
    keys = [cache_key("kiln lstm", str(FORMAT), source_digest("ir", "codegen", "runtime"), host.signature(),
                      f"O{engine.OPT_LEVEL}", name) for name, _ in entries]  # fmt: skip
    found = [cache.get(key) if cache.enabled else None for key in keys]
    missing = [k for k, code in enumerate(found) if code is None]
    compiled = engine.compile_many([entries[k][1]() for k in missing]) if missing else []
    for k, code in zip(missing, compiled, strict=True):
        found[k] = code
        if cache.enabled:
            cache.put(keys[k], code)
    return [code for code in found if code is not None]


def _address(a: np.ndarray) -> int:
    """``a.ctypes.data``, read where numpy keeps it: 0.1 us against 0.9 us, and a one-step call (an
    ``nn.LSTMCell``'s) reads eight of them."""
    return data_pointer(a) or 0


def _rows(a: np.ndarray, lead: int, width: int) -> tuple[int, int, int] | None:
    """(address, step stride, row stride) in elements of ``a``, whose first ``lead`` axes (1: rows;
    2: steps and rows) index rows of ``width`` contiguous elements; None where they are not, or
    where rows overlap (a product reads a row block with the row stride as its leading dimension)."""
    item, shape, strides = a.itemsize, a.shape, a.strides
    expected = item
    for k in range(len(shape) - 1, lead - 1, -1):  # (plain indexing: a one-step call reads eight arrays)
        if shape[k] != 1 and strides[k] != expected:
            return None
        expected *= shape[k]
    address = _address(a)
    if address % item or strides[0] % item or strides[lead - 1] % item:
        return None
    rows = shape[lead - 1]
    row_stride = strides[lead - 1] // item if rows > 1 else width
    if row_stride < width:
        return None
    step_stride = strides[0] // item if lead == 2 and shape[0] > 1 else 0
    return address, step_stride, row_stride


class _Kernels:
    """The functions of one recurrence, dtype and hidden size, loaded (see the module docs)."""

    GATES = 4
    #: function name (``symbol``'s direction) -> its IR generator over (dtype, hidden)
    FUNCTIONS: dict[str, Callable[[DType, int], str]] = {}
    #: Functions compiled at their first call rather than by ``build``: the backward variants for a
    #: cotangent of the gate activations (or a GRU's ``hn``), which the layers never give (only a
    #: caller of ``rnn_scan`` that reads its packed gates does). Each costs LLVM 40-60 ms (an LSTM's
    #: three functions took 142 ms), which a long recurrence's first call waits for.
    LAZY: frozenset[str] = frozenset()

    def __init__(self, dtype: np.dtype, hidden: int, library: engine.Library) -> None:
        self.dtype, self.hidden = dtype, hidden
        self._libraries = [library]  # the functions live while they do
        self._lock = threading.Lock()
        self.functions = {name: self._function(library, name) for name in self.FUNCTIONS if name not in self.LAZY}
        self.blocks = {name: self._blocks(library, name) for name in self.FUNCTIONS if name not in self.LAZY}

    def _function(self, library: engine.Library, name: str):
        return _KERNEL(library.address(symbol(name, from_numpy_dtype(self.dtype), self.hidden)))

    def _blocks(self, library: engine.Library, name: str):
        return _ROWS(library.address(rows_symbol(symbol(name, from_numpy_dtype(self.dtype), self.hidden))))

    @classmethod
    def build(cls, dtype, hidden: int):
        """Compile (or load) the functions but the lazy ones; ``Unsupported`` for a dtype other than
        float32/float64."""
        dtype = np.dtype(dtype)
        if dtype.char not in "fd":
            raise Unsupported(f"no native recurrence for {dtype} (the numpy kernel runs)")
        names = [name for name in cls.FUNCTIONS if name not in cls.LAZY]
        return cls(dtype, hidden, engine.Library(_cached([cls._entry(name, dtype, hidden) for name in names])))

    @classmethod
    def _entry(cls, name: str, dtype: np.dtype, hidden: int) -> tuple[str, Callable[[], str]]:
        """``_cached``'s entry of the function ``name``: its symbol, which names it with its dtype and
        hidden size (the code that generates it is in the key), and its IR, generated only when not
        cached -- 20 ms of a warm process's first LSTM call went into generating IR to hash it."""
        kiln_dtype = from_numpy_dtype(dtype)
        return symbol(name, kiln_dtype, hidden), functools.partial(cls.FUNCTIONS[name], kiln_dtype, hidden)

    def _takes(self, hidden: int, *arrays: np.ndarray | None) -> bool:
        return hidden == self.hidden and all(a is None or a.dtype == self.dtype for a in arrays)

    def _load(self, name: str):
        """The lazy function ``name``, compiled (or loaded from the disk cache) now."""
        with self._lock:
            if name not in self.functions:
                library = engine.Library(_cached([self._entry(name, self.dtype, self.hidden)]))
                self.functions[name] = self._function(library, name)
                self.blocks[name] = self._blocks(library, name)
                self._libraries.append(library)
            return self.functions[name]

    def _run(self, name: str, slots: list[int], layout: tuple[str, ...] | None = None) -> None:
        """Run the function ``name`` on ``slots``; where ``layout`` (its slots' names) is given and the
        work is worth a second thread, over blocks of the batch's rows on the threads (``_row_blocks``),
        on the native pool (``spin``: the executor leaves its workers spinning before a recurrence)."""
        function = self.functions.get(name) or self._load(name)
        if layout is not None:  # (not a one-step cell's call: two thousand of them make an LSTMCell loop's trip)
            blocks = min(threads.get_num_threads(), slots[1] // ROW_BLOCK)
            work = threads.product_work(
                slots[0] * slots[1] * self.GATES * self.hidden * self.hidden
            )  # the steps' products
            if blocks >= 2 and work >= threads.min_work_bytes(spin=True):
                shifts = _row_shifts(layout, slots, self.GATES * self.hidden, self.hidden, self.dtype.itemsize)
                table = _row_blocks(slots, shifts, blocks)
                threads.parallel_for(self.blocks[name], _address(table), blocks, work, spin=True)
                return
        params = np.array(slots, dtype=np.int64)
        function(_address(params))


#: The fewest batch rows a thread's share of a recurrence gets (the product kernel's row tile on
#: AVX-512, ``host.ROWS``): each batch row's recurrence depends on its own rows only (``h[t, b]``
#: on ``h[t - 1, b]``), so the rows split over threads with no synchronization between time steps.
ROW_BLOCK = 8


def _row_shifts(layout: tuple[str, ...], slots: list[int], gate_width: int, hidden: int,
                itemsize: int) -> list[tuple[int, int]]:  # fmt: skip
    """``(slot, bytes per batch row)`` of each array address in ``slots`` (named by ``layout``) that a
    block of rows starting further down moves: arrays given as (address, step stride, row stride) move
    by their row stride; the scratch of a step's product (``step``, (B, G H)) and the backward's
    carried state (``dh``/``dc``, (B, H)) by their contiguous rows; weights and biases stay."""
    shifts = []
    for k, name in enumerate(layout):
        if f"{name}_b" in layout:
            shifts.append((k, slots[layout.index(f"{name}_b")] * itemsize))
        elif name == "step":
            shifts.append((k, gate_width * itemsize))
        elif name in ("dh", "dc"):
            shifts.append((k, hidden * itemsize))
    return shifts


def _row_blocks(slots: list[int], shifts: list[tuple[int, int]], blocks: int) -> np.ndarray:
    """The params of each of ``blocks`` blocks of the batch's rows, one row of the table each (what a
    function's blocks of rows, ``recurrence.rows_symbol``, read): ``slots`` with the batch cut to the
    block's rows and each array moved to its first row."""
    batch = slots[1]
    firsts = [batch * block // blocks for block in range(blocks + 1)]
    table = np.array([slots] * blocks, dtype=np.int64)
    for block in range(blocks):
        row, first = table[block], firsts[block]
        row[1] = firsts[block + 1] - first
        for k, step in shifts:
            if slots[k]:  # (0: an array the call does not pass, as packed rows not asked for)
                row[k] += first * step
    return table


@functools.lru_cache(maxsize=16)
def _zeros(dtype: np.dtype, size: int) -> np.ndarray:
    """A read-only zero bias (shared: an eager layer's pre-activations come with theirs added)."""
    zeros = np.zeros(size, dtype=dtype)
    zeros.flags.writeable = False
    return zeros


def _inputs(A: np.ndarray, gx, bias, width: int) -> tuple[tuple[int, int, int], np.ndarray]:
    """The forward's pre-activations ``gx + bias``: (``gx``'s rows, ``bias`` contiguous), or ``A``'s rows
    and a zero bias where ``A`` holds them -- ``gx`` None, or ``gx`` whose rows the kernel does not
    take, added into ``A`` here."""
    rows = None if gx is None else _rows(gx, 2, width)
    if rows is not None:
        return rows, np.ascontiguousarray(bias)
    if gx is not None:
        np.add(gx.reshape(A.shape), bias.reshape(A.shape[2:]), out=A)
    rows = _rows(A, 2, width)
    assert rows is not None, "the caller checked A's rows"
    return rows, _zeros(A.dtype, width)


def _found(*rows: tuple[int, int, int] | None) -> list[int] | None:
    """The slots of ``_rows``' results, or None where any array was not taken."""
    if any(r is None for r in rows):
        return None
    return [value for r in rows for value in r]  # type: ignore[union-attr]


class LSTMKernels(_Kernels):
    """``lstm_forward`` and ``lstm_backward`` (``recurrence.py``)."""

    GATES = 4
    FUNCTIONS = {
        "lstm_forward": forward_ir,
        "lstm_backward": functools.partial(backward_ir, with_tangents=False),
        "lstm_backward_tangents": functools.partial(backward_ir, with_tangents=True),
    }
    LAZY = frozenset({"lstm_backward_tangents"})

    def forward(self, A, h0, c0, hs, cs, tanh_c, w_hh_t, gx=None, bias=None, packed=None) -> bool:
        """``lstm_forward``'s work (True), or nothing (False: arrays this kernel does not take). ``gx``
        (T, B, 4H) and ``bias`` (4H): the pre-activations are ``gx + bias``, not ``A``'s; ``packed``:
        rnn_scan's prev and final rows, filled as the steps go (by numpy after them where their rows
        are not plain)."""
        steps, batch, _, hidden = A.shape
        if not self._takes(hidden, A, h0, c0, hs, cs, tanh_c, w_hh_t, gx, bias):
            return False
        if steps == 0:
            return True
        found = _found(_rows(A, 2, 4 * hidden), _rows(h0, 1, hidden), _rows(c0, 1, hidden), _rows(hs, 2, hidden),
                       _rows(cs, 2, hidden), _rows(tanh_c, 2, hidden))  # fmt: skip
        if found is None:
            return False
        inputs, bias = _inputs(A, gx, bias, 4 * hidden)
        w_hh_t = padded_rows(w_hh_t)  # the callers pass a view of the weight: (H, 4H), rows as the kernel reads them
        step = scratch("rnn.native_step", (batch, 4 * hidden), A.dtype)
        rows = None if packed is None else _found(*(_rows(a, 2, hidden) for a in packed))
        slots = [steps, batch, *inputs, _address(bias), *found, _address(w_hh_t), _address(step), int(rows is not None),
                 *(rows or [0] * 3 * len(PACKED))]  # fmt: skip
        assert len(slots) == len(FORWARD)
        self._run("lstm_forward", slots, FORWARD)
        if packed is not None and rows is None:
            packed_rows(packed, (h0, c0), (hs, cs))
        return True

    def backward(self, A, c_prev, tanh_c, w_hh, dH, dC, eA, dz):
        """``lstm_backward``'s (dh0, dc0) with ``dz`` filled, or None (arrays this kernel does not take)."""
        steps, batch, _, hidden = A.shape
        if steps == 0 or not self._takes(hidden, A, c_prev, tanh_c, w_hh, dH, dC, eA, dz):
            return None
        width = 4 * hidden
        found = _found(_rows(A, 2, width), _rows(c_prev, 2, hidden), _rows(tanh_c, 2, hidden), _rows(dH, 2, hidden),
                       _rows(dC, 2, hidden), _rows(A if eA is None else eA, 2, width), _rows(dz, 2, width))  # fmt: skip
        if found is None:
            return None
        w_hh = padded_rows(w_hh)
        dh, dc = np.array(dH[-1], order="C"), np.array(dC[-1], order="C")
        slots = [steps, batch, *found, _address(w_hh), _address(dh), _address(dc)]
        assert len(slots) == len(BACKWARD)
        self._run("lstm_backward" if eA is None else "lstm_backward_tangents", slots, BACKWARD)
        return dh, dc


class GRUKernels(_Kernels):
    """``gru_forward`` and ``gru_backward`` (``recurrence_gru.py``)."""

    GATES = 3
    FUNCTIONS = {
        "gru_forward": gru_forward_ir,
        **{"gru_backward" + ("_tangents" if tangents else "") + ("_g_hn" if g_hn else ""):
           functools.partial(gru_backward_ir, with_tangents=tangents, with_g_hn=g_hn)
           for tangents in (False, True) for g_hn in (False, True)},
    }  # fmt: skip
    LAZY = frozenset({"gru_backward_tangents", "gru_backward_g_hn", "gru_backward_tangents_g_hn"})

    def forward(self, A, h0, hs, hn, w_hh_t, b_hn, gx=None, bias=None) -> bool:
        """``gru_forward``'s work (True), or nothing (False: arrays this kernel does not take); ``gx`` and
        ``bias`` as ``LSTMKernels.forward``'s."""
        steps, batch, _, hidden = A.shape
        if not self._takes(hidden, A, h0, hs, hn, w_hh_t, b_hn, gx, bias):
            return False
        if steps == 0:
            return True
        found = _found(_rows(A, 2, 3 * hidden), _rows(h0, 1, hidden), _rows(hs, 2, hidden), _rows(hn, 2, hidden))
        if found is None:
            return False
        inputs, bias = _inputs(A, gx, bias, 3 * hidden)
        w_hh_t, b_hn = padded_rows(w_hh_t), np.ascontiguousarray(b_hn)  # (H, 3H), rows as the kernel reads them
        step = scratch("rnn.native_step", (batch, 3 * hidden), A.dtype)
        slots = [steps, batch, *inputs, _address(bias), *found, _address(w_hh_t), _address(b_hn), _address(step)]
        assert len(slots) == len(GRU_FORWARD)
        self._run("gru_forward", slots, GRU_FORWARD)
        return True

    def backward(self, A, h_prev, hn, w_hh, dH, eA, g_hn, dz, dz_hh):
        """``gru_backward``'s dh0 with ``dz`` and ``dz_hh`` filled, or None (arrays this kernel does not take)."""
        steps, batch, _, hidden = A.shape
        if steps == 0 or not self._takes(hidden, A, h_prev, hn, w_hh, dH, eA, g_hn, dz, dz_hh):
            return None
        width = 3 * hidden
        found = _found(_rows(A, 2, width), _rows(h_prev, 2, hidden), _rows(hn, 2, hidden), _rows(dH, 2, hidden),
                       _rows(A if eA is None else eA, 2, width), _rows(hn if g_hn is None else g_hn, 2, hidden),
                       _rows(dz, 2, width), _rows(dz_hh, 2, width))  # fmt: skip
        if found is None:
            return None
        w_hh = padded_rows(w_hh)
        dh = np.array(dH[-1], order="C")
        slots = [steps, batch, *found, _address(w_hh), _address(dh)]
        assert len(slots) == len(GRU_BACKWARD)
        name = "gru_backward" + ("_tangents" if eA is not None else "") + ("_g_hn" if g_hn is not None else "")
        self._run(name, slots, GRU_BACKWARD)
        return dh


def _block_rows(a: np.ndarray, width: int) -> tuple[int, int] | None:
    """(address, row stride in elements) of ``a`` (1, B, ``width``) or (B, ``width``), whose rows are
    ``width`` contiguous elements; None where they are not (``_rows``, with C order's answer first:
    a compiled loop's arrays are, and a trip reads five)."""
    if a.flags.c_contiguous:
        return _address(a), width
    found = _rows(a, a.ndim - 1, width)
    return None if found is None else (found[0], found[-1])


class LSTMStepKernels(_Kernels):
    """One LSTM step on ``rnn_scan``'s packed layout (``recurrence_step.py``): ``forward`` and
    ``backward`` take ``recurrence_numpy._lstm_scan_step``'s and ``_lstm_backward_step``'s arrays."""

    GATES = 4
    FUNCTIONS = {"lstm_step_forward": step_forward_ir, "lstm_step_backward": step_backward_ir}

    def __init__(self, dtype: np.dtype, hidden: int, library: engine.Library) -> None:
        super().__init__(dtype, hidden, library)
        layout = ScanLayout("LSTM", hidden)
        self.width, self.grad_width = layout.width, layout.grad_width

    def forward(self, gx, bias, h0, c0, w_hh, out) -> bool:
        """``out`` (1, B, width) filled (True), or nothing (False: arrays these kernels do not take)."""
        batch, hidden = h0.shape
        if not self._takes(hidden, gx, bias, h0, c0, w_hh, out) or bias.strides[0] != bias.itemsize:
            return False
        width = 4 * hidden
        shapes = (gx.shape, bias.shape, c0.shape, w_hh.shape, out.shape)
        if shapes != ((1, batch, width), (width,), (batch, hidden), (width, hidden), (1, batch, self.width)):
            return False
        if batch == 0:
            return True
        found = [_block_rows(gx, width), _block_rows(h0, hidden), _block_rows(c0, hidden), _block_rows(out, self.width)]
        if any(r is None for r in found):
            return False
        (gx_at, gx_b), (h0_at, h0_b), (c0_at, c0_b), (out_at, out_b) = found  # type: ignore[misc]
        w_hh_t = transposed(w_hh)  # (H, 4H) row-major: the product's B (kept over a compiled loop's trips)
        step = scratch("rnn.native_step", (batch, 4 * hidden), out.dtype)
        slots = [batch, gx_at, gx_b, _address(bias), h0_at, h0_b, c0_at, c0_b, _address(w_hh_t), _address(step),
                 out_at, out_b]  # fmt: skip
        assert len(slots) == len(STEP_FORWARD)
        self._run("lstm_step_forward", slots)
        return True

    def backward(self, packed, w_hh, g, out) -> np.ndarray | None:
        """``out`` (1, B, grad_width), filled, or None (arrays these kernels do not take; nothing written)."""
        _, batch, width = packed.shape
        hidden = w_hh.shape[1]
        if not self._takes(hidden, packed, w_hh, g, out):
            return None
        shapes = (packed.shape, g.shape, w_hh.shape, out.shape)
        if shapes != (
            (1, batch, self.width),
            (1, batch, self.width),
            (4 * hidden, hidden),
            (1, batch, self.grad_width),
        ):
            return None
        if batch == 0:
            return out
        found = [_block_rows(packed, width), _block_rows(g, width), _block_rows(out, self.grad_width)]
        if any(r is None for r in found):
            return None
        (packed_at, packed_b), (g_at, g_b), (out_at, out_b) = found  # type: ignore[misc]
        w_hh = padded_rows(w_hh)
        slots = [batch, packed_at, packed_b, g_at, g_b, _address(w_hh), out_at, out_b]
        assert len(slots) == len(STEP_BACKWARD)
        self._run("lstm_step_backward", slots)
        return out
