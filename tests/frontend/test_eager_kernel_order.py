"""The order the eager kernels' thread compiles the keys in, and the keys it does not compile
(kiln/frontend/eager_queue.py): worth first, a composite's primitives after it and not once it is
compiled, stale keys parked until called again, keys numpy runs in microseconds left on numpy. Each
rule is checked on the cache's counters: a private cache whose worker is held by a first key until
the others are queued, so the order does not depend on timing."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kiln
from kiln.frontend import eager_kernels, eager_queue
from kiln.frontend.eager_queue import Entry, KernelCache
from kiln.frontend.jit import background


class Held:
    """A cache whose worker is held on its first key (``hold``) until ``release``; ``made`` lists the
    keys compiled, in order."""

    def __init__(self) -> None:
        self.cache = KernelCache(64)
        self.made: list[str] = []
        self._go = self.hold("hold")

    def hold(self, name: str) -> threading.Event:
        """Queue key ``(name,)``, whose compile waits for the event returned, and wait until the
        worker has taken it: the keys queued next wait behind it."""
        go, taken = threading.Event(), threading.Event()

        def held() -> Entry:
            taken.set()
            assert go.wait(60), "the test never released the worker"
            return Entry(reason="the test's holding key")

        self.cache.lookup((name,), held)
        assert taken.wait(60), "the worker never took the key"
        return go

    def make(self, name: str, entry: Entry | None = None):
        def made() -> Entry:
            self.made.append(name)
            return entry if entry is not None else Entry(program=lambda arrays: arrays)

        return made

    def call(self, name: str, times: int = 1, numpy_seconds: float | None = None, entry: Entry | None = None):
        """``times`` lookups of key ``(name,)``; its fastest numpy run noted as ``numpy_seconds``."""
        for _ in range(times):
            self.cache.lookup((name,), self.make(name, entry))
        if numpy_seconds is not None:
            self.cache.entries[(name,)].numpy_seconds = numpy_seconds
        return self.cache.entries[(name,)]

    def release(self) -> None:
        self._go.set()
        assert self.cache.wait(60)


@pytest.fixture
def held(monkeypatch):
    monkeypatch.setattr(eager_queue, "MIN_NUMPY_SECONDS", 8e-6)
    cache = Held()
    yield cache
    cache.release()


def test_the_key_worth_most_compiles_first_untimed_ones_before_all(held):
    held.call("small", numpy_seconds=50e-6)
    held.call("large", numpy_seconds=400e-6)
    held.call("often", times=10, numpy_seconds=60e-6)  # 600 us so far: worth more than "large"
    held.call("untimed")  # a product's or a fused step's: numpy runs are not timed
    held.call("untimed too")
    held.release()
    assert held.made == ["untimed", "untimed too", "often", "large", "small"]
    assert held.cache.counts["compiled"] == 6 and held.cache.counts["queued"] == 6


def test_while_a_program_compiles_in_the_background_keys_compile_in_the_order_they_came(held):
    go = threading.Event()
    job = background.submit(lambda: go.wait(60))
    try:
        held.call("small", numpy_seconds=50e-6)
        held.call("large", numpy_seconds=400e-6)
        held.call("quick", numpy_seconds=1e-6)  # the other rules hold
        held.release()
    finally:
        go.set()
        job.wait(60)
    assert held.made == ["small", "large"] and held.cache.counts["declined"] == 1


def test_a_composites_primitive_compiles_after_it_and_not_once_it_is_compiled(held):
    held.call("softmax", numpy_seconds=100e-6)
    with eager_queue.covering(("softmax",)):
        inner = held.call("exp", times=5, numpy_seconds=300e-6)  # worth more, but covered
        with eager_queue.covering(("other",)):  # an inner composite: the outermost cover stays
            held.call("max", numpy_seconds=200e-6)
    held.release()
    assert held.made == ["softmax"]
    assert inner.parked and inner.program is None and inner.cover == ("softmax",)
    assert held.cache.entries[("max",)].cover == ("softmax",) and held.cache.counts["parked"] == 2
    # met again outside the composite (a call of its own): queued again, compiled for that call
    held.call("exp")
    assert held.cache.wait(60)
    assert held.made == ["softmax", "exp"] and inner.cover is None
    assert held.cache.entries[("exp",)].program is not None and held.cache.counts["queued"] == 5


def test_a_composites_primitive_compiles_when_the_composite_stays_on_numpy(held):
    held.call("layer_norm", numpy_seconds=100e-6, entry=Entry(reason="not compiled by the backend"))
    with eager_queue.covering(("layer_norm",)):
        held.call("sqrt", numpy_seconds=30e-6)
    held.release()
    assert held.made == ["layer_norm", "sqrt"]
    assert held.cache.entries[("sqrt",)].program is not None and not held.cache.counts["parked"]


def test_a_key_no_longer_called_is_parked_and_queued_again_at_its_next_call(held):
    gone = held.call("gone", numpy_seconds=500e-6)
    held.call("live", times=eager_queue.STALE_LOOKUPS + 1, numpy_seconds=20e-6)
    held.release()
    assert held.made == ["live"] and gone.parked and held.cache.counts["parked"] == 1
    assert held.cache.lookup(("gone",), held.make("gone")) is gone  # its numpy run meanwhile
    assert held.cache.wait(60)
    assert held.made == ["live", "gone"] and held.cache.entries[("gone",)].program is not None
    assert held.cache.entries[("gone",)].numpy_seconds == 500e-6  # what the cache knew of it stays


def test_a_key_parked_stale_and_called_again_is_stale_only_after_ten_times_as_long(held):
    """A key called less often than the step estimate says (every few steps) would be parked at every
    turn: once called again, it is stale only after ``REVIVED_FACTOR`` times as long."""
    rare = held.call("rare", numpy_seconds=500e-6)
    held.call("live", times=eager_queue.STALE_LOOKUPS + 1, numpy_seconds=20e-6)
    held.release()
    assert rare.parked and held.made == ["live"]
    go = held.hold("slow")
    held.call("rare")  # queued again, behind "slow"
    held.call("live", times=eager_queue.STALE_LOOKUPS + 1)  # stale again by the time its turn comes
    go.set()
    assert held.cache.wait(60)
    assert held.made == ["live", "rare"] and held.cache.counts["parked"] == 1
    go = held.hold("slow 2")
    twice = held.call("twice", numpy_seconds=500e-6)
    held.call("live", times=eager_queue.STALE_LOOKUPS + 1)
    go.set()
    assert held.cache.wait(60) and twice.parked
    go = held.hold("slow 3")
    held.call("twice")  # revived
    held.call("live", times=eager_queue.REVIVED_FACTOR * eager_queue.STALE_LOOKUPS + 1)
    go.set()
    assert held.cache.wait(60) and twice.parked and "twice" not in held.made
    assert held.cache.counts["parked"] == 3


def test_stale_means_steps_as_the_keys_calls_measure_them():
    """Keys called every 40 lookups make a step of 40: a key not called for 100 lookups (past the
    floor of 64) is not stale until 3 steps (120) have passed."""
    entries = [Entry(calls=6, first_call=10 + i, last_call=10 + i + 5 * 40) for i in range(3)]
    entries.append(Entry(calls=2, first_call=0, last_call=900))  # called twice, far apart: no step
    step = eager_queue._step_estimate(entries)
    assert step == 40
    key = Entry(calls=1, first_call=1000, last_call=1000)
    assert not eager_queue._stale(key, 1100, step)
    assert eager_queue._stale(key, 1121, step)
    assert not eager_queue._stale(key, 1060, 0.0) and eager_queue._stale(key, 1065, 0.0)  # the floor alone


def test_a_key_numpy_runs_in_microseconds_stays_on_numpy_uncompiled(held):
    quick = held.call("quick", numpy_seconds=3e-6)
    held.call("slow", numpy_seconds=30e-6)
    held.release()
    assert held.made == ["slow"] and held.cache.counts["declined"] == 1
    assert quick.program is None and not quick.failed and quick.reason.startswith("numpy takes 3.0 us")
    assert held.cache.lookup(("quick",), held.make("quick")) is quick  # numpy's, not queued again
    assert held.cache.wait(60) and held.cache.counts["queued"] == 3


def test_an_evicted_key_met_again_before_its_turn_is_queued_once(held):
    held.cache.capacity = 2
    held.call("a", numpy_seconds=50e-6)
    held.call("b", numpy_seconds=50e-6)  # evicts "hold" (compiling)
    held.call("c", numpy_seconds=50e-6)  # evicts "a", still queued
    held.call("a", numpy_seconds=50e-6)  # evicts "b", still queued; "a" is queued once
    held.release()  # (``wait`` would not return if "a" were counted twice)
    assert sorted(held.made) == ["a", "c"] and held.cache.counts["dropped"] == 1


def test_softmaxs_exp_is_not_compiled_once_softmax_is_and_results_equal_numpys(on):
    """End to end: softmax's numpy run calls the routed ``exp``; the worker compiles softmax, then parks
    exp (softmax's program runs the calls). An ``exp`` of the user's own then compiles."""
    x = np.random.default_rng(0).normal(size=(64, 256)).astype(np.float32)
    expected = np.exp(x - x.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    t = kiln.tensor(x)
    for _ in range(2):
        np.testing.assert_allclose(kiln.softmax(t, -1).numpy(), expected, rtol=1e-5, atol=1e-7)
        assert eager_kernels.wait(120)
    exps = [e for key, e in eager_kernels.CACHE.entries.items() if key[0] == "exp"]
    (softmax,) = [e for key, e in eager_kernels.CACHE.entries.items() if key[0] == "softmax"]
    assert softmax.program is not None
    assert exps and all(e.program is None and e.parked for e in exps)
    np.testing.assert_allclose(kiln.exp(t - 1.0).numpy(), np.exp(x - 1.0), rtol=1e-6)
    assert eager_kernels.wait(120)
    assert any(e.program is not None for key, e in eager_kernels.CACHE.entries.items() if key[0] == "exp")


@pytest.mark.parametrize("on_arrays", [True, False], ids=["update-on-arrays", "loop"])
def test_an_optimizers_numpy_loop_is_timed_as_its_fused_step_and_covers_its_ops(on, monkeypatch, on_arrays):
    """While Adam's fused step compiles, its update runs on the arrays (``optim._on_arrays``; or its loop
    of eager ops where that cannot run): the update's time is the step's numpy run (it was untimed:
    first in the queue whatever it saved), and the loop's ``sqrt`` is covered by it -- parked once the
    step's program runs. The steps equal a loop's that never compiled."""
    if not on_arrays:
        monkeypatch.setattr(kiln.optim._on_arrays, "may_run", lambda tensors: False)
    rng = np.random.default_rng(3)
    start = rng.normal(size=5000).astype(np.float32)
    grads = [rng.normal(size=5000).astype(np.float32) for _ in range(3)]

    def steps(**kwargs) -> list[np.ndarray]:
        p = kiln.tensor(start.copy(), requires_grad=True)
        opt = kiln.optim.Adam([p], lr=0.01, **kwargs)
        out = []
        for g in grads:
            p.grad = kiln.tensor(g)
            opt.step()
            assert eager_kernels.wait(120)
            out.append(p.detach().numpy().copy())
        return out

    on.set_enabled(False)
    expected = steps(foreach=False)  # the loop on numpy, eager kernels off: no key of its own
    on.set_enabled(True)
    for got, want in zip(steps(), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    (step_key,) = [key for key in eager_kernels.CACHE.entries if key[0] == "adam_step"]
    step = eager_kernels.CACHE.entries[step_key]
    assert step.program is not None and 0 < step.numpy_seconds < 1
    covered = [e for key, e in eager_kernels.CACHE.entries.items() if key[0] == "sqrt"]
    assert bool(covered) != on_arrays  # the update on the arrays runs no eager op
    assert all(e.cover == step_key and e.parked and e.program is None for e in covered)
