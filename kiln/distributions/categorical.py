"""The categorical distribution over {0, ..., K - 1}, parametrized by probabilities or by logits."""

from __future__ import annotations

import math

import numpy as np

import kiln

from . import constraints
from .distribution import Distribution, logits_to_probs, probs_to_logits

__all__ = ["Categorical"]


class Categorical(Distribution):
    """``Categorical(probs=p)`` or ``Categorical(logits=l)`` over the last dim (K categories; the
    other dims are the batch). ``probs`` need not sum to 1 (they are normalized); ``logits`` are
    normalized with logsumexp.

    >>> import kiln
    >>> kiln.distributions.Categorical(probs=kiln.tensor([0.25, 0.75])).log_prob(kiln.tensor(1)).exp()
    tensor(0.7500)
    """

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real}
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args=None) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        given = probs if probs is not None else logits
        if not isinstance(given, kiln.Tensor) or given.ndim < 1:
            raise ValueError("`probs` or `logits` must be a tensor with at least one dimension")
        if probs is not None:
            self.probs = probs / probs.sum(-1, keepdim=True)
        else:
            self.logits = logits - logits.logsumexp(-1, keepdim=True)
        self._param = self.probs if probs is not None else self.logits
        self._given = "probs" if probs is not None else "logits"
        self._num_events = given.shape[-1]
        super().__init__(tuple(given.shape[:-1]), validate_args=validate_args)

    def __getattr__(self, name: str):
        if name == "probs" and "logits" in self.__dict__:
            self.probs = logits_to_probs(self.logits)
            return self.probs
        if name == "logits" and "probs" in self.__dict__:
            self.logits = probs_to_logits(self.probs)
            return self.logits
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    @property
    def support(self):
        return constraints.integer_interval(0, self._num_events - 1)

    @property
    def param_shape(self):
        return self._param.shape

    def expand(self, batch_shape, _instance=None):
        shape = tuple(batch_shape) + (self._num_events,)
        if self._given == "probs":
            return Categorical(probs=self.probs.expand(shape), validate_args=False)
        return Categorical(logits=self.logits.expand(shape), validate_args=False)

    @property
    def mean(self):
        return kiln.full(tuple(self._batch_shape), float("nan"), dtype=self._param.dtype)

    @property
    def mode(self):
        return self.probs.argmax(-1)

    @property
    def variance(self):
        return kiln.full(tuple(self._batch_shape), float("nan"), dtype=self._param.dtype)

    def sample(self, sample_shape=()):
        sample_shape = tuple(kiln.Size(sample_shape))
        n = math.prod(sample_shape)
        with kiln.no_grad():
            rows = self.probs.reshape(-1, self._num_events)
            if n == 0 or rows.shape[0] == 0:
                return kiln.zeros(sample_shape + tuple(self._batch_shape), dtype=kiln.int64)
            draws = kiln.multinomial(rows, n, True)  # (batch, n)
            return draws.t().reshape(sample_shape + tuple(self._batch_shape))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        value = value.long().unsqueeze(-1)
        shape = np.broadcast_shapes(tuple(value.shape), tuple(self.logits.shape[:-1]) + (1,))
        logits = self.logits.expand(tuple(shape[:-1]) + (self._num_events,))
        return logits.gather(-1, value.expand(shape)).squeeze(-1)

    def entropy(self):
        # 0 log 0 = 0: a category of probability 0 has logits -inf, clamped to the least finite value
        min_real = float(np.finfo(self.logits.dtype.np).min)
        logits = self.logits.clamp(min=min_real)
        return -(logits * self.probs).sum(-1)

    def enumerate_support(self, expand: bool = True):
        values = kiln.arange(self._num_events, dtype=kiln.int64).reshape((-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values
