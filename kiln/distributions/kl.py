"""``kl_divergence(p, q)``: KL(p || q) from a table of closed forms, extended with ``register_kl``."""

from __future__ import annotations

import math

import numpy as np

import kiln

from .bernoulli import Bernoulli
from .categorical import Categorical
from .independent import Independent, _sum_rightmost
from .multivariate_normal import MultivariateNormal
from .normal import Normal
from .uniform import Uniform

__all__ = ["kl_divergence", "register_kl"]

_KL_TABLE: dict[tuple[type, type], object] = {}


def register_kl(type_p: type, type_q: type):
    """Decorator registering ``fn(p, q)`` as KL(p || q) for these two distribution types."""

    def decorate(fn):
        _KL_TABLE[(type_p, type_q)] = fn
        return fn

    return decorate


def kl_divergence(p, q):
    """KL(p || q), over the batch (the shapes broadcast)."""
    for (tp, tq), fn in _KL_TABLE.items():  # the most specific match: exact types first
        if type(p) is tp and type(q) is tq:
            return fn(p, q)
    for (tp, tq), fn in _KL_TABLE.items():
        if isinstance(p, tp) and isinstance(q, tq):
            return fn(p, q)
    raise NotImplementedError(
        f"No KL(p || q) is implemented for p type {type(p).__name__} and q type {type(q).__name__}"
    )


@register_kl(Normal, Normal)
def _kl_normal_normal(p, q):
    var_ratio = (p.scale / q.scale).pow(2)
    t1 = ((p.loc - q.loc) / q.scale).pow(2)
    return 0.5 * (var_ratio + t1 - 1 - var_ratio.log())


@register_kl(Categorical, Categorical)
def _kl_categorical_categorical(p, q):
    t = p.probs * (p.logits - q.logits)
    shape = np.broadcast_shapes(tuple(t.shape), tuple(q.probs.shape), tuple(p.probs.shape))
    t = t.expand(shape)
    t = kiln.where((q.probs == 0).expand(shape), math.inf, t)  # mass where q has none: infinite divergence
    t = kiln.where((p.probs == 0).expand(shape), 0.0, t)  # 0 log 0 = 0
    return t.sum(-1)


@register_kl(Bernoulli, Bernoulli)
def _kl_bernoulli_bernoulli(p, q):
    softplus = kiln.nn.functional.softplus
    t1 = p.probs * (softplus(-q.logits) - softplus(-p.logits))
    t1 = kiln.where(q.probs == 0, math.inf, t1)
    t1 = kiln.where(p.probs == 0, 0.0, t1)
    t2 = (1 - p.probs) * (softplus(q.logits) - softplus(p.logits))
    t2 = kiln.where(q.probs == 1, math.inf, t2)
    t2 = kiln.where(p.probs == 1, 0.0, t2)
    return t1 + t2


@register_kl(Uniform, Uniform)
def _kl_uniform_uniform(p, q):
    result = ((q.high - q.low) / (p.high - p.low)).log()
    return kiln.where((q.low > p.low) | (q.high < p.high), math.inf, result)


@register_kl(Normal, Uniform)
def _kl_normal_uniform(p, q):
    return kiln.full_like(p.loc.expand(np.broadcast_shapes(tuple(p.loc.shape), tuple(q.low.shape))), math.inf)


@register_kl(Uniform, Normal)
def _kl_uniform_normal(p, q):
    common = q.scale / (p.high - p.low)
    t1 = (math.sqrt(math.pi * 2) * common).log()
    t2 = common.pow(-2) / 12  # the variance of p over q's
    t3 = ((p.high + p.low - 2 * q.loc) / 2).pow(2)
    return t1 + 0.5 * (t2 + t3 / q.scale.pow(2))


@register_kl(Independent, Independent)
def _kl_independent_independent(p, q):
    if p.reinterpreted_batch_ndims != q.reinterpreted_batch_ndims:
        raise NotImplementedError("KL between Independent distributions with different reinterpreted_batch_ndims")
    return _sum_rightmost(kl_divergence(p.base_dist, q.base_dist), p.reinterpreted_batch_ndims)


@register_kl(MultivariateNormal, MultivariateNormal)
def _kl_mvn_mvn(p, q):
    # 0.5 (tr(Sq^-1 Sp) + |Lq^-1 (mq - mp)|^2 - k + log det Sq - log det Sp), with S = L L^T
    k = p.event_shape[0]
    batch = np.broadcast_shapes(tuple(p.batch_shape), tuple(q.batch_shape))
    lq = q.scale_tril.expand(batch + (k, k))
    trace = kiln.linalg.solve_triangular(lq, p.scale_tril.expand(batch + (k, k)), upper=False).pow(2).sum((-2, -1))
    diff = (q.loc - p.loc).expand(batch + (k,)).unsqueeze(-1)
    mahalanobis = kiln.linalg.solve_triangular(lq, diff, upper=False).pow(2).sum((-2, -1))
    return q._half_log_det() - p._half_log_det() + 0.5 * (trace + mahalanobis - k)
