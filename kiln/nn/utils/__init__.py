"""``kiln.nn.utils``: gradient clipping, parameters as one vector, weight and spectral norm (hook style and
``parametrizations``), ``parametrize``, BatchNorm fusion, ``stateless.functional_call``, and ``rnn`` (padding
and packing sequences)."""

from . import clip_grad, fusion, parametrizations, parametrize, rnn, stateless
from .clip_grad import (
    clip_grad_norm,
    clip_grad_norm_,
    clip_grad_value_,
    clip_grads_with_norm_,
    get_total_norm,
    parameters_to_vector,
    vector_to_parameters,
)
from .fusion import fuse_conv_bn_eval, fuse_conv_bn_weights, fuse_linear_bn_eval, fuse_linear_bn_weights
from .spectral_norm import remove_spectral_norm, spectral_norm
from .weight_norm import remove_weight_norm, weight_norm

__all__ = [
    "clip_grad", "fusion", "parametrizations", "parametrize", "rnn", "stateless",
    "clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "get_total_norm", "clip_grads_with_norm_",
    "parameters_to_vector", "vector_to_parameters", "weight_norm", "remove_weight_norm", "spectral_norm",
    "remove_spectral_norm", "fuse_conv_bn_eval", "fuse_conv_bn_weights", "fuse_linear_bn_eval",
    "fuse_linear_bn_weights",
]  # fmt: skip
