"""kiln's CPU code generator: fused kernels as LLVM IR through llvmlite, compiled for the host.

``engine`` (target machine, optimization, object code, loaded libraries), ``mathlib`` (inline
vectorizable math), ``flags`` (fast-math flags per use), ``emitter`` (the scalar emitter protocol
in LLVM IR), ``loops`` and ``kernels`` (loop nests and the kernel ABI).
"""


class Unsupported(Exception):
    """A kernel the LLVM code generator does not compile (the reason is the message); the
    executor runs that node with the interpreter instead and ``kiln.explain`` says why."""
