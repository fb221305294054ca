"""kiln's op namespace: every public op, as functions over tensors.

Each module binds its Tensor methods with ``@method``; this package is also the ``ops``
namespace that the primitives' VJP rules are written against.
"""

from ..autograd.grad_mode import is_grad_enabled  # VJP rules: whether the gradient is differentiated again
from ..dispatch import apply  # VJP rules may call a primitive directly: ops.apply(P["fold"], g, ...)
from . import (
    bitwise,
    compat,
    copies,
    creation,
    diagonals,
    elementwise,
    generator,
    indexing,
    inplace_views,
    interop,
    linalg,
    more_elementwise,
    more_indexing,
    more_linalg,
    more_reductions,
    more_shape,
    order_stats,
    pieces,
    random,
    reductions,
    shape,
    sparse,
    tensor_methods,  # (last: it binds in-place forms of methods the others bind)
    windows,
)  # fmt: skip
from ._util import cast
from .bitwise import *  # noqa: F403
from .compat import *  # noqa: F403
from .copies import *  # noqa: F403
from .creation import *  # noqa: F403
from .diagonals import *  # noqa: F403
from .elementwise import *  # noqa: F403
from .generator import *  # noqa: F403
from .indexing import *  # noqa: F403
from .inplace import commit_inplace
from .inplace_views import *  # noqa: F403
from .interop import *  # noqa: F403
from .linalg import *  # noqa: F403
from .more_elementwise import *  # noqa: F403
from .more_indexing import *  # noqa: F403
from .more_linalg import *  # noqa: F403
from .more_reductions import *  # noqa: F403
from .more_shape import *  # noqa: F403
from .order_stats import *  # noqa: F403
from .pieces import *  # noqa: F403
from .random import *  # noqa: F403
from .reductions import *  # noqa: F403
from .shape import *  # noqa: F403
from .sparse import *  # noqa: F403
from .windows import *  # noqa: F403

__all__ = (
    ["cast", "commit_inplace"] + bitwise.__all__ + compat.__all__ + copies.__all__ + creation.__all__ + diagonals.__all__ + elementwise.__all__ + generator.__all__ + indexing.__all__ + inplace_views.__all__ + interop.__all__
    + linalg.__all__ + more_elementwise.__all__ + more_indexing.__all__ + more_linalg.__all__ + more_reductions.__all__ + more_shape.__all__ + order_stats.__all__ + pieces.__all__ + random.__all__ + reductions.__all__ + shape.__all__ + sparse.__all__ + windows.__all__
)  # fmt: skip
