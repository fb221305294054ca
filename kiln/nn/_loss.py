"""Classification losses, against classes or class probabilities: nll_loss, cross_entropy,
binary_cross_entropy and kl_div (binary_cross_entropy_with_logits: ``_loss_logits``).

``reduction`` is ``"mean"``, ``"sum"`` or ``"none"``, as in PyTorch; for class-index targets
``"mean"`` divides by the summed weights of the targets that are not ``ignore_index``.
"""

from __future__ import annotations

import kiln
from kiln.frontend.autocast import FLOAT32, autocast_op
from kiln.frontend.eager_composites import compiled_composite

from ._cross_entropy_arrays import cross_entropy_on_arrays
from ._loss_logits import check_same_size
from ._loss_reduction import _check_reduction, _reduce, legacy_reduction
from ._utils import check_tensor, saves_target

__all__ = ["nll_loss", "cross_entropy", "binary_cross_entropy", "kl_div"]

# PyTorch's names of the dtypes a class-index target must not have, for its error message
_TORCH_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "bool": "Bool",
                "int32": "Int", "int16": "Short", "int8": "Char"}  # fmt: skip


class TargetError(RuntimeError, ValueError):
    """A target that does not fit the input (its shape, or a float target that is neither class
    indices nor probabilities of the input's shape). A ``RuntimeError`` as in PyTorch, which code
    ported from it catches, and a ``ValueError`` as kiln raised before."""


def _class_dim(input: kiln.Tensor, op: str) -> int:
    if input.ndim == 0:
        raise ValueError(f"{op}: expected input of shape (C,), (N, C) or (N, C, d1, ...), got a 0-d tensor")
    return 0 if input.ndim == 1 else 1


def _check_class_weight(weight, classes: int, op: str) -> None:
    if weight is not None and tuple(weight.shape) != (classes,):
        raise RuntimeError(
            f"{op}: weight tensor should be defined either for all {classes} classes or no classes but got "
            f"weight tensor of shape: {list(weight.shape)}"
        )


def _picked_log_probs(logp, target, weight, ignore_index: int, op: str, normalizer=None):
    """Per-sample -logp[target] * w[target] and the weights w (0 where ignored). With
    ``normalizer``, ``(peak, log_total)`` along the class dim (keepdim), ``logp`` holds logits
    and the log-probability picked is ``(logit - peak) - log_total``: log_softmax's value at the
    target, without the whole log_softmax (``_log_softmax_normalizer``)."""
    cdim = _class_dim(logp, op)
    classes = logp.shape[cdim]
    expected = tuple(s for i, s in enumerate(logp.shape) if i != cdim)
    if target.dtype not in (kiln.int64, kiln.uint8):  # PyTorch takes Long or Byte only: code run here must run there
        name = _TORCH_NAMES.get(target.dtype.name, target.dtype.name)
        why = "class indices are int64 (or uint8)"
        if op == "cross_entropy" and target.dtype.is_floating_point:
            why += f"; class probabilities need the input's shape {list(logp.shape)}, got {list(target.shape)}"
        raise TargetError(f"{op}: expected target dtype to be Long or Byte, but got {name} ({why})")
    if tuple(target.shape) != expected:
        raise TargetError(
            f"{op}: expected target of shape {list(expected)} for input of shape {list(logp.shape)}, "
            f"got {list(target.shape)}"
        )
    _check_class_weight(weight, classes, op)
    indices = target.to(kiln.int64)
    valid = indices != ignore_index
    safe = kiln.where(valid, indices, 0)
    index = safe.unsqueeze(cdim)
    # The gather below checks the same index with the same bounds: compiled, one check remains (this one).
    message = f"{op}: Target {{value}} is out of bounds (expected class indices in [0, {classes - 1}])"
    kiln.jit.check_range(index, 0, classes, IndexError, message)
    picked = saves_target(kiln.gather(logp, cdim, index), target, "nll_loss")  # PyTorch's nll_loss keeps it
    if normalizer is not None:
        peak, log_total = normalizer
        picked = (picked - peak) - log_total
    picked = picked.squeeze(cdim)
    if weight is None:
        w = valid.to(logp.dtype)
    else:
        w = kiln.where(valid, kiln.gather(weight, 0, safe.flatten()).reshape(safe.shape), 0.0)
    return -(picked * w), w, valid


@autocast_op(FLOAT32)
def nll_loss(input, target, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
             reduction: str = "mean") -> kiln.Tensor:  # fmt: skip
    """Negative log-likelihood of class indices ``target`` under log-probabilities ``input`` (N, C, ...)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_tensor(input, "input", "nll_loss")
    _check_reduction(reduction)
    losses, w, _ = _picked_log_probs(input, target, weight, ignore_index, "nll_loss")
    if reduction == "none":
        return losses
    return losses.sum() if reduction == "sum" else losses.sum() / w.sum()


@autocast_op(FLOAT32)
@compiled_composite("cross_entropy")
def cross_entropy(input, target, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> kiln.Tensor:  # fmt: skip
    """Cross-entropy of logits ``input`` (C,), (N, C) or (N, C, d1, ...) against class indices or
    class probabilities (a float ``target`` of the input's shape), as ``torch.nn.functional.cross_entropy``.

    >>> import kiln
    >>> round(cross_entropy(kiln.tensor([[0.0, 0.0]]), kiln.tensor([1])).item(), 4)
    0.6931
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_tensor(input, "input", "cross_entropy")
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    cdim = _class_dim(input, "cross_entropy")
    classes = input.shape[cdim]
    soft = target.dtype.is_floating_point and tuple(target.shape) == tuple(input.shape)
    if not soft and label_smoothing == 0.0 and input.numel():

        def composite(logits):
            normalizer = _log_softmax_normalizer(logits, cdim)
            losses, w, _ = _picked_log_probs(logits, target, weight, ignore_index, "cross_entropy", normalizer)
            return losses if reduction == "none" else losses.sum() if reduction == "sum" else losses.sum() / w.sum()

        out = None if weight is not None else cross_entropy_on_arrays(input, target, ignore_index, reduction, composite)
        return composite(input) if out is None else out  # (None: the ops run)
    logp = kiln.log_softmax(input, dim=cdim)
    if soft:
        return _soft_cross_entropy(logp, target, weight, reduction, label_smoothing, cdim)
    losses, w, valid = _picked_log_probs(logp, target, weight, ignore_index, "cross_entropy")
    loss = losses if reduction == "none" else losses.sum() if reduction == "sum" else losses.sum() / w.sum()
    if label_smoothing == 0.0:
        return loss
    # PyTorch's smoothing term: -sum_c w_c logp_c per sample, 0 where ignored, normalized like the loss.
    weighted = logp if weight is None else logp * _class_shaped(weight, logp, cdim)
    smooth = kiln.where(valid, -weighted.sum(dim=cdim), 0.0)
    if reduction == "sum":
        smooth = smooth.sum()
    elif reduction == "mean":
        smooth = smooth.sum() / w.sum()
    return loss * (1 - label_smoothing) + smooth * (label_smoothing / classes)


def _log_softmax_normalizer(input, cdim: int):
    """``(peak, log_total)``: log_softmax(input) is ``(input - peak) - log_total`` along ``cdim``
    (keepdim), as ``kiln.log_softmax`` computes it. Cross-entropy against class indices needs
    log_softmax at the targets only: compiled, the forward writes per-sample values instead of two
    arrays of the logits' size, and the backward is one elementwise pass (softmax minus the
    one-hot) without a sum over the classes (GPT's (512, 256) logits, forward and backward
    compiled, one thread: 165 -> 153 us; PyTorch's 120 us)."""
    peak = input.detach().amax(dim=cdim, keepdim=True)
    return peak, kiln.log(kiln.exp(input - peak).sum(dim=cdim, keepdim=True))


def _class_shaped(weight, like, cdim: int):
    shape = [1] * like.ndim
    shape[cdim] = weight.shape[0]
    return weight.reshape(shape)


def _soft_cross_entropy(logp, target, weight, reduction: str, label_smoothing: float, cdim: int):
    classes = logp.shape[cdim]
    _check_class_weight(weight, classes, "cross_entropy")
    if label_smoothing > 0.0:
        target = target * (1 - label_smoothing) + label_smoothing / classes
    product = logp * target if weight is None else logp * target * _class_shaped(weight, logp, cdim)
    losses = -product.sum(dim=cdim)
    if reduction == "mean":
        return losses.sum() / (logp.numel() // classes if logp.numel() else 0)
    return losses.sum() if reduction == "sum" else losses


def _clamped_logs(x):
    return kiln.clamp(kiln.log(x), min=-100.0), kiln.clamp(kiln.log(1 - x), min=-100.0)


class _BinaryCrossEntropy(kiln.autograd.Function):
    """Elementwise BCE with PyTorch's own input gradient, (x - t) / max(x (1 - x), 1e-12).

    Differentiating the clamped logs instead would give 0 * inf = nan at x = 0 or 1 (a saturated
    sigmoid); PyTorch's formula stays finite there, and so does this one.
    """

    kiln_only = True  # calls no user code: a traced call runs it unwatched (``jit.hazards``)

    @staticmethod
    def forward(ctx, input, target):
        ctx.save_for_backward(input, target)
        log_x, log_1mx = _clamped_logs(input)
        return -(target * log_x + (1 - target) * log_1mx)

    @staticmethod
    def backward(ctx, grad):
        input, target = ctx.saved_tensors
        grad_input = grad * (input - target) / kiln.clamp((1 - input) * input, min=1e-12)
        # The target's gradient is not clamped in PyTorch: it is infinite where the input is 0 or 1.
        return grad_input, grad * (kiln.log(1 - input) - kiln.log(input))


@autocast_op(FLOAT32)
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction: str = "mean") -> kiln.Tensor:  # fmt: skip
    """-(t log x + (1 - t) log(1 - x)) for probabilities ``input``; each log clamped to >= -100 as in PyTorch."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_tensor(input, "input", "binary_cross_entropy")
    check_same_size(input, target, "binary_cross_entropy")
    # not (x < 0 or x > 1) rather than 0 <= x <= 1: a nan passes, as in PyTorch
    outside = (input < 0) | (input > 1)
    kiln.jit.check_values(
        ~outside, RuntimeError, "binary_cross_entropy: all elements of input should be between 0 and 1"
    )
    loss = _BinaryCrossEntropy.apply(input, target)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def kl_div(input, target, size_average=None, reduce=None, reduction: str = "mean",
           log_target: bool = False) -> kiln.Tensor:  # fmt: skip
    """KL(target || exp(input)) pointwise: ``target (log target - input)``; ``input`` holds log-probabilities.

    ``reduction="batchmean"`` divides the sum by the batch size (the mathematically right mean).
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    if log_target:
        loss = kiln.exp(target) * (target - input)
    else:
        # xlogy, as PyTorch's: 0 log 0 = 0 (with no nan gradient), a negative target gives nan
        loss = kiln.special.xlogy(target, target) - target * input
    if reduction == "batchmean":
        return loss.sum() / input.shape[0] if input.ndim else loss.sum()
    return _reduce(loss, reduction)
