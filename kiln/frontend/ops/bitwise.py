"""Bit ops with PyTorch's semantics: ``& | ^ ~ << >>``, their ``bitwise_*`` functions, methods and
in-place forms (``&=``, ``bitwise_left_shift_``...), on every integer dtype and bool.

Operands promote as PyTorch's (``int8_tensor & 1`` stays int8, the number wrapping into it;
``bool_tensor & 1`` is int64); a floating point operand raises PyTorch's NotImplementedError (a
RuntimeError). On bool results ``& | ^ ~`` are the logical primitives, which fused kernels of masks
already hold; on integers they are the bit primitives of ``kiln/ir/primitives/bitwise.py``, which
compile. Shifts take integers only (bool << bool is refused, as in PyTorch) and define every count:
one below zero or at least the width shifts every bit out (0, or the sign fill for ``>>``).
"""

from __future__ import annotations

from ...ir import dtypes as dt
from ...ir.primitives import P
from ..dispatch import apply
from ..tensor import Tensor, method
from ._util import promote, scalar_tensor
from .elementwise import logical_and, logical_not, logical_or, logical_xor
from .inplace import commit_inplace
from .numpy_operands import has_array, operate

__all__ = ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift"]

#: PyTorch's names of the dtypes its "not implemented for" errors give.
_TORCH_NAMES = {dt.float16: "Half", dt.float32: "Float", dt.float64: "Double", dt.bool_: "Bool"}


def _refuse(kernel: str, dtype: dt.DType):
    raise NotImplementedError(f"\"{kernel}_cpu\" not implemented for '{_TORCH_NAMES.get(dtype, dtype.name)}'")


def _bits(name: str, prim, logical, kernel: str):
    """The function ``name``: ``logical`` on two bools, ``prim`` on integers after PyTorch's promotion."""

    def op(input, other) -> Tensor:
        if isinstance(input, Tensor) and isinstance(other, Tensor) and input._dtype is other._dtype:
            dtype = input._dtype  # (the common case: no promotion)
            operands: tuple[Tensor, ...] = (input, other)
        elif isinstance(input, Tensor) and other.__class__ is bool and input._dtype is dt.bool_ and logical is not None:
            return logical(input, other)  # ``mask | True``: promote's path costs ~1.4 us more
        elif isinstance(input, Tensor) and other.__class__ is int and input._dtype.category == dt.INTEGER:
            dtype = input._dtype  # ``t & 0xFF``: the number wraps into the tensor's dtype, as promote's would
            operands = (input, scalar_tensor(other, dtype, input._device))
        else:
            try:
                operands = promote(input, other, op=name)
            except TypeError:  # ``t & np.array(...)``: numpy's result, as PyTorch's operator gives
                if has_array(input, other):
                    return operate(op, input, other, name)
                raise
            dtype = operands[0]._dtype
        if dtype is dt.bool_ and logical is not None:
            return logical(*operands)
        if dtype.category == dt.FLOATING or dtype is dt.bool_:
            _refuse(kernel, dtype)
        return apply(prim, *operands)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Elementwise ``{name}`` of integers or bools, with PyTorch's promotion (the module docstring)."
    return method(name)(op)


bitwise_and = _bits("bitwise_and", P["bitwise_and"], logical_and, "bitwise_and")
bitwise_or = _bits("bitwise_or", P["bitwise_or"], logical_or, "bitwise_or")
bitwise_xor = _bits("bitwise_xor", P["bitwise_xor"], logical_xor, "bitwise_xor")
bitwise_left_shift = _bits("bitwise_left_shift", P["shift_left"], None, "lshift")
bitwise_right_shift = _bits("bitwise_right_shift", P["shift_right"], None, "rshift")


@method("bitwise_not")
def bitwise_not(input: Tensor) -> Tensor:
    """Every bit flipped; logical not on bool."""
    if input._dtype is dt.bool_:
        return logical_not(input)
    if input._dtype.category == dt.FLOATING:
        _refuse("bitwise_not", input._dtype)
    return apply(P["bitwise_not"], input)


@method("__invert__")
def _invert(self: Tensor) -> Tensor:
    if self._dtype.category == dt.FLOATING:
        raise TypeError("~ (operator.invert) is only implemented on integer and Boolean-type tensors")
    return bitwise_not(self)


# ----------------------------------------------------------------------------- operators and in-place forms
_FUNCTIONS = {"and": bitwise_and, "or": bitwise_or, "xor": bitwise_xor, "lshift": bitwise_left_shift,
              "rshift": bitwise_right_shift}  # fmt: skip


def _reflected(fn):
    return lambda self, other: fn(other, self)


def _inplace(fn, name: str):
    def op(self: Tensor, other) -> Tensor:
        return commit_inplace(self, fn(self, other), op=name)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"In-place ``{fn.__name__}``: writes the result into ``self`` and returns it."
    return op


def _augmented(fn, name: str):
    """``t &= other``: in place, except with a numpy array, where PyTorch's is ``t = t & a`` (as ``+=``)."""
    inplace = _inplace(fn, name)

    def op(self: Tensor, other) -> Tensor:
        return NotImplemented if has_array(self, other) else inplace(self, other)

    op.__name__ = op.__qualname__ = name
    return op


for _symbol, _fn in _FUNCTIONS.items():
    method(f"__{_symbol}__")(_fn)
    method(f"__r{_symbol}__")(_reflected(_fn))
    method(f"__i{_symbol}__")(_augmented(_fn, f"__i{_symbol}__"))
for _fn in (bitwise_and, bitwise_or, bitwise_xor, bitwise_left_shift, bitwise_right_shift):
    method(_fn.__name__ + "_")(_inplace(_fn, _fn.__name__ + "_"))
method("bitwise_not_")(lambda self: commit_inplace(self, bitwise_not(self), op="bitwise_not_"))
