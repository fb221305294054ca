"""An optimizer's fused update run on the numpy arrays of its tensors.

A fused step is written once as ``update(ops, shared, row)`` (``kiln.frontend.fused_steps``): one
parameter's update, op for op the arithmetic of the optimizer's eager loop, in the same dtypes.
``fused_steps`` builds it as a graph and runs the compiled program; ``run_on_arrays`` evaluates it
with ``ArrayOps`` on the arrays themselves: what a step runs while that program is not ready (the
first steps of a fresh process, or eager kernels off). An Adam step of the ten parameters of a small
CNN was ~150 eager ops, each paying its dispatch and promotion (~5-10 us) for a few thousand
values; on the arrays it is the same ~150 numpy calls at ~1-2 us.

It runs where the loop would give nothing more to see: plain float32/float64 CPU tensors, outside
traces and profiles (which record the loop's ops). The results are the loop's, bit
for bit (``tests/optim/test_on_arrays.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kiln.frontend import dispatch
from kiln.frontend.autograd import grad_mode
from kiln.frontend.jit import state as _jit
from kiln.frontend.tensor import Tensor
from kiln.ir.types import CPU

_NUMBERS = (float, int)
_FLOATS = frozenset({np.dtype(np.float32), np.dtype(np.float64)})


class ArrayOps:
    """``fused_steps.GraphOps``' ops on numpy arrays, with eager kiln's promotions: a Python number
    takes the other operand's dtype, a 0-d operand the other's when the other is not 0-d, else the
    wider dtype wins. (numpy's own rules would make a float32 array times a 0-d float64 array a
    float64 array.)"""

    @staticmethod
    def binary(ufunc: Callable, x, y) -> np.ndarray:
        if type(x) in _NUMBERS:  # (not numpy's scalars, which the ops below return for 0-d values)
            x = np.asarray(x, dtype=y.dtype)
        elif type(y) in _NUMBERS:
            y = np.asarray(y, dtype=x.dtype)
        if x.dtype is not y.dtype and x.dtype != y.dtype:
            if x.ndim and not y.ndim:
                y = y.astype(x.dtype)
            elif y.ndim and not x.ndim:
                x = x.astype(y.dtype)
            elif x.dtype.itemsize < y.dtype.itemsize:
                x = x.astype(y.dtype)
            else:
                y = y.astype(x.dtype)
        return ufunc(x, y)

    def add(self, x, y) -> np.ndarray:
        return self.binary(np.add, x, y)

    def sub(self, x, y) -> np.ndarray:
        return self.binary(np.subtract, x, y)

    def mul(self, x, y) -> np.ndarray:
        return self.binary(np.multiply, x, y)

    def div(self, x, y) -> np.ndarray:
        return self.binary(np.true_divide, x, y)

    def pow(self, x, y) -> np.ndarray:
        return self.binary(np.power, x, y)

    def maximum(self, x, y) -> np.ndarray:
        return self.binary(np.maximum, x, y)

    @staticmethod
    def sqrt(x) -> np.ndarray:
        return np.sqrt(x)

    @staticmethod
    def neg(x) -> np.ndarray:
        return np.negative(x)


_OPS = ArrayOps()


def may_run(tensors) -> bool:
    """Whether ``run_on_arrays`` may run over ``tensors``: plain float32/float64 CPU tensors (no
    sparse or inference tensor, no other kind), no trace or profile recording."""
    if (_jit.tracing and _jit.current.get() is not None) or dispatch.profiling_ops:  # (this thread's trace)
        return False
    for t in tensors:
        if not isinstance(t, Tensor) or t._device is not CPU or t._data.dtype not in _FLOATS:
            return False
        if getattr(t, "is_sparse", False) or (grad_mode.inference_used and t._inference):
            return False
    return True


def run_on_arrays(
    name: str, update: Callable, shared: Sequence, rows: Sequence[Sequence], attrs_key: tuple = ()
) -> bool:
    """Apply ``update(ops, shared, row)`` to every row on the arrays (``fused_steps.run_fused``'s
    call: ``name`` and ``attrs_key``, which name its program, are not needed here), each new value written into
    its tensor in place (its version counter moved, as an in-place op's); False, touching nothing,
    where the caller must run its loop (see ``may_run``; and a group with a 0-d parameter)."""
    if not rows or not may_run([*shared, *(t for row in rows for t in row)]):
        return False
    if any(row[0]._data.ndim == 0 for row in rows):
        # A 0-d parameter's 0-d state meets the 0-d float64 hyperparameters as an equal: the loop's
        # in-place ops round each product back to float32 where the update, one expression, would not.
        return False
    shared_arrays = [t._data for t in shared]
    for row in rows:
        new = update(_OPS, shared_arrays, [t._data for t in row])
        for tensor, value in zip(row, new, strict=True):
            if value is not None:
                np.copyto(tensor._data, value)
                tensor._version[0] += 1
    return True
