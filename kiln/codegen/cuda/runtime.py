"""The vocabulary generated CUDA source calls, on the device and under Numba's CUDA simulator.

Generated kernels (kiln/codegen/cuda/core.py, kernels.py) call a few functions by name:
``fma_<dtype>`` (rounded once), ``floor_/ceil_/rint_/sqrt_/fabs_/copysign_/fmod_<dtype>`` (the
float type kept), ``libm_sin_<dtype>``/``libm_cos_<dtype>`` (correctly rounded), ``sdiv``/``srem``
(C's truncating division), ``shfl_down`` (a warp shuffle). On a GPU they are libdevice's functions
and ``cuda.shfl_down_sync``. The simulator has no shuffles and computes ``cuda.fma`` as
``a * b + c`` (rounded twice), so there they are numpy's functions, an exact fma, and a shuffle
through shared memory with barriers (every thread of the block calls it, as the kernels do).

``namespace(simulator)`` is the dict a generated module is executed in. The helpers that read
``cuda.threadIdx`` are executed in that same dict, because the simulator swaps ``cuda`` for a
per-thread fake in the globals of the function it runs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..numpy_core import fused_multiply_add

_FLOATS = ("float32", "float64")

# helpers written once, for both: compiled as device functions on a GPU, run as Python in the simulator
_SHARED_SOURCE = """
@cuda.jit(device=True)
def sdiv(a, b):
    q = a // b
    if q * b != a and (a < 0) != (b < 0):
        q += 1
    return q


@cuda.jit(device=True)
def srem(a, b):
    return a - b * sdiv(a, b)
"""

_DEVICE_SHUFFLE = """
@cuda.jit(device=True)
def shfl_down(value, offset, scratch):
    return cuda.shfl_down_sync(0xFFFFFFFF, value, offset)
"""

_SIMULATED_SHUFFLE = """
@cuda.jit(device=True)
def shfl_down(value, offset, scratch):
    # the lane ``offset`` above this one, within the warp (a lane past the warp keeps its value)
    tid = cuda.threadIdx.x
    cuda.syncthreads()
    scratch[tid] = value
    cuda.syncthreads()
    if tid % 32 + offset < 32 and tid + offset < cuda.blockDim.x:
        return scratch[tid + offset]
    return value
"""


def simulator() -> bool:
    """Whether numba runs CUDA kernels in its simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    from numba import config  # noqa: PLC0415 - numba is imported when the CUDA backend is used

    return bool(config.ENABLE_CUDASIM)  # type: ignore[attr-defined]  # numba's config is dynamic


def _simulated_math() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _FLOATS:
        t = getattr(np, name)

        def fma(a, b, c, t=t, single=name == "float32"):
            return t(fused_multiply_add(float(a), float(b), float(c), single))

        out[f"fma_{name}"] = fma
        ufuncs: dict[str, Any] = {"floor": np.floor, "ceil": np.ceil, "rint": np.rint, "sqrt": np.sqrt,
                                  "fabs": np.fabs, "copysign": np.copysign, "fmod": np.fmod,
                                  "libm_sin": np.sin, "libm_cos": np.cos}  # fmt: skip
        for fn, impl in ufuncs.items():
            out[f"{fn}_{name}"] = lambda *a, impl=impl, t=t: t(impl(*(t(x) for x in a)))
    return out


def _device_math() -> dict[str, Any]:
    from numba.cuda import libdevice  # noqa: PLC0415 - only on a GPU

    out: dict[str, Any] = {}
    for name, suffix in (("float32", "f"), ("float64", "")):
        for fn in ("fma", "floor", "ceil", "rint", "sqrt", "fabs", "copysign", "fmod"):
            out[f"{fn}_{name}"] = getattr(libdevice, fn + suffix)
        for fn in ("sin", "cos"):
            out[f"libm_{fn}_{name}"] = getattr(libdevice, fn + suffix)
    return out


def namespace(simulated: bool) -> dict[str, Any]:
    """The globals a generated module runs in (see the module docstring)."""
    import numba  # noqa: PLC0415
    from numba import cuda  # noqa: PLC0415

    ns: dict[str, Any] = {"cuda": cuda, "np": np, "math": math, "numba": numba}
    ns.update(_simulated_math() if simulated else _device_math())
    source = _SHARED_SOURCE + (_SIMULATED_SHUFFLE if simulated else _DEVICE_SHUFFLE)
    exec(compile(source, "<kiln cuda runtime>", "exec"), ns)  # noqa: S102 - kiln's own helpers
    return ns
