"""kiln's IR layer: dtypes, types, the primitive registry, and graphs.

- ``types``: ``TensorType(shape, dtype, device)``; a dimension is an int or a symbolic size ``Sym("B")``.
- ``graph``: ``Graph``/``Node``/``Value``/``GraphBuilder`` (flat, typed SSA).
- ``printer`` / ``parser``: the text form, one node per line; the grammar is in ``kiln.ir.printer``'s docstring.
- ``verifier``: ``verify(graph)`` (SSA, topological order, known ops, every type re-inferred).
- ``serialize``: graphs as strict JSON, and graph files (safetensors; loading never executes code).

Nothing here imports the other layers: rules that need tensor ops receive them as an argument.
"""
