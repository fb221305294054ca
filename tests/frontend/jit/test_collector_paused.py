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

    def get_count(self) -> tuple[int, int, int]:
        return gc.get_count()

    def collect(self, generation: int = 2) -> int:
        self.calls.append(f"collect({generation})")
        return gc.collect(generation)

    def freeze(self) -> None:
        self.calls.append("freeze")
        gc.freeze()

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")
        gc.unfreeze()

    def get_freeze_count(self) -> int:
        return gc.get_freeze_count()


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


def test_a_trace_that_leaves_many_young_objects_moves_them_to_the_old_generation_unwalked(collector, monkeypatch):
    """Left to the collector, its first young collection and then a collection of the middle
    generation would walk them twice (an LSTMCell loop over 1,000 steps: GC over its first 9 calls
    1.3-1.5 s -> 0.4-0.6 s of CPU when they were collected once, 0.28 s of its first call, which
    moving them takes no time of)."""
    monkeypatch.setattr(call_cache, "_MANY_YOUNG_OBJECTS", -1)  # any trace's objects count as many here

    @kiln.compile
    def h(x):
        return x - 1

    for _ in range(2):
        np.testing.assert_array_equal(h(kiln.ones(2)).numpy(), [0.0, 0.0])
    assert collector.calls == ["disable", "freeze", "unfreeze", "enable"] and gc.isenabled()
    (spec,) = h.state.specializations
    node = spec.traced_graph.nodes[0]
    assert gc.is_tracked(node) and any(o is node for o in gc.get_objects(generation=2))
    assert gc.get_freeze_count() == 0


def test_a_mid_sized_trace_moves_its_young_objects_unwalked_too(collector):
    """A trace of 3,000 ops leaves over 20,000 young objects (DCGAN's step, 1,149 nodes, about 84,000):
    they are moved to the old generation, not walked by a young collection at the end of the first
    call (23-62 ms of DCGAN's and the CNN's); the compiled calls stay equal to eager."""

    def step(x):
        for _ in range(1000):
            x = (x * 1.01).tanh() + 0.5
        return x.sum()

    compiled = kiln.compile(step)
    for k in range(3):
        x = kiln.from_numpy(np.linspace(-1.0, 1.0, 64, dtype=np.float32) * (k + 1))
        np.testing.assert_allclose(compiled(x).numpy(), step(x).numpy(), rtol=1e-5, atol=1e-5)
    assert collector.calls == ["disable", "freeze", "unfreeze", "enable"] and gc.isenabled()


def test_objects_the_program_froze_stay_frozen(collector, monkeypatch):
    """``gc.freeze()`` before forking workers: unfreezing would thaw them, so the young generations
    are collected instead."""
    monkeypatch.setattr(call_cache, "_MANY_YOUNG_OBJECTS", -1)

    @kiln.compile
    def k(x):
        return x * 3

    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        np.testing.assert_array_equal(k(kiln.ones(2)).numpy(), [3.0, 3.0])
        assert 0 < gc.get_freeze_count() <= frozen  # (less any that died since)
    finally:
        gc.unfreeze()
    assert collector.calls == ["disable", "collect(1)", "enable"]


def test_a_trace_that_raises_restores_the_collector(collector):
    @kiln.compile
    def bad(x):
        raise ValueError("in the user's code")

    with pytest.raises(ValueError, match="user's code"):
        bad(kiln.ones(2))
    assert collector.calls == ["disable", "enable"] and gc.isenabled()
