"""The cycle collector is paused while a call is traced, and left as the user had it afterwards."""

import gc

import numpy as np
import pytest

import kiln
from kiln.frontend.jit import call_cache


class _RecordingCollector:
    """``gc`` as the call cache sees it, recording what the cache asks of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def isenabled(self) -> bool:
        return gc.isenabled()

    def disable(self) -> None:
        self.calls.append("disable")
        gc.disable()

    def enable(self) -> None:
        self.calls.append("enable")
        gc.enable()


@pytest.fixture
def collector(monkeypatch):
    recorder = _RecordingCollector()
    monkeypatch.setattr(call_cache, "gc", recorder)
    yield recorder
    gc.enable()


def test_the_collector_is_paused_for_the_trace_only(collector):
    @kiln.compile
    def f(x):
        return x * 2

    for _ in range(3):
        np.testing.assert_array_equal(f(kiln.ones(2)).numpy(), [2.0, 2.0])
    assert collector.calls == ["disable", "enable"]  # one trace; later calls run the program
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off(collector):
    @kiln.compile
    def g(x):
        return x + 1

    gc.disable()
    g(kiln.ones(2))
    assert collector.calls == ["disable"] and not gc.isenabled()


def test_a_trace_that_raises_restores_the_collector(collector):
    @kiln.compile
    def bad(x):
        raise ValueError("in the user's code")

    with pytest.raises(ValueError, match="user's code"):
        bad(kiln.ones(2))
    assert collector.calls == ["disable", "enable"] and gc.isenabled()
