"""PyTorch names that ported programs use, over kiln's existing ops: sorting and top-k, closeness,
``addcmul``/``addcdiv``, ``repeat_interleave``, ``meshgrid``, ``Tensor.type``/``view_as``, the
legacy tensor-type constructors (``LongTensor``...), memory formats, and type predicates.

Sorting orders with the ``argsort`` primitive (a stable sort, run as an extern node when compiled)
and gathers the values, so they carry their gradient (through ``gather``); a traced call that sorts
or takes the top k compiles.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import numpy as np

from ...ir import dtypes as dt
from ...ir.primitives import P
from ..dispatch import apply
from ..tensor import Tensor, make_tensor, method
from . import creation, indexing

__all__ = [
    "sort", "argsort", "topk", "isclose", "allclose", "addcmul", "addcdiv", "repeat_interleave", "meshgrid",
    "is_complex", "is_floating_point", "numel", "conj", "conj_physical", "resolve_conj", "resolve_neg",
    "LongTensor", "FloatTensor", "DoubleTensor", "IntTensor", "BoolTensor", "ByteTensor", "ShortTensor",
    "HalfTensor", "CharTensor", "preserve_format", "contiguous_format", "channels_last", "channels_last_3d",
    "memory_format", "view_as_real", "view_as_complex", "finfo", "iinfo",
]  # fmt: skip

SortResult = namedtuple("sort", ["values", "indices"])  # type: ignore[name-match]  # PyTorch's type name (torch.return_types)
TopkResult = namedtuple("topk", ["values", "indices"])  # type: ignore[name-match]


def _order(input: Tensor, dim: int, descending: bool) -> Tensor:
    """A stable order along ``dim`` (ties keep their positions, nan as the largest value, as torch's
    CPU sort): the ``argsort`` primitive, which a compiled program runs as an extern node."""
    return apply(P["argsort"], input.detach(), axis=dim, descending=bool(descending))


@method("sort")
def sort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
    """Values sorted along ``dim`` and their positions (ties keep their order), as ``torch.sort``."""
    return _sort(input, dim, descending)


@method("argsort")
def argsort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    return _sort(input, dim, descending).indices


def _sort(input: Tensor, dim: int, descending: bool):
    if input.ndim == 0:
        return SortResult(input.clone(), creation.zeros((), dtype=dt.int64))
    index = _order(input, dim, descending)
    return SortResult(indexing.gather(input, dim, index), index)


@method("topk")
def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002
    """The ``k`` largest (or smallest) entries along ``dim`` and their positions, as ``torch.topk``."""
    size = input.shape[dim] if input.ndim else 1
    if not 0 <= k <= size:
        raise RuntimeError(f"selected index k out of range: k={k} for a dimension of size {size}")
    if input.ndim == 0:
        return TopkResult(input.clone(), creation.zeros((), dtype=dt.int64))
    index = _order(input, dim, largest).narrow(dim, 0, k)
    return TopkResult(indexing.gather(input, dim, index), index)


def isclose(input: Tensor, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """|input - other| <= atol + rtol * |other| elementwise (infinities equal only to themselves)."""
    other = other if isinstance(other, Tensor) else creation.tensor(other, dtype=input.dtype)
    a, b = input.detach().numpy(), other.detach().numpy()
    return make_tensor(np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan), input.device)


method("isclose")(isclose)


@method("allclose")
def allclose(input: Tensor, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    return bool(isclose(input, other, rtol, atol, equal_nan).all().item())


@method("addcmul")
def addcmul(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """input + value * tensor1 * tensor2."""
    return input + value * tensor1 * tensor2


@method("addcdiv")
def addcdiv(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """input + value * tensor1 / tensor2."""
    return input + value * tensor1 / tensor2


@method("addcmul_")
def addcmul_(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    return input.add_(value * tensor1 * tensor2)


@method("addcdiv_")
def addcdiv_(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    return input.add_(value * tensor1 / tensor2)


@method("repeat_interleave")
def repeat_interleave(input: Tensor, repeats=None, dim: int | None = None, *, output_size: int | None = None):
    """Each element (or slice along ``dim``) repeated ``repeats`` times in place, as in torch."""
    if repeats is None:  # torch.repeat_interleave(repeats): the positions, each repeated by its count
        counts = input.detach().numpy()
        return make_tensor(np.repeat(np.arange(len(counts), dtype=np.int64), counts), input.device)
    if dim is None:
        input, dim = input.reshape(-1), 0
    counts = repeats.detach().numpy() if isinstance(repeats, Tensor) else repeats
    index = np.repeat(np.arange(input.shape[dim], dtype=np.int64), counts)
    if output_size is not None and len(index) != output_size:
        raise RuntimeError(f"repeat_interleave: output_size {output_size} does not match the repeats' sum {len(index)}")
    return indexing.index_select(input, dim, make_tensor(index, input.device))


def meshgrid(*tensors, indexing: str = "ij"):  # noqa: A002 - PyTorch's keyword
    """Coordinate grids of 1-d tensors: ``ij`` (matrix) or ``xy`` (Cartesian: the first two swapped)."""
    if len(tensors) == 1 and isinstance(tensors[0], list | tuple):
        tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"):
        raise ValueError(f"torch.meshgrid: indexing must be one of 'xy' or 'ij', but received: {indexing}")
    sizes = [t.numel() for t in tensors]
    if indexing == "xy" and len(tensors) >= 2:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    grids = []
    for i, t in enumerate(tensors):
        axis = i if indexing == "ij" or len(tensors) < 2 else (1 - i if i < 2 else i)
        view = [1] * len(tensors)
        view[axis] = -1
        grids.append(t.reshape(view).expand(*sizes))
    return tuple(grids)


def is_complex(input: Tensor) -> bool:
    return False  # kiln has no complex dtype


def is_floating_point(input: Tensor) -> bool:
    return input.dtype.category == dt.FLOATING


def numel(input: Tensor) -> int:
    return input.numel()


@method("conj", "conj_physical", "resolve_conj", "resolve_neg")
def conj(input: Tensor) -> Tensor:
    """The complex conjugate: the tensor itself for real dtypes (kiln has no complex dtype)."""
    return input


conj_physical = resolve_conj = resolve_neg = conj

Tensor.is_complex = lambda self: False  # type: ignore[attr-defined]  # bound at import, as @method does
Tensor.is_sparse = property(lambda self: False)  # type: ignore[attr-defined]
Tensor.is_xpu = property(lambda self: False)  # type: ignore[attr-defined]
Tensor.is_mps = property(lambda self: False)  # type: ignore[attr-defined]


@method("view_as")
def view_as(input: Tensor, other: Tensor) -> Tensor:
    return input.view(other.shape)


# ---------------------------------------------------------------------- legacy types and Tensor.type
_LEGACY = {
    "torch.FloatTensor": dt.float32, "torch.DoubleTensor": dt.float64, "torch.HalfTensor": dt.float16,
    "torch.LongTensor": dt.int64, "torch.IntTensor": dt.int32, "torch.ShortTensor": dt.int16,
    "torch.CharTensor": dt.int8, "torch.ByteTensor": dt.uint8, "torch.BoolTensor": dt.bool_,
}  # fmt: skip
_LEGACY_NAME = {v: k for k, v in _LEGACY.items()}


@method("type")
def type_(input: Tensor, dtype=None, non_blocking: bool = False, **kwargs):
    """With no dtype, the legacy type name (``'torch.FloatTensor'``); else the tensor in ``dtype``
    (a kiln dtype, a legacy name string, or a legacy constructor such as ``kiln.LongTensor``)."""
    if dtype is None:
        return _LEGACY_NAME.get(input.dtype, f"torch.{input.dtype.name}")
    if isinstance(dtype, str):
        name = dtype.replace("kiln.", "torch.").replace("torch.cuda.", "torch.")
        if name not in _LEGACY:
            raise ValueError(f"invalid type: '{dtype}'")
        dtype = _LEGACY[name]
    dtype = getattr(dtype, "dtype", dtype)  # kiln.LongTensor and friends carry their dtype
    return input if input.dtype is dtype else input.to(dtype)


class _LegacyType(type):
    dtype: Any  # each legacy type's dtype, set by _legacy

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, Tensor) and obj.dtype is cls.dtype


def _legacy(name: str, dtype) -> type:
    def new(cls, *args, device=None):
        if len(args) == 1 and not isinstance(args[0], int):
            return creation.tensor(args[0], dtype=dtype, device=device)
        return creation.empty(*args, dtype=dtype, device=device)  # sizes: uninitialized, as in torch

    return _LegacyType(name, (), {"dtype": dtype, "__new__": new, "__doc__": f"``kiln.{name}(data or *sizes)``"})


LongTensor, FloatTensor, DoubleTensor = (
    _legacy("LongTensor", dt.int64),
    _legacy("FloatTensor", dt.float32),
    _legacy("DoubleTensor", dt.float64),
)
IntTensor, BoolTensor, ByteTensor = (
    _legacy("IntTensor", dt.int32),
    _legacy("BoolTensor", dt.bool_),
    _legacy("ByteTensor", dt.uint8),
)
ShortTensor, HalfTensor, CharTensor = (
    _legacy("ShortTensor", dt.int16),
    _legacy("HalfTensor", dt.float16),
    _legacy("CharTensor", dt.int8),
)


# ---------------------------------------------------------------------- memory formats
class memory_format:  # noqa: N801 - PyTorch's name
    """A memory format, accepted where PyTorch takes one. kiln keeps C order (contiguous) layouts
    whatever the format asked: a channels-last tensor computes the same values."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"


preserve_format = memory_format("preserve_format")
contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
channels_last_3d = memory_format("channels_last_3d")

_contiguous = Tensor.contiguous  # type: ignore[attr-defined]  # bound by the ops at import


def _contiguous_with_format(self, memory_format=contiguous_format):
    return _contiguous(self)


Tensor.contiguous = _contiguous_with_format  # type: ignore[attr-defined]
Tensor.is_contiguous = (  # type: ignore[method-assign]
    lambda self, memory_format=contiguous_format, _plain=Tensor.is_contiguous: _plain(self)  # type: ignore[misc]
)


def view_as_real(input: Tensor) -> Tensor:
    raise TypeError("view_as_real: kiln has no complex dtype, so there is no complex tensor to view as real")


def view_as_complex(input: Tensor) -> Tensor:
    raise TypeError("view_as_complex: kiln has no complex dtype (complex numbers are not supported yet)")


# ---------------------------------------------------------------------- finfo and iinfo
class finfo:  # noqa: N801 - PyTorch's name
    """Machine limits of a floating dtype (``kiln.finfo(kiln.float32).eps``), as ``torch.finfo``."""

    def __init__(self, type=None) -> None:  # noqa: A002 - PyTorch's keyword
        self.dtype = dt.get_default_dtype() if type is None else type
        if self.dtype.category != dt.FLOATING:
            raise TypeError(f"torch.finfo() requires a floating point input type, got {self.dtype}")
        if self.dtype.name == "bfloat16":
            import ml_dtypes  # noqa: PLC0415 - bfloat16 exists only with it

            info: Any = ml_dtypes.finfo(ml_dtypes.bfloat16)  # numpy's finfo and ml_dtypes' share these fields
        else:
            info = np.finfo(self.dtype.np)
        self.bits, self.eps, self.max, self.min = info.bits, float(info.eps), float(info.max), float(info.min)
        self.tiny = self.smallest_normal = float(info.smallest_normal)
        self.resolution = 10.0 ** -int(info.precision)  # exactly, as torch (not the float32 value)

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution}, min={self.min:g}, max={self.max:g}, eps={self.eps:g}, "
                f"smallest_normal={self.tiny:g}, tiny={self.tiny:g}, dtype={self.dtype.name})")  # fmt: skip


class iinfo:  # noqa: N801 - PyTorch's name
    """Limits of an integer dtype (``kiln.iinfo(kiln.int64).max``), as ``torch.iinfo``."""

    def __init__(self, type) -> None:  # noqa: A002
        self.dtype = type
        if self.dtype.category not in (dt.INTEGER, dt.BOOL):
            raise TypeError(f"torch.iinfo() requires an integer input type, got {self.dtype}")
        info = np.iinfo(np.uint8 if self.dtype.category == dt.BOOL else self.dtype.np)
        self.bits, self.max, self.min = info.bits, int(info.max), int(info.min)

    def __repr__(self) -> str:
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype.name})"
