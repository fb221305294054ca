"""Creating tensors and moving them: tensor, zeros, arange, eye, clone, to(device/dtype)..."""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np

from ...ir import dtypes as dt
from ...ir.primitives import P
from ...ir.types import CPU, Device
from ...ir.types import device as parse_device
from ...runtime.devices import array_namespace, cuda_available, to_device
from ..autograd.grad_mode import no_grad
from ..dispatch import apply
from ..jit import state as _jit
from ..tensor import Tensor, layout, make_tensor, method, sparse_coo, strided
from ._util import cast
from .inplace import commit_inplace

__all__ = [
    "tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "empty", "zeros_like", "ones_like",
    "full_like", "empty_like", "arange", "linspace", "eye", "clone", "scalar_tensor", "layout", "strided",
    "empty_strided",
]  # fmt: skip


def _device(device) -> Device:
    return CPU if device is None else parse_device(device)


def _dtype(dtype, default: dt.DType | None = None) -> dt.DType:
    if dtype is None:
        return default or dt.get_default_dtype()
    return dt.as_dtype(dtype)


def placement(op: str, layout=None, pin_memory: bool = False, memory_format=None, ndim: int | None = None) -> None:
    """Check the keywords PyTorch's factories take about memory (``layout=torch.strided``,
    ``pin_memory=False``, ``memory_format=torch.contiguous_format``), which ported programs pass.

    kiln makes strided tensors in C order: a channels-last format is accepted as a hint (the values
    and shape are the same; the strides stay C order, as ``compat.memory_format`` says) where
    PyTorch's rank rule allows it. ``pin_memory=True`` raises without a GPU, as PyTorch's does, and
    is a no-op with one (kiln copies host arrays to the GPU without pinning them).
    """
    if layout is not None and layout != strided:
        if layout == sparse_coo:
            raise RuntimeError(f"{op}(): kiln makes strided tensors here; make a sparse one with .to_sparse()")
        raise TypeError(f"{op}(): layout must be kiln.strided, got {layout!r}")
    if pin_memory and not cuda_available():
        raise RuntimeError("pin_memory=True requires a CUDA or other accelerator backend; no pinned memory "
                           "allocator is available on this system")  # fmt: skip
    if memory_format is not None:
        name = getattr(memory_format, "name", None)
        if name == "preserve_format" and ndim is not None:
            raise RuntimeError("unsupported memory format Preserve")  # (PyTorch's, for a new tensor)
        if ndim is not None and name in ("channels_last", "channels_last_3d"):
            rank = 4 if name == "channels_last" else 5
            if ndim != rank:
                raise RuntimeError(f"required rank {rank} tensor to use {name} format")
        elif name not in ("preserve_format", "contiguous_format", "channels_last", "channels_last_3d"):
            raise TypeError(f"{op}(): memory_format must be a kiln memory format, got {memory_format!r}")


def out_dtype(out, dtype, op: str) -> dt.DType:
    """The dtype a factory makes for ``out=`` (``out``'s own, which a given ``dtype`` must match), as PyTorch."""
    if not isinstance(out, Tensor):
        raise TypeError(f"{op}(): argument 'out' must be Tensor, not {type(out).__name__}")
    if out._requires_grad:
        raise RuntimeError(f"{op}(): functions with out=... arguments don't support automatic differentiation, "
                           "but one of the arguments requires grad.")  # fmt: skip
    if dtype is not None and dt.as_dtype(dtype) is not out._dtype:
        raise RuntimeError(f"dtype {dt.as_dtype(dtype).name} does not match dtype of out parameter ({out._dtype.name})")
    return out._dtype


def written(out: Tensor, result: Tensor) -> Tensor:
    """``result`` written into ``out``, which is returned (PyTorch's ``out=``): in place where the shapes
    match; otherwise ``out`` is resized to the result, as PyTorch resizes it (warning where it held
    elements, as PyTorch does)."""
    if tuple(out.shape) == tuple(result.shape):
        return copy_(out, result)
    if out.numel():
        warnings.warn(f"An output with one or more elements was resized since it had shape {list(out.shape)}, which "
                      f"does not match the required output shape {list(result.shape)}.", UserWarning, stacklevel=3)  # fmt: skip
    out.data = to(result, out._device)
    return out


def _finish(array: np.ndarray, device: Device, requires_grad: bool) -> Tensor:
    if device is not CPU:
        array = to_device(array, device)
    t = make_tensor(array, device)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _infer_array(data, default_float: bool = True) -> np.ndarray:
    """``data`` as a numpy array with PyTorch's inference: Python floats -> the default dtype
    (unless ``default_float`` is False: a requested dtype must not see them rounded first)."""
    if isinstance(data, Tensor):
        data._value_access("kiln.tensor(Tensor) (a copy of its values as data)")
        return data._host()
    if isinstance(data, np.ndarray | np.generic):
        return np.asarray(data)
    if isinstance(data, list | tuple) and any(isinstance(x, Tensor) for x in data):
        data = [x.tolist() if isinstance(x, Tensor) else x for x in data]
    try:
        array = np.asarray(data)
    except ValueError as error:
        raise ValueError(f"tensor(): expected a number or a nested sequence of equal lengths ({error})") from None
    if array.dtype == np.float64 and default_float:
        return array.astype(dt.get_default_dtype().np)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"tensor(): expected numbers, got {type(data).__name__} of {array.dtype}")
    return array


def tensor(data, *, dtype=None, device=None, requires_grad: bool = False, pin_memory: bool = False) -> Tensor:
    """A new tensor holding a copy of ``data`` (numbers, nested lists, numpy arrays, tensors).

    >>> tensor([[1, 2], [3, 4]]).dtype
    kiln.int64
    >>> tensor([1.0, 2.0]).dtype
    kiln.float32
    """
    if pin_memory:
        placement("tensor", pin_memory=pin_memory)
    array = _infer_array(data, default_float=dtype is None)
    array = np.array(array, dtype=None if dtype is None else dt.as_dtype(dtype).np, copy=True)
    if array.dtype not in dt._BY_NUMPY:
        array = array.astype(dt.from_numpy_dtype(array.dtype).np)
    out = _finish(array, _device(device), requires_grad)
    if _jit.tracing and isinstance(data, np.ndarray):  # read the array at each compiled call
        _jit.numpy_tensor(data, out, shares_memory=False)
    return out


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """Like ``tensor``, but shares memory with a tensor or numpy array when nothing must change."""
    dtype = None if dtype is None else dt.as_dtype(dtype)
    target = None if device is None else parse_device(device)
    if isinstance(data, Tensor):
        out = data if dtype is None else data.to(dtype)
        return out if target is None else out.to(target)
    if isinstance(data, np.ndarray) and (dtype is None or data.dtype == dtype.np) and target in (None, CPU):
        return from_numpy(data)
    return tensor(data, dtype=dtype, device=device)


def from_numpy(array: np.ndarray) -> Tensor:
    """A CPU tensor sharing ``array``'s memory: writes through either are seen by both.

    >>> a = np.zeros(3, dtype=np.float32); t = from_numpy(a); t += 1; a.tolist()
    [1.0, 1.0, 1.0]
    """
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy expected an np.ndarray, got {type(array).__name__}")
    out = make_tensor(array, CPU, dt.from_numpy_dtype(array.dtype))
    if _jit.tracing:  # the array's memory is an input of a compiled call, read (and written) each call
        _jit.numpy_tensor(array, out, shares_memory=True)
    return out


def _shape(size, op: str = "size") -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], list | tuple):
        size = size[0]
    for d in size:
        if isinstance(d, float | complex | str) or (isinstance(d, Tensor) and d._dtype.category != dt.INTEGER):
            raise TypeError(
                f"{op}(): argument 'size' must be a tuple of ints, but found element of type {type(d).__name__}"
            )
    shape = tuple(int(d) for d in size)
    if any(d < 0 for d in shape):
        raise RuntimeError(f"trying to create tensor with negative dimension: {list(shape)}")
    return shape


def sizes_of(sizes: tuple, size, op: str) -> tuple[int, ...]:
    """The shape of ``op(*sizes)`` or ``op(size=...)`` (PyTorch takes either spelling, not both)."""
    if size is None:
        return _shape(sizes, op)
    if sizes:
        raise TypeError(f"{op}() got its sizes both as arguments {sizes} and as size={size!r}")
    return _shape((size,), op)


def _filled(shape, value, dtype, device, requires_grad) -> Tensor:
    device = _device(device)
    xp = array_namespace(device)
    if device is CPU:
        # numpy.zeros (calloc'd memory) is one C call; numpy.full is Python over empty and copyto (~1 us)
        zero = value.__class__ is int and value == 0
        return _finish(
            np.zeros(shape, dtype.np) if zero else np.full(shape, value, dtype=dtype.np), device, requires_grad
        )
    with xp.cuda.Device(device.index or 0):  # pragma: no cover - needs a GPU
        t = make_tensor(xp.full(shape, value, dtype=dtype.np), device)
    return t.requires_grad_(requires_grad)


def zeros(*sizes, size=None, dtype=None, device=None, requires_grad: bool = False, layout=None,
          pin_memory: bool = False, out=None) -> Tensor:  # fmt: skip
    if layout is not None or pin_memory or out is not None:
        placement("zeros", layout, pin_memory)
        if out is not None:
            return written(out, zeros(*sizes, size=size, dtype=out_dtype(out, dtype, "zeros"), device=out.device))
    return _filled(sizes_of(sizes, size, "zeros"), 0, _dtype(dtype), device, requires_grad)


def ones(*sizes, size=None, dtype=None, device=None, requires_grad: bool = False, layout=None,
         pin_memory: bool = False, out=None) -> Tensor:  # fmt: skip
    if layout is not None or pin_memory or out is not None:
        placement("ones", layout, pin_memory)
        if out is not None:
            return written(out, ones(*sizes, size=size, dtype=out_dtype(out, dtype, "ones"), device=out.device))
    return _filled(sizes_of(sizes, size, "ones"), 1, _dtype(dtype), device, requires_grad)


def empty(*sizes, size=None, dtype=None, device=None, requires_grad: bool = False, layout=None,
          pin_memory: bool = False, memory_format=None, out=None) -> Tensor:  # fmt: skip
    shape = sizes_of(sizes, size, "empty")
    if layout is not None or pin_memory or memory_format is not None or out is not None:
        placement("empty", layout, pin_memory, memory_format, ndim=len(shape))
        if out is not None:
            return written(out, empty(*shape, dtype=out_dtype(out, dtype, "empty"), device=out.device))
    return _filled(shape, 0, _dtype(dtype), device, requires_grad)


def empty_strided(size, stride, *, dtype=None, device=None, requires_grad: bool = False, layout=None,
                  pin_memory: bool = False) -> Tensor:  # fmt: skip
    """A tensor of ``size`` whose elements are ``stride`` elements apart (zero-filled), as
    ``torch.empty_strided``: its memory holds the elements the strides reach (on the CPU; on a GPU
    the copy there is C order, with the same values).

    >>> empty_strided((2, 3), (1, 2)).stride()
    (1, 2)
    """
    placement("empty_strided", layout, pin_memory)
    shape, strides = _shape((size,), "empty_strided"), tuple(int(s) for s in stride)
    if len(strides) != len(shape) or any(s < 0 for s in strides):
        raise RuntimeError(
            f"empty_strided: mismatch in length of strides and shape ({list(strides)} for {list(shape)})"
        )
    dtype = _dtype(dtype)
    span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    memory = np.zeros(span, dtype.np)
    array = np.lib.stride_tricks.as_strided(memory, shape, tuple(s * dtype.itemsize for s in strides))
    return _finish(array, _device(device), requires_grad)


def full(size, fill_value, *, dtype=None, device=None, requires_grad: bool = False, layout=None,
         pin_memory: bool = False, out=None) -> Tensor:  # fmt: skip
    """``fill_value`` everywhere; the dtype follows the value (bool, int64, default float)."""
    if layout is not None or pin_memory or out is not None:
        placement("full", layout, pin_memory)
        if out is not None:
            return written(out, full(size, fill_value, dtype=out_dtype(out, dtype, "full"), device=out.device))
    return _filled(_shape((size,)), fill_value, _dtype(dtype, dt.scalar_dtype(fill_value)), device, requires_grad)


def _like(fn):
    def like(input: Tensor, *args, dtype=None, device=None, requires_grad: bool = False, memory_format=None,
             layout=None, pin_memory: bool = False) -> Tensor:  # fmt: skip
        if layout is not None or pin_memory or memory_format is not None:
            placement(like.__name__, layout, pin_memory, memory_format)
        dtype = input._dtype if dtype is None else dt.as_dtype(dtype)
        device = input._device if device is None else device
        return fn(tuple(input.shape), *args, dtype=dtype, device=device, requires_grad=requires_grad)

    like.__name__ = like.__qualname__ = fn.__name__ + "_like"
    like.__doc__ = f"``{fn.__name__}`` with the shape, dtype and device of ``input``."
    return like


zeros_like = _like(zeros)
ones_like = _like(ones)
empty_like = _like(empty)
full_like = _like(full)


def _number(x, op: str):
    if isinstance(x, Tensor):
        x = x.item()
    if isinstance(x, np.generic):
        x = x.item()
    if not isinstance(x, int | float) or isinstance(x, bool):
        raise TypeError(f"{op}(): expected a number, got {type(x).__name__}")
    return x


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad: bool = False, layout=None,
           pin_memory: bool = False, out=None) -> Tensor:  # fmt: skip
    """Values from ``start`` to ``end`` (exclusive) by ``step``, as ``torch.arange``.

    int64 when every argument is an int, else the default float dtype. Float results hold
    ``start + i * step`` computed in float64, and their count is ``ceil((end - start) / step)``;
    an integer ``dtype`` truncates the three arguments to ints first, as PyTorch does.

    >>> arange(5).tolist(), arange(1, 2.5, 0.5).tolist()
    ([0, 1, 2, 3, 4], [1.0, 1.5, 2.0])
    """
    if layout is not None or pin_memory or out is not None:
        placement("arange", layout, pin_memory)
        if out is not None:
            return written(out, arange(start, end, step, dtype=out_dtype(out, dtype, "arange"), device=out.device))
    if end is None:
        start, end = 0, start
    start, end, step = (_number(x, "arange") for x in (start, end, step))
    default = dt.int64 if all(isinstance(x, int) for x in (start, end, step)) else dt.get_default_dtype()
    dtype = _dtype(dtype, default)
    if not dtype.is_floating_point:
        start, end, step = int(start), int(end), int(step)
    if step == 0:
        raise RuntimeError("arange: step must be nonzero")
    if not all(math.isfinite(x) for x in (start, end)):
        raise RuntimeError(f"arange: unsupported range: {start} -> {end}")
    if (end - start) * step < 0:
        raise RuntimeError("arange: upper bound and lower bound inconsistent with step sign")
    if dtype.is_floating_point:
        count = math.ceil((end - start) / step)
        array = start + np.arange(count, dtype=np.float64) * step
    else:
        array = np.arange(start, end, step, dtype=np.int64)
    return _finish(array.astype(dtype.np), _device(device), requires_grad)


def linspace(start, end, steps: int, *, dtype=None, device=None, requires_grad: bool = False, layout=None,
             pin_memory: bool = False, out=None) -> Tensor:  # fmt: skip
    """``steps`` evenly spaced values from ``start`` to ``end`` inclusive (the default float dtype).

    Computed in float64 from both ends (the first half from ``start``, the second from ``end``,
    as PyTorch does, so both endpoints are exact), then cast; integer dtypes truncate.

    >>> linspace(0, 1, 5).tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    if layout is not None or pin_memory or out is not None:
        placement("linspace", layout, pin_memory)
        if out is not None:
            return written(out, linspace(start, end, steps, dtype=out_dtype(out, dtype, "linspace"), device=out.device))
    start, end = _number(start, "linspace"), _number(end, "linspace")
    steps = int(_number(steps, "linspace"))
    if steps < 0:
        raise RuntimeError(f"linspace: number of steps must be non-negative, got {steps}")
    dtype = _dtype(dtype)
    if not dtype.is_floating_point:
        start, end = int(start), int(end)
    i = np.arange(steps, dtype=np.float64)
    step = (end - start) / (steps - 1) if steps > 1 else 0.0
    half = steps // 2 if steps > 1 else 1  # a single step is `start`
    array = np.where(i < half, start + i * step, end - (steps - 1 - i) * step)
    if not dtype.is_floating_point:
        array = np.trunc(array)
    return _finish(array.astype(dtype.np), _device(device), requires_grad)


def eye(n: int, m: int | None = None, *, dtype=None, device=None, requires_grad: bool = False, layout=None,
        pin_memory: bool = False, out=None) -> Tensor:  # fmt: skip
    """The ``n`` x ``m`` identity matrix (``m`` defaults to ``n``)."""
    if layout is not None or pin_memory or out is not None:
        placement("eye", layout, pin_memory)
        if out is not None:
            return written(out, eye(n, m, dtype=out_dtype(out, dtype, "eye"), device=out.device))
    for name, value in (("n", n), ("m", m)):
        if value is not None and value < 0:
            raise RuntimeError(f"eye: {name} must be greater or equal to 0, got {value}")
    return _finish(np.eye(n, m, dtype=_dtype(dtype).np), _device(device), requires_grad)


def scalar_tensor(value, *, dtype=None, device=None, requires_grad: bool = False, layout=None,
                  pin_memory: bool = False) -> Tensor:  # fmt: skip
    placement("scalar_tensor", layout, pin_memory)
    return tensor(value, dtype=_dtype(dtype), device=device, requires_grad=requires_grad)


@method("clone")
def clone(input: Tensor, *, memory_format=None) -> Tensor:
    """A copy that owns its memory, differentiable (gradient passes through unchanged)."""
    return apply(P["copy"], input)


# ----------------------------------------------------------------------------- to(), casts, fills
@method("to")
def to(input: Tensor, *args, dtype=None, device=None, copy: bool = False, non_blocking: bool = False,
       memory_format=None) -> Tensor:  # fmt: skip
    """``to(dtype)``, ``to(device)``, ``to(device, dtype)`` or ``to(other_tensor)``, as in PyTorch."""
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a._device, a._dtype
        elif isinstance(a, dt.DType) or a in (float, int, bool):
            dtype = a
        else:
            device = a
    out = input
    if dtype is not None:
        out = cast(out, dt.as_dtype(dtype))
    if device is not None and parse_device(device) is not out._device:
        out = _move(out, parse_device(device))
    if copy and out is input:
        out = clone(input)
    return out


def _move(input: Tensor, device: Device) -> Tensor:
    input._value_access(f"a copy from {input._device} to {device}")  # the IR has no device transfers yet
    if input._requires_grad:
        return _device_copy().apply(input, device)  # differentiable: the gradient moves back
    return make_tensor(to_device(input._data, device), device, input._dtype)


@functools.cache
def _device_copy():
    from ..autograd.function import Function  # noqa: PLC0415 - function.py imports the ops

    class DeviceCopy(Function):
        @staticmethod
        def forward(ctx, x, device):
            ctx.source = x._device
            return make_tensor(to_device(x._data, device), device, x._dtype)

        @staticmethod
        def backward(ctx, g):
            return _move(g, ctx.source), None

    return DeviceCopy


@method("cpu")
def cpu(input: Tensor) -> Tensor:
    return to(input, CPU)


@method("cuda")
def cuda(input: Tensor, device=None) -> Tensor:
    return to(
        input, parse_device("cuda" if device is None else f"cuda:{device}" if isinstance(device, int) else device)
    )


def _cast_method(name: str, dtype: dt.DType):
    def op(self: Tensor) -> Tensor:
        return cast(self, dtype)

    op.__name__ = name
    method(name)(op)


for _name, _dt in {"float": dt.float32, "double": dt.float64, "half": dt.float16, "long": dt.int64,
                   "int": dt.int32, "short": dt.int16, "char": dt.int8, "byte": dt.uint8, "bool": dt.bool_}.items():  # fmt: skip
    _cast_method(_name, _dt)


@method("bfloat16")
def _to_bfloat16(self: Tensor) -> Tensor:
    """``self`` as bfloat16 (made on first use: it needs ml_dtypes)."""
    return cast(self, dt.bfloat16_dtype())


@method("type_as")
def type_as(input: Tensor, other: Tensor) -> Tensor:
    return cast(input, other._dtype)


def _new(name: str, fn):
    def new(self: Tensor, *args, dtype=None, device=None, requires_grad: bool = False, layout=None,
            pin_memory: bool = False) -> Tensor:  # fmt: skip
        if layout is not None or pin_memory:
            placement(name, layout, pin_memory)
        dtype = self._dtype if dtype is None else dtype
        return fn(*args, dtype=dtype, device=self._device if device is None else device, requires_grad=requires_grad)

    new.__name__ = new.__qualname__ = name
    new.__doc__ = f"``{fn.__name__}`` with this tensor's dtype and device unless given."
    method(name)(new)


for _name, _fn in {
    "new_zeros": zeros,
    "new_ones": ones,
    "new_empty": empty,
    "new_full": full,
    "new_tensor": tensor,
}.items():
    _new(_name, _fn)


@method("copy_")
def copy_(input: Tensor, src: Tensor) -> Tensor:
    """Copy ``src`` into ``input`` (broadcasting, converting dtype and device)."""
    if not isinstance(src, Tensor):
        raise TypeError(f"copy_(): argument 'src' must be a Tensor, not {type(src).__name__}")
    if src._device is not input._device:
        src = to(src, input._device)
    return commit_inplace(input, cast(src, input._dtype), op="copy_")


@method("fill_")
def fill_(input: Tensor, value) -> Tensor:
    """Write ``value`` (a number, or a 0-d tensor, whose gradient is then the sum of the filled
    tensor's) into every element of ``input``."""
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError(
                f"fill_ only supports 0-dimension value tensor but got tensor with {value.ndim} dimensions "
                f"(shape {tuple(value.shape)})"
            )
        if value._device is not input._device:
            value = to(value, input._device)
        return commit_inplace(input, cast(value, input._dtype), op="fill_", uniform=True)
    with no_grad():
        filled = full_like(input, value)
    return commit_inplace(input, filled, op="fill_", uniform=True)


@method("zero_")
def zero_(input: Tensor) -> Tensor:
    return fill_(input, 0)


def _rebuild_tensor(array: np.ndarray, device: str, requires_grad: bool) -> Tensor:
    t = tensor(array, dtype=dt.from_numpy_dtype(array.dtype), device=device)
    return t.requires_grad_(requires_grad)
