"""kiln's CUDA code generator: fused kernels as ``numba.cuda.jit`` source (the second ``Backend``).

``core`` (the scalar core of kiln/codegen/core.py written as Python source), ``runtime`` (what the
generated source calls, on a GPU and under Numba's CUDA simulator), ``kernels`` (elementwise,
row-reduction and horizontal kernels), ``backend`` (generate, load, the disk cache's encoding).
"""
