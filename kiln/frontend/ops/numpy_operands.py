"""A tensor and a numpy array in one operator (``t + np.ones(3)``), with PyTorch's results.

PyTorch's arithmetic operators take no ndarray: ``t + a`` gives way to numpy, which computes on the
tensor's array and wraps its result as a tensor (``Tensor.__array_wrap__``). What a ported program
sees, measured with torch 2.13 and numpy 2, and what kiln gives:

- ``t + a``, ``-``, ``*``, ``/``, ``//``, ``%``, ``**``, ``@``, ``&``, ``|``, ``^``, ``<<``, ``>>``:
  a tensor of *numpy's* result dtype for the two dtypes (``float32`` with ``float64[3]`` is float64,
  ``float16`` with ``int64`` is float64; a 0-d array is an array, not a weak scalar, as in NEP 50),
  a bool result as uint8 (``__array_wrap__`` makes it so); where numpy has no loop (``bool - bool``,
  ``float & float``) numpy's TypeError;
- ``t == a`` (and ``a == t``): PyTorch's own ``eq``, the array taken as a tensor (PyTorch's promotion);
- ``a / t``: PyTorch's ``__rtruediv__``, ``reciprocal(t) * a``;
- ``a + t`` and the other reflected forms, and ``t < a``, ``<=``, ``>``, ``>=``: a TypeError;
- ``t += a``: not in place but ``t = t + a``, a new tensor (``elementwise._augmented``).

kiln computes them with its ops on the array as a tensor (``as_tensor``, so a traced call reads the
array at each compiled call), casting first to the dtype numpy would compute in. Two differences from
PyTorch, on cases where PyTorch's result is an accident rather than a meaning: a tensor that requires
grad is accepted (the gradient flows through the cast; PyTorch refuses to make it a numpy array), and
``t != a`` is the elementwise complement of ``t == a`` (PyTorch's is Python's fallback, ``True``).
Functional forms (``kiln.add(t, a)``) take an array the same way, where PyTorch's raise a TypeError.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...ir import dtypes as dt
from ..tensor import Tensor
from ._util import cast
from .creation import as_tensor

#: The numpy function that PyTorch's operator falls back to, by kiln op name.
_UFUNCS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "floor_divide": np.floor_divide,
    "remainder": np.remainder, "pow": np.power, "matmul": np.matmul, "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor, "bitwise_left_shift": np.left_shift,
    "bitwise_right_shift": np.right_shift,
}  # fmt: skip
_SYMBOLS = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "floor_divide": "//", "remainder": "%", "pow": "**",
    "matmul": "@", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "bitwise_and": "&", "bitwise_or": "|",
    "bitwise_xor": "^", "bitwise_left_shift": "<<", "bitwise_right_shift": ">>",
}  # fmt: skip
_ORDERINGS = frozenset({"lt", "le", "gt", "ge"})


def has_array(a, b) -> bool:
    """Whether either operand is a numpy array: asked only where the ops' promotion refused an operand
    (a TypeError, free to catch when none is raised), so no op pays for it otherwise."""
    return isinstance(a, np.ndarray) or isinstance(b, np.ndarray)


def operate(fn: Callable, a, b, name: str):
    """``fn(a, b)`` (the kiln op ``name``) where ``a`` or ``b`` is a numpy array, as PyTorch's operator."""
    symbol = _SYMBOLS.get(name, name)
    if not isinstance(a, Tensor):  # a reflected operator: ``array + t`` calls Tensor.__radd__
        if isinstance(b, Tensor) and name in ("eq", "ne"):
            return fn(b, a)
        if isinstance(b, Tensor) and name == "div":  # PyTorch's __rtruediv__: reciprocal(t) * array
            return fn(1, b) * a
        raise TypeError(f"unsupported operand type(s) for {symbol}: '{type(a).__name__}' and '{type(b).__name__}'")
    if isinstance(b, Tensor):
        raise TypeError(f"{name}(): expected a Tensor or a number as the first operand, got {type(a).__name__}")
    if name in ("eq", "ne"):
        return fn(a, as_tensor(b, device=a._device))
    if name in _ORDERINGS:
        raise TypeError(f"'{symbol}' not supported between instances of 'Tensor' and '{type(b).__name__}'")
    ufunc = _UFUNCS.get(name)
    if ufunc is None:
        raise TypeError(f"{name}(): argument 'other' must be Tensor, not {type(b).__name__}")
    computed = ufunc.resolve_dtypes((a._dtype.np, b.dtype, None))  # numpy's TypeError where it has no loop
    try:
        dtype = dt.from_numpy_dtype(computed[0])
    except TypeError:
        raise TypeError(f"a tensor {symbol} a numpy array of {b.dtype}: kiln has no {computed[0]} tensors") from None
    out = fn(cast(a, dtype), as_tensor(b, dtype=dtype, device=a._device))
    return cast(out, dt.uint8) if out._dtype is dt.bool_ else out  # (PyTorch's __array_wrap__ makes bool uint8)
