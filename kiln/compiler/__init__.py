"""The compiler: from a traced graph to a program that runs (DESIGN.md, "Tracing and compile").

- ``options``: ``CompileOptions``, what a compile is told, and the compile deadline's default;
- ``driver``: ``compile_graph`` calls the layers below in order -- the graph passes
  (``kiln.passes``), the backend's lowering stages, its code generator (``kiln.codegen``) and
  loader (``kiln.runtime``);
- ``program_cache``: the driver's entries in the disk cache (``kiln.runtime.cache``);
- ``program_worker``: the process that runs a background compile's passes and code generation.

The frontend (``kiln.frontend.jit``: the tracer, the call cache and its guards) calls the compiler;
the compiler never imports the frontend.
"""
