"""Custom differentiable ops: subclass ``Function`` with static ``forward`` and ``backward``.

>>> import kiln
>>> class Cube(kiln.autograd.Function):
...     @staticmethod
...     def forward(ctx, x):
...         ctx.save_for_backward(x)
...         return x * x * x
...     @staticmethod
...     def backward(ctx, g):
...         (x,) = ctx.saved_tensors
...         return g * 3 * x * x
>>> x = kiln.tensor(2.0, requires_grad=True)
>>> Cube.apply(x).backward(); x.grad.item()
12.0
"""

from __future__ import annotations

import weakref

from ..jit import state as _jit
from ..tensor import Tensor, make_tensor
from .grad_mode import set_mode, state
from .graph import FreedGraphError, Node, SavedTensor, _edge_of


class FunctionCtx:
    """What ``forward`` and ``backward`` receive as ``ctx``; attributes may be set freely."""

    def __init__(self, needs_input_grad: tuple[bool, ...]) -> None:
        self.needs_input_grad = needs_input_grad
        self._to_save: tuple = ()
        self._saved: tuple | None = None
        self._node_ref: weakref.ref | None = None
        self._non_differentiable: set[int] = set()
        self.materialize_grads = True

    def save_for_backward(self, *tensors) -> None:
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward can only save tensors or None, got {type(t).__name__}")
        self._to_save = tensors

    def mark_non_differentiable(self, *tensors) -> None:
        self._non_differentiable.update(id(t) for t in tensors)

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = bool(value)

    @property
    def saved_tensors(self) -> tuple:
        if self._saved is None:
            if self._node_ref is None:  # no graph was recorded: hand back what was saved
                return self._to_save
            node = self._node_ref()
            raise FreedGraphError(
                "Trying to backward through the graph a second time (through "
                f"{node.name() if node else 'a custom Function'}): saved tensors were freed. "
                "Pass retain_graph=True to the first backward."
            )
        assert self._node_ref is not None  # set with _saved, when the graph was recorded
        node = self._node_ref()
        return tuple(None if s is None else s.unpack(node) for s in self._saved)


class FunctionBackward(Node):
    __slots__ = ("cls", "ctx", "output_meta")

    def __init__(self, cls, ctx: FunctionCtx, args: tuple, outputs: tuple) -> None:
        super().__init__(tuple([_edge_of(a) if isinstance(a, Tensor) else None for a in args]))
        self.cls, self.ctx = cls, ctx
        self.output_meta = [(tuple(o.shape), o._dtype, o._device) if isinstance(o, Tensor) else None for o in outputs]

    @property
    def num_outputs(self) -> int:  # type: ignore[override]
        return len(self.output_meta)

    def name(self) -> str:
        return self.cls.__name__ + "Backward"

    def apply(self, grads: list) -> tuple:
        if _jit.tracing and not self.cls.__module__.startswith("kiln."):
            # a user's backward, run by the engine even where kiln's own code pinned the ops' line
            # (a class the user marked ``kiln_only``): its ops have lines of their own
            result = _jit.own_lines(self.cls.backward, self.ctx, *grads)
        else:
            result = self.cls.backward(self.ctx, *grads)
        result = result if isinstance(result, tuple) else (result,)
        n = len(self.next_edges)
        if len(result) < n:
            raise RuntimeError(
                f"function {self.name()} returned an incorrect number of gradients (expected {n}, got {len(result)})"
            )
        return tuple(result[:n])

    def release(self) -> None:
        self.ctx._saved = None


class Function:
    """Base class of custom autograd ops; call them with ``MyFunction.apply(*args)``."""

    #: Whether ``forward`` and ``backward`` run kiln's code only (set by kiln's own Functions that call
    #: no callable from the user): a traced call's hazard watch is paused around them. Read from the
    #: Function's own class only, as ``Module.kiln_only``: a subclass's methods may be the user's.
    kiln_only = False

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("a Function subclass must define a static forward(ctx, *args)")

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("a Function subclass must define a static backward(ctx, *grads)")

    @classmethod
    def apply(cls, *args, **kwargs):
        if _jit.watch_hooks and cls.__dict__.get("kiln_only"):
            watch = _jit.watch_here()
            if watch is not None:
                return _jit.unwatched(watch, cls.apply, *args, **kwargs)
        needs = tuple([isinstance(a, Tensor) and a._requires_grad for a in args])
        ctx = FunctionCtx(needs)
        grad_enabled = state.grad_enabled
        set_mode(False)  # forward runs without grad (no_grad's effect, without its object)
        try:
            outputs = cls.forward(ctx, *args, **kwargs)
        finally:
            set_mode(grad_enabled)
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        if not (grad_enabled and True in needs):
            return outputs
        inputs_by_id = {id(a) for a in args if isinstance(a, Tensor)}
        outs = tuple(_alias(o) if isinstance(o, Tensor) and id(o) in inputs_by_id else o for o in outs)
        node = FunctionBackward(cls, ctx, args, outs)
        for i, o in enumerate(outs):
            if isinstance(o, Tensor) and o._dtype.is_floating_point and id(o) not in ctx._non_differentiable:
                o.grad_fn, o._output_nr, o._requires_grad = node, i, True
        ctx._node_ref = weakref.ref(node)
        out_index = {id(o): i for i, o in enumerate(outs) if isinstance(o, Tensor)}
        ctx._saved = tuple(
            [None if t is None else SavedTensor(t, node, out_index[id(t)]) if id(t) in out_index else SavedTensor(t)
             for t in ctx._to_save]
        )  # fmt: skip
        ctx._to_save = ()
        return outs[0] if single else outs


def _alias(t: Tensor) -> Tensor:
    """An output that is an input is returned as a new tensor on the same memory, as in PyTorch."""
    out = make_tensor(t._data, t._device, t._dtype)
    out._version, out._base = t._version, (t._base if t._base is not None else t)
    return out
