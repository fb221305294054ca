"""kiln's dtypes and PyTorch's type-promotion rules.

A ``DType`` names an element type once for every layer: the IR prints it (``f32``), eager
kernels read its numpy dtype, and promotion works on its category (bool < integer < float).

>>> promote_types(int32, float16) is float16
True
>>> promote_types(int64, float16) is float16  # the category decides, not the size (numpy: float64)
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BOOL, INTEGER, FLOATING = 0, 1, 2


@dataclass(frozen=True, eq=False)
class DType:
    name: str  # PyTorch's name: "float32"
    short: str  # the IR's name: "f32"
    np: np.dtype
    category: int  # BOOL, INTEGER or FLOATING

    @property
    def itemsize(self) -> int:
        return self.np.itemsize

    @property
    def is_floating_point(self) -> bool:
        return self.category == FLOATING

    @property
    def is_signed(self) -> bool:
        return self.category != BOOL and self.np.kind != "u"

    def __repr__(self) -> str:
        return f"kiln.{self.name}"

    def __reduce__(self) -> str:  # dtypes are singletons, also across pickling
        return self.name


bool_ = DType("bool", "bool", np.dtype(np.bool_), BOOL)
uint8 = DType("uint8", "u8", np.dtype(np.uint8), INTEGER)
int8 = DType("int8", "i8", np.dtype(np.int8), INTEGER)
int16 = DType("int16", "i16", np.dtype(np.int16), INTEGER)
int32 = DType("int32", "i32", np.dtype(np.int32), INTEGER)
int64 = DType("int64", "i64", np.dtype(np.int64), INTEGER)
float16 = DType("float16", "f16", np.dtype(np.float16), FLOATING)
float32 = DType("float32", "f32", np.dtype(np.float32), FLOATING)
float64 = DType("float64", "f64", np.dtype(np.float64), FLOATING)

ALL_DTYPES = (bool_, uint8, int8, int16, int32, int64, float16, float32, float64)
FLOAT_DTYPES = (float16, float32, float64)
INT_DTYPES = (uint8, int8, int16, int32, int64)
BY_NAME = {d.name: d for d in ALL_DTYPES} | {d.short: d for d in ALL_DTYPES}
_BY_NUMPY = {d.np: d for d in ALL_DTYPES}

# PyTorch-style aliases, exported as kiln.float, kiln.long, ...
ALIASES = {
    "float": float32, "double": float64, "half": float16,
    "long": int64, "int": int32, "short": int16, "bool": bool_,
}  # fmt: skip


def from_numpy_dtype(dtype: np.dtype) -> DType:
    """The kiln dtype of a numpy dtype; a clear error for types kiln has not (complex, str)."""
    try:
        return _BY_NUMPY[np.dtype(dtype)]
    except KeyError:
        if np.dtype(dtype).name == "bfloat16":  # an ml_dtypes array met before kiln.bfloat16 was asked for
            return bfloat16_dtype()
        supported = ", ".join(d.name for d in ALL_DTYPES)
        raise TypeError(f"kiln does not support numpy dtype {np.dtype(dtype)}; expected one of: {supported}") from None


def as_dtype(dtype: object) -> DType:
    """Accept a kiln dtype, its name ("float32", "f32"), a numpy dtype or a Python type."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str) and dtype in BY_NAME:
        return BY_NAME[dtype]
    if dtype in ("bfloat16", "bf16"):
        return bfloat16_dtype()
    if dtype is float:
        return float32
    if dtype is int:
        return int64
    if dtype is bool:
        return bool_
    try:
        return from_numpy_dtype(np.dtype(dtype))  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"expected a kiln dtype such as kiln.float32, got {dtype!r}") from None


def _promote_same_category(a: DType, b: DType) -> DType:
    if a is b:
        return a
    # numpy's table agrees with PyTorch's for pairs of bool/int/float of the same category,
    # and for uint8 with signed ints (-> the next wider signed int).
    return _BY_NUMPY[np.promote_types(a.np, b.np)]


def promote_types(a: DType, b: DType) -> DType:
    """PyTorch's ``torch.promote_types``: the smallest dtype both can be cast to safely."""
    if a is b:
        return a
    if a.category != b.category:
        hi, lo = (a, b) if a.category > b.category else (b, a)
        return hi  # float16 + int64 -> float16 (PyTorch), not float64 (numpy)
    if a.itemsize == b.itemsize == 2 and a.category == FLOATING:
        return float32  # bfloat16 with float16: neither holds the other (PyTorch: float32)
    return _promote_same_category(a, b)


_default_dtype = float32


def get_default_dtype() -> DType:
    return _default_dtype


def set_default_dtype(dtype: DType) -> None:
    global _default_dtype
    dtype = as_dtype(dtype)
    if not dtype.is_floating_point:
        raise TypeError(f"default dtype must be a floating point dtype, got {dtype.name}")
    _default_dtype = dtype


def scalar_dtype(value: object) -> DType:
    """The dtype PyTorch gives a Python scalar on its own: bool, int64 or the default float."""
    if isinstance(value, bool | np.bool_):
        return bool_
    if isinstance(value, int | np.integer):
        return int64
    if isinstance(value, float | np.floating):
        return _default_dtype
    raise TypeError(f"expected a Python number, got {type(value).__name__}")


def result_type(*operands: object) -> DType:
    """PyTorch's ``torch.result_type`` over tensors and Python scalars.

    Operands are ranked by priority: tensors with dimensions, then zero-dimensional tensors,
    then Python scalars. A lower-priority group changes the result only when it holds a higher
    category (int -> float), and then only to that category's dtype within the group.
    An operand is anything with ``dtype`` and ``ndim`` attributes, or a Python number.
    """
    dims: DType | None = None
    zero_dims: DType | None = None
    scalars: DType | None = None
    for x in operands:
        dt = getattr(x, "dtype", None)
        if isinstance(dt, DType):
            if x.ndim:  # type: ignore[attr-defined]
                dims = dt if dims is None else promote_types(dims, dt)
            else:
                zero_dims = dt if zero_dims is None else promote_types(zero_dims, dt)
        else:
            sd = scalar_dtype(x)
            scalars = sd if scalars is None else promote_types(scalars, sd)
    result = dims
    for group in (zero_dims, scalars):
        if group is None:
            continue
        if result is None or group.category > result.category:
            result = group
    assert result is not None, "result_type needs at least one operand"
    return result


def float_to_int(xp, x, dtype: DType):
    """Float -> integer conversion with no undefined behaviour: truncate toward zero, then wrap
    modulo 2**bits into narrower types (what PyTorch gives for in-range values on x86-64); nan
    becomes 0 and values beyond int64 saturate. Float -> bool is ``x != 0``."""
    if dtype is bool_:
        return x != 0
    limit = 9.2e18  # the largest float64 below 2**63, so the int64 conversion is defined
    x = xp.clip(xp.nan_to_num(x.astype(np.float64), nan=0.0, posinf=limit, neginf=-limit), -limit, limit)
    return x.astype(np.int64).astype(dtype.np)


# ------------------------------------------------------------------ bfloat16 (serial)
# bfloat16 arrays are ml_dtypes' numpy dtype. The DType is made when first asked for (kiln.bfloat16,
# as_dtype("bfloat16"), a bfloat16 array or file met), so `import kiln` neither needs ml_dtypes nor pays
# for importing it. Once made it is registered like the others (BY_NAME, from_numpy_dtype); ALL_DTYPES
# and FLOAT_DTYPES stay the dtypes every kernel handles natively.
_bfloat16: DType | None = None


def bfloat16_dtype() -> DType:
    """``kiln.bfloat16``; ImportError saying what to install when ml_dtypes is missing."""
    global _bfloat16
    if _bfloat16 is None:
        try:
            import ml_dtypes  # noqa: PLC0415
        except ImportError:
            raise ImportError(
                "kiln.bfloat16 stores its values through the ml_dtypes package, which is not installed: "
                "pip install 'kiln[bf16]' (or pip install ml_dtypes)"
            ) from None
        from .primitives.widen import widen_kernels  # noqa: PLC0415 - primitives import this module

        made = DType("bfloat16", "bf16", np.dtype(ml_dtypes.bfloat16), FLOATING)
        widen_kernels(made.np)  # before anyone can make a bfloat16 tensor: kernels compute in float32
        BY_NAME["bfloat16"] = BY_NAME["bf16"] = made
        _BY_NUMPY[made.np] = made
        _bfloat16 = made
    return _bfloat16


def __getattr__(name: str) -> DType:
    if name == "bfloat16":
        return bfloat16_dtype()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
