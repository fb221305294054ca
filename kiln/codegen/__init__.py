"""Code generators and what they share: ``core`` (the scalar core a backend implements),
``semantics`` (kiln's scalar semantics over any core: the emitter protocol of kiln.ir.emitter),
``mathlib`` (the transcendental routines over the core), ``kernel_dag`` and ``index`` (a kernel
body as a scalar DAG, and the index algebra of its loads), ``numpy_core`` (a reference core over
numpy arrays); ``llvm/`` is the CPU backend. See DESIGN.md."""
