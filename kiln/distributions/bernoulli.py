"""The Bernoulli distribution, parametrized by probabilities or by logits."""

from __future__ import annotations

import kiln
from kiln.nn import functional as F

from . import constraints
from .distribution import Distribution, broadcast_all, logits_to_probs, probs_to_logits

__all__ = ["Bernoulli"]


class Bernoulli(Distribution):
    """``Bernoulli(probs=p)`` or ``Bernoulli(logits=l)`` (exactly one): 1 with probability p."""

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.boolean
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args=None) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        if probs is not None:
            (self.probs,) = broadcast_all(probs)
            shape = tuple(self.probs.shape)
        else:
            (self.logits,) = broadcast_all(logits)
            shape = tuple(self.logits.shape)
        super().__init__(shape, validate_args=validate_args)

    def __getattr__(self, name: str):
        # probs and logits are computed from each other the first time they are asked for
        if name == "probs" and "logits" in self.__dict__:
            self.probs = logits_to_probs(self.logits, is_binary=True)
            return self.probs
        if name == "logits" and "probs" in self.__dict__:
            self.logits = probs_to_logits(self.probs, is_binary=True)
            return self.logits
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    @property
    def param_shape(self):
        return self._batch_shape

    def expand(self, batch_shape, _instance=None):
        batch_shape = tuple(batch_shape)
        if "probs" in self.__dict__:
            return Bernoulli(probs=self.probs.expand(batch_shape), validate_args=False)
        return Bernoulli(logits=self.logits.expand(batch_shape), validate_args=False)

    @property
    def mean(self):
        return self.probs

    @property
    def mode(self):
        mode = (self.probs >= 0.5).to(self.probs.dtype)
        return kiln.where(self.probs == 0.5, float("nan"), mode)

    @property
    def variance(self):
        return self.probs * (1 - self.probs)

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        with kiln.no_grad():
            probs = self.probs.expand(shape)
            return (kiln.rand(shape, dtype=probs.dtype, device=probs.device) < probs).to(probs.dtype)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return -F.binary_cross_entropy_with_logits(logits, value, reduction="none")

    def entropy(self):
        return F.binary_cross_entropy_with_logits(self.logits, self.probs, reduction="none")

    def enumerate_support(self, expand: bool = True):
        values = kiln.arange(2, dtype=self.probs.dtype).reshape((2,) + (1,) * len(self._batch_shape))
        return values.expand((2,) + tuple(self._batch_shape)) if expand else values
