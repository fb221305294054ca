"""``linear`` on eager CPU tensors as one autograd node, as PyTorch's addmm.

Composed of ops, ``input @ weight.T + bias`` is three dispatches forward and three backward nodes
(the transpose's, the product's, the sum's), about 9 us and 20 us a call on small tensors where
PyTorch takes 2.6 and 7. ``linear_eager`` runs the product and the bias add on the arrays and
attaches one ``LinearBackward``, whose gradients are the same ops the three nodes ran (so they are
differentiable again under ``create_graph``). It declines (returns None) wherever the composite
must run: a trace records the ops, a profile records them, and every other device, dtype or shape
takes the ops' own checks and errors.
"""

from __future__ import annotations

import numpy as np

from ...ir.primitives import P
from ...ir.types import CPU
from ...runtime.threads import blas_product
from .. import dispatch
from ..autograd import grad_mode
from ..autograd.graph import LazyEdgesNode, _freed_error, pending_edge, version_error
from ..jit import state as _jit
from ..tensor import Tensor, make_tensor
from .linalg import matmul
from .shape import reshape, sum_to, transpose

_matmul, _reduce_sum = P["matmul"], P["reduce_sum"]
_FLOATS = frozenset((np.dtype(np.float32), np.dtype(np.float64)))


def linear_eager(input, weight, bias=None) -> Tensor | None:
    """``input @ weight.T + bias`` as one node, or None where ``nn.functional.linear``'s ops must run."""
    if (_jit.tracing and _jit.current.get() is not None) or dispatch.profiling_ops or not _plain(input, weight, bias):
        return None
    x, w = input._data, weight._data
    dtype = weight._dtype
    if (
        x.dtype not in _FLOATS or input._dtype is not dtype or w.ndim != 2 or x.ndim < 2 or x.shape[-1] != w.shape[1]
        or (bias is not None and (bias._dtype is not dtype or bias._data.shape != (w.shape[0],)))
    ):  # fmt: skip
        return None
    kernel = dispatch._compiled_routes.get(_matmul) or _matmul.eager  # the kernel dispatch would run
    out = _product(kernel, x, w.T)
    if bias is not None:
        out += bias._data  # (the product is a new array)
    result = make_tensor(out, CPU, dtype)
    needs = input._requires_grad or weight._requires_grad or (bias is not None and bias._requires_grad)
    if needs and grad_mode.state.grad_enabled:
        if grad_mode.inference_used and any(t is not None and t._inference for t in (input, weight, bias)):
            return None  # the ops raise the error of saving an inference tensor
        LinearBackward.attach(result, input, weight, bias)
    return result


def _product(kernel, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` by the matmul primitive's kernel, on the BLAS threads dispatch's product would use."""
    return blas_product(kernel, a.shape, b.shape, np, a, b)


def _plain(input, weight, bias) -> bool:
    """Plain CPU tensors (Parameters included; no sparse or other kind of tensor)."""
    for t in (input, weight, bias):
        if t is None:
            continue
        if not isinstance(t, Tensor) or t._device is not CPU or getattr(t, "is_sparse", False):
            return False
    return True


class LinearBackward(LazyEdgesNode):
    """The backward of ``linear_eager``: the product's two gradients and the bias's sum.

    It keeps few objects for the cyclic collector to walk: the saved tensors themselves with their
    versions as ints (no saved-tensor objects), and the parameters (leaves) in place of their edges
    until backward reads them (no edge tuple per call)."""

    __slots__ = ("saved_input", "input_version", "saved_weight", "weight_version", "input_shape")
    saved_input: Tensor | None  # None: not needed (the weight needs no gradient), or released
    input_version: int
    saved_weight: Tensor | None
    weight_version: int
    input_shape: tuple[int, ...]

    @classmethod
    def attach(cls, result: Tensor, input: Tensor, weight: Tensor, bias: Tensor | None) -> None:
        node = cls((pending_edge(input), pending_edge(weight), None if bias is None else pending_edge(bias)))
        # Each saved tensor is checked for in-place changes when read: the input for the weight's
        # gradient, the weight for the input's (as the product's node read them).
        node.saved_input = input if weight._requires_grad else None
        node.saved_weight = weight if input._requires_grad else None
        node.input_version, node.weight_version = input._version[0], weight._version[0]
        node.input_shape = input._data.shape
        result.grad_fn, result._output_nr, result._requires_grad = node, 0, True

    def name(self) -> str:
        return "LinearBackward"

    def apply(self, grads: list) -> tuple:
        g = grads[0]
        if (
            grad_mode.state.grad_enabled
            or (_jit.tracing and _jit.current.get() is not None)
            or dispatch.profiling_ops
            or g._device is not CPU
        ):
            return self._through_ops(g)  # a graph (create_graph), a trace or a profile records each op
        return self._on_arrays(g)

    def _through_ops(self, g: Tensor) -> tuple:
        edge_x, edge_w, edge_b = self.next_edges
        grad_x = grad_w = grad_b = None
        if edge_x is not None:
            grad_x = matmul(g, self._unpack(self.saved_weight, self.weight_version))
        if edge_w is not None:
            rows = reshape(g, (-1, g._data.shape[-1]))
            grad_w = matmul(
                transpose(rows, 0, 1),
                reshape(self._unpack(self.saved_input, self.input_version), (-1, self.input_shape[-1])),
            )
        if edge_b is not None:
            grad_b = sum_to(g, (g._data.shape[-1],))
        return grad_x, grad_w, grad_b

    def _on_arrays(self, g: Tensor) -> tuple:
        """The same gradients from the same kernels, run on the arrays: nothing records them."""
        edge_x, edge_w, edge_b = self.next_edges
        kernel = dispatch._compiled_routes.get(_matmul) or _matmul.eager
        dtype, out = g._dtype, g._data
        grad_x = grad_w = grad_b = None
        if edge_x is not None:
            w = self._unpack(self.saved_weight, self.weight_version)._data
            grad_x = make_tensor(_product(kernel, out, w), CPU, dtype)
        if edge_w is not None:
            x = self._unpack(self.saved_input, self.input_version)._data
            rows = out.reshape(-1, out.shape[-1])
            grad_w = make_tensor(_product(kernel, rows.T, x.reshape(-1, x.shape[-1])), CPU, dtype)
        if edge_b is not None:
            summed = (dispatch._compiled_routes.get(_reduce_sum) or _reduce_sum.eager)(
                np, out, axes=tuple(range(out.ndim - 1)), keepdim=False
            )
            grad_b = make_tensor(np.asarray(summed), CPU, dtype)
        return grad_x, grad_w, grad_b

    def _unpack(self, saved: Tensor | None, version: int) -> Tensor:
        if saved is None:  # (read only for a gradient that needs it: it was saved, then released)
            raise _freed_error(self)
        if saved._version[0] != version:
            raise version_error(self, version, saved._version[0])
        return saved

    def release(self) -> None:
        self.saved_input = self.saved_weight = None
