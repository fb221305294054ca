"""kiln's IR layer: dtypes, types, the primitive registry (and, later, Graph, printer, verifier).

Nothing here imports the other layers: rules that need tensor ops receive them as an argument.
"""
