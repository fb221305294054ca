"""``Parameter``: a tensor that a ``Module`` registers as one of its learnable weights."""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler

import kiln
from kiln import multiprocessing as _shared
from kiln.frontend.tensor import Tensor

__all__ = ["Parameter", "Buffer"]


class Parameter(Tensor):
    """A leaf tensor that requires grad by default and that ``Module.__setattr__`` registers.

    It shares memory with the tensor it was made from, as ``torch.nn.Parameter`` does.
    """

    __slots__ = ()

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True) -> Parameter:
        if data is None:
            data = kiln.empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter: expected a Tensor as data, got {type(data).__name__}")
        src = data.detach()
        p = object.__new__(cls)
        for slot in Tensor.__slots__:
            if slot not in ("__weakref__", "__dict__"):  # (attributes set on ``data`` stay its own, as in PyTorch)
                object.__setattr__(p, slot, getattr(src, slot))
        # A parameter is its own leaf: no base, its own hook lists.
        p._base, p._grad, p._hooks, p._grad_acc = None, None, None, None
        p.requires_grad_(requires_grad)
        return p

    def __init__(self, data: Tensor | None = None, requires_grad: bool = True) -> None:
        pass  # all the work happens in __new__ (Tensor.__init__ refuses direct construction)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    __str__ = __repr__

    def __reduce_ex__(self, protocol):
        rebuild = (Parameter, (kiln.from_numpy(self.detach().numpy().copy()), self.requires_grad))
        return (*rebuild, self.__dict__) if self.__dict__ else rebuild  # pickled with its attributes, as PyTorch's

    # deepcopy makes a new Parameter without the attributes: PyTorch's Parameter.__deepcopy__ does too

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        result = Parameter(self.detach().clone(), self.requires_grad)
        memo[id(self)] = result
        return result


def _to_process(param: Parameter):
    """How a parameter travels to another process (a ``Process`` argument, a ``Queue``): one in shared
    memory (``Module.share_memory``) as a parameter over the same segment, so that the workers of a
    Hogwild run train the one set of weights; others as ``pickle`` takes them (a copy)."""
    args = _shared.shared_reduction(param)
    if args is None:
        return param.__reduce_ex__(4)
    return _shared_parameter, (args, param.__dict__ or None)


def _shared_parameter(args: tuple, attributes: dict | None) -> Parameter:
    param = Parameter(_shared._rebuild_shared(*args), args[-1])
    if attributes:
        param.__dict__.update(attributes)
    return param


ForkingPickler.register(Parameter, _to_process)


class Buffer:
    """Marker accepted by ``Module.__setattr__`` to register a buffer (PyTorch 2.5's ``nn.Buffer``)."""

    def __init__(self, data: Tensor, *, persistent: bool = True) -> None:
        self.data = data
        self.persistent = persistent


class UninitializedParameter(Parameter):
    """A parameter whose shape is not known yet (lazy modules): empty until ``materialize(shape)``.

    Materializing changes this same object in place into a ``Parameter``, so an optimizer built
    before the first forward call still holds it.
    """

    __slots__ = ()

    def __new__(cls, requires_grad: bool = True, device=None, dtype=None) -> UninitializedParameter:
        return super().__new__(cls, kiln.empty(0, device=device, dtype=dtype), requires_grad)  # type: ignore[return-value]

    def __init__(self, requires_grad: bool = True, device=None, dtype=None) -> None:
        pass

    def materialize(self, shape, device=None, dtype=None) -> None:
        value = kiln.empty(*shape, device=device or self.device, dtype=dtype or self.dtype)
        self.data = value
        self.__class__ = Parameter  # type: ignore[assignment]  # materialized: in place, a Parameter now

    def __repr__(self) -> str:
        return "<UninitializedParameter>"

    __str__ = __repr__

    def __deepcopy__(self, memo):
        result = UninitializedParameter(self.requires_grad, self.device, self.dtype)
        memo[id(self)] = result
        return result


class UninitializedBuffer(Tensor):
    """Marker type for a lazy module's buffer of unknown shape (kiln's lazy norms make real buffers late)."""
