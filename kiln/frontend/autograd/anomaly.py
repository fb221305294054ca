"""Anomaly detection: name the forward op whose backward produced nan."""

from __future__ import annotations

from . import grad_mode
from .grad_mode import state


def is_anomaly_enabled() -> bool:
    return state.anomaly


class set_detect_anomaly:
    """``set_detect_anomaly(True)`` records the user's stack at each op and checks every backward
    output for nan, raising an error that names the op and where it was called from."""

    def __init__(self, mode: bool) -> None:
        self._prev = state.anomaly
        state.anomaly = bool(mode)
        grad_mode.anomaly_used = grad_mode.anomaly_used or state.anomaly

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        state.anomaly = self._prev


class detect_anomaly(set_detect_anomaly):
    """Anomaly mode inside a ``with`` block."""

    def __init__(self) -> None:
        self._prev = state.anomaly

    def __enter__(self) -> None:
        state.anomaly = grad_mode.anomaly_used = True
