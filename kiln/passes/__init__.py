"""Graph -> Graph passes of the JIT: pure functions, one per file, named by verb.

Each pass returns a new graph (or the same one when it changes nothing) and never mutates its
input; unchanged nodes and values are shared between the two, as they are immutable.

- ``fold_constants``: evaluate nodes whose inputs are all constants; merge identical constants.
- ``simplify``: exact algebraic identities (``x * 1``, ``neg(neg(x))``, identity reshapes...).
- ``eliminate_common_subexpressions``: compute each distinct expression once (never random ones).
- ``eliminate_dead_code``: drop nodes no output depends on.
- ``run_pipeline(graph, passes=DEFAULT_PIPELINE, verify=False, record=None)`` runs a tuple of
  passes, optionally verifying and recording the graph after each.

The compile driver (``kiln.compiler.driver``) runs these, then the lowering stages a backend
asks for: ``fusion.fuse``, ``layouts.infer_layouts``, ``write_backs.choose_write_backs`` and
``memory_plan.plan_memory``.
"""

from .eliminate_common_subexpressions import eliminate_common_subexpressions
from .eliminate_dead_code import eliminate_dead_code
from .fold_constants import FOLD_LIMIT, fold_constants
from .pipeline import DEFAULT_PIPELINE, PassError, run_pipeline
from .simplify import simplify

__all__ = [
    "DEFAULT_PIPELINE",
    "FOLD_LIMIT",
    "PassError",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "fold_constants",
    "run_pipeline",
    "simplify",
]
