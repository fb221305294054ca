"""Linear algebra: matmul (and ``@``), mm, bmm, dot, outer, einsum, norm.

Everything funnels into the one ``matmul`` primitive (inputs with ndim >= 2, batch dims
broadcast). Vectors follow PyTorch's rules by adding a unit dimension before the product and
removing it after, so a float32 matrix product reaches numpy's BLAS with no extra copy.
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import dtypes as dt
from ...ir.primitives import P
from ...ir.shapes import normalize_axes
from ...runtime.threads import blas_product
from .. import eager_products  # noqa: F401 - installs kiln's own product kernel behind the matmul primitive
from ..autocast import LOWER, autocast_op
from ..dispatch import apply
from ..tensor import Tensor, method
from ._util import cast, check_tensor
from .elementwise import abs, eq, mul, ne, pow, where
from .numpy_operands import operate
from .reductions import _sqrt_zero_grad, amax, amin, sum

__all__ = ["matmul", "mm", "bmm", "dot", "outer", "ger", "einsum", "norm"]

_matmul = P["matmul"]
_reshape = P["reshape"]


def _same_dtype(a: Tensor, b: Tensor, op: str) -> None:
    if a._dtype is not b._dtype:
        raise RuntimeError(
            f"{op}: expected both inputs to have the same dtype, but got: {a._dtype.name} != {b._dtype.name}"
        )


def _sparse(x) -> bool:
    """Whether ``x`` is a COO sparse tensor (``ops.sparse``), which takes its own products."""
    return x.__class__ is not Tensor and getattr(x, "is_sparse", False)


def _product(a: Tensor, b: Tensor) -> Tensor:
    """The matmul primitive on ``a`` and ``b``: a product too small to gain from a second BLAS
    thread runs on one (``runtime.threads.blas_product``)."""
    return blas_product(apply, a._data.shape, b._data.shape, _matmul, a, b)


def _with_shape(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    # Only unit dimensions are added or removed here, which is always a view.
    return apply(_reshape, x, shape=shape)


# ----------------------------------------------------------------------------- matmul and friends
@method("matmul", "__matmul__")
@autocast_op(LOWER)
def matmul(input: Tensor, other: Tensor) -> Tensor:
    """The matrix product with PyTorch's rules for 1-D inputs and broadcast batch dims.

    >>> import kiln
    >>> (kiln.ones(2, 3) @ kiln.ones(3)).tolist()
    [3.0, 3.0]
    """
    if _sparse(input) or _sparse(other):
        return input.matmul(other) if _sparse(input) else other.__rmatmul__(input)
    if not isinstance(other, Tensor) and isinstance(other, np.ndarray):  # ``t @ array``: numpy's dtype, as PyTorch's
        return operate(matmul, input, other, "matmul")
    check_tensor(input, "input", "matmul")
    check_tensor(other, "other", "matmul")
    if input._dtype is not other._dtype:
        raise RuntimeError(
            f"expected m1 and m2 to have the same dtype, but got: {input._dtype.name} != {other._dtype.name}"
        )
    a_nd, b_nd = input._data.ndim, other._data.ndim
    if a_nd >= 2 and b_nd >= 2:
        return _product(input, other)
    if a_nd == 0 or b_nd == 0:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {a_nd}D and {b_nd}D")
    a_shape, b_shape = input._data.shape, other._data.shape
    if b_nd == 1:
        if a_shape[-1] != b_shape[0]:
            raise RuntimeError(
                f"matmul: shapes {list(a_shape)} and {list(b_shape)} cannot be multiplied: the last dim of the "
                f"first ({a_shape[-1]}) must equal the length of the vector ({b_shape[0]})"
            )
        if a_nd == 1:  # vector @ vector: the dot product, a 0-d tensor
            out = _product(_with_shape(input, (1, a_shape[0])), _with_shape(other, (b_shape[0], 1)))
            return _with_shape(out, ())
        out = _product(input, _with_shape(other, (b_shape[0], 1)))
        return _with_shape(out, out._data.shape[:-1])
    out = _product(_with_shape(input, (1, a_shape[0])), other)  # vector @ matrix (batched)
    return _with_shape(out, out._data.shape[:-2] + out._data.shape[-1:])


@method("__rmatmul__")
def _rmatmul(self: Tensor, other: Tensor) -> Tensor:
    return matmul(other, self)


@method("mm")
@autocast_op(LOWER)
def mm(input: Tensor, mat2: Tensor) -> Tensor:
    """The product of two matrices (2-D only; either may be a sparse COO matrix)."""
    if _sparse(input) or _sparse(mat2):
        return input.mm(mat2) if _sparse(input) else mat2.__rmatmul__(input)
    if input.ndim != 2:
        raise RuntimeError(f"mm: self must be a matrix, got a {input.ndim}-D tensor of shape {list(input.shape)}")
    if mat2.ndim != 2:
        raise RuntimeError(f"mm: mat2 must be a matrix, got a {mat2.ndim}-D tensor of shape {list(mat2.shape)}")
    _same_dtype(input, mat2, "mm")
    return _product(input, mat2)


@method("bmm")
@autocast_op(LOWER)
def bmm(input: Tensor, mat2: Tensor) -> Tensor:
    """Batched matrix product of (b, n, k) and (b, k, m) tensors; no broadcasting."""
    for name, t in (("batch1", input), ("batch2", mat2)):
        if t.ndim != 3:
            raise RuntimeError(f"bmm: {name} must be a 3D tensor, got shape {list(t.shape)}")
    expected = [input.shape[0], input.shape[2]]
    if [mat2.shape[0], mat2.shape[1]] != expected:
        raise RuntimeError(
            f"bmm: Expected size for first two dimensions of batch2 tensor to be: {expected} but got: "
            f"{[mat2.shape[0], mat2.shape[1]]} (shapes {list(input.shape)} and {list(mat2.shape)})."
        )
    _same_dtype(input, mat2, "bmm")
    return _product(input, mat2)


def _vectors(input: Tensor, other: Tensor, op: str) -> None:
    if input.ndim != 1 or other.ndim != 1:
        raise RuntimeError(f"{op}: 1D tensors expected, but got {input.ndim}D and {other.ndim}D tensors")
    if input.shape[0] != other.shape[0]:
        raise RuntimeError(
            f"{op}: inconsistent tensor size, expected tensor [{input.shape[0]}] and src [{other.shape[0]}] to have "
            f"the same number of elements, but got {input.shape[0]} and {other.shape[0]} elements respectively"
        )
    _same_dtype(input, other, op)


@method("dot")
def dot(input: Tensor, other: Tensor) -> Tensor:
    """The dot product of two 1-D tensors of one length and dtype (a 0-d tensor)."""
    _vectors(input, other, "dot")
    return matmul(input, other)


@method("outer", "ger")
def outer(input: Tensor, vec2: Tensor) -> Tensor:
    """The outer product of two 1-D tensors: ``out[i, j] = input[i] * vec2[j]`` (dtypes promote)."""
    for name, t in (("self", input), ("vec2", vec2)):
        if t.ndim != 1:
            raise RuntimeError(f"outer: Expected 1-D argument {name}, but got {t.ndim}-D (shape {list(t.shape)})")
    return mul(_with_shape(input, (input.shape[0], 1)), _with_shape(vec2, (1, vec2.shape[0])))


ger = outer


# ----------------------------------------------------------------------------- norm
@method("norm")
def norm(input: Tensor, p="fro", dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """The vector p-norm over ``dim`` (all elements when None): p = 'fro' or 2 (default), inf,
    -inf, 0 (count of nonzeros), 1, or any other number. The gradient at a zero norm is 0, as in
    PyTorch (not inf * 0 = nan).

    >>> import kiln
    >>> kiln.tensor([3.0, 4.0]).norm()
    tensor(5.)
    """
    if dtype is not None:
        input = cast(input, dt.as_dtype(dtype))
    if not input._dtype.is_floating_point:
        raise RuntimeError(f"norm: Expected a floating point tensor as input. Got {input._dtype.name}")
    if p is None or p == "fro" or p == 2:
        return _sqrt_zero_grad(sum(mul(input, input), dim, keepdim))
    if isinstance(p, str):
        raise ValueError(f"norm: p must be 'fro' or a number (kiln has no nuclear norm), got {p!r}")
    axes = normalize_axes(dim, input.ndim)
    if p == math.inf:
        return amax(abs(input), axes, keepdim)
    if p == -math.inf:
        return amin(abs(input), axes, keepdim)
    if p == 0:
        return sum(cast(ne(input, 0.0), input._dtype), axes, keepdim)
    if p == 1:
        return sum(abs(input), axes, keepdim)
    # |x|^p and s^(1/p) have infinite or nan slopes at 0, where PyTorch's gradient is 0: feed
    # them 1 there and put the limit value (0, or inf for p < 0) in with where().
    magnitude = abs(input)
    zero = eq(magnitude, 0.0)
    powered = where(zero, math.inf if p < 0 else 0.0, pow(where(zero, 1.0, magnitude), float(p)))
    total = sum(powered, axes, keepdim)
    if p < 0:  # a zero element makes the sum inf and the norm 0, with slope 0
        return pow(total, 1.0 / float(p))
    total_zero = eq(total, 0.0)
    return where(total_zero, 0.0, pow(where(total_zero, 1.0, total), 1.0 / float(p)))


# ----------------------------------------------------------------------------- einsum
# Labels are single letters; the dims an ellipsis stands for get labels ("...", k), counted
# from the right so that operands with fewer ellipsis dims broadcast against the others.
_ELLIPSIS = "..."


@autocast_op(LOWER)
def einsum(equation: str, *operands) -> Tensor:
    """Einstein summation, as ``torch.einsum``: ``einsum("bij,bjk->bik", a, b)``.

    Supports an implicit output (labels seen once, sorted), ``...`` (broadcast dims) and any
    number of operands, contracted left to right through the matmul primitive. A label
    repeated within one operand (a diagonal, ``"ii->i"``) is not supported and raises.

    >>> import kiln
    >>> kiln.einsum("ij,j->i", kiln.ones(2, 3), kiln.ones(3)).tolist()
    [3.0, 3.0]
    """
    if len(operands) == 1 and isinstance(operands[0], list | tuple):
        operands = tuple(operands[0])
    for i, t in enumerate(operands):
        check_tensor(t, f"operands[{i}]", "einsum")
    if not operands:
        raise ValueError("einsum(): must provide at least one operand")
    for t in operands[1:]:
        if t._dtype is not operands[0]._dtype:
            raise RuntimeError(
                f"einsum(): expected operands of one dtype, got {', '.join(x._dtype.name for x in operands)}"
            )
    inputs, output = _parse(equation, operands)
    _check_sizes(inputs, operands)
    terms = list(zip(operands, inputs, strict=True))
    result, labels = terms[0]
    result, labels = _sum_unneeded(result, labels, _needed(output, inputs[1:]))
    for k in range(1, len(terms)):
        needed = _needed(output, inputs[k + 1 :])
        other, other_labels = _sum_unneeded(*terms[k], needed | set(labels))
        result, labels = _contract(result, labels, other, other_labels, needed)
    return _permute(result, tuple(labels.index(label) for label in output))


def _permute(t: Tensor, dims: tuple[int, ...]) -> Tensor:
    if dims == tuple(range(len(dims))):
        return t
    from .shape import permute  # noqa: PLC0415 - shape.py is written alongside; look it up at call time

    return permute(t, dims)


def _needed(output: list, rest: list) -> set:
    needed = set(output)
    for labels in rest:
        needed.update(labels)
    return needed


def _parse(equation: str, operands) -> tuple[list[list], list]:
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    specs = lhs.split(",")
    if len(specs) != len(operands):
        raise ValueError(
            f"einsum(): the equation {equation!r} names {len(specs)} operand(s) but {len(operands)} were given"
        )
    letters = [_letters(spec, i, equation) for i, spec in enumerate(specs)]
    ellipsis_dims = []
    for i, (spec, t) in enumerate(zip(specs, operands, strict=True)):
        named = len(letters[i])
        if _ELLIPSIS not in spec and t.ndim != named:
            raise ValueError(
                f"einsum(): the number of subscripts in the equation ({named}) does not match the number of "
                f"dimensions ({t.ndim}) for operand {i} (shape {list(t.shape)}) and no ellipsis was given"
            )
        if t.ndim < named:
            raise ValueError(f"einsum(): operand {i} has {t.ndim} dims, fewer than the {named} subscripts in {spec!r}")
        ellipsis_dims.append(t.ndim - named if _ELLIPSIS in spec else 0)
    width = max(ellipsis_dims)
    inputs = [_expand_ellipsis(spec, n, width) for spec, n in zip(specs, ellipsis_dims, strict=True)]
    for i, labels in enumerate(inputs):
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise NotImplementedError(
                f"einsum(): subscript {repeated[0]!r} repeats within operand {i} ({specs[i]!r}): diagonals are not supported"
            )
    if arrow:
        _letters(rhs, None, equation)
        output = _expand_ellipsis(rhs, width, width)
        seen = {label for labels in inputs for label in labels}
        for label in output:
            if output.count(label) > 1:
                raise ValueError(f"einsum(): output subscript {label!r} appears more than once in {equation!r}")
            if label not in seen:
                raise ValueError(f"einsum(): output subscript {label!r} in {equation!r} does not appear in any input")
    else:
        flat = [c for labels in inputs for c in labels if isinstance(c, str)]
        output = _expand_ellipsis(_ELLIPSIS, width, width) + sorted(c for c in set(flat) if flat.count(c) == 1)
    return inputs, output


def _letters(spec: str, operand: int | None, equation: str) -> str:
    if spec.count(_ELLIPSIS) > 1:
        raise ValueError(f"einsum(): more than one ellipsis in {spec!r} of {equation!r}")
    letters = spec.replace(_ELLIPSIS, "")
    for c in letters:
        if not ("a" <= c <= "z" or "A" <= c <= "Z"):
            place = "the output" if operand is None else f"operand {operand}"
            raise ValueError(
                f"einsum(): invalid subscript {c!r} for {place} in {equation!r}; subscripts must be in [a-zA-Z]"
            )
    return letters


def _expand_ellipsis(spec: str, count: int, width: int) -> list:
    head, dots, tail = spec.partition(_ELLIPSIS)
    middle = [(_ELLIPSIS, k) for k in range(width - count, width)] if dots else []
    return list(head) + middle + list(tail)


def _check_sizes(inputs: list[list], operands) -> None:
    """Every label has one size across operands, where a size of 1 broadcasts, as in PyTorch."""
    sizes: dict = {}
    for i, (labels, t) in enumerate(zip(inputs, operands, strict=True)):
        for label, d in zip(labels, t.shape, strict=True):
            known = sizes.get(label, 1)
            if d != known and d != 1 and known != 1:
                shown = "..." if isinstance(label, tuple) else label
                raise RuntimeError(
                    f"einsum(): subscript {shown!r} has size {d} in operand {i} (shape {list(t.shape)}) but size "
                    f"{known} elsewhere; sizes must match or be 1"
                )
            sizes[label] = d if known == 1 else known


def _sum_unneeded(t: Tensor, labels: list, needed: set) -> tuple[Tensor, list]:
    drop = tuple(i for i, label in enumerate(labels) if label not in needed)
    if not drop:
        return t, labels
    return sum(t, drop), [label for i, label in enumerate(labels) if i not in drop]


def _contract(a: Tensor, la: list, b: Tensor, lb: list, keep: set) -> tuple[Tensor, list]:
    """Multiply two terms and sum the labels they share that nothing later needs, as one matmul.

    a is laid out as (batch..., left, contracted) and b as (batch..., contracted, right), with
    the left, contracted and right labels each flattened into one dim; batch dims broadcast.
    """
    shared = [label for label in la if label in lb]
    batch = [label for label in shared if label in keep]
    contracted = [label for label in shared if label not in keep]
    left = [label for label in la if label not in lb]
    right = [label for label in lb if label not in la]
    # A contracted label of size 1 on one side and n on the other: sum the n side first.
    for label in contracted:
        da, db = a.shape[la.index(label)], b.shape[lb.index(label)]
        if da != db:
            if da > db:
                a = sum(a, la.index(label), keepdim=True)
            else:
                b = sum(b, lb.index(label), keepdim=True)
    a = _permute(a, tuple(la.index(label) for label in batch + left + contracted))
    b = _permute(b, tuple(lb.index(label) for label in batch + contracted + right))
    nb = len(batch)
    left_shape = tuple(a.shape[nb : nb + len(left)])
    right_shape = tuple(b.shape[nb + len(contracted) :])
    k = math.prod(a.shape[nb + len(left) :])
    a = a.reshape(tuple(a.shape[:nb]) + (math.prod(left_shape), k))
    b = b.reshape(tuple(b.shape[:nb]) + (k, math.prod(right_shape)))
    out = _product(a, b)
    out = out.reshape(tuple(out.shape[:nb]) + left_shape + right_shape)
    return out, batch + left + right
