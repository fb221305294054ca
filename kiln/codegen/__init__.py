"""Code generators: llvm/ (llvmlite, CPU) and cuda/ (numba.cuda), both implementing the scalar
emitter protocol of kiln.ir.emitter. They arrive with the JIT; see DESIGN.md."""
