"""``kiln.nn.functional``: the neural-network math as functions, PyTorch's names and semantics.

Everything here is written against kiln's public API only (``import kiln``), as a user could
have written it: convolution and pooling over ``kiln.unfold_windows``, losses and norms over
reductions and elementwise ops. Gradients come from the primitives underneath.

>>> import kiln
>>> import kiln.nn.functional as F
>>> F.relu(kiln.tensor([-1.0, 2.0])).tolist()
[0.0, 2.0]
"""

from __future__ import annotations

import math

import kiln
from kiln.frontend.autocast import LOWER, autocast_op
from kiln.frontend.eager_composites import compiled_composite
from kiln.frontend.ops.leaky_relu import leaky_relu_eager
from kiln.frontend.ops.linear import linear_eager

from ._activation import (
    celu,
    glu,
    gumbel_softmax,
    hardshrink,
    hardsigmoid,
    hardswish,
    mish,
    prelu,
    rrelu,
    selu,
    softmin,
    softshrink,
    softsign,
    tanhshrink,
    threshold,
)
from ._conv import conv1d, conv2d, conv3d, fold, unfold
from ._conv_transpose import conv_transpose1d, conv_transpose2d, conv_transpose3d
from ._ctc import ctc_loss
from ._derived import derived
from ._distance import (
    channel_shuffle,
    cosine_similarity,
    normalize,
    pairwise_distance,
    pdist,
    pixel_shuffle,
    pixel_unshuffle,
)
from ._dropout import alpha_dropout, dropout1d, dropout2d, dropout3d, feature_alpha_dropout
from ._embedding import embedding
from ._embedding_bag import embedding_bag
from ._grid import affine_grid, grid_sample
from ._interpolate import interpolate, upsample, upsample_bilinear, upsample_nearest
from ._loss import binary_cross_entropy, cross_entropy, kl_div, nll_loss
from ._loss_logits import binary_cross_entropy_with_logits
from ._loss_margin import (
    cosine_embedding_loss,
    hinge_embedding_loss,
    margin_ranking_loss,
    multi_margin_loss,
    multilabel_margin_loss,
    multilabel_soft_margin_loss,
    soft_margin_loss,
    triplet_margin_loss,
    triplet_margin_with_distance_loss,
)
from ._loss_regression import gaussian_nll_loss, huber_loss, l1_loss, mse_loss, poisson_nll_loss, smooth_l1_loss
from ._norm import batch_norm, group_norm, instance_norm, layer_norm, local_response_norm, rms_norm
from ._pooling import (
    max_pool1d,
    max_pool1d_with_indices,
    max_pool2d,
    max_pool2d_with_indices,
    max_pool3d,
    max_pool3d_with_indices,
    max_unpool1d,
    max_unpool2d,
    max_unpool3d,
)
from ._pooling_adaptive import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_avg_pool3d,
    adaptive_max_pool1d,
    adaptive_max_pool1d_with_indices,
    adaptive_max_pool2d,
    adaptive_max_pool2d_with_indices,
    adaptive_max_pool3d,
    adaptive_max_pool3d_with_indices,
)
from ._pooling_avg import avg_pool1d, avg_pool2d, avg_pool3d, lp_pool1d, lp_pool2d, lp_pool3d
from ._utils import check_tensor

__all__ = [
    # activations
    "relu", "relu6", "leaky_relu", "elu", "gelu", "silu", "softplus", "sigmoid", "tanh", "logsigmoid",
    "hardtanh", "softmax", "log_softmax",
    # layers
    "linear", "bilinear", "embedding", "dropout", "scaled_dot_product_attention", "one_hot", "pad",
    "conv1d", "conv2d", "conv3d", "unfold", "fold",
    "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
    "layer_norm", "batch_norm", "group_norm", "instance_norm", "rms_norm",
    # losses
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
    "smooth_l1_loss", "huber_loss", "kl_div", "soft_margin_loss", "margin_ranking_loss", "hinge_embedding_loss",
    "cosine_embedding_loss", "poisson_nll_loss", "gaussian_nll_loss", "triplet_margin_loss",
    "multilabel_soft_margin_loss", "multi_margin_loss",
    # more activations, in-place forms
    "celu", "selu", "glu", "hardswish", "hardsigmoid", "mish", "softsign", "softmin", "softshrink", "hardshrink",
    "tanhshrink", "threshold", "prelu", "rrelu", "relu_", "elu_", "leaky_relu_", "hardtanh_", "threshold_",
    "celu_", "selu_", "rrelu_",
    # shapes, distances, resampling, channel dropout
    "normalize", "cosine_similarity", "pairwise_distance", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle",
    "interpolate", "upsample", "upsample_nearest", "upsample_bilinear",
    "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
    # more pooling, sampling, transposed convolution
    "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "adaptive_max_pool1d_with_indices",
    "adaptive_max_pool2d_with_indices", "adaptive_max_pool3d_with_indices", "lp_pool1d", "lp_pool2d", "lp_pool3d",
    "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices", "gumbel_softmax",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "triplet_margin_with_distance_loss", "max_unpool1d", "max_unpool2d",
    "max_unpool3d", "pdist", "affine_grid", "grid_sample", "multilabel_margin_loss",
    "ctc_loss", "embedding_bag", "local_response_norm",
]  # fmt: skip


# ----------------------------------------------------------------------------- activations
def relu(input, inplace: bool = False) -> kiln.Tensor:
    if inplace:
        return input.relu_()
    return kiln.relu(input)  # one autograd node on plain CPU tensors, eagerly (frontend/ops/relu.py)


def gelu(input, approximate: str = "none") -> kiln.Tensor:
    """x * Phi(x); ``approximate="tanh"`` for the tanh formula."""
    return kiln.gelu(input, approximate=approximate)


def silu(input, inplace: bool = False) -> kiln.Tensor:
    return kiln.silu(input)


def softplus(input, beta: float = 1.0, threshold: float = 20.0) -> kiln.Tensor:
    return kiln.softplus(input, beta, threshold)


def sigmoid(input) -> kiln.Tensor:
    return kiln.sigmoid(input)


def tanh(input) -> kiln.Tensor:
    return kiln.tanh(input)


def leaky_relu(input, negative_slope: float = 0.01, inplace: bool = False) -> kiln.Tensor:
    # `x > 0` as the condition: the gradient at 0 is negative_slope (PyTorch's) and nan stays nan.
    out = leaky_relu_eager(input, negative_slope)  # one autograd node on plain CPU tensors, eagerly
    if out is None:
        out = kiln.where(input > 0, input, input * negative_slope)
    return input.copy_(out) if inplace else out


def elu(input, alpha: float = 1.0, inplace: bool = False) -> kiln.Tensor:
    positive = input > 0
    # expm1 of the clamped input, so the unselected branch cannot overflow into a nan gradient.
    out = kiln.where(positive, input, kiln.expm1(kiln.where(positive, 0.0, input)) * alpha)
    return input.copy_(out) if inplace else out


def hardtanh(input, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> kiln.Tensor:
    # Not clamp: PyTorch's hardtanh has gradient 0 on the bounds themselves (clamp passes 1).
    out = kiln.where(input <= min_val, min_val, kiln.where(input >= max_val, max_val, input))
    return input.copy_(out) if inplace else out


def relu6(input, inplace: bool = False) -> kiln.Tensor:
    return hardtanh(input, 0.0, 6.0, inplace)


# In-place forms: the result written back into ``input`` (PyTorch's trailing-underscore names).
def relu_(input) -> kiln.Tensor:
    return input.relu_()


def elu_(input, alpha: float = 1.0) -> kiln.Tensor:
    return input.copy_(elu(input, alpha))


def leaky_relu_(input, negative_slope: float = 0.01) -> kiln.Tensor:
    return input.copy_(leaky_relu(input, negative_slope))


def hardtanh_(input, min_val: float = -1.0, max_val: float = 1.0) -> kiln.Tensor:
    return input.copy_(hardtanh(input, min_val, max_val))


def threshold_(input, threshold_value: float, value: float) -> kiln.Tensor:
    return input.copy_(threshold(input, threshold_value, value))


def celu_(input, alpha: float = 1.0) -> kiln.Tensor:
    return input.copy_(celu(input, alpha))


def selu_(input) -> kiln.Tensor:
    return input.copy_(selu(input))


def rrelu_(input, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False) -> kiln.Tensor:
    return input.copy_(rrelu(input, lower, upper, training))


def logsigmoid(input) -> kiln.Tensor:
    return -kiln.softplus(-input)


def _softmax_dim(input, dim) -> int:
    if dim is not None:
        return dim
    return 0 if input.ndim in (0, 1, 3) else 1  # PyTorch's legacy implicit dim


def softmax(input, dim=None, _stacklevel: int = 3, dtype=None) -> kiln.Tensor:
    return kiln.softmax(input, _softmax_dim(input, dim), dtype=dtype)


def log_softmax(input, dim=None, _stacklevel: int = 3, dtype=None) -> kiln.Tensor:
    return kiln.log_softmax(input, _softmax_dim(input, dim), dtype=dtype)


# ----------------------------------------------------------------------------- layers
@autocast_op(LOWER)
@kiln.jit.composite("linear")
def linear(input, weight, bias=None) -> kiln.Tensor:
    """``input @ weight.T + bias`` over any leading dims of ``input`` (..., in_features).

    >>> import kiln
    >>> linear(kiln.ones(2, 3), kiln.ones(4, 3), kiln.zeros(4)).shape
    kiln.Size([2, 4])
    """
    fast = linear_eager(input, weight, bias)  # one autograd node on plain CPU tensors, eagerly
    if fast is not None:
        return fast
    check_tensor(input, "input", "linear")
    check_tensor(weight, "weight", "linear")
    if weight.ndim not in (1, 2):
        raise RuntimeError(f"linear: expected a 1-d or 2-d weight, got weight of size {list(weight.shape)}")
    if input.ndim == 0 or input.shape[-1] != weight.shape[-1]:
        raise RuntimeError(
            f"linear: input's last dimension must equal in_features={weight.shape[-1]} (weight of size "
            f"{list(weight.shape)}), got input of size {list(input.shape)}"
        )
    # (a Linear looped over time steps: its weight's transpose is recorded once per trace)
    transposed = (
        derived(("linear weight^T",), (input, weight), lambda: weight.transpose(0, 1)) if weight.ndim == 2 else weight
    )
    out = kiln.matmul(input, transposed)
    return out if bias is None else out + bias


def bilinear(input1, input2, weight, bias=None) -> kiln.Tensor:
    """``y[..., o] = input1[..., i] weight[o, i, j] input2[..., j] + bias[o]``."""
    if weight.ndim != 3 or input1.shape[-1] != weight.shape[1] or input2.shape[-1] != weight.shape[2]:
        raise RuntimeError(
            f"bilinear: expected weight (out, in1, in2) to match input1 (..., {input1.shape[-1]}) and input2 "
            f"(..., {input2.shape[-1]}), got weight of size {list(weight.shape)}"
        )
    out_features, in1, in2 = weight.shape
    lead = tuple(input1.shape[:-1])
    x1, x2 = input1.reshape(-1, in1), input2.reshape(-1, in2)
    mixed = kiln.matmul(x1, weight.permute(1, 0, 2).reshape(in1, out_features * in2))
    out = (mixed.reshape(-1, out_features, in2) * x2.unsqueeze(1)).sum(dim=-1).reshape(*lead, out_features)
    return out if bias is None else out + bias


def dropout(input, p: float = 0.5, training: bool = True, inplace: bool = False, *, generator=None) -> kiln.Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1 / (1 - p); identity when not training.

    The mask is drawn with ``kiln.bernoulli`` from ``generator`` (the default generator when None),
    so the same seed gives the same mask. The keep probability is a number, not a tensor filled
    with it: traced, such a tensor became a constant of the input's size in the program and its
    detached copy an index gather (a GAT's (8, 2708, 2708) attention: seconds of tracing, and a
    constant read per call).
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        out = input * 0.0
    else:
        keep = kiln.bernoulli(input, 1.0 - p, generator=generator)
        out = input * keep * (1.0 / (1.0 - p))
    return input.copy_(out) if inplace else out


@autocast_op(LOWER)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale=None, *, generator=None) -> kiln.Tensor:  # fmt: skip
    """softmax(q k^T * scale + mask) v over (..., L, E) queries and (..., S, E) keys.

    A bool ``attn_mask`` says which positions take part (True = keep), a float one is added to
    the scores; ``is_causal`` keeps key j for query i when j <= i.
    """
    if is_causal and attn_mask is not None:
        raise RuntimeError("scaled_dot_product_attention: explicit attn_mask should not be set when is_causal=True")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise RuntimeError(
            f"scaled_dot_product_attention: expected query (..., L, E), key (..., S, E) and value (..., S, Ev), got "
            f"{list(query.shape)}, {list(key.shape)} and {list(value.shape)}"
        )
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if dropout_p > 0.0:  # random: eager, on the generator's stream
        weights = dropout(_attention_weights(query, key, attn_mask, is_causal, scale), dropout_p, generator=generator)
        return kiln.matmul(weights, value)
    return _attention(query, key, value, attn_mask, is_causal, scale)


@compiled_composite("scaled_dot_product_attention")
def _attention(query, key, value, attn_mask, is_causal: bool, scale: float) -> kiln.Tensor:
    """Attention without dropout: eager calls run one compiled program (``eager_composites``), the
    scale, mask and softmax one kernel between the two products, and its compiled backward (a GPT's
    (8, 4, 64, 32) causal heads, forward and backward, one thread: 1.8 -> 1.1 ms; PyTorch 1.0 ms)."""
    return kiln.matmul(_attention_weights(query, key, attn_mask, is_causal, scale), value)


def _attention_weights(query, key, attn_mask, is_causal: bool, scale: float) -> kiln.Tensor:
    """softmax(q k^T * scale + mask) over the keys."""
    scores = kiln.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        length, source = query.shape[-2], key.shape[-2]
        rows = kiln.arange(length, device=query.device).reshape(length, 1)
        attn_mask = kiln.arange(source, device=query.device).reshape(1, source) <= rows
    if attn_mask is not None:
        if attn_mask.dtype == kiln.bool:
            scores = kiln.where(attn_mask, scores, -math.inf)
        else:
            scores = scores + attn_mask
    return kiln.softmax(scores, dim=-1)


def one_hot(tensor, num_classes: int = -1) -> kiln.Tensor:
    """int64 one-hot encoding along a new last dim; ``num_classes=-1`` means max + 1."""
    check_tensor(tensor, "tensor", "one_hot")
    if tensor.dtype != kiln.int64:
        raise RuntimeError(f"one_hot is only applicable to index tensor of dtype int64, got {tensor.dtype}")
    kiln.jit.check_values(tensor >= 0, RuntimeError, "one_hot: class values must be non-negative (got {value})",
                          shown=tensor)  # fmt: skip
    if num_classes == -1:
        if not tensor.numel():
            raise RuntimeError("one_hot: can not infer the total number of classes from an empty tensor")
        num_classes = int(tensor.max().item()) + 1
    else:
        message = f"one_hot: class values must be smaller than num_classes ({num_classes}), got {{value}}"
        kiln.jit.check_values(tensor < num_classes, RuntimeError, message, shown=tensor)
    classes = kiln.arange(num_classes, device=tensor.device)
    return (tensor.unsqueeze(-1) == classes).to(kiln.int64)


def pad(input, pad, mode: str = "constant", value=None) -> kiln.Tensor:
    """Pad trailing dims by ``pad = (left_last, right_last, left_prev, right_prev, ...)``."""
    return kiln.pad(input, pad, mode=mode, value=value)
