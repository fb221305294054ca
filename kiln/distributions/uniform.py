"""The continuous uniform distribution on [low, high)."""

from __future__ import annotations

import kiln

from . import constraints
from .distribution import Distribution, broadcast_all

__all__ = ["Uniform"]


class Uniform(Distribution):
    """``Uniform(low, high)``: uniform on the half-open interval [low, high)."""

    arg_constraints = {"low": constraints.dependent, "high": constraints.dependent}
    has_rsample = True

    def __init__(self, low, high, validate_args=None) -> None:
        self.low, self.high = broadcast_all(low, high)
        super().__init__(tuple(self.low.shape), validate_args=validate_args)
        if self._validate_args and not bool(kiln.all(self.low < self.high)):
            raise ValueError(
                f"Expected parameter low (Tensor of shape {tuple(self.low.shape)}) of distribution {self!r} to satisfy "
                f"the constraint LessThan(upper_bound=high), but found invalid values:\n{self.low}"
            )

    @property
    def support(self):
        return constraints.half_open_interval(self.low, self.high)

    def expand(self, batch_shape, _instance=None):
        batch_shape = tuple(batch_shape)
        return Uniform(self.low.expand(batch_shape), self.high.expand(batch_shape), validate_args=False)

    @property
    def mean(self):
        return (self.high + self.low) / 2

    @property
    def mode(self):
        return kiln.full_like(self.low, float("nan"))

    @property
    def stddev(self):
        return (self.high - self.low) / 12**0.5

    @property
    def variance(self):
        return (self.high - self.low).pow(2) / 12

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        u = kiln.rand(shape, dtype=self.low.dtype, device=self.low.device)
        return self.low + u * (self.high - self.low)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        inside = (self.low <= value) & (value < self.high)
        return kiln.log(inside.to(self.low.dtype)) - kiln.log(self.high - self.low)

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return ((value - self.low) / (self.high - self.low)).clamp(0, 1)

    def icdf(self, value):
        return value * (self.high - self.low) + self.low

    def entropy(self):
        return kiln.log(self.high - self.low)
