"""The ``check`` primitive: a check that eager code makes on values, as a node of the graph.

``check(ok[, shown], error=..., message=...)`` raises ``error(message)`` unless every element of
the bool tensor ``ok`` is true, and otherwise gives a 0-d ``True`` that nothing needs to read.
``error`` is a name from ``ERRORS`` (a fixed table: a graph names an exception, it never holds
code); ``{value}`` in ``message`` becomes the element of ``shown`` (``ok``'s shape) at the first
position where ``ok`` is false, as in "index -1 is out of bounds".

A check is the one primitive with an *effect* (``Primitive.effect``): it is kept when nothing
reads its output (``eliminate_dead_code``). It may be merged with an identical check (same
inputs, same error and message: the first of the two raises first, as eager would) and folded
when ``ok`` is a constant that holds everywhere (it can never raise); a check that fails on
constants is not folded, so it raises at run time with its source line. The frontend records
checks (``kiln.frontend.ops.checks``) so that index ranges, class targets and integer division
by zero raise on every compiled call exactly as they do eagerly.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from ..types import TensorType
from . import NOT_DIFFERENTIABLE, Kind, Primitive, Sample, register

#: The exceptions a check may raise, by name.
ERRORS: dict[str, type[Exception]] = {
    "IndexError": IndexError,
    "ValueError": ValueError,
    "RuntimeError": RuntimeError,
    "ZeroDivisionError": ZeroDivisionError,
}


def _check_infer(ok: TensorType, *shown: TensorType, error: str, message: str) -> TensorType:
    if ok.dtype is not dt.bool_:
        raise TypeError(f"check: expected a bool tensor of conditions, got {ok.dtype.name}")
    if len(shown) > 1 or (shown and shown[0].shape != ok.shape):
        given = ", ".join(str(list(s.shape)) for s in shown)
        raise ValueError(f"check: expected at most one tensor of shown values of shape {list(ok.shape)}, got {given}")
    if error not in ERRORS:
        raise ValueError(f"check: unknown error {error!r}; expected one of {', '.join(ERRORS)}")
    if not isinstance(message, str):
        raise TypeError(f"check: expected a message string, got {type(message).__name__}")
    return TensorType((), dt.bool_, ok.device)


def check_failure(xp, ok, shown: tuple, error: str, message: str) -> Exception:
    """The exception of a failed check: ``message`` with ``{value}`` filled from ``shown``."""
    if shown and "{value}" in message:
        position = int(xp.argmin(ok.reshape(-1)))  # the first False
        message = message.replace("{value}", str(shown[0].reshape(-1)[position].item()))
    return ERRORS[error](message)


_TRUE = np.ones((), dtype=bool)
_TRUE.flags.writeable = False  # one result for every check that holds: nothing reads or writes it


def _check_eager(xp, ok, *shown, error: str, message: str):
    if xp is np:
        if np.count_nonzero(ok) == ok.size:  # a fifth of ok.all()'s cost: checks run on every call
            return _TRUE
    elif ok.all():
        return xp.ones((), dtype=bool)
    raise check_failure(xp, ok, shown, error, message)


def _check_samples(rng):
    index = rng.integers(0, 5, size=(3, 4))
    return [
        Sample((index < 5, index), {"error": "IndexError", "message": "index {value} is out of bounds"}, False),
        Sample((np.ones((), bool),), {"error": "ZeroDivisionError", "message": "division by zero"}, False),
        Sample((np.ones((0, 2), bool),), {"error": "RuntimeError", "message": "never raised: no elements"}, False),
    ]


check = register(Primitive(
    "check", Kind.CHECK, _check_infer, _check_eager, NOT_DIFFERENTIABLE, effect=True,
    # PyTorch has no op for it; its result, when it does not raise, is torch.all's.
    reference=lambda torch, ok, *shown, error, message: torch.all(ok),
    samples=_check_samples,
    doc="Raise ERRORS[error](message) unless all of ok holds ({value}: shown at the first failure); else True.",
))  # fmt: skip
