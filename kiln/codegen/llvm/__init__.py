"""kiln's CPU code generator: fused kernels as LLVM IR through llvmlite, compiled for the host.

``engine`` (target machine, optimization, object code, loaded libraries), ``core`` (the scalar
core of kiln/codegen/core.py over an IRBuilder), ``flags`` (fast-math flags per float mode),
``emitter`` (kiln's semantics over that core, loads and stores), ``loops`` and ``kernels`` (loop
nests and the kernel ABI).
"""

from ..core import Unsupported

__all__ = ["Unsupported"]
