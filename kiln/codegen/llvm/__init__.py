"""kiln's CPU code generator: fused kernels as LLVM IR through llvmlite, compiled for the host.

``engine`` (target machine, optimization, object code, loaded libraries), ``core`` (the scalar
core of kiln/codegen/core.py over an IRBuilder), ``flags`` (fast-math flags per float mode),
``emitter`` (kiln's semantics over that core, loads and stores), ``kernels`` (``KernelModule``:
the kernel ABI and the table of kernel kinds' generators, ``kinds``), the kernel-building core the
kinds' modules share (``body``: a body's DAG as IR; ``loops``: loop nests and index arithmetic),
one module per kind (``elementwise``, ``reduction``, ``horizontal``, ``conv_epilogue``) and per
family of natively compiled primitives (``kernel_info.NATIVE_FAMILIES``), ``pool`` (the native
thread pool that splits kernels over cores, installed into ``runtime.threads`` here).
"""

import os

from ...runtime import threads
from ..core import Unsupported
from . import pool

# Programs of kernels alone split them on the native pool (runtime.executor decides); with it,
# GELU 4M ran 1.28 -> 0.97 ms on 2 threads. Programs that call BLAS keep the Python pool: an MLP
# training step measured a median 0.96x torch over 7 runs with the native pool against 0.83x.
if pool.supported() and os.environ.get("KILN_NATIVE_POOL", "1") != "0":  # 0: the Python pool only
    threads.install_native_pool(pool.NativePool)
