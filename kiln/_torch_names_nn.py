"""The ``torch.*`` spellings of ``nn.functional`` (``torch.conv2d``, ``torch.batch_norm``,
``torch.dropout``...) and the top-level in-place functions (``torch.exp_(t)`` is ``t.exp_()``).

PyTorch exposes its ATen operators at the top level with ATen's signatures, which are not always
``nn.functional``'s: ``torch.embedding(weight, indices)`` takes its arguments the other way round,
``torch.batch_norm`` puts ``weight`` and ``bias`` before the running statistics, ``torch.dropout``'s
``p`` and ``train`` are required, losses take ``reduction`` as an int (0 none, 1 mean, 2 sum;
0 by default), and
``torch.adaptive_max_pool1d`` always returns the indices. Where the signatures agree the name is
``nn.functional``'s own function; where they differ a wrapper here maps one onto the other.

This module sits on the public side, over ``kiln.nn``, as ``_torch_names`` does.
"""

from __future__ import annotations

from .frontend import ops
from .frontend.ops.inplace import commit_inplace
from .frontend.tensor import Tensor, method
from .ir import dtypes as dt
from .nn import functional as F

_SAME = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "rms_norm",
         "adaptive_avg_pool1d", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "prelu", "hardshrink",
         "bilinear", "pairwise_distance")  # fmt: skip
_WRAPPED = ("dropout", "alpha_dropout", "feature_alpha_dropout", "feature_dropout", "dropout_", "alpha_dropout_",
            "feature_alpha_dropout_", "feature_dropout_", "batch_norm", "layer_norm", "group_norm", "instance_norm",
            "embedding", "embedding_bag", "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d",
            "adaptive_max_pool1d", "selu", "celu", "rrelu", "threshold", "selu_", "celu_", "rrelu_", "threshold_",
            "relu_", "kl_div", "cosine_embedding_loss", "margin_ranking_loss", "hinge_embedding_loss",
            "triplet_margin_loss", "poisson_nll_loss", "ctc_loss", "binary_cross_entropy_with_logits",
            "constant_pad_nd")  # fmt: skip
for _name in _SAME:
    globals()[_name] = getattr(F, _name)

_REDUCTIONS = ("none", "mean", "sum")  # ATen's enum: Reduction::None, Mean, Sum


def _reduction(reduction) -> str:
    """ATen's int (what ``torch.<loss>`` takes) as ``nn.functional``'s string; a string is kept."""
    if isinstance(reduction, str):
        return reduction
    if reduction not in (0, 1, 2):
        raise ValueError(f"{reduction} is not a valid value for reduction (0: none, 1: mean, 2: sum)")
    return _REDUCTIONS[reduction]


# ----------------------------------------------------------------------------- dropout
def dropout(input: Tensor, p: float, train: bool) -> Tensor:
    return F.dropout(input, p, train)


def alpha_dropout(input: Tensor, p: float, train: bool) -> Tensor:
    return F.alpha_dropout(input, p, train)


def feature_alpha_dropout(input: Tensor, p: float, train: bool) -> Tensor:
    return F.feature_alpha_dropout(input, p, train)


def feature_dropout(input: Tensor, p: float, train: bool) -> Tensor:
    """Zeroes whole features (every entry past dim 1 of a sample's channel) with probability ``p``,
    scaling the rest by ``1 / (1 - p)``: ``dropout1d``/``2d``/``3d`` for any rank from 2 up."""
    if not train or p == 0.0:
        return input
    if input.ndim < 2:
        raise RuntimeError(f"feature_dropout: expected an input of at least 2 dimensions, got {input.ndim}")
    mask_shape = tuple(input.shape[:2]) + (1,) * (input.ndim - 2)
    return F.dropout(ops.ones(mask_shape, dtype=input.dtype, device=input.device), p, True) * input


def _dropout_inplace(fn, name: str):
    def op(input: Tensor, p: float, train: bool) -> Tensor:
        return commit_inplace(input, fn(input, p, train), op=name)

    op.__name__ = op.__qualname__ = name
    return op


dropout_ = _dropout_inplace(dropout, "dropout_")
alpha_dropout_ = _dropout_inplace(alpha_dropout, "alpha_dropout_")
feature_alpha_dropout_ = _dropout_inplace(feature_alpha_dropout, "feature_alpha_dropout_")
feature_dropout_ = _dropout_inplace(feature_dropout, "feature_dropout_")


# ----------------------------------------------------------------------------- normalization
def batch_norm(input, weight, bias, running_mean, running_var, training: bool, momentum: float, eps: float,
               cudnn_enabled: bool = True) -> Tensor:  # fmt: skip
    """ATen's order: ``weight`` and ``bias`` before the running statistics (``nn.functional``'s after)."""
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5, cudnn_enable: bool = True):
    return F.layer_norm(input, normalized_shape, weight, bias, eps)


def group_norm(input, num_groups: int, weight=None, bias=None, eps: float = 1e-5, cudnn_enabled: bool = True):
    return F.group_norm(input, num_groups, weight, bias, eps)


def instance_norm(input, weight, bias, running_mean, running_var, use_input_stats: bool, momentum: float,
                  eps: float, cudnn_enabled: bool = True) -> Tensor:  # fmt: skip
    return F.instance_norm(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)


# ----------------------------------------------------------------------------- embeddings
def embedding(weight: Tensor, indices: Tensor, padding_idx: int = -1, scale_grad_by_freq: bool = False,
              sparse: bool = False) -> Tensor:  # fmt: skip
    """ATen's order (weight first); a negative ``padding_idx`` means none, as ATen's -1 default."""
    return F.embedding(indices, weight, None if padding_idx is None or padding_idx < 0 else padding_idx,
                       scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)  # fmt: skip


_BAG_MODES = ("sum", "mean", "max")


def embedding_bag(weight, indices, offsets, scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False,
                  per_sample_weights=None, include_last_offset: bool = False, padding_idx=None):  # fmt: skip
    """ATen's ``(output, offset2bag, bag_size, max_indices)``; ``mode`` 0 sum, 1 mean, 2 max. The
    three bookkeeping tensors are those of PyTorch's general CPU path: the bag of each index, the
    size of each bag (zeros for "sum"), and for "max" the weight row each maximum came from
    (``bag_size`` otherwise). PyTorch's float32 "sum" path leaves ``offset2bag`` empty instead."""
    name = _BAG_MODES[mode] if isinstance(mode, int) else mode
    output = F.embedding_bag(indices, weight, offsets, scale_grad_by_freq=scale_grad_by_freq, mode=name,
                             sparse=sparse, per_sample_weights=per_sample_weights,
                             include_last_offset=include_last_offset, padding_idx=padding_idx)  # fmt: skip
    bags, n = output.shape[0], indices.numel()
    starts = ops.narrow(offsets, 0, 0, bags).long()
    ends = ops.cat([ops.narrow(offsets, 0, 1, bags - 1).long(), ops.tensor([n])]) if bags else starts
    positions = ops.arange(n)
    offset2bag = ops.sub(ops.searchsorted(starts, positions, right=True), 1).clamp_(min=0)
    in_bag = ops.lt(positions, ops.index_select(ends, 0, offset2bag)) if bags else positions.bool()
    kept = in_bag if padding_idx is None else ops.logical_and(in_bag, ops.ne(indices, padding_idx))
    bag_size = ops.zeros(bags, dtype=dt.int64).index_add_(0, offset2bag, kept.long())
    if name != "max":
        bag_size = bag_size if name == "mean" else ops.zeros(bags, dtype=dt.int64)
        return output, offset2bag, bag_size, bag_size.clone()
    rows = ops.index_select(weight.detach(), 0, indices.long())  # (n, d): which row gave each maximum
    hit = ops.logical_and(ops.unsqueeze(kept, 1), ops.eq(rows, ops.index_select(output.detach(), 0, offset2bag)))
    first = ops.where(hit, ops.unsqueeze(positions, 1), n)
    position = ops.zeros(tuple(output.shape), dtype=dt.int64).fill_(n)  # n: an empty bag's, row 0 below
    position = position.scatter_reduce_(0, ops.expand(ops.unsqueeze(offset2bag, 1), tuple(rows.shape)), first,
                                        reduce="amin")  # fmt: skip
    padded = ops.cat([indices.long(), ops.tensor([0])])
    return output, offset2bag, bag_size, ops.index_select(padded, 0, position.flatten()).reshape(tuple(output.shape))


# ----------------------------------------------------------------------------- pooling
def max_pool1d(input, kernel_size, stride=(), padding=0, dilation=1, ceil_mode: bool = False) -> Tensor:
    """ATen's default ``stride=[]`` is the kernel size (``nn.functional``'s ``None``)."""
    return F.max_pool1d(input, kernel_size, stride or None, padding, dilation, ceil_mode)


def max_pool2d(input, kernel_size, stride=(), padding=0, dilation=1, ceil_mode: bool = False) -> Tensor:
    return F.max_pool2d(input, kernel_size, stride or None, padding, dilation, ceil_mode)


def max_pool3d(input, kernel_size, stride=(), padding=0, dilation=1, ceil_mode: bool = False) -> Tensor:
    return F.max_pool3d(input, kernel_size, stride or None, padding, dilation, ceil_mode)


def avg_pool1d(input, kernel_size, stride=(), padding=0, ceil_mode: bool = False, count_include_pad: bool = True):
    return F.avg_pool1d(input, kernel_size, stride or None, padding, ceil_mode, count_include_pad)


def adaptive_max_pool1d(input, output_size) -> tuple[Tensor, Tensor]:
    """Values and indices, always (ATen's)."""
    return tuple(F.adaptive_max_pool1d(input, output_size, return_indices=True))  # type: ignore[return-value]


def constant_pad_nd(input: Tensor, pad, value=0) -> Tensor:
    return F.pad(input, list(pad), "constant", value)


# ----------------------------------------------------------------------------- activations
def selu(input: Tensor) -> Tensor:
    return F.selu(input)


def celu(input: Tensor, alpha: float = 1.0) -> Tensor:
    return F.celu(input, alpha)


def rrelu(input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False, generator=None):
    if generator is not None:
        raise NotImplementedError("rrelu: a generator argument is not supported; it draws from kiln's default")
    return F.rrelu(input, lower, upper, training)


def threshold(input: Tensor, threshold: float, value: float) -> Tensor:
    return F.threshold(input, threshold, value)


selu_, celu_, threshold_, relu_ = F.selu_, F.celu_, F.threshold_, F.relu_


def rrelu_(input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False, generator=None):
    if generator is not None:
        raise NotImplementedError("rrelu_: a generator argument is not supported; it draws from kiln's default")
    return F.rrelu_(input, lower, upper, training)


# ----------------------------------------------------------------------------- losses (reduction as ATen's int)
# ATen's schemas give ``reduction`` the default Mean, but torch's Python binding cannot read that default and
# passes 0: ``torch.kl_div(a, b)`` is unreduced (torch 2.x). The defaults here are what torch does, 0.
def kl_div(input: Tensor, target: Tensor, reduction=0, *, log_target: bool = False) -> Tensor:
    return F.kl_div(input, target, reduction=_reduction(reduction), log_target=log_target)


def cosine_embedding_loss(input1, input2, target, margin: float = 0.0, reduction=0) -> Tensor:
    return F.cosine_embedding_loss(input1, input2, target, margin, reduction=_reduction(reduction))


def margin_ranking_loss(input1, input2, target, margin: float = 0.0, reduction=0) -> Tensor:
    return F.margin_ranking_loss(input1, input2, target, margin, reduction=_reduction(reduction))


def hinge_embedding_loss(input, target, margin: float = 1.0, reduction=0) -> Tensor:
    return F.hinge_embedding_loss(input, target, margin, reduction=_reduction(reduction))


def triplet_margin_loss(anchor, positive, negative, margin: float = 1.0, p: float = 2, eps: float = 1e-6,
                        swap: bool = False, reduction=0) -> Tensor:  # fmt: skip
    return F.triplet_margin_loss(anchor, positive, negative, margin, p, eps, swap, reduction=_reduction(reduction))


def poisson_nll_loss(input, target, log_input: bool, full: bool, eps: float, reduction) -> Tensor:
    return F.poisson_nll_loss(input, target, log_input, full, eps=eps, reduction=_reduction(reduction))


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank: int = 0, reduction=0,
             zero_infinity: bool = False) -> Tensor:  # fmt: skip
    return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, _reduction(reduction), zero_infinity)


def binary_cross_entropy_with_logits(input, target, weight=None, pos_weight=None, reduction=0) -> Tensor:
    return F.binary_cross_entropy_with_logits(input, target, weight, reduction=_reduction(reduction),
                                              pos_weight=pos_weight)  # fmt: skip


# ----------------------------------------------------------------------------- in-place functions
def _commit(fn, name: str):
    def op(self: Tensor, *args, **kwargs) -> Tensor:
        return commit_inplace(self, fn(self, *args, **kwargs), op=name)

    op.__name__ = op.__qualname__ = name
    return op


for _name in ("gcd", "lcm"):  # the two of PyTorch's in-place methods kiln's Tensor lacked
    method(_name + "_")(_commit(getattr(ops, _name), _name + "_"))

# ``torch.<name>_(t, ...)`` is ``t.<name>_(...)``: the Tensor method itself, bound at the top level.
_INPLACE_METHODS = (
    "abs_", "acos_", "acosh_", "addmv_", "arccos_", "arccosh_", "arcsin_", "arcsinh_", "arctan_", "arctanh_",
    "as_strided_", "asin_", "asinh_", "atan_", "atanh_", "ceil_", "clamp_", "clamp_max_", "clamp_min_", "clip_",
    "cos_", "cosh_", "deg2rad_", "detach_", "erf_", "erfc_", "exp2_", "exp_", "expm1_", "fill_", "fix_", "floor_",
    "frac_", "gcd_", "i0_", "lcm_", "ldexp_", "log10_", "log1p_", "log2_", "log_", "logit_", "nan_to_num_", "neg_",
    "negative_", "rad2deg_", "reciprocal_", "resize_as_", "round_", "rsqrt_", "sigmoid_", "sin_", "sinc_", "sinh_",
    "sqrt_", "square_", "tan_", "tanh_", "trunc_", "xlogy_", "zero_",
)  # fmt: skip
for _name in _INPLACE_METHODS:
    globals()[_name] = getattr(Tensor, _name)
del _name

__all__ = [*_SAME, *_WRAPPED, *_INPLACE_METHODS]
