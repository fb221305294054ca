"""Layer normalization on the arrays of eager CPU tensors, as one autograd node.

Composed of ops (``_norm.layer_norm``: ``moments``, then the affine map), a layer norm is about ten
ops forward and a node per op backward, each a pass over the rows or a reduction of its own: where
the composite runs on numpy (eager, its compiled program not running), GPT's five LayerNorms of
(8, 64, 128) were about a sixth of its step. Here the same formulas run on (rows, D) arrays --
the mean, the deviations centered twice (``_batch_norm.moments`` says why), the biased variance,
``r = 1 / sqrt(var + eps)`` -- and the backward is the closed form over each row's D values,

    dx = r (gw - mean(gw) - xhat mean(gw xhat)),   gw = g * weight,   xhat = centered * r,

with the weight's and the bias's gradients ``sum(g xhat)`` and ``sum(g)`` over the rows: the ops'
values within rounding. Under ``create_graph``, a trace or a profile the backward is the ops'
gradient of the composite recomputed (differentiable again). It declines (None) wherever the
composite must run: traces and profiles record ops; other devices, dtypes and kinds take the ops'.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.frontend.autograd import grad_mode
from kiln.frontend.ops._util import plain_arrays
from kiln.frontend.ops.arrays_node import ArraysBackward
from kiln.frontend.tensor import Tensor, make_tensor

#: ``composite(x, weight, bias)``: the layer norm computed with ops (the backward's recompute).
Composite = Callable[[Tensor, "Tensor | None", "Tensor | None"], Tensor]


def layer_norm_on_arrays(x, size: int, weight, bias, eps: float, composite: Composite) -> Tensor | None:
    """Layer norm of ``x`` over its trailing dims of ``size`` elements together (``weight`` and
    ``bias`` of those dims, or None) as one node; None where ``composite`` must run."""
    if not plain_arrays(x, weight, bias) or x._data.size == 0 or size == 0:
        return None
    a = x._data.reshape(-1, size)  # (rows, D): a view where x's memory allows, else a copy
    dtype = a.dtype.type
    mean = a.mean(axis=1, keepdims=True)
    centered = a - mean
    centered -= centered.mean(axis=1, keepdims=True)  # (the drift)
    var = np.einsum("rd,rd->r", centered, centered)[:, None] / dtype(size)
    r = np.sqrt(var + dtype(eps))
    np.divide(dtype(1), r, out=r)
    y = centered * r
    if weight is not None:
        y *= weight._data.reshape(1, size)
    if bias is not None:
        y += bias._data.reshape(1, size)
    result = make_tensor(y.reshape(x._data.shape), x._device, x._dtype)
    if grad_mode.state.grad_enabled and any(t is not None and t._requires_grad for t in (x, weight, bias)):
        LayerNormBackward.attach(result, (x, weight, bias), (centered, r), composite)
    return result


class LayerNormBackward(ArraysBackward):
    """The closed-form gradients of ``layer_norm_on_arrays``' output (see the module docstring)."""

    __slots__ = ("arrays", "bias_shape")
    arrays: tuple  # the deviations (rows, D) and r (rows, 1)
    bias_shape: tuple | None

    @classmethod
    def attach(cls, result: Tensor, inputs: tuple, arrays: tuple, composite: Composite) -> None:
        node = cls._new(result, inputs, composite, unchecked=(2,))  # no gradient reads the bias's value
        node.arrays = arrays
        node.bias_shape = None if inputs[2] is None else inputs[2]._data.shape

    def name(self) -> str:
        return "NativeLayerNormBackward"

    def _on_arrays(self, g: Tensor, saved: tuple) -> tuple:
        weight = saved[1]
        centered, r = self.arrays
        size = centered.shape[1]
        dtype = centered.dtype.type
        g2 = g._data.reshape(-1, size)
        xhat = centered * r
        edge_x, edge_w, edge_b = self.next_edges
        gx = gw = gb = None
        if edge_w is not None:
            gw = make_tensor(np.einsum("rd,rd->d", g2, xhat).reshape(weight._data.shape), g._device, g._dtype)
        if edge_b is not None:
            gb = make_tensor(g2.sum(axis=0).reshape(self.bias_shape), g._device, g._dtype)
        if edge_x is not None:
            gy = g2 * weight._data.reshape(1, size) if weight is not None else g2.copy()
            proj = np.einsum("rd,rd->r", gy, xhat)[:, None] / dtype(size)  # mean(gy xhat) per row
            gy -= gy.mean(axis=1, keepdims=True)
            gy -= xhat * proj
            gy *= r
            gx = make_tensor(gy.reshape(g._data.shape), g._device, g._dtype)
        return gx, gw, gb

    def release(self) -> None:
        super().release()
        self.arrays = ()
