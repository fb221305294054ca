"""The normal distribution."""

from __future__ import annotations

import math

import kiln

from . import constraints
from .distribution import LOG_SQRT_2PI, Distribution, broadcast_all

__all__ = ["Normal"]


class Normal(Distribution):
    """``Normal(loc, scale)``: mean ``loc``, standard deviation ``scale`` (tensors or numbers, broadcast).

    >>> import kiln
    >>> kiln.distributions.Normal(0.0, 1.0).log_prob(kiln.tensor(0.0))
    tensor(-0.9189)
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        super().__init__(tuple(self.loc.shape), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        batch_shape = tuple(batch_shape)
        return Normal(self.loc.expand(batch_shape), self.scale.expand(batch_shape), validate_args=False)

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def stddev(self):
        return self.scale

    @property
    def variance(self):
        return self.scale.pow(2)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        eps = kiln.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + eps * self.scale

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return -((value - self.loc) ** 2) / (2 * self.variance) - self.scale.log() - LOG_SQRT_2PI

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 * (1 + kiln.erf((value - self.loc) / (self.scale * math.sqrt(2))))

    def icdf(self, value):
        return self.loc + self.scale * math.sqrt(2) * kiln.special.erfinv(2 * value - 1)

    def entropy(self):
        return 0.5 + LOG_SQRT_2PI + self.scale.log()
