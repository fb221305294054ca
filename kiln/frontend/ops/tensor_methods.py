"""Tensor methods and properties of PyTorch's that ported programs call, over kiln's ops: the memory
questions (``nbytes``, ``itemsize``, ``is_pinned()``, ``dim_order()``), the predicates that are False for
every kiln tensor (``is_meta``, ``is_quantized``...), the conjugate-transpose names of real tensors
(``mH``, ``H``, ``adjoint``), more in-place forms (``tril_``, ``index_fill_``...) and the legacy
``Tensor.new(...)``.

>>> import kiln
>>> t = kiln.ones(2, 3)
>>> t.nbytes, t.itemsize, t.is_pinned(), t.dim_order(), t.mT.shape == t.mH.shape
(24, 4, False, (0, 1), True)
"""

from __future__ import annotations

from ...runtime.devices import cuda_available
from ..autograd.grad_mode import is_grad_enabled
from ..tensor import Size, Tensor, method
from . import elementwise, shape
from .creation import empty, tensor
from .inplace import commit_inplace

__all__: list[str] = []


# ---------------------------------------------------------------------- memory
def _nbytes(self: Tensor) -> int:
    return int(self._data.size) * self._dtype.itemsize


def _itemsize(self: Tensor) -> int:
    return self._dtype.itemsize


Tensor.nbytes = property(_nbytes)  # type: ignore[attr-defined]  # bound at import, as @method does
Tensor.itemsize = property(_itemsize)  # type: ignore[attr-defined]
Tensor.is_cpu = property(lambda self: self._device.type == "cpu")  # type: ignore[attr-defined]
Tensor.output_nr = property(lambda self: self._output_nr)  # type: ignore[attr-defined]
# Kinds of tensor kiln does not have: a ported program's checks of them (``if p.is_meta``) say no.
for _name in ("is_meta", "is_quantized", "is_nested", "is_mkldnn", "is_sparse_csr", "is_vulkan", "is_ipu",
              "is_xla", "is_mtia", "is_maia"):  # fmt: skip
    setattr(Tensor, _name, property(lambda self: False))


@method("is_pinned")
def is_pinned(self: Tensor, device=None) -> bool:
    """False: kiln does not pin host memory (``pin_memory()`` is a no-op with a GPU)."""
    return False


@method("pin_memory")
def pin_memory(self: Tensor, device=None) -> Tensor:
    """``self`` with a GPU (kiln copies host arrays to it unpinned); without one PyTorch's error."""
    if not cuda_available():
        raise RuntimeError("Cannot access accelerator device when none is available.")
    return self


@method("is_inference")
def is_inference(self: Tensor) -> bool:
    return bool(self._inference)


@method("is_conj", "is_neg")
def is_conj(self: Tensor) -> bool:
    return False  # kiln has no complex dtype: no lazily conjugated or negated views either


@method("dim_order")
def dim_order(self: Tensor) -> tuple[int, ...]:
    """The dims from the outermost in memory to the innermost (largest stride first; ties keep their
    order), as ``torch.Tensor.dim_order``: ``(0, 1, ..., n-1)`` for a contiguous tensor."""
    strides = self.stride()
    return tuple(sorted(range(self.ndim), key=lambda d: -strides[d]))


@method("to_dense")
def to_dense(self: Tensor, dtype=None, *, masked_grad=None) -> Tensor:
    """A dense tensor is its own dense form (a sparse one has its own ``to_dense``)."""
    return self if dtype is None else self.to(dtype)


# ---------------------------------------------------------------------- real tensors' conjugates
@method("adjoint")
def adjoint(self: Tensor) -> Tensor:
    """The conjugate transpose of the last two dims: the transpose, for kiln's real dtypes."""
    return shape.transpose(self, -2, -1)


Tensor.mH = property(adjoint)  # type: ignore[attr-defined]
Tensor.H = property(lambda self: self.t())  # type: ignore[attr-defined]  # (t() refuses more than 2 dims, as H)
Tensor.real = property(lambda self: self)  # type: ignore[attr-defined]  # a real tensor is its real part


# ---------------------------------------------------------------------- more in-place forms
def _inplace(name: str, fn) -> None:
    def op(self: Tensor, *args, **kwargs) -> Tensor:
        return commit_inplace(self, fn(self, *args, **kwargs), op=name)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"In-place ``{name[:-1]}``: writes the result into ``self`` and returns it."
    method(name)(op)


for _name, _fn in {
    "tril_": Tensor.tril, "triu_": Tensor.triu, "log2_": elementwise.log2, "log10_": elementwise.log10,  # type: ignore[attr-defined]
    "negative_": elementwise.neg, "logical_and_": elementwise.logical_and, "logical_or_": elementwise.logical_or,
    "logical_xor_": elementwise.logical_xor, "index_fill_": Tensor.index_fill,  # type: ignore[attr-defined]
    "index_copy_": Tensor.index_copy, "masked_scatter_": Tensor.masked_scatter,  # type: ignore[attr-defined]
    "fix_": elementwise.trunc, "scatter_reduce_": Tensor.scatter_reduce,  # type: ignore[attr-defined]
    "index_reduce_": Tensor.index_reduce,  # type: ignore[attr-defined]
}.items():  # fmt: skip
    _inplace(_name, _fn)


@method("renorm_")
def renorm_(self: Tensor, p, dim: int, maxnorm) -> Tensor:
    """In-place ``renorm``. Its composite saves its input deep inside (``abs``), where the write would
    invalidate it: with a gradient to track it reads a clone (the old values) instead."""
    source = self.clone() if self.requires_grad and is_grad_enabled() else self
    return commit_inplace(self, Tensor.renorm(source, p, dim, maxnorm), op="renorm_")  # type: ignore[attr-defined]


method("fix")(elementwise.trunc)
method("unsafe_chunk")(Tensor.chunk)  # type: ignore[attr-defined]  # (imported after the ops that bind these)
method("unsafe_split")(Tensor.split)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- the legacy constructor
@method("new")
def new(self: Tensor, *args, device=None) -> Tensor:
    """PyTorch's legacy ``t.new(...)``: ``t.new(2, 3)`` an uninitialized (here zero-filled) tensor of
    that shape, ``t.new([1, 2])`` (a sequence or array) that data, ``t.new()`` an empty one, all in
    ``t``'s dtype and on its device (or ``device``); ``t.new(other)`` shares ``other``'s memory."""
    where = self._device if device is None else device
    if not args:
        return empty(0, dtype=self._dtype, device=where)
    if len(args) == 1 and isinstance(args[0], Tensor):  # an alias of its memory, in self's dtype only
        if args[0]._dtype is not self._dtype:
            raise TypeError(f"new(): expected a tensor of {self._dtype.name}, got {args[0]._dtype.name}")
        return args[0].detach()
    if len(args) == 1 and isinstance(args[0], Size):
        return empty(*args[0], dtype=self._dtype, device=where)
    if len(args) == 1 and not isinstance(args[0], int):
        return tensor(args[0], dtype=self._dtype, device=where)
    if all(isinstance(n, int) and not isinstance(n, bool) for n in args):
        return empty(*args, dtype=self._dtype, device=where)
    given = ", ".join(type(a).__name__ for a in args)
    raise TypeError(f"new(): expected sizes (ints) or one sequence of data, got ({given})")
