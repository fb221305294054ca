"""``kiln.compile(check=True)``: run each compiled call eagerly too, and compare.

The state the call may change (every external of the specialization: arguments, captured
tensors, the generator's state) and the ``.grad`` values are snapshotted; the function runs
eagerly; the snapshot is restored; the compiled program runs; results, final states and
gradients are compared, and the first difference beyond tolerance raises, naming it.
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .pytree import flatten


class CompileCheckError(AssertionError):
    """``check=True``: the compiled call disagreed with the eager one."""


def _tolerance(dtype) -> tuple[float, float]:
    if dtype == np.float64:
        return 1e-10, 1e-12
    if dtype == np.float16:
        return 1e-2, 1e-3
    return 1e-5, 1e-6


def _state(externals: list) -> list:
    return [(t._data.copy(), None if t._grad is None else t._grad._data.copy()) for t in externals]


def _compare(what: str, eager, compiled) -> None:
    if eager is None or compiled is None:
        if (eager is None) != (compiled is None):
            raise CompileCheckError(f"{what}: eager gave {eager is not None and 'a tensor' or None}, compiled "
                                    f"{compiled is not None and 'a tensor' or None}")  # fmt: skip
        return
    if eager.shape != compiled.shape or eager.dtype != compiled.dtype:
        raise CompileCheckError(f"{what}: eager {eager.dtype}{list(eager.shape)}, compiled "
                                f"{compiled.dtype}{list(compiled.shape)}")  # fmt: skip
    if eager.dtype.kind in "fc":
        rtol, atol = _tolerance(eager.dtype)
        ok = np.allclose(compiled, eager, rtol=rtol, atol=atol, equal_nan=True)
    else:
        ok = np.array_equal(compiled, eager)
    if not ok:
        diff = np.abs(compiled.astype(np.float64) - eager.astype(np.float64))
        raise CompileCheckError(f"{what} differs between eager and compiled: max abs difference {np.nanmax(diff):.3g}")


def run_checked(compiled, spec, args, kwargs, leaves: list):
    # The specialization's prologues first (an optimizer's hyperparameters written into its tensors): the
    # state restored after the eager call is then the state the compiled call starts from -- restored
    # before them, a learning rate changed since the last call was put back stale, and the prologue,
    # which writes a value only when it changed, left it so (a false difference).
    for fn, prologue_args, prologue_kwargs in spec.prologues:
        fn(*prologue_args, **prologue_kwargs)
    externals = [spec.external(i, leaves) for i in range(len(spec.sources))]
    before = [(t, t._data.copy(), t._grad) for t in externals]
    eager_leaves = [x._data.copy() if isinstance(x, Tensor) else x for x in flatten(compiled.fn(*args, **kwargs))[0]]
    eager_state = _state(externals)
    for t, data, grad in before:
        t._data[...] = data
        t._version[0] += 1
        t._grad = grad
    result = spec.run(leaves)
    names = [s.name for s in spec.sources]
    for i, (e, c) in enumerate(zip(eager_leaves, flatten(result)[0], strict=True)):
        if isinstance(c, Tensor):
            _compare(f"result {i}", e, c._data)
        elif not (e == c or (e != e and c != c)):
            raise CompileCheckError(f"result {i}: eager {e!r}, compiled {c!r}")
    for name, (data, grad), t in zip(names, eager_state, externals, strict=True):
        _compare(f"{name} after the call", data, t._data)
        _compare(f"{name}.grad after the call", grad, None if t._grad is None else t._grad._data)
    return result
