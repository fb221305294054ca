"""The ``Distribution`` base class and the helpers its subclasses share.

A distribution has a ``batch_shape`` (independent distributions with their own parameters) and an
``event_shape`` (the shape of one draw); ``sample(sample_shape)`` returns
``sample_shape + batch_shape + event_shape``. ``rsample`` draws by reparametrization (a
differentiable function of the parameters and of noise from kiln's generator, so
``kiln.manual_seed`` makes it reproducible); ``sample`` is the same draw without gradient.
"""

from __future__ import annotations

import math

import numpy as np

import kiln

from . import constraints

__all__ = ["Distribution"]

_VALIDATE_DEFAULT = True


class Distribution:
    """Base class of kiln's distributions (``torch.distributions.Distribution``)."""

    has_rsample = False
    has_enumerate_support = False
    arg_constraints: dict = {}
    support: constraints.Constraint | None = None

    @staticmethod
    def set_default_validate_args(value: bool) -> None:
        """Whether new distributions check their arguments and ``log_prob`` values (default True)."""
        global _VALIDATE_DEFAULT
        if value not in (True, False):
            raise ValueError(f"set_default_validate_args expects True or False, got {value!r}")
        _VALIDATE_DEFAULT = value

    def __init__(self, batch_shape=(), event_shape=(), validate_args=None) -> None:
        self._batch_shape = kiln.Size(batch_shape)
        self._event_shape = kiln.Size(event_shape)
        self._validate_args = _VALIDATE_DEFAULT if validate_args is None else bool(validate_args)
        if self._validate_args:
            for name, constraint in self.arg_constraints.items():
                if constraint is constraints.dependent or name not in self.__dict__:
                    continue  # a parameter given the other way (probs or logits) is not set
                value = getattr(self, name)
                _check_values(constraint.check(value),
                              f"Expected parameter {name} ({type(value).__name__} of shape {tuple(value.shape)}) of "
                              f"distribution {self!r} to satisfy the constraint {constraint!r}, but found invalid "
                              "values")  # fmt: skip

    # ------------------------------------------------------------------ shapes
    @property
    def batch_shape(self):
        return self._batch_shape

    @property
    def event_shape(self):
        return self._event_shape

    def _extended_shape(self, sample_shape=()) -> tuple:
        return tuple(kiln.Size(sample_shape)) + tuple(self._batch_shape) + tuple(self._event_shape)

    def expand(self, batch_shape, _instance=None):
        raise NotImplementedError(f"{type(self).__name__} does not implement expand")

    # ------------------------------------------------------------------ moments
    @property
    def mean(self):
        raise NotImplementedError(f"{type(self).__name__} does not implement mean")

    @property
    def mode(self):
        raise NotImplementedError(f"{type(self).__name__} does not implement mode")

    @property
    def variance(self):
        raise NotImplementedError(f"{type(self).__name__} does not implement variance")

    @property
    def stddev(self):
        return self.variance.sqrt()

    # ------------------------------------------------------------------ draws and densities
    def sample(self, sample_shape=()):
        with kiln.no_grad():
            return self.rsample(sample_shape)

    def sample_n(self, n: int):
        return self.sample((n,))

    def rsample(self, sample_shape=()):
        raise NotImplementedError(f"{type(self).__name__} has no reparametrized sampler (has_rsample is False)")

    def log_prob(self, value):
        raise NotImplementedError

    def cdf(self, value):
        raise NotImplementedError(f"{type(self).__name__} does not implement cdf")

    def icdf(self, value):
        raise NotImplementedError(f"{type(self).__name__} does not implement icdf")

    def entropy(self):
        raise NotImplementedError(f"{type(self).__name__} does not implement entropy")

    def perplexity(self):
        return kiln.exp(self.entropy())

    def enumerate_support(self, expand: bool = True):
        raise NotImplementedError(f"{type(self).__name__} does not implement enumerate_support")

    def _validate_sample(self, value) -> None:
        if not isinstance(value, kiln.Tensor):
            raise ValueError(f"The value argument to log_prob must be a Tensor, got {type(value).__name__}")
        event = len(self._event_shape)
        if event and tuple(value.shape[-event:]) != tuple(self._event_shape):
            raise ValueError(
                f"The right-most size of value must match event_shape: {tuple(value.shape)} vs {tuple(self._event_shape)}."
            )
        try:
            np.broadcast_shapes(tuple(value.shape), tuple(self._batch_shape) + tuple(self._event_shape))
        except ValueError:
            raise ValueError(
                f"Value of shape {tuple(value.shape)} is not broadcastable with batch_shape+event_shape: "
                f"{tuple(self._batch_shape) + tuple(self._event_shape)}"
            ) from None
        support = self.support
        if support is None or support is constraints.dependent:
            return
        _check_values(support.check(value),
                      f"Expected value argument ({type(value).__name__} of shape {tuple(value.shape)}) to be within "
                      f"the support ({support!r}) of the distribution {self!r}, but found invalid values")  # fmt: skip

    def __repr__(self) -> str:
        names = [k for k in self.arg_constraints if k in self.__dict__]
        shown = ", ".join(
            f"{k}: {self.__dict__[k] if self.__dict__[k].numel() == 1 else tuple(self.__dict__[k].shape)}"
            for k in names
        )
        return f"{type(self).__name__}({shown})"


# ----------------------------------------------------------------------------- helpers
def broadcast_all(*values):
    """Tensors and numbers broadcast to one shape (numbers become tensors of the others' dtype,
    or of the default dtype)."""
    tensors = [v for v in values if isinstance(v, kiln.Tensor)]
    for v in values:
        if not isinstance(v, kiln.Tensor | int | float):
            raise ValueError(f"Input arguments must all be instances of numbers or Tensors, got {type(v).__name__}")
    dtype = tensors[0].dtype if tensors else kiln.get_default_dtype()
    as_tensors = [v if isinstance(v, kiln.Tensor) else kiln.tensor(float(v), dtype=dtype) for v in values]
    shape = np.broadcast_shapes(*(tuple(t.shape) for t in as_tensors))
    return tuple(t.expand(shape) if tuple(t.shape) != shape else t for t in as_tensors)


def logits_to_probs(logits, is_binary: bool = False):
    return kiln.sigmoid(logits) if is_binary else kiln.softmax(logits, -1)


def clamp_probs(probs):
    eps = float(np.finfo(probs.dtype.np).eps)
    return probs.clamp(eps, 1 - eps)


def probs_to_logits(probs, is_binary: bool = False):
    clamped = clamp_probs(probs)
    if is_binary:
        return kiln.log(clamped) - kiln.log1p(-clamped)
    return kiln.log(clamped)


LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _check_values(ok, message: str) -> None:
    """Raise ``ValueError(message)`` unless every element of ``ok`` holds: now, and on every compiled
    call of a trace (a check node, as index ranges are), so validating arguments never stops a trace."""
    if not isinstance(ok, kiln.Tensor):
        ok = kiln.tensor(ok)
    kiln.jit.check_values(ok if ok.dtype == kiln.bool else ok.bool(), ValueError, message)
