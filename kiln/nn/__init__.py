"""``kiln.nn``: neural-network building blocks, written only against kiln's public API.

``kiln.nn.functional`` holds the math as plain functions (PyTorch's names and semantics);
the ``Module`` classes hold parameters and buffers and call it.
"""

from . import attention, functional, init, utils
from .modules import *  # noqa: F403
from .modules import __all__ as _modules_all
from .parameter import Buffer, Parameter, UninitializedBuffer, UninitializedParameter

# isort: split
# dist: data parallelism (kiln.nn.parallel), with DataParallel at kiln.nn as in PyTorch
from . import parallel  # noqa: E402
from .parallel import DataParallel  # noqa: E402

__all__ = [
    "attention",
    "functional",
    "init",
    "utils",
    "Parameter",
    "Buffer",
    "UninitializedParameter",
    "UninitializedBuffer",
    *_modules_all,
    "parallel",
    "DataParallel",
]
