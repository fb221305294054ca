"""The sets a distribution's parameters and values live in, as ``torch.distributions.constraints``.

A constraint answers ``check(value)`` with a boolean tensor (per element, or per event for
``simplex``); distributions use them to validate their arguments and the values given to
``log_prob`` when ``validate_args`` is on (PyTorch's default).
"""

from __future__ import annotations

import kiln

__all__ = [
    "Constraint", "real", "positive", "nonnegative", "unit_interval", "simplex", "boolean", "interval",
    "integer_interval", "dependent",
]  # fmt: skip


class Constraint:
    is_discrete = False
    event_dim = 0

    def check(self, value):
        raise NotImplementedError

    def __repr__(self) -> str:
        return type(self).__name__[1:] + "()"


class _Real(Constraint):
    def check(self, value):
        return value == value  # not nan


class _GreaterThan(Constraint):
    def __init__(self, lower_bound: float) -> None:
        self.lower_bound = lower_bound

    def check(self, value):
        return value > self.lower_bound

    def __repr__(self) -> str:
        return f"GreaterThan(lower_bound={self.lower_bound})"


class _GreaterThanEq(_GreaterThan):
    def check(self, value):
        return value >= self.lower_bound

    def __repr__(self) -> str:
        return f"GreaterThanEq(lower_bound={self.lower_bound})"


class _Interval(Constraint):
    def __init__(self, lower_bound, upper_bound) -> None:
        self.lower_bound, self.upper_bound = lower_bound, upper_bound

    def check(self, value):
        return (value >= self.lower_bound) & (value <= self.upper_bound)

    def __repr__(self) -> str:
        return f"Interval(lower_bound={self.lower_bound}, upper_bound={self.upper_bound})"


class _HalfOpenInterval(_Interval):
    def check(self, value):
        return (value >= self.lower_bound) & (value < self.upper_bound)


class _IntegerInterval(_Interval):
    is_discrete = True

    def check(self, value):
        return (value % 1 == 0) & (value >= self.lower_bound) & (value <= self.upper_bound)

    def __repr__(self) -> str:
        return f"IntegerInterval(lower_bound={self.lower_bound}, upper_bound={self.upper_bound})"


class _Boolean(Constraint):
    is_discrete = True

    def check(self, value):
        return (value == 0) | (value == 1)


class _Simplex(Constraint):
    event_dim = 1

    def check(self, value):
        return kiln.all(value >= 0, dim=-1) & ((value.sum(-1) - 1).abs() < 1e-6)


class _Dependent(Constraint):
    """A constraint that depends on other parameters (Uniform's support): not checked by itself."""

    def check(self, value):
        raise ValueError("Cannot determine validity of dependent constraint")


real = _Real()
positive = _GreaterThan(0.0)
nonnegative = _GreaterThanEq(0.0)
unit_interval = _Interval(0.0, 1.0)
simplex = _Simplex()
boolean = _Boolean()
dependent = _Dependent()
interval = _Interval
half_open_interval = _HalfOpenInterval
integer_interval = _IntegerInterval
