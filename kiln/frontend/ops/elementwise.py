"""Elementwise ops: the primitives with PyTorch's promotion, the composites, and operators.

Composites are plain Python over primitives; each says why it is built the way it is when the
obvious form would be wrong (a gradient at a kink, nan propagation, overflow).
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import dtypes as dt
from ...ir.primitives import P
from ..dispatch import apply
from ..eager_composites import compiled_composite
from ..jit.regions import composite
from ..opmath import in_float32
from ..tensor import Tensor, method
from ._util import as_tensor_arg, cast, promote, scalar_tensor
from .checks import check_nonzero, check_range
from .gelu_arrays import gelu_tanh_eager
from .inplace import commit_inplace
from .numpy_operands import has_array, operate
from .relu import clamp_eager, relu_eager

__all__ = [
    "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "floor_divide",
    "remainder", "pow", "square", "neg", "negative", "abs", "sign", "exp", "expm1", "log", "log1p",
    "log2", "log10", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "relu", "gelu",
    "silu", "softplus", "erf", "floor", "ceil", "round", "trunc", "clamp", "clip", "maximum",
    "minimum", "where", "eq", "ne", "lt", "le", "gt", "ge", "equal", "logical_and", "logical_or",
    "logical_xor", "logical_not", "isnan", "isinf", "isfinite", "lerp",
]  # fmt: skip

_add, _sub, _mul, _div = P["add"], P["sub"], P["mul"], P["div"]
_le, _where = P["le"], P["where"]
_FLOAT_CATEGORY = dt.FLOATING


def _binary(prim, a, b, name: str) -> Tensor:
    # Fast path: two tensors of one dtype, or a tensor and a number of no higher category.
    if isinstance(a, Tensor):
        if isinstance(b, Tensor):
            if a._dtype is b._dtype:
                return apply(prim, a, b)
        elif (
            isinstance(b, float)
            and a._dtype.category == _FLOAT_CATEGORY
            or (isinstance(b, int) and not isinstance(b, bool) and a._dtype.category != dt.BOOL)
        ):
            return apply(prim, a, scalar_tensor(b, a._dtype, a._device))
    elif (
        (a.__class__ is float or a.__class__ is int) and isinstance(b, Tensor) and b._dtype.category == _FLOAT_CATEGORY
    ):
        return apply(prim, scalar_tensor(a, b._dtype, b._device), b)  # a number first (1 - y*y, a VJP's)
    if prim is _add or prim is _sub:
        b = _dense_of_sparse(a, b)  # ``dense + sparse``: Tensor.__add__ comes here
        if prim is _sub:
            _no_bool_operand(a, b)
    try:
        operands = promote(a, b, op=name)
    except TypeError:  # ``t + np.ones(3)``: PyTorch's result (numpy_operands), looked for only here
        if has_array(a, b):
            return operate(lambda x, y: _binary(prim, x, y, name), a, b, name)
        raise
    return apply(prim, *operands)


def _dense_of_sparse(input, other):
    """``other`` as a dense tensor when it is a sparse one added to (or taken from) a dense ``input``:
    PyTorch's ``dense + sparse`` is dense (GCN's ``torch.eye(V) + adjacency``)."""
    if isinstance(input, Tensor) and getattr(other, "layout", None) == "sparse_coo":
        return other.to_dense()
    return other


def _no_bool_operand(a, b) -> None:
    """PyTorch refuses a subtraction with a bool operand (a bool tensor, True or False), and so
    does kiln rather than compute it as 0/1 (two tensors of one dtype never come here: numpy
    refuses bool - bool itself)."""
    for x in (a, b):
        if (x.__class__ is bool or isinstance(x, Tensor) and x._dtype is dt.bool_) and not has_array(a, b):
            raise RuntimeError(
                "sub: a bool operand cannot be subtracted or subtracted from (PyTorch refuses it too); "
                "to invert a mask use ~mask or logical_not(mask), to compare two masks use ^ or logical_xor"
            )


def _float_binary(prim, a, b, name: str) -> Tensor:
    # Fast path: floats of one dtype, or a float tensor and a number (which never widens it).
    if isinstance(a, Tensor) and a._dtype.category == _FLOAT_CATEGORY:
        if isinstance(b, Tensor):
            if a._dtype is b._dtype:
                return apply(prim, a, b)
        elif b.__class__ is float or b.__class__ is int:
            return apply(prim, a, scalar_tensor(b, a._dtype, a._device))
    try:
        operands = promote(a, b, op=name, floating=True)
    except TypeError:  # (an array: numpy_operands)
        if has_array(a, b):
            return operate(lambda x, y: _float_binary(prim, x, y, name), a, b, name)
        raise
    return apply(prim, *operands)


def _unary_float(prim, x: Tensor) -> Tensor:
    """A float-valued function: integer and bool inputs compute in the default float dtype."""
    if x._dtype.category != _FLOAT_CATEGORY:
        x = cast(x, dt.get_default_dtype())
    return apply(prim, x)


# ----------------------------------------------------------------------------- arithmetic
@method("add")
def add(input, other, *, alpha=1) -> Tensor:
    if alpha != 1:  # (a sparse ``other`` is made dense first; without alpha, _binary's slower path does it)
        other = mul(_dense_of_sparse(input, other), alpha)
    return _binary(_add, input, other, "add")


@method("sub")
def sub(input, other, *, alpha=1) -> Tensor:
    if alpha != 1:  # (a sparse ``other`` is made dense first; without alpha, _binary's slower path does it)
        other = mul(_dense_of_sparse(input, other), alpha)
    return _binary(_sub, input, other, "sub")


@method("mul")
def mul(input, other) -> Tensor:
    return _binary(_mul, input, other, "mul")


@method("div")
def div(input, other, *, rounding_mode: str | None = None) -> Tensor:
    """True division (ints give floats); ``rounding_mode`` "floor" or "trunc" as in PyTorch."""
    if rounding_mode is None:
        return _float_binary(_div, input, other, "div")
    if rounding_mode == "floor":
        return floor_divide(input, other)
    if rounding_mode == "trunc":
        a, b = promote(input, other, op="div")
        if a._dtype.is_floating_point:
            return trunc(apply(_div, a, b))
        check_nonzero(b, ZeroDivisionError, _BY_ZERO)
        q = apply(P["floor_divide"], a, b)  # floor, then step toward zero where inexact and negative
        inexact_negative = logical_and(ne(apply(P["remainder"], a, b), 0), ne(lt(a, 0), lt(b, 0)))
        return add(q, cast(inexact_negative, q._dtype))
    raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found {rounding_mode!r}")


subtract, multiply, divide, true_divide = sub, mul, div, div


_BY_ZERO = "integer division or remainder by zero"


def _divide(prim, input, other, name: str) -> Tensor:
    """``floor_divide``/``remainder``: integer division by zero raises ZeroDivisionError, eagerly and on
    compiled calls (a check of the graph, made before the division, since the kernels give 0)."""
    if isinstance(input, Tensor):
        floats = input._dtype.is_floating_point
        if floats and (other.__class__ in (int, float) or isinstance(other, Tensor) and other._dtype is input._dtype):
            return _binary(prim, input, other, name)  # the fast path: float division needs no check
        if other.__class__ is int and input._dtype.category == dt.INTEGER:
            if other == 0:  # a Python number is baked into a trace: raising now is raising every time
                raise ZeroDivisionError(_BY_ZERO)
            return _binary(prim, input, other, name)
    try:
        a, b = promote(input, other, op=name)
    except TypeError:  # (an array: numpy_operands)
        if has_array(input, other):
            return operate(lambda x, y: _divide(prim, x, y, name), input, other, name)
        raise
    if not a._dtype.is_floating_point:
        check_nonzero(b, ZeroDivisionError, _BY_ZERO)
    return apply(prim, a, b)


@method("floor_divide")
def floor_divide(input, other) -> Tensor:
    return _divide(P["floor_divide"], input, other, "floor_divide")


@method("remainder")
def remainder(input, other) -> Tensor:
    return _divide(P["remainder"], input, other, "remainder")


@method("pow")
def pow(input, exponent) -> Tensor:
    if isinstance(input, Tensor) and isinstance(exponent, int | float) and exponent == 2:
        return mul(input, input)  # exact and cheaper; the gradient 2x is the same
    if isinstance(input, Tensor) and isinstance(exponent, int | float) and input._dtype.is_floating_point:
        special = _special_power(input, exponent)
        if special is not None:
            return special
    if isinstance(input, Tensor) and (input._dtype.is_floating_point or exponent.__class__ is int and exponent >= 0):
        return _binary(P["pow"], input, exponent, "pow")
    try:
        a, b = promote(input, exponent, op="pow")
    except TypeError:  # (an array: numpy_operands)
        if has_array(input, exponent):
            return operate(pow, input, exponent, "pow")
        raise
    if a._dtype.category == dt.INTEGER:  # numpy's (eager's) error; a check, so compiled calls raise it too
        check_range(b, 0, None, ValueError, "Integers to negative integer powers are not allowed.")
    return apply(P["pow"], a, b)


def _special_power(input: Tensor, exponent: float) -> Tensor | None:
    """``input ** exponent`` for the exponents PyTorch computes without ``pow`` (and so with its
    results: ``x ** -0.5`` is ``rsqrt``, -inf at -0.0, where C's pow gives +inf), else None. Speed
    too: numpy's pow takes a slow path for a negative base, 7.8 ms against 0.2 for ``x ** 3.0`` over
    131,072 float32 values of both signs (GELU's tanh form, makemore's and minGPT's)."""
    if exponent == 3:
        return mul(mul(input, input), input)
    if exponent == 0.5:
        return sqrt(input)
    if exponent == -0.5:
        return rsqrt(input)
    if exponent == -1:
        return reciprocal(input)
    if exponent == -2:
        return reciprocal(mul(input, input))
    return None


@method("square")
def square(input: Tensor) -> Tensor:
    return mul(input, input)


@method("neg", "negative", "__neg__")
def neg(input: Tensor) -> Tensor:
    if input._dtype is dt.bool_:
        raise TypeError("negation, the `-` operator, on a bool tensor is not supported; use logical_not() or `~`")
    return apply(P["neg"], input)


negative = neg


@method("abs", "__abs__")
def abs(input: Tensor) -> Tensor:
    return apply(P["abs"], input)


@method("sign")
def sign(input: Tensor) -> Tensor:
    return apply(P["sign"], input)


def _public(op, name: str, doc: str):
    """Name a generated op, document it and bind it as a Tensor method."""
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    return method(name)(op)


def _float_unary(name: str):
    prim = P[name]

    def op(input: Tensor) -> Tensor:
        return _unary_float(prim, input)

    return _public(op, name, f"Elementwise {name}; integer inputs compute in the default float dtype.")


exp = _float_unary("exp")
expm1 = _float_unary("expm1")
log = _float_unary("log")
log1p = _float_unary("log1p")
sqrt = _float_unary("sqrt")
rsqrt = _float_unary("rsqrt")
sin = _float_unary("sin")
cos = _float_unary("cos")
tanh = _float_unary("tanh")
sigmoid = _float_unary("sigmoid")
erf = _float_unary("erf")


@method("log2")
def log2(input: Tensor) -> Tensor:
    return mul(log(input), 1.0 / math.log(2.0))


@method("log10")
def log10(input: Tensor) -> Tensor:
    return mul(log(input), 1.0 / math.log(10.0))


@method("reciprocal")
def reciprocal(input: Tensor) -> Tensor:
    return _float_binary(_div, 1, input, "reciprocal")


@method("floor")
def floor(input: Tensor) -> Tensor:
    return input if not input._dtype.is_floating_point else apply(P["floor"], input)


@method("ceil")
def ceil(input: Tensor) -> Tensor:
    return input if not input._dtype.is_floating_point else apply(P["ceil"], input)


@method("trunc")
def trunc(input: Tensor) -> Tensor:
    return where(lt(input, 0), ceil(input), floor(input))


@method("round")
def round(input: Tensor, *, decimals: int = 0) -> Tensor:
    """Round half to even, as PyTorch does; ``decimals`` scales by 10**decimals first."""
    if not input._dtype.is_floating_point:
        return input
    if decimals == 0:
        return apply(P["round"], input)
    scale = 10.0**decimals
    return div(apply(P["round"], mul(input, scale)), scale)


# ----------------------------------------------------------------------------- activations
@method("relu")
def relu(input: Tensor) -> Tensor:
    # where(x <= 0, 0, x), not maximum(x, 0): maximum splits the gradient at 0 (PyTorch gives 0
    # there), and `x > 0` as the condition would turn nan into 0 (PyTorch keeps nan).
    out = relu_eager(input)  # one autograd node on plain float CPU tensors, eagerly
    if out is not None:
        return out
    if isinstance(input, Tensor) and input._dtype.category != dt.BOOL:
        # le() and where() without their promotion: 0 is a zero of x's dtype for both (two of them,
        # made in the order le() and where() make them, so a traced graph is the same as theirs)
        below = apply(_le, input, scalar_tensor(0, input._dtype, input._device))
        return apply(_where, below, scalar_tensor(0, input._dtype, input._device), input)
    return where(le(input, 0), 0, input)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@in_float32
@compiled_composite("gelu")
@composite("gelu")
def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x); ``approximate="tanh"`` uses the tanh formula, as ``torch.nn.functional.gelu``.

    Written as x (1/2 + f(x) / 2) (a multiply-add and a multiply, compiled) and the tanh form's
    argument as x (c + c' x^2): PyTorch's values to rounding in two fewer operations per element
    (a compiled tanh-GELU is bound by its arithmetic), and the backward keeps x, which it needs
    anyway, rather than x / 2."""
    if approximate == "none":
        return mul(input, add(mul(erf(mul(input, 1.0 / math.sqrt(2.0))), 0.5), 0.5))
    if approximate == "tanh":
        out = gelu_tanh_eager(input, _GELU_CUBIC, _SQRT_2_OVER_PI, _gelu_tanh)  # (None: the ops run)
        return _gelu_tanh(input) if out is None else out
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


_GELU_CUBIC = _SQRT_2_OVER_PI * 0.044715


def _gelu_tanh(input: Tensor) -> Tensor:
    """The tanh form of gelu with ops (``gelu_arrays`` computes the same on the arrays)."""
    inner = mul(input, add(mul(mul(input, input), _GELU_CUBIC), _SQRT_2_OVER_PI))
    return mul(input, add(mul(tanh(inner), 0.5), 0.5))


@in_float32
def silu(input: Tensor) -> Tensor:
    return mul(input, sigmoid(input))


@in_float32
def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (PyTorch's rule).

    Written as relu(bx) + log1p(exp(-|bx|)) so that nothing overflows: a where() whose unselected
    branch is inf would still send nan into the gradient (0 * inf). |bx| is where(bx > 0, bx, -bx)
    rather than abs(), whose subgradient 0 at 0 would make the gradient there 0 instead of 1/2.
    """
    bx = mul(input, beta)
    magnitude = where(gt(bx, 0), bx, neg(bx))
    smooth = div(add(log1p(exp(neg(magnitude))), relu(bx)), beta)
    return where(gt(bx, threshold), input, smooth)


# ----------------------------------------------------------------------------- min, max, where
@method("clamp", "clip")
def clamp(input: Tensor, min=None, max=None) -> Tensor:
    """Limit to [min, max]. The gradient is 1 inside and on the bounds, as in PyTorch; nan stays nan,
    and its gradient is 0 (PyTorch's: nan is not within the bounds); a nan bound makes every value nan."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of 'min' or 'max' must not be None")
    out = clamp_eager(input, min, max)
    if out is not None:
        return out
    if any(isinstance(b, float) and math.isnan(b) for b in (min, max)):  # nan everywhere, no gradient
        return where(ne(input, math.nan), _bound_like(math.nan, input), input)
    out = input
    if min is not None:
        out = where(lt(out, min), _bound_like(min, out), out)
    if max is not None:
        out = where(gt(out, max), _bound_like(max, out), out)
    if out._requires_grad and input._requires_grad and input._dtype.is_floating_point:
        out = where(isnan(input), input.detach(), out)  # the same values; no gradient through nan
    return out


clip = clamp


def _bound_like(bound, like: Tensor):
    return bound if isinstance(bound, Tensor) else scalar_tensor(bound, dt.result_type(like, bound), like._device)


@method("maximum")
def maximum(input, other) -> Tensor:
    return _binary(P["maximum"], input, other, "maximum")


@method("minimum")
def minimum(input, other) -> Tensor:
    return _binary(P["minimum"], input, other, "minimum")


def where(condition: Tensor, input, other) -> Tensor:
    """``input`` where ``condition`` holds, else ``other``; numbers are allowed for either."""
    if not isinstance(condition, Tensor):
        raise TypeError(f"where(): argument 'condition' must be a Tensor, not {type(condition).__name__}")
    if condition._dtype is not dt.bool_:
        raise TypeError(
            f"where expected condition to be a boolean tensor, but got a tensor with dtype {condition._dtype.name}"
        )
    if isinstance(input, Tensor) and isinstance(other, Tensor) and input._dtype is other._dtype:
        return apply(P["where"], condition, input, other)
    if not isinstance(input, Tensor) and not isinstance(other, Tensor):
        input = scalar_tensor(input, dt.result_type(input, other), condition._device)
    a, b = promote(input, other, op="where")
    return apply(P["where"], condition, a, b)


@method("where")
def _where_method(self: Tensor, condition: Tensor, other) -> Tensor:
    return where(condition, self, other)


# ----------------------------------------------------------------------------- comparisons, logic
def _comparison(name: str):
    prim = P[name]

    def op(input, other) -> Tensor:
        return _binary(prim, input, other, name)

    return _public(op, name, f"Elementwise {name}, computed in the promoted dtype; the result is bool.")


eq = _comparison("eq")
ne = _comparison("ne")
lt = _comparison("lt")
le = _comparison("le")
gt = _comparison("gt")
ge = _comparison("ge")


@method("equal")
def equal(input: Tensor, other: Tensor) -> bool:
    """True when both have the same shape and elements (a Python bool, as in PyTorch)."""
    return tuple(input.shape) == tuple(other.shape) and bool(eq(input, other).all())


def _logical(name: str):
    prim = P[name]

    def op(input, other) -> Tensor:
        if not isinstance(input, Tensor):
            input = as_tensor_arg(input, other)
        other = as_tensor_arg(other, input)
        return apply(prim, cast(input, dt.bool_), cast(other, dt.bool_))

    return _public(op, name, f"Elementwise {name} of the operands' truth values; the result is bool.")


logical_and = _logical("logical_and")
logical_or = _logical("logical_or")
logical_xor = _logical("logical_xor")


@method("logical_not")
def logical_not(input: Tensor) -> Tensor:
    return apply(P["logical_not"], cast(input, dt.bool_))


@method("isnan")
def isnan(input: Tensor) -> Tensor:
    return ne(input, input)


@method("isinf")
def isinf(input: Tensor) -> Tensor:
    if not input._dtype.is_floating_point:
        return ne(input, input)  # all False, with the right shape and device
    return eq(abs(input), math.inf)


@method("isfinite")
def isfinite(input: Tensor) -> Tensor:
    if not input._dtype.is_floating_point:
        return eq(input, input)
    return lt(abs(input), math.inf)  # false for inf and nan


@method("lerp")
def lerp(input: Tensor, end: Tensor, weight) -> Tensor:
    return add(input, mul(sub(end, input), weight))


# ----------------------------------------------------------------------------- Python operators
def _operator(prim, name: str):
    """``self + other`` and the like: ``_binary``'s fast path inlined, one Python call fewer than
    ``add(self, other)`` on the most common ops (~0.04 us of a ~0.9 us one-element add)."""

    def op(self: Tensor, other) -> Tensor:
        if isinstance(other, Tensor) and self._dtype is other._dtype:
            return apply(prim, self, other)
        return _binary(prim, self, other, name)

    return op


_OPERATORS = {
    "__add__": _operator(_add, "add"), "__radd__": lambda a, b: add(b, a),
    "__sub__": _operator(_sub, "sub"), "__rsub__": lambda a, b: sub(b, a),
    "__mul__": _operator(_mul, "mul"), "__rmul__": lambda a, b: mul(b, a),
    "__truediv__": div, "__rtruediv__": lambda a, b: div(b, a),
    "__floordiv__": floor_divide, "__rfloordiv__": lambda a, b: floor_divide(b, a),
    "__mod__": remainder, "__rmod__": lambda a, b: remainder(b, a),
    "__pow__": pow, "__rpow__": lambda a, b: pow(b, a),
    "__eq__": eq, "__ne__": ne, "__lt__": lt, "__le__": le, "__gt__": gt, "__ge__": ge,
}  # fmt: skip
for _name, _fn in _OPERATORS.items():
    method(_name)(_fn)  # (``& | ^ ~ << >>``: bitwise.py)


@method("__pos__")
def _pos(self: Tensor) -> Tensor:
    return self


# ----------------------------------------------------------------------------- in-place forms
def _inplace(fn, name: str):
    def op(self: Tensor, *args, **kwargs) -> Tensor:
        return commit_inplace(self, fn(self, *args, **kwargs), op=name)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"In-place {fn.__name__}: writes the result into ``self`` and returns it."
    return op


_INPLACE = {
    "add": add, "sub": sub, "mul": mul, "div": div, "floor_divide": floor_divide, "remainder": remainder,
    "pow": pow, "square": square, "neg": neg, "abs": abs, "sign": sign, "exp": exp, "expm1": expm1, "log": log,
    "log1p": log1p, "sqrt": sqrt, "rsqrt": rsqrt, "reciprocal": reciprocal, "sin": sin, "cos": cos,
    "tanh": tanh, "sigmoid": sigmoid, "relu": relu, "erf": erf, "floor": floor, "ceil": ceil, "round": round,
    "trunc": trunc, "clamp": clamp, "clip": clamp, "lerp": lerp, "logical_not": logical_not,
    "eq": eq, "ne": ne, "lt": lt, "le": le, "gt": gt, "ge": ge,
}  # fmt: skip
for _name, _fn in _INPLACE.items():
    method(_name + "_")(_inplace(_fn, _name + "_"))


def _augmented(fn, name: str):
    """``t += other``: in place, except with a numpy array, where PyTorch's ``t += a`` is ``t = t + a``
    (a new tensor, of numpy's dtype: numpy computes it), which NotImplemented makes Python do."""

    def op(self: Tensor, other) -> Tensor:
        if isinstance(other, np.ndarray):
            return NotImplemented
        return commit_inplace(self, fn(self, other), op=name)

    op.__name__ = op.__qualname__ = name
    return op


_AUGMENTED = {"__iadd__": add, "__isub__": sub, "__imul__": mul, "__itruediv__": div,
              "__ifloordiv__": floor_divide, "__imod__": remainder, "__ipow__": pow}  # fmt: skip
for _name, _fn in _AUGMENTED.items():
    method(_name)(_augmented(_fn, _name))
