"""The multivariate normal distribution, by covariance, precision or lower Cholesky factor."""

from __future__ import annotations

import math

import numpy as np

import kiln

from . import constraints
from .distribution import Distribution

__all__ = ["MultivariateNormal"]


def _batch_mv(matrix, vector):
    return (matrix @ vector.unsqueeze(-1)).squeeze(-1)


class MultivariateNormal(Distribution):
    """``MultivariateNormal(loc, covariance_matrix=...)`` (or ``precision_matrix=`` or
    ``scale_tril=``, exactly one): events are vectors of ``loc``'s last dim; batch dims broadcast.
    Everything is computed from the lower Cholesky factor ``scale_tril`` (``kiln.linalg``)."""

    arg_constraints = {"loc": constraints.real}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc, covariance_matrix=None, precision_matrix=None, scale_tril=None, validate_args=None) -> None:
        if loc.ndim < 1:
            raise ValueError("loc must be at least one-dimensional.")
        given = [m for m in (covariance_matrix, precision_matrix, scale_tril) if m is not None]
        if len(given) != 1:
            raise ValueError("Exactly one of covariance_matrix or precision_matrix or scale_tril may be specified.")
        (matrix,) = given
        if matrix.ndim < 2:
            raise ValueError("scale_tril, covariance_matrix or precision_matrix must be at least two-dimensional, "
                             f"with optional leading batch dimensions; got shape {tuple(matrix.shape)}")  # fmt: skip
        batch = np.broadcast_shapes(tuple(matrix.shape[:-2]), tuple(loc.shape[:-1]))
        k = loc.shape[-1]
        self.loc = loc.expand(batch + (k,))
        try:
            if scale_tril is not None:
                self.scale_tril = scale_tril.expand(batch + (k, k))
            elif covariance_matrix is not None:
                self.covariance_matrix = covariance_matrix.expand(batch + (k, k))
                self.scale_tril = kiln.linalg.cholesky(self.covariance_matrix)
            else:
                self.precision_matrix = precision_matrix.expand(batch + (k, k))
                self.scale_tril = kiln.linalg.cholesky(kiln.linalg.inv(self.precision_matrix))
        except kiln.linalg.LinAlgError as error:
            raise ValueError(f"MultivariateNormal: the matrix given is not positive-definite ({error})") from None
        super().__init__(batch, (k,), validate_args=validate_args)
        if self._validate_args and scale_tril is not None:
            diagonal = kiln.diagonal(self.scale_tril, 0, -2, -1)
            if not bool(kiln.all(diagonal > 0)):
                raise ValueError("Expected parameter scale_tril to satisfy the constraint LowerCholesky(), "
                                 f"but found a non-positive diagonal:\n{diagonal}")  # fmt: skip

    def __getattr__(self, name: str):
        # the covariance and precision are computed from scale_tril the first time they are asked for
        if name == "covariance_matrix" and "scale_tril" in self.__dict__:
            self.covariance_matrix = self.scale_tril @ self.scale_tril.mT
            return self.covariance_matrix
        if name == "precision_matrix" and "scale_tril" in self.__dict__:
            self.precision_matrix = kiln.linalg.inv(self.covariance_matrix)
            return self.precision_matrix
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def expand(self, batch_shape, _instance=None):
        k = self._event_shape[0]
        return MultivariateNormal(self.loc.expand(tuple(batch_shape) + (k,)),
                                  scale_tril=self.scale_tril.expand(tuple(batch_shape) + (k, k)), validate_args=False)  # fmt: skip

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return self.scale_tril.pow(2).sum(-1).expand(tuple(self._batch_shape) + tuple(self._event_shape))

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        eps = kiln.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + _batch_mv(self.scale_tril, eps)

    def _half_log_det(self):
        return kiln.diagonal(self.scale_tril, 0, -2, -1).log().sum(-1)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        diff = value - self.loc
        shape = np.broadcast_shapes(tuple(diff.shape[:-1]), tuple(self.scale_tril.shape[:-2]))
        k = self._event_shape[0]
        solved = kiln.linalg.solve_triangular(self.scale_tril.expand(shape + (k, k)),
                                              diff.expand(shape + (k,)).unsqueeze(-1), upper=False)  # fmt: skip
        mahalanobis = solved.squeeze(-1).pow(2).sum(-1)
        return -0.5 * (k * math.log(2 * math.pi) + mahalanobis) - self._half_log_det()

    def entropy(self):
        k = self._event_shape[0]
        return 0.5 * k * (1.0 + math.log(2 * math.pi)) + self._half_log_det()
