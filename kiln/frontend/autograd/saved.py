"""What backward nodes save of the forward: tensors with the versions they had, checked when read,
and the errors of reading them after an in-place change or after the graph was freed."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .graph import Node


class SavedTensor:
    """A tensor saved for backward, with the version it had then.

    An output is saved as its array and version counter, not as the tensor, so that the
    tensor -> grad_fn -> saved tensor path is no reference cycle; unpacking rebuilds a tensor
    whose ``grad_fn`` is the saving node (needed for higher-order gradients).
    """

    __slots__ = ("tensor", "data", "device", "counter", "version", "node_ref", "output_nr", "trace")

    def __init__(self, tensor, node: Node | None = None, output_nr: int = 0) -> None:
        if tensor._inference:
            raise inference_error()
        self.counter = tensor._version
        self.version = tensor._version[0]
        if node is None:
            self.tensor = tensor
        else:
            self.tensor = None
            self.data, self.device = tensor._data, tensor._device
            self.node_ref, self.output_nr = weakref.ref(node), output_nr
            self.trace = tensor._trace  # a traced output keeps its IR value when unpacked

    def unpack(self, node: Node):
        if self.counter[0] != self.version:
            raise version_error(node, self.version, self.counter[0])
        if self.tensor is not None:
            return self.tensor
        from ..tensor import make_tensor  # noqa: PLC0415 - tensor imports this module

        t = make_tensor(self.data, self.device)
        t._version = self.counter
        t._requires_grad = True
        t.grad_fn, t._output_nr = self.node_ref(), self.output_nr
        if self.trace is not None:
            t._trace = self.trace
        return t


def save_tensors(tensors: tuple, unchecked: tuple[int, ...] = ()) -> tuple[int | None, ...]:
    """The versions ``tensors`` (None for an absent one) have now, for ``unpack_tensors`` to check
    later. A node keeps the tensors themselves and these ints (no object per saved tensor, and ints
    are not walked by the cyclic collector); for inputs only, whose tensors hold no path back to
    the node (an output's does: ``SavedTensor``). The tensors at the positions ``unchecked`` are kept
    for a recomputation whose gradients do not read their values (a bias, which PyTorch's nodes do not
    save): their version is None, and an in-place change of them is no error."""
    for t in tensors:
        if t is not None and t._inference:
            raise inference_error()
    return tuple([None if t is None or i in unchecked else t._version[0] for i, t in enumerate(tensors)])


def unpack_tensors(node: Node, tensors: tuple | None, versions: tuple) -> tuple:
    """``tensors`` as ``node`` saved them (``save_tensors``), each checked for in-place changes."""
    if tensors is None:
        raise _freed_error(node)
    for t, version in zip(tensors, versions, strict=True):
        if version is not None and t._version[0] != version:
            raise version_error(node, version, t._version[0])
    return tensors


def inference_error() -> RuntimeError:
    return RuntimeError(
        "Inference tensors cannot be saved for backward. Make a normal tensor from it "
        "(x.clone() outside kiln.inference_mode()) before using it in autograd."
    )


def version_error(node: Node, saved: int, now: int) -> RuntimeError:
    """The error for a tensor that ``node`` saved at version ``saved`` and finds at ``now``."""
    return RuntimeError(
        "one of the variables needed for gradient computation has been modified by an "
        f"inplace operation: it was saved by {node.name()} at version {saved} and "
        f"is now at version {now}. Hint: clone it before the inplace "
        "operation, or run with kiln.autograd.set_detect_anomaly(True) to see the forward op."
    )


class FreedGraphError(RuntimeError):
    """A backward reached a node whose saved values were freed by an earlier backward (run the
    first one with ``retain_graph=True`` to keep them). A ``RuntimeError``, as PyTorch raises."""


def _freed_error(node: Node) -> FreedGraphError:
    return FreedGraphError(
        f"Trying to backward through the graph a second time (through {node.name()}): its saved "
        "tensors were freed after the first backward. Pass retain_graph=True to the first "
        "backward() or autograd.grad() call if you need to backward through it again."
    )
