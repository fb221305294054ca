"""kiln's CPU code generator: fused kernels as LLVM IR through llvmlite, compiled for the host.

``engine`` (target machine, optimization, object code, loaded libraries), ``core`` (the scalar
core of kiln/codegen/core.py over an IRBuilder), ``flags`` (fast-math flags per float mode),
``emitter`` (kiln's semantics over that core, loads and stores), ``loops`` and ``kernels`` (loop
nests and the kernel ABI), ``pool`` (the native thread pool that splits kernels over cores,
installed into ``runtime.threads`` here).
"""

import os

from ...runtime import threads
from ..core import Unsupported
from . import pool

# Opt-in for now: an MLP training step measured a median 0.96x torch over 7 runs with this pool
# (0.79-1.22x) against 0.83x with the Python pool (0.67-1.03x), its workers parked before every
# BLAS call; elementwise kernels gain (GELU 4M: 1.28 -> 0.97 ms on 2 threads). Why the step loses
# is not known yet (the machine's noise is as large as the difference).
if pool.supported() and os.environ.get("KILN_NATIVE_POOL", "0") == "1":
    threads.install_native_pool(pool.NativePool)

__all__ = ["Unsupported"]
