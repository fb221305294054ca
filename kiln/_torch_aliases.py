"""The ``torch.*`` and ``Tensor`` names that PyTorch keeps beside ``torch.linalg`` and
``torch.special``: ``det``, ``inverse``, ``svd``, ``digamma``, ``lgamma``...

Where the semantics are identical the name is the same function object as kiln.linalg's or
kiln.special's; where PyTorch's older spelling differs (``svd`` returns V rather than Vh,
``cholesky`` takes ``upper`` positionally, ``cross`` looks for a dim of size 3) a wrapper says so.
This module sits on the public side (it reads ``kiln.linalg`` and ``kiln.special``, which are
written over the frontend) and binds the methods at import, as the frontend's ``@method`` does.
"""

from __future__ import annotations

import math
from collections import namedtuple

from . import linalg, special
from .frontend import ops
from .frontend.ops.inplace import commit_inplace
from .frontend.tensor import Tensor, method

__all__ = [
    "det", "inverse", "slogdet", "logdet", "matrix_power", "cholesky", "svd", "pinverse", "cross", "digamma",
    "erfinv", "erfc", "xlogy", "logit", "i0", "sinc", "lgamma", "polygamma", "matrix_exp",
]  # fmt: skip

SVDResult = namedtuple("svd", ["U", "S", "V"])  # type: ignore[name-match]  # PyTorch's type name (torch.return_types)

det = linalg.det
inverse = linalg.inv
slogdet = linalg.slogdet
matrix_power = linalg.matrix_power
matrix_exp = linalg.matrix_exp
polygamma = special.polygamma
digamma, erfinv, erfc, xlogy, logit, i0, sinc = (
    special.digamma, special.erfinv, special.erfc, special.xlogy, special.logit, special.i0, special.sinc
)  # fmt: skip
lgamma = special.gammaln


def logdet(input: Tensor) -> Tensor:
    """log(det): nan for a negative determinant, -inf for a singular matrix, as PyTorch's."""
    sign, logabsdet = linalg.slogdet(input)
    return ops.where(ops.lt(sign, 0), math.nan, logabsdet)


def cholesky(input: Tensor, upper: bool = False) -> Tensor:
    """PyTorch's older ``torch.cholesky`` (``upper`` may be positional)."""
    return linalg.cholesky(input, upper=upper)


def svd(input: Tensor, some: bool = True, compute_uv: bool = True) -> SVDResult:
    """``input = U diag(S) V^T`` (V, not linalg.svd's Vh); reduced unless ``some=False``. Without
    ``compute_uv`` U and V are zeros, as PyTorch's."""
    u, s, vh = linalg.svd(input, full_matrices=not some)
    v = ops.transpose(vh, -2, -1)
    if not compute_uv:
        return SVDResult(ops.zeros_like(u), s, ops.zeros_like(v))
    return SVDResult(u, s, v)


def pinverse(input: Tensor, rcond: float = 1e-15) -> Tensor:
    return linalg.pinv(input, rtol=rcond)


def cross(input: Tensor, other: Tensor, dim: int | None = None) -> Tensor:
    """The cross product along ``dim``; without one, along the first dim of size 3 (PyTorch's
    deprecated default, not linalg.cross's last dim)."""
    if dim is None:
        shape = ops.broadcast_shapes(tuple(input.shape), tuple(other.shape))
        sized = [d for d, n in enumerate(shape) if n == 3]
        if not sized:
            raise RuntimeError(f"no dimension of size 3 in input (shapes {list(input.shape)} and {list(other.shape)})")
        dim = sized[0]
    if input.ndim != other.ndim or tuple(input.shape) != tuple(other.shape):
        input, other = ops.broadcast_tensors(input, other)
    return linalg.cross(input, other, dim=dim)


_METHODS = {
    "det": det, "inverse": inverse, "slogdet": slogdet, "logdet": logdet, "matrix_power": matrix_power,
    "cholesky": cholesky, "svd": svd, "pinverse": pinverse, "cross": cross, "digamma": digamma, "erfinv": erfinv,
    "erfc": erfc, "xlogy": xlogy, "logit": logit, "i0": i0, "sinc": sinc, "lgamma": lgamma, "matrix_exp": matrix_exp,
}  # fmt: skip
for _name, _fn in _METHODS.items():
    method(_name)(_fn)


def _inplace(fn, name: str):
    def op(self: Tensor, *args, **kwargs) -> Tensor:
        return commit_inplace(self, fn(self, *args, **kwargs), op=name)

    op.__name__ = op.__qualname__ = name
    return op


for _name in ("digamma", "erfinv", "erfc", "xlogy", "logit", "i0", "sinc", "lgamma"):
    method(_name + "_")(_inplace(_METHODS[_name], _name + "_"))


@method("polygamma")
def _polygamma_method(self: Tensor, n: int) -> Tensor:
    """``Tensor.polygamma(n)``: the tensor is the second argument of ``torch.polygamma(n, x)``."""
    return polygamma(n, self)


@method("polygamma_")
def _polygamma_inplace(self: Tensor, n: int) -> Tensor:
    return commit_inplace(self, polygamma(n, self), op="polygamma_")
