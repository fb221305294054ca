"""Cross-entropy of (N, C) logits against class indices on the arrays, as one autograd node.

Composed of ops (``_loss.cross_entropy``: the log-softmax normalizer, the target's checks, a gather,
the weights of the targets kept, the reduction), a classifier's loss was ~20 ops forward and a node
per op backward: where the composite runs on numpy (eager, its compiled program not running), an
MLP's (64, 10) loss was about a third of its step. Here the same formulas run on the arrays: each
row's peak, ``log(sum(exp(x - peak)))``, the logit picked at the target, ``-(picked - peak -
log_total)`` per sample kept (``ignore_index`` drops a sample, and the mean divides by the samples
kept), and the backward is ``(softmax - onehot) * kept * g`` (scaled by the mean's divisor): the ops'
values within rounding. Under ``create_graph``, a trace or a profile the backward is the ops'
gradient of the composite recomputed. It declines (None) wherever the ops must run: class weights,
other shapes, dtypes and kinds, a target out of range (the ops raise the error) and traces and
profiles (which record ops).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.frontend.autograd import grad_mode
from kiln.frontend.ops._util import plain_arrays
from kiln.frontend.ops.arrays_node import ArraysBackward
from kiln.frontend.tensor import Tensor, make_tensor

_INDEX_DTYPES = frozenset({np.dtype(np.int64), np.dtype(np.uint8)})
_REDUCTIONS = ("mean", "sum", "none")


def cross_entropy_on_arrays(input, target, ignore_index: int, reduction: str,
                            composite: Callable[[Tensor], Tensor]) -> Tensor | None:  # fmt: skip
    """The loss of ``input`` (N, C) logits against ``target`` (N,) class indices as one node, or
    None where ``composite`` (the same with ops, of the input alone) must run."""
    if reduction not in _REDUCTIONS or not plain_arrays(input) or not isinstance(target, Tensor):
        return None
    x, t = input._data, target._data
    if x.ndim != 2 or x.size == 0 or t.shape != x.shape[:1] or t.dtype not in _INDEX_DTYPES:
        return None
    if target._device is not input._device or target._requires_grad:
        return None
    kept = t != ignore_index
    safe = np.where(kept, t, 0)
    if safe.min() < 0 or safe.max() >= x.shape[1]:
        return None  # the ops raise the error, naming the target
    dtype = x.dtype.type
    peak = x.max(axis=1, keepdims=True)
    exps = np.exp(x - peak)
    total = exps.sum(axis=1, keepdims=True)
    rows = np.arange(x.shape[0])
    picked = (x[rows, safe] - peak[:, 0]) - np.log(total[:, 0])
    weights = kept.astype(x.dtype)
    losses = -(picked * weights)
    count = weights.sum(dtype=x.dtype)
    if reduction == "none":
        out, scale = losses, None
    elif reduction == "sum":
        out, scale = np.asarray(losses.sum(dtype=x.dtype)), dtype(1)
    else:
        out, scale = np.asarray(losses.sum(dtype=x.dtype) / count), dtype(1) / count
    result = make_tensor(out, input._device, input._dtype)
    if input._requires_grad and grad_mode.state.grad_enabled:
        exps /= total  # softmax
        exps[rows, safe] -= dtype(1)
        exps *= weights[:, None]  # (softmax - onehot) of each sample kept, 0 for the others
        CrossEntropyBackward.attach(result, input, target, exps, scale, composite)
    return result


class CrossEntropyBackward(ArraysBackward):
    """The backward of ``cross_entropy_on_arrays``: ``(softmax - onehot) * kept`` times ``g``
    (per sample for ``reduction="none"``, else times the reduction's scale)."""

    __slots__ = ("slope", "scale")
    slope: np.ndarray | None
    scale: object  # the reduction's factor (a numpy scalar), None for "none"

    @classmethod
    def attach(cls, result: Tensor, input: Tensor, target: Tensor, slope, scale, composite: Callable) -> None:
        # the target as PyTorch's nll_loss keeps it (an in-place change of it is an error); the
        # input for a recomputation only: its values enter no gradient here, as in the ops' nodes
        node = cls._new(result, (input,), composite, also=(target,), unchecked=(0,))
        node.slope, node.scale = slope, scale

    def name(self) -> str:
        return "NllLossBackward0"

    def _takes(self, g: Tensor, x: Tensor) -> bool:
        return plain_arrays(g, x)  # g is the loss's gradient: a scalar, or one per sample

    def _on_arrays(self, g: Tensor, saved: tuple) -> tuple:
        slope = self.slope
        assert slope is not None  # (released together with ``saved``, which unpack_tensors checked)
        ga = g._data
        factor = ga[:, None] if self.scale is None else ga * self.scale
        return (make_tensor(slope * factor, g._device, g._dtype),)

    def release(self) -> None:
        super().release()
        self.slope = None
