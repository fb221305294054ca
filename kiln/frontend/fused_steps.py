"""Horizontal in-place updates of many tensors as one compiled program (an optimizer's fused step).

``run_fused(name, update, shared, rows, attrs_key)`` applies ``update`` to every row of tensors --
one row per parameter, such as ``(param, grad, exp_avg, exp_avg_sq, step)`` -- as one program
that ``eager_kernels`` compiles in the background (fusion makes the rows' elementwise chains a few
horizontal kernels). ``update(ops, shared, row)`` receives graph values and returns, per tensor of
the row, its new value or None (unchanged); it is written with ``GraphOps``, which mirrors the
eager ops: binary ops broadcast 0-d values and promote a 0-d float64 operand to the other's
dtype (``cast``), as eager kiln does. New values are written into the row's tensors in place
(the program writes most straight into their memory; the rest are copied) and their version
counters move, as an in-place op's do.

``run_fused`` returns False where the caller must run its eager loop instead: a compile still
running or failed, eager kernels off, a tensor not on the CPU or not float32/float64, or a
``kiln.compile`` trace running (it must see the loop's ops).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from ..ir.dtypes import DType
from ..ir.graph import GraphBuilder, Value
from ..ir.types import CPU, TensorType
from . import eager_kernels, eager_queue
from .jit import state as _jit
from .tensor import Tensor

_FLOATS = frozenset({np.dtype(np.float32), np.dtype(np.float64)})


class GraphOps:
    """Graph-building ops with eager kiln's broadcasting of 0-d values and its promotions."""

    def __init__(self, builder: GraphBuilder) -> None:
        self.b = builder

    def cast(self, x: Value, dtype: DType) -> Value:
        return x if x.type.dtype is dtype else self.b.node("cast", [x], {"dtype": dtype})

    def constant(self, number: float, dtype: DType) -> Value:
        return self.b.constant(np.asarray(number, dtype=dtype.np), TensorType((), dtype, CPU))

    def binary(self, op: str, x: Value | float, y: Value | float) -> Value:
        """``op(x, y)`` of floats; a Python number takes the other's dtype, a 0-d operand the other's
        dtype when the other is not 0-d, else the wider dtype wins (eager's rules in one category)."""
        x, y = self._value(x, y), self._value(y, x)
        if x.type.shape and not y.type.shape:
            y = self.cast(y, x.type.dtype)
        elif y.type.shape and not x.type.shape:
            x = self.cast(x, y.type.dtype)
        elif x.type.dtype.itemsize != y.type.dtype.itemsize:
            wider = max(x.type.dtype, y.type.dtype, key=lambda d: d.itemsize)
            x, y = self.cast(x, wider), self.cast(y, wider)
        return self.b.node(op, [x, y])

    def _value(self, x: Value | float, other: Value | float) -> Value:
        if isinstance(x, Value):
            return x
        assert isinstance(other, Value), "GraphOps: one operand must be a graph value"
        return self.constant(float(x), other.type.dtype)

    def add(self, x, y) -> Value:
        return self.binary("add", x, y)

    def sub(self, x, y) -> Value:
        return self.binary("sub", x, y)

    def mul(self, x, y) -> Value:
        return self.binary("mul", x, y)

    def div(self, x, y) -> Value:
        return self.binary("div", x, y)

    def pow(self, x, y) -> Value:
        return self.binary("pow", x, y)

    def maximum(self, x, y) -> Value:
        return self.binary("maximum", x, y)

    def sqrt(self, x: Value) -> Value:
        return self.b.node("sqrt", [x])

    def neg(self, x: Value) -> Value:
        return self.b.node("neg", [x])


Update = Callable[[GraphOps, Sequence[Value], Sequence[Value]], Sequence[Value | None]]


def _build(update: Update, n_shared: int, row_length: int, layouts: eager_kernels.Layouts) -> eager_kernels.Built:
    """The graph of ``update`` over every row: inputs shared values first, then each row in turn."""
    b = GraphBuilder()
    inputs = [b.input(t) for t in eager_kernels.input_types(layouts)]
    ops = GraphOps(b)
    shared = inputs[:n_shared]
    outputs: list[Value] = []
    write_backs: list[tuple[int, int]] = []
    for start in range(n_shared, len(inputs), row_length):
        row = inputs[start : start + row_length]
        for i, new in enumerate(update(ops, shared, row)):
            if new is not None:
                assert new.type.shape == row[i].type.shape, f"update changed the shape of row tensor {i}"
                write_backs.append((len(outputs), start + i))
                outputs.append(ops.cast(new, row[i].type.dtype))
    return b.build(outputs), [strides for _, _, strides in layouts], tuple(write_backs)


def may_run() -> bool:
    """Whether ``run_fused`` may run a program now: eager kernels on and no trace recording (a trace
    records the caller's loop, op by op: the program would hide the update). An optimizer asks
    before it makes state for the program, so a traced step makes its state as the loop does."""
    return eager_kernels.enabled() and not (_jit.tracing and _jit.current.get() is not None)


def run_fused(name: str, update: Update, shared: Sequence[Tensor], rows: Sequence[Sequence[Tensor]],
              attrs_key: tuple = ()) -> bool:  # fmt: skip
    """Apply ``update`` to every row in place as one compiled program; False: the caller runs its
    eager loop (see the module docstring). ``attrs_key`` names what else decides the graph."""
    if not rows or not may_run():
        return False
    tensors = [*shared, *(t for row in rows for t in row)]
    if any(t._device is not CPU or t._data.dtype not in _FLOATS for t in tensors):
        return False
    row_length = len(rows[0])
    arrays = [t._data for t in tensors]
    key = (len(shared), row_length, attrs_key)
    build = functools.partial(_build, update, len(shared), row_length)
    entry = eager_kernels.ready_entry(name, arrays, key, build)
    if entry is None:
        _loop_of(eager_kernels.key_of(name, arrays, key))
        return False
    assert entry.program is not None
    _write_back(entry.program(arrays), rows, len(shared), row_length, entry.write_backs)
    return True


_timing = threading.local()  # ``missed``: (the key, the cover before) in a ``timed_loop`` that missed
_OUTSIDE = object()  # ``missed`` outside every ``timed_loop``


class timed_loop:
    """Around an optimizer's update of one group (``Optimizer._step``). Where ``run_fused`` has no
    program for it inside (compiling, or left on numpy), the caller's per-parameter loop runs on
    numpy: the update's time is noted as the fused step's numpy run, which the eager kernels' thread
    weighs as it weighs an op's (``eager_queue``: untimed, DCGAN's two Adam steps came first, before
    fold kernels that saved more a step), and the loop's ops are covered by it (its ``sqrt`` is not
    compiled once the step's program runs). A class, not a generator: it runs at every step (about
    1 us against a ``contextlib`` generator's several)."""

    __slots__ = ("outer", "start")

    def __enter__(self) -> None:
        self.outer = getattr(_timing, "missed", _OUTSIDE)
        _timing.missed = None
        self.start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        missed, _timing.missed = _timing.missed, self.outer
        if missed is not None:
            key, cover = missed
            eager_queue.set_cover(cover)
            eager_kernels.note_numpy_seconds(key, time.perf_counter() - self.start)


def _loop_of(key: tuple) -> None:
    """In a ``timed_loop``: the per-parameter loop that runs next is the numpy run of ``key``."""
    if getattr(_timing, "missed", _OUTSIDE) is None:
        _timing.missed = (key, eager_queue.cover_from_here(key))


def _write_back(outputs: list, rows, n_shared: int, row_length: int, write_backs) -> None:
    """Each output into its row tensor (unless the program wrote it there) and a version step for each."""
    for o, i in write_backs:
        target = rows[(i - n_shared) // row_length][(i - n_shared) % row_length]
        if outputs[o] is not target._data:
            np.copyto(target._data, outputs[o])
        target._version[0] += 1
