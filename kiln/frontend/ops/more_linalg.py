"""More of PyTorch's product names over ``matmul``: the BLAS-style ``add*`` family with its
beta/alpha rules, ``mv``, ``inner``, ``vdot``, ``kron``, ``tensordot``, ``cdist``, ``dist`` and
``chain_matmul``.

The ``add*`` ops follow PyTorch's rule that a zero ``beta`` (or ``alpha``) drops its term
altogether, so nan or inf there does not leak into the result as ``0 * nan``; the dropped term
still takes part in broadcasting.
"""

from __future__ import annotations

import math

from ...ir.shapes import normalize_axis
from ..tensor import Tensor, method
from .creation import zeros_like
from .elementwise import abs, add, mul, ne, pow, sqrt, sub, where
from .linalg import matmul
from .reductions import amax, amin, sum
from .shape import broadcast_to, permute, reshape, unsqueeze

__all__ = [
    "addmm", "addmv", "addr", "addbmm", "baddbmm", "mv", "inner", "vdot", "kron", "tensordot", "cdist", "dist",
    "chain_matmul",
]  # fmt: skip


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(message)


def _same_dtype(op: str, *tensors: Tensor) -> None:
    dtypes = {x.dtype for x in tensors}
    _require(
        len(dtypes) == 1,
        f"{op}: expected all operands to have the same dtype, but got {sorted(d.name for d in dtypes)}",
    )


def _scaled_sum(op: str, input: Tensor, product: Tensor, beta, alpha) -> Tensor:
    """beta * input + alpha * product, with a zero factor dropping its term (not multiplying it)."""
    if not input.dtype.is_floating_point and (isinstance(beta, float) or isinstance(alpha, float)):
        raise RuntimeError(
            f"{op}: for integral input tensors, argument alpha and beta must not be a floating point number."
        )
    shape = tuple(product.shape)
    try:
        base = broadcast_to(input, shape)
    except (RuntimeError, ValueError) as e:
        raise RuntimeError(f"{op}: the input of shape {list(input.shape)} cannot be broadcast to {list(shape)}") from e
    scaled_base = None if beta == 0 else base if beta == 1 else mul(base, beta)
    scaled_product = None if alpha == 0 else product if alpha == 1 else mul(product, alpha)
    if scaled_base is None:
        return zeros_like(product) if scaled_product is None else scaled_product
    return scaled_base.clone() if scaled_product is None else add(scaled_base, scaled_product)


@method("addmm")
def addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """beta * input + alpha * (mat1 @ mat2) for 2-d mat1, mat2."""
    _require(mat1.ndim == 2, f"mat1 must be a matrix, got {mat1.ndim}-D tensor")
    _require(mat2.ndim == 2, f"mat2 must be a matrix, got {mat2.ndim}-D tensor")
    _same_dtype("addmm", input, mat1, mat2)
    return _scaled_sum("addmm", input, matmul(mat1, mat2), beta, alpha)


@method("addmv")
def addmv(input: Tensor, mat: Tensor, vec: Tensor, *, beta=1, alpha=1) -> Tensor:
    _require(
        mat.ndim == 2 and vec.ndim == 1, f"vector + matrix @ vector expected, got {input.ndim}, {mat.ndim}, {vec.ndim}"
    )
    _same_dtype("addmv", input, mat, vec)
    return _scaled_sum("addmv", input, matmul(mat, vec), beta, alpha)


@method("addr")
def addr(input: Tensor, vec1: Tensor, vec2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """beta * input + alpha * outer(vec1, vec2)."""
    _require(vec1.ndim == 1, f"addr: Expected 1-D argument vec1, but got {vec1.ndim}-D")
    _require(vec2.ndim == 1, f"addr: Expected 1-D argument vec2, but got {vec2.ndim}-D")
    _same_dtype("addr", input, vec1, vec2)
    return _scaled_sum("addr", input, mul(unsqueeze(vec1, 1), unsqueeze(vec2, 0)), beta, alpha)


def _batches(name: str, input: Tensor, batch1: Tensor, batch2: Tensor) -> None:
    """The checks of baddbmm and addbmm: two 3-d operands with as many batches, of one dtype."""
    _require(batch1.ndim == 3, f"batch1 must be a 3D tensor, got {batch1.ndim}-D")
    _require(batch2.ndim == 3, f"batch2 must be a 3D tensor, got {batch2.ndim}-D")
    _require(batch1.shape[0] == batch2.shape[0], "batch1 and batch2 must have same number of batches, "
             f"got {batch1.shape[0]} and {batch2.shape[0]}")  # fmt: skip
    _same_dtype(name, input, batch1, batch2)


@method("baddbmm")
def baddbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """beta * input + alpha * (batch1 @ batch2), batch by batch (3-d operands)."""
    _batches("baddbmm", input, batch1, batch2)
    return _scaled_sum("baddbmm", input, matmul(batch1, batch2), beta, alpha)


@method("addbmm")
def addbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """beta * input + alpha * sum over the batch of batch1[i] @ batch2[i]."""
    _batches("addbmm", input, batch1, batch2)
    # One matrix product over the batch folded into the inner dim: sum_b A_b B_b = [A_0 .. A_b] @ [B_0; ..; B_b].
    b, n, k = batch1.shape
    m = batch2.shape[2]
    left = reshape(permute(batch1, 1, 0, 2), (n, b * k))
    return _scaled_sum("addbmm", input, matmul(left, reshape(batch2, (b * k, m))), beta, alpha)


for _name, _fn in {"addmm": addmm, "addmv": addmv, "addr": addr, "baddbmm": baddbmm, "addbmm": addbmm}.items():

    def _inplace(self: Tensor, *args, _fn=_fn, _name=_name, **kwargs) -> Tensor:
        from .inplace import commit_inplace  # noqa: PLC0415

        return commit_inplace(self, _fn(self, *args, **kwargs), op=_name + "_")

    method(_name + "_")(_inplace)


@method("mv")
def mv(input: Tensor, vec: Tensor) -> Tensor:
    _require(input.ndim == 2 and vec.ndim == 1, f"vector + matrix @ vector expected, got {input.ndim}, {vec.ndim}")
    return matmul(input, vec)


@method("inner")
def inner(input: Tensor, other: Tensor) -> Tensor:
    """Sum over the last dims of both (a product of every pair of their other indices); 0-d scales."""
    if input.ndim == 0 or other.ndim == 0:
        return mul(input, other)
    _require(input.shape[-1] == other.shape[-1], f"inner() the last dimension must match on both input tensors "
             f"but got shapes {list(input.shape)} and {list(other.shape)}")  # fmt: skip
    return tensordot(input, other, ([-1], [-1]))


@method("vdot")
def vdot(input: Tensor, other: Tensor) -> Tensor:
    """The dot product of two 1-D tensors (kiln's dtypes are real, so nothing is conjugated)."""
    _require(
        input.ndim == 1 and other.ndim == 1, f"1D tensors expected, but got {input.ndim}D and {other.ndim}D tensors"
    )
    _same_dtype("vdot", input, other)
    _require(input.shape[0] == other.shape[0], "inconsistent tensor size, expected tensor "
             f"[{input.shape[0]}] and src [{other.shape[0]}] to have the same number of elements, but got "
             f"{input.shape[0]} and {other.shape[0]} elements respectively")  # fmt: skip
    return matmul(input, other)


@method("kron")
def kron(input: Tensor, other: Tensor) -> Tensor:
    """The Kronecker product: out[i*q + k, j*r + l, ...] = a[i, j, ...] * b[k, l, ...] (shapes padded left)."""
    nd = max(input.ndim, other.ndim)
    a = reshape(input, (1,) * (nd - input.ndim) + tuple(input.shape))
    b = reshape(other, (1,) * (nd - other.ndim) + tuple(other.shape))
    a_shape = [s for d in a.shape for s in (d, 1)]  # a's dims interleaved with ones
    b_shape = [s for d in b.shape for s in (1, d)]
    out = mul(reshape(a, tuple(a_shape)), reshape(b, tuple(b_shape)))
    return reshape(out, tuple(x * y for x, y in zip(a.shape, b.shape)))


def tensordot(a: Tensor, b: Tensor, dims=2, out=None) -> Tensor:
    """Contract ``dims`` (a count of a's last and b's first dims, or two lists of dims) by one matmul."""
    if out is not None:
        raise TypeError("tensordot: out= is not supported by kiln")
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    if isinstance(dims, int):
        _require(dims >= 0, f"tensordot expects dims >= 0, but got dims={dims}")
        _require(dims <= min(a.ndim, b.ndim), f"tensordot expects dims < ndim_a or ndim_b, but got dims={dims}")
        dims_a, dims_b = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    else:
        dims_a, dims_b = ([d] if isinstance(d, int) else list(d) for d in dims)
    _require(len(dims_a) == len(dims_b), "both dimension lists should have same length")
    dims_a = [normalize_axis(d, a.ndim) for d in dims_a]
    dims_b = [normalize_axis(d, b.ndim) for d in dims_b]
    for da, db in zip(dims_a, dims_b):
        _require(a.shape[da] == b.shape[db], f"contracted dimensions need to match, but first has size "
                 f"{a.shape[da]} in dim {da} and second has size {b.shape[db]} in dim {db}")  # fmt: skip
    free_a = [d for d in range(a.ndim) if d not in dims_a]
    free_b = [d for d in range(b.ndim) if d not in dims_b]
    k = math.prod(a.shape[d] for d in dims_a)
    left = reshape(permute(a, *free_a, *dims_a), (math.prod(a.shape[d] for d in free_a), k))
    right = reshape(permute(b, *dims_b, *free_b), (k, math.prod(b.shape[d] for d in free_b)))
    shape = tuple(a.shape[d] for d in free_a) + tuple(b.shape[d] for d in free_b)
    return reshape(matmul(left, right), shape)


def _pnorm(diff: Tensor, p: float, dim) -> Tensor:
    """The p-norm of ``diff`` over ``dim``, with the gradient at a zero distance 0, as PyTorch's."""
    a = abs(diff)
    if p == 0:
        return sum(ne(a, 0).to(diff.dtype), dim)
    if p == math.inf:
        return amax(a, dim)
    if p == -math.inf:
        return amin(a, dim)
    if p == 1:
        return sum(a, dim)
    total = sum(pow(a, p) if p != 2 else mul(a, a), dim)
    zero = total == 0
    root = sqrt(where(zero, 1.0, total)) if p == 2 else pow(where(zero, 1.0, total), 1.0 / p)
    return where(zero, 0.0, root)


def cdist(x1: Tensor, x2: Tensor, p: float = 2.0, compute_mode=None) -> Tensor:
    """Pairwise p-norm distances between the rows of x1 (..., P, M) and x2 (..., R, M): (..., P, R).

    Computed from the differences (PyTorch's exact mode), not the expanded |a|^2 - 2ab + |b|^2
    that PyTorch may use for large p=2 inputs: slower, never less accurate."""
    _require(x1.ndim >= 2, f"cdist only supports at least 2D tensors, X1 got: {x1.ndim}D")
    _require(x2.ndim >= 2, f"cdist only supports at least 2D tensors, X2 got: {x2.ndim}D")
    _require(x1.shape[-1] == x2.shape[-1], f"X1 and X2 must have the same number of columns. "
             f"X1: {x1.shape[-1]} X2: {x2.shape[-1]}")  # fmt: skip
    _require(x1.dtype.is_floating_point and x2.dtype.is_floating_point,
             f"cdist only supports floating-point dtypes, X1 got: {x1.dtype.name}")  # fmt: skip
    _require(p >= 0, "cdist only supports non-negative p values")
    diff = sub(unsqueeze(x1, -2), unsqueeze(x2, -3))  # (..., P, R, M)
    return _pnorm(diff, p, -1)


@method("dist")
def dist(input: Tensor, other: Tensor, p: float = 2) -> Tensor:
    """The p-norm of input - other (broadcast), a 0-d tensor."""
    diff = sub(input, other)
    return _pnorm(reshape(diff, (-1,)), p, 0)


def chain_matmul(*matrices) -> Tensor:
    """The product of the 2-d matrices, left to right (deprecated in PyTorch for linalg.multi_dot)."""
    _require(len(matrices) > 0, "chain_matmul(): Expected one or more matrices")
    for m in matrices:
        _require(m.ndim == 2, f"Tensor dimension is {m.ndim}, expected 2 instead.")
    out = matrices[0]
    if len(matrices) == 1:
        return out.clone()
    for m in matrices[1:]:
        out = matmul(out, m)
    return out
