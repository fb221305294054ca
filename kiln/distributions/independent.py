"""``Independent``: some batch dims of a distribution reinterpreted as event dims."""

from __future__ import annotations

from .distribution import Distribution

__all__ = ["Independent"]


def _sum_rightmost(value, n: int):
    return value.sum(tuple(range(-n, 0))) if n else value


class Independent(Distribution):
    """``Independent(Normal(loc, scale), 1)``: the last batch dim becomes part of one event, so
    ``log_prob`` and ``entropy`` sum over it (a diagonal Gaussian over vectors)."""

    arg_constraints: dict = {}

    def __init__(self, base_distribution, reinterpreted_batch_ndims: int, validate_args=None) -> None:
        batch = tuple(base_distribution.batch_shape)
        if reinterpreted_batch_ndims > len(batch):
            raise ValueError(
                f"Expected reinterpreted_batch_ndims <= len(base_distribution.batch_shape), actual "
                f"{reinterpreted_batch_ndims} vs {len(batch)}"
            )
        split = len(batch) - reinterpreted_batch_ndims
        self.base_dist = base_distribution
        self.reinterpreted_batch_ndims = reinterpreted_batch_ndims
        super().__init__(batch[:split], batch[split:] + tuple(base_distribution.event_shape), validate_args=False)
        self._validate_args = base_distribution._validate_args if validate_args is None else bool(validate_args)

    @property
    def has_rsample(self):  # type: ignore[override]
        return self.base_dist.has_rsample

    @property
    def support(self):  # type: ignore[override]
        return self.base_dist.support

    def expand(self, batch_shape, _instance=None):
        base_batch = tuple(batch_shape) + tuple(self.event_shape[: self.reinterpreted_batch_ndims])
        return Independent(self.base_dist.expand(base_batch), self.reinterpreted_batch_ndims, validate_args=False)

    @property
    def mean(self):
        return self.base_dist.mean

    @property
    def mode(self):
        return self.base_dist.mode

    @property
    def variance(self):
        return self.base_dist.variance

    def sample(self, sample_shape=()):
        return self.base_dist.sample(sample_shape)

    def rsample(self, sample_shape=()):
        return self.base_dist.rsample(sample_shape)

    def log_prob(self, value):
        return _sum_rightmost(self.base_dist.log_prob(value), self.reinterpreted_batch_ndims)

    def entropy(self):
        return _sum_rightmost(self.base_dist.entropy(), self.reinterpreted_batch_ndims)

    def __repr__(self) -> str:
        return f"Independent({self.base_dist!r}, {self.reinterpreted_batch_ndims})"
