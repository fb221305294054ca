"""``kiln.nn``: neural-network building blocks, written only against kiln's public API.

``kiln.nn.functional`` holds the math as plain functions (PyTorch's names and semantics);
the ``Module`` classes that hold parameters come later.
"""

from . import functional

__all__ = ["functional"]
