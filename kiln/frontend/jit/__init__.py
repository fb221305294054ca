"""The tracing JIT: ``kiln.compile``, ``kiln.explain``, ``kiln.export`` (see DESIGN.md, "Tracing and compile")."""
