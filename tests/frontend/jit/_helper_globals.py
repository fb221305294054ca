"""A helper module for test_python_reads: functions that read and write globals of their own."""

from __future__ import annotations

SCALE = 2.0
TABLE = {"shift": 0.0}
LOG: list = []


def scaled(x):
    return x * SCALE + TABLE["shift"]


def logged(x):
    LOG.append(1)
    return x + 1.0
