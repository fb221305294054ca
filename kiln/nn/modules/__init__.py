"""``kiln.nn`` layers: ``Module`` and its subclasses, PyTorch's names, parameters and defaults.

The submodules follow ``torch.nn.modules``' file names (``container``, ``activation``, ``linear``,
``conv``, ``batchnorm``, ``normalization``, ``rnn``, ``transformer``, ...), so imports spelled with
PyTorch's paths work; each name below comes from the submodule PyTorch keeps it in.
"""

from . import (
    activation,
    batchnorm,
    container,
    conv,
    distance,
    dropout,
    flatten,
    fold,
    instancenorm,
    lazy,
    linear,
    loss,
    module,
    normalization,
    padding,
    pixelshuffle,
    pooling,
    rnn,
    sparse,
    transformer,
    upsampling,
)
from .activation import *  # noqa: F403
from .batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm
from .container import *  # noqa: F403
from .conv import *  # noqa: F403
from .distance import *  # noqa: F403
from .dropout import *  # noqa: F403
from .flatten import *  # noqa: F403
from .fold import *  # noqa: F403
from .instancenorm import *  # noqa: F403
from .lazy import *  # noqa: F403
from .linear import Bilinear, Identity, Linear
from .loss import *  # noqa: F403
from .module import Module, RemovableHandle
from .normalization import GroupNorm, LayerNorm, LocalResponseNorm, RMSNorm
from .padding import *  # noqa: F403
from .pixelshuffle import *  # noqa: F403
from .pooling import *  # noqa: F403
from .rnn import *  # noqa: F403
from .sparse import Embedding, EmbeddingBag
from .transformer import *  # noqa: F403
from .upsampling import *  # noqa: F403

_SUBMODULES = (activation, batchnorm, container, conv, distance, dropout, flatten, fold, instancenorm, lazy, linear, loss,
               module, normalization, padding, pixelshuffle, pooling, rnn, sparse, transformer, upsampling)  # fmt: skip
__all__ = sorted({name for m in _SUBMODULES for name in m.__all__ if not name.startswith("_")})

# PyTorch keeps each lazy class beside its regular one (torch.nn.modules.linear.LazyLinear, ...).
for _home, _names in ((linear, ("LazyLinear",)), (conv, ("LazyConv1d", "LazyConv2d", "LazyConv3d", "LazyConvTranspose1d",
                      "LazyConvTranspose2d", "LazyConvTranspose3d")), (batchnorm, ("LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d")),
                      (instancenorm, ("LazyInstanceNorm1d", "LazyInstanceNorm2d", "LazyInstanceNorm3d"))):  # fmt: skip
    for _name in _names:
        setattr(_home, _name, getattr(lazy, _name))
