"""Folding an eval-mode BatchNorm into the convolution or linear layer before it (PyTorch's ``fusion``).

>>> import kiln
>>> conv, bn = kiln.nn.Conv2d(1, 2, 3).eval(), kiln.nn.BatchNorm2d(2).eval()
>>> fuse_conv_bn_eval(conv, bn).weight.shape
kiln.Size([2, 1, 3, 3])
"""

from __future__ import annotations

import copy

import kiln

from ..parameter import Parameter

__all__ = ["fuse_conv_bn_eval", "fuse_conv_bn_weights", "fuse_linear_bn_eval", "fuse_linear_bn_weights"]


def fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b, transpose: bool = False):
    """(weight, bias) of the convolution that computes ``bn(conv(x))`` with the BatchNorm's running statistics."""
    conv_b = kiln.zeros_like(bn_rm) if conv_b is None else conv_b
    bn_w = kiln.ones_like(bn_rm) if bn_w is None else bn_w
    bn_b = kiln.zeros_like(bn_rm) if bn_b is None else bn_b
    inv_std = kiln.rsqrt(bn_rv + bn_eps)
    # The output channels are dim 0 of a convolution's weight and dim 1 of a transposed one's.
    shape = [1, -1] if transpose else [-1, 1]
    shape += [1] * (conv_w.ndim - 2)
    with kiln.no_grad():
        weight = (conv_w * (bn_w * inv_std).reshape(shape)).to(conv_w.dtype)
        bias = ((conv_b - bn_rm) * inv_std * bn_w + bn_b).to(conv_w.dtype)
    return Parameter(weight, conv_w.requires_grad), Parameter(bias, conv_b.requires_grad)


def fuse_conv_bn_eval(conv, bn, transpose: bool = False):
    """A copy of ``conv`` (eval mode) with ``bn`` (eval mode) folded into its weight and bias."""
    if conv.training or bn.training:
        raise AssertionError("Fusion only for eval!")
    fused = copy.deepcopy(conv)
    if bn.running_mean is None or bn.running_var is None:
        raise AssertionError("fuse_conv_bn_eval needs a BatchNorm with running statistics")
    fused.weight, fused.bias = fuse_conv_bn_weights(fused.weight, fused.bias, bn.running_mean, bn.running_var,
                                                    bn.eps, bn.weight, bn.bias, transpose)  # fmt: skip
    return fused


def fuse_linear_bn_weights(linear_w, linear_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b):
    """(weight, bias) of the linear layer that computes ``bn(linear(x))`` with the running statistics."""
    linear_b = kiln.zeros_like(bn_rm) if linear_b is None else linear_b
    bn_w = kiln.ones_like(bn_rm) if bn_w is None else bn_w
    bn_b = kiln.zeros_like(bn_rm) if bn_b is None else bn_b
    with kiln.no_grad():
        scale = bn_w * kiln.rsqrt(bn_rv + bn_eps)
        weight = linear_w * scale.unsqueeze(-1)
        bias = (linear_b - bn_rm) * scale + bn_b
    return Parameter(weight, linear_w.requires_grad), Parameter(bias, linear_b.requires_grad)


def fuse_linear_bn_eval(linear, bn):
    """A copy of ``linear`` (eval mode) with ``bn`` (eval mode) folded in."""
    if linear.training or bn.training:
        raise AssertionError("Fusion only for eval!")
    if linear.out_features != bn.num_features:
        raise AssertionError("To fuse, linear.out_features must equal bn.num_features")
    fused = copy.deepcopy(linear)
    fused.weight, fused.bias = fuse_linear_bn_weights(fused.weight, fused.bias, bn.running_mean, bn.running_var,
                                                      bn.eps, bn.weight, bn.bias)  # fmt: skip
    return fused
