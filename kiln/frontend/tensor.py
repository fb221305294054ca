"""The Tensor: an array (numpy or cupy) plus autograd and view metadata.

A tensor keeps its numpy/cupy array at hand (``_data``); views share memory with their base and
share its version counter, so an in-place change through any of them is seen by every saved
copy's check. Ops live in ``kiln.frontend.ops``; each op module binds its Tensor methods with
``@method``, so this file holds only what is about the tensor itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ir import dtypes as dt
from ..ir.shapes import normalize_axis
from ..ir.types import CPU, Device
from .autograd import grad_mode as _grad_mode
from .autograd.grad_mode import state as _grad_state
from .jit import state as _jit

if TYPE_CHECKING:
    from .bound_methods import BoundMethods as _Base
else:
    _Base = object  # at runtime the ops bind the methods onto Tensor itself

_NP_TO_DTYPE = dt._BY_NUMPY  # the same dict: bfloat16 registers itself there when first used


class Size(tuple):
    """A tensor's shape: a tuple of ints, with ``numel()`` as in PyTorch."""

    def numel(self) -> int:
        n = 1
        for d in self:
            n *= d
        return n

    def __repr__(self) -> str:
        return f"kiln.Size({list(self)})"


class layout(str):  # noqa: N801 - PyTorch's name
    """A tensor's memory layout (``kiln.strided``, ``kiln.sparse_coo``), as ``torch.layout``: a str
    equal to its name, so code that compared the plain string keeps working."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"kiln.{str.__str__(self)}"

    __str__ = __repr__  # (printed as PyTorch prints torch.strided)


strided = layout("strided")
sparse_coo = layout("sparse_coo")


class Tensor(_Base):
    __slots__ = (
        "_data", "_device", "_dtype", "_requires_grad", "grad_fn", "_output_nr", "_grad",
        "_version", "_base", "_hooks", "_retains_grad", "_grad_acc", "_inference", "_trace",
        "_post_accumulate_hooks", "__weakref__", "__dict__",
    )  # fmt: skip
    __array_priority__ = 1000  # numpy defers `ndarray + Tensor` to Tensor.__radd__

    # The slots' types (annotations only: __slots__ makes the attributes, make_tensor fills them).
    _data: Any  # a numpy or cupy array
    _device: Device
    _dtype: dt.DType
    _requires_grad: bool
    grad_fn: Any  # the autograd Node that made it, or None for a leaf
    _output_nr: int
    _grad: Tensor | None
    _version: list[int]  # one cell, shared with every view of the same memory
    _base: Tensor | None
    _hooks: list[Callable] | None
    _retains_grad: bool
    _grad_acc: Any  # a weakref to the leaf's gradient accumulator, or None
    _inference: bool
    _trace: Any  # the IR value while a trace runs, else None
    _post_accumulate_hooks: list[Callable] | None
    # ``__dict__``: the Python attributes a program sets on a tensor, as on PyTorch's (libraries tag
    # parameters: ``p._no_weight_decay = True``). Made on the first attribute set, so an op's result
    # pays nothing for it; a compiled call guards a captured tensor's attributes (``jit/reads.py``),
    # pickling and ``copy.deepcopy`` carry them, ``detach()`` and views start without.

    def __new__(cls, *args, device=None):
        """PyTorch's legacy constructor, which real programs still use: ``Tensor(2, 3)`` is a tensor
        of the default float dtype and that shape (zero-filled where PyTorch leaves it uninitialized),
        ``Tensor()`` an empty one, ``Tensor([1, 2])`` (a sequence or array) that data in the default
        float dtype, ``Tensor(t)`` ``t`` itself. Prefer ``kiln.tensor``,
        ``kiln.empty``. Subclasses (``nn.Parameter``) construct themselves.

        >>> Tensor(2, 3).shape, Tensor([1, 2]).tolist(), Tensor().shape
        (kiln.Size([2, 3]), [1.0, 2.0], kiln.Size([0]))
        """
        if cls is not Tensor:
            return object.__new__(cls)
        from .ops import creation  # noqa: PLC0415  (ops import this module)

        dtype = dt.get_default_dtype()
        if not args:
            return creation.empty(0, dtype=dtype, device=device)
        if len(args) == 1 and isinstance(args[0], Tensor):
            return args[0]  # PyTorch's Tensor(t) is t, whatever its dtype
        if len(args) == 1 and isinstance(args[0], Size):
            return creation.empty(*args[0], dtype=dtype, device=device)
        if len(args) == 1 and isinstance(args[0], list | tuple | np.ndarray):
            return creation.tensor(args[0], dtype=dtype, device=device)
        if all(isinstance(a, int | np.integer) and not isinstance(a, bool) for a in args):
            return creation.empty(*args, dtype=dtype, device=device)
        given = ", ".join(type(a).__name__ for a in args)
        raise TypeError(f"Tensor(...) expected sizes (ints) or one sequence of data, got ({given})")

    def __init__(self, *args, **kwargs) -> None:
        pass  # construction happens in __new__ (make_tensor on every op's hot path skips both)

    # ------------------------------------------------------------------ metadata
    @property
    def shape(self) -> Size:
        if _jit.tracing:  # a trace learning dynamic sizes watches what Python does with them
            return Size(_jit.shape_of(self))
        return Size(self._data.shape)

    def size(self, dim: int | None = None):
        shape = _jit.shape_of(self) if _jit.tracing else self._data.shape
        if dim is None:
            return Size(shape)
        if dim.__class__ is int and -len(shape) <= dim < len(shape):
            return shape[dim]
        return shape[normalize_axis(dim, self._data.ndim)]  # (its error, or a dim that is no plain int)

    @property
    def dtype(self) -> dt.DType:
        return self._dtype

    @property
    def layout(self) -> layout:
        return strided  # (a sparse COO tensor is a SparseTensor, whose layout is sparse_coo)

    @property
    def device(self) -> Device:
        return self._device

    @property
    def ndim(self) -> int:
        return self._data.ndim

    def dim(self) -> int:
        return self._data.ndim

    ndimension = dim

    def numel(self) -> int:
        return int(self._data.size)

    nelement = numel

    def element_size(self) -> int:
        return self._dtype.itemsize

    def is_floating_point(self) -> bool:
        return self._dtype.is_floating_point

    @property
    def is_cuda(self) -> bool:
        return self._device.type == "cuda"

    def stride(self, dim: int | None = None):
        strides = tuple(s // self._dtype.itemsize for s in self._data.strides)
        return strides if dim is None else strides[dim]

    def is_contiguous(self) -> bool:
        return bool(self._data.flags.c_contiguous)

    def data_ptr(self) -> int:
        return self._data.ctypes.data if self._device is CPU else self._data.data.ptr

    def storage_offset(self) -> int:
        if self._base is None:
            return 0
        return (self.data_ptr() - self._base.data_ptr()) // self._dtype.itemsize

    @property
    def _version_value(self) -> int:
        return self._version[0]

    # ------------------------------------------------------------------ autograd
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if self.grad_fn is not None:
            if not requires_grad:
                raise RuntimeError(
                    "you can only change requires_grad flags of leaf variables; this tensor is the "
                    "result of an op. Use .detach() to get a tensor that does not require grad."
                )
            return self
        if requires_grad and not self._dtype.is_floating_point:
            raise RuntimeError(f"only tensors of floating point dtype can require gradients, got {self._dtype.name}")
        self._requires_grad = bool(requires_grad)
        return self

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def grad(self) -> Tensor | None:
        if _jit.tracing:  # whether .grad is set becomes a guard of the trace (unless the call set it first)
            _jit.grad_read(self)
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or None, got {type(value).__name__}")
            if value.shape != self.shape:
                raise RuntimeError(f"assigned grad has shape {tuple(value.shape)}, expected {tuple(self.shape)}")
            if value._dtype is not self._dtype or value._device is not self._device:
                raise RuntimeError(
                    f"assigned grad has dtype {value._dtype.name} on {value._device}, expected "
                    f"{self._dtype.name} on {self._device}"
                )
        if _jit.tracing:
            _jit.grad_change(self, overwrite=True)
        self._grad = value

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def retain_grad(self) -> None:
        """Keep ``.grad`` for this non-leaf tensor after backward."""
        if self.grad_fn is None:
            if not self._requires_grad:
                raise RuntimeError("can't retain_grad on a tensor that has requires_grad=False")
            return
        if self._retains_grad:
            return
        from .autograd.inplace_history import RetainGrad  # noqa: PLC0415

        # (an in-place write moves the hook to the tensor's new history: see move_retained_grad)
        self.grad_fn.register_prehook(RetainGrad(self), self._output_nr)
        self._retains_grad = True

    def register_hook(self, hook: Callable):
        """``hook(grad)`` runs when this tensor's gradient is computed; it may return a new one."""
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if _jit.tracing and not _jit.born_in_trace(self):
            # Compiled calls would not register it again: a hook on a tensor from outside the call
            # is Python state the call changes.
            _jit.unsafe("register_hook on a tensor from outside the compiled call (an argument or a captured tensor)")
        if self.grad_fn is not None:
            return self.grad_fn.register_prehook(hook, self._output_nr)
        from .autograd.graph import RemovableHandle  # noqa: PLC0415

        if self._hooks is None:
            self._hooks = []
        return RemovableHandle(self._hooks, hook)

    def register_post_accumulate_grad_hook(self, hook: Callable):
        """``hook(tensor)`` runs after a backward accumulated into this leaf's ``.grad`` (it reads
        ``tensor.grad``; its return value is ignored). Data parallelism starts a gradient's
        all-reduce from here, as soon as the gradient is complete."""
        if self.grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        from .autograd.graph import RemovableHandle  # noqa: PLC0415

        if self._post_accumulate_hooks is None:
            self._post_accumulate_hooks = []
        return RemovableHandle(self._post_accumulate_hooks, hook)

    def backward(self, gradient=None, retain_graph: bool | None = None, create_graph: bool = False, inputs=None):
        from .autograd.api import backward  # noqa: PLC0415

        backward(self, gradient, retain_graph=retain_graph, create_graph=create_graph, inputs=inputs)

    def detach(self) -> Tensor:
        """A tensor sharing this one's memory (and version counter), outside the graph."""
        out = make_tensor(self._data, self._device, self._dtype)
        out._version = self._version
        out._base = self._base if self._base is not None else self
        if self._trace is not None:
            out._trace = self._trace  # traced: the same IR value, for as long as the memory is unchanged
        return out

    def detach_(self) -> Tensor:
        if self._base is not None and self._base._requires_grad:
            raise RuntimeError("can't detach_ a view of a tensor that requires grad; use detach()")
        self.grad_fn = None
        self._requires_grad = False
        return self

    @property
    def data(self) -> Tensor:
        return self.detach()

    @data.setter
    def data(self, value: Tensor) -> None:
        if _jit.tracing:  # a compiled program would go on reading the old memory
            _jit.unsafe("assigning Tensor.data swaps a tensor's memory, which a traced graph cannot repeat")
        self._data, self._device, self._dtype = value._data, value._device, value._dtype

    # ------------------------------------------------------------------ conversions out
    def _value_access(self, what: str) -> None:
        """Called before Python reads values: a trace stops here (see ``kiln.compile``)."""
        if _jit.tracing:
            _jit.value_access(self, what)

    def item(self):
        self._value_access("Tensor.item()")
        if self._data.size != 1:
            raise RuntimeError(f"a Tensor with {self._data.size} elements cannot be converted to Scalar")
        return self._host().reshape(()).item()

    def tolist(self):
        self._value_access("Tensor.tolist()")
        return self._host().tolist()

    def numpy(self, *, force: bool = False) -> np.ndarray:
        """The tensor's memory as a numpy array (shared, not copied, on the CPU)."""
        self._value_access("Tensor.numpy()")
        if self._requires_grad and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        if self._device is not CPU:
            if not force:
                raise TypeError(f"can't convert {self._device} tensor to numpy. Use Tensor.cpu() first.")
            return self._host()
        return self._data

    def __array__(self, dtype=None, copy=None):
        self._value_access("numpy.asarray(Tensor)")
        host = self._host()
        if dtype is not None:
            return host.astype(dtype, copy=bool(copy))
        return host.copy() if copy else host

    def _host(self) -> np.ndarray:
        if self._device is CPU:
            return self._data
        return self._data.get()

    def __dlpack__(self, *args, **kwargs):
        if self._requires_grad:
            raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
        return self._data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()

    def __bool__(self) -> bool:
        self._value_access("bool(Tensor)")
        if self._data.size != 1:
            raise RuntimeError(f"Boolean value of Tensor with {self._data.size} values is ambiguous")
        return bool(self._host().reshape(()))

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self._dtype.category != dt.INTEGER or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __len__(self) -> int:
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        if _jit.tracing:  # Python makes what len() returns a plain int: a size no trace can follow
            _jit.len_read(self)
        return self._data.shape[0]

    def __iter__(self):
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._data.shape[0]))

    __hash__ = object.__hash__

    # ------------------------------------------------------------------ sharing between processes
    def share_memory_(self) -> Tensor:
        """Move this CPU tensor's memory into shared memory, in place (see ``kiln.multiprocessing``)."""
        from .. import multiprocessing  # noqa: PLC0415 - sharing is rare; keep import kiln light

        return multiprocessing.share_memory_(self)

    def is_shared(self) -> bool:
        from .. import multiprocessing  # noqa: PLC0415

        return multiprocessing.is_shared(self)

    def __repr__(self) -> str:
        from .formatting import tensor_repr  # noqa: PLC0415

        return tensor_repr(self)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        """A 0-d tensor formats as its number (``f"{loss}"`` prints 0.25, as PyTorch's), others as repr."""
        if self._data.ndim == 0:
            return format(self.item(), spec)
        return repr(self)

    def __reduce_ex__(self, protocol):
        # Pickling goes through numpy (DataLoader workers, multiprocessing); the graph does not travel.
        from .ops.creation import _rebuild_tensor  # noqa: PLC0415

        rebuild = (_rebuild_tensor, (self._host(), str(self._device), self._requires_grad))
        return (*rebuild, self.__dict__) if self.__dict__ else rebuild  # (the attributes, as PyTorch keeps them)


def make_tensor(array, device: Device = CPU, dtype: dt.DType | None = None) -> Tensor:
    """Wrap an array as a tensor on ``device``, sharing its memory. The hot path of every op."""
    t = object.__new__(Tensor)
    t._data = array
    t._device = device
    t._dtype = dtype or _NP_TO_DTYPE[array.dtype]
    t._requires_grad = False
    t.grad_fn = None
    t._output_nr = 0
    t._grad = None
    t._version = [0]
    t._base = None
    t._hooks = None
    t._retains_grad = False
    t._grad_acc = None
    t._inference = _grad_mode.inference_used and _grad_state.inference
    t._trace = None
    t._post_accumulate_hooks = None
    if _jit.tracing:
        _jit.stamp(t)
    return t


def method(*names: str):
    """Bind the decorated function as Tensor method(s): ``@method("add", "__add__")``."""

    def bind(fn):
        for name in names:
            setattr(Tensor, name, fn)
        return fn

    return bind
