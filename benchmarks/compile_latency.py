"""Compile latency and compiled-call overhead: ``kiln.compile`` next to ``torch.compile`` and ``jax.jit``.

Two subjects, every implementation measured in this one process:

- the training step of an MLP 784-512-512-10 (batch 128, Adam, cross-entropy): the time of
  the first calls, one by one, and the steady-state time per step. kiln's first call runs
  eagerly and creates Adam's moments, which is not cached (state created by a traced call is
  never baked in), so kiln's specialization is traced and built on call 2: that call is
  kiln's compile latency, set against the first call of ``torch.compile`` and ``jax.jit``;
- the per-call overhead of a compiled trivial function, ``x + 1`` on a 1-element float32
  tensor, next to the same statement run eagerly.

One-shot latencies are a single call each (``torch.compile``'s is measured once, with its
caches disabled so that an earlier run cannot hide the work); kiln's are the median of fresh
models, since a kiln compile takes a fraction of a second. ``--quick`` skips ``torch.compile``,
whose compile of the step alone takes seconds. Run it alone with
``python -m benchmarks.compile_latency [--quick]`` or through ``python -m benchmarks.run``.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable

import numpy as np

import kiln

from .common import KILN, Result, Timing, _summarize, compare, optional_import, skipped, torch_with_kiln_threads

WORKLOAD = "compile"
SIZES = (784, 512, 512, 10)
BATCH = 128
STEP_CALL1 = "MLP step: call 1"
STEP_COMPILE = "MLP step: compile latency"
STEP_WARMUP = "MLP step: calls 1-3, total"
STEP_STEADY = "MLP step: per step, steady state"
TRIVIAL_COMPILE = "x + 1, 1 element: first call"
TRIVIAL = "x + 1, 1 element: per call"
KILN_EAGER = "kiln eager"
KILN_REPEATS = {True: 1, False: 5}  # fresh kiln models timed per one-shot latency, by `quick`
QUICK_SKIP = "skipped in --quick: torch.compile takes seconds to compile; run without --quick"


# ----------------------------------------------------------------------------- the models
def kiln_setup() -> tuple[Callable, list[np.ndarray], tuple]:
    """A fresh seeded kiln MLP with Adam: (uncompiled step, initial weights, (x, y) as numpy)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIZES[0]), dtype=np.float32)
    y = rng.integers(0, SIZES[-1], BATCH)
    kiln.manual_seed(0)
    nn = kiln.nn
    layers = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:], strict=True):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    weights = [p.detach().numpy().copy() for p in model.parameters()]
    return make_step(kiln, model, kiln.from_numpy(x), kiln.from_numpy(y)), weights, (x, y)


def torch_setup(torch, weights: list[np.ndarray], data: tuple) -> Callable:
    """The same MLP, weights and batch in PyTorch; returns its uncompiled step."""
    nn = torch.nn
    layers = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:], strict=True):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights, strict=True):
            p.copy_(torch.from_numpy(w))
    x, y = data
    return make_step(torch, model, torch.from_numpy(x.copy()), torch.from_numpy(y.copy()))


def make_step(lib, model, x, y) -> Callable:
    """One training step of ``model`` with ``lib``'s Adam; the function the JITs compile."""
    optimizer = lib.optim.Adam(model.parameters(), lr=1e-3)
    cross_entropy = lib.nn.functional.cross_entropy

    def train_step():
        loss = cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        # Detached: kiln does not cache a call whose result requires grad while it updated
        # parameters in place (it would attach a backward through the updated weights).
        return loss.detach()

    return train_step


def jax_setup(jax, weights: list[np.ndarray], data: tuple) -> tuple[Callable, Callable]:
    """The same step in JAX, Adam written out as in ``torch.optim.Adam``: (jitted step, runner)."""
    jnp = jax.numpy
    x, y = jnp.asarray(data[0]), jnp.asarray(data[1])
    lr, beta1, beta2, eps = 1e-3, 0.9, 0.999, 1e-8

    def loss_fn(params):
        h = x
        for i in range(0, len(params), 2):
            h = h @ params[i].T + params[i + 1]
            if i + 2 < len(params):
                h = jax.nn.relu(h)
        logp = jax.nn.log_softmax(h, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    def step(params, m, v, t):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        t = t + 1
        m = [beta1 * a + (1 - beta1) * g for a, g in zip(m, grads, strict=True)]
        v = [beta2 * a + (1 - beta2) * g * g for a, g in zip(v, grads, strict=True)]
        scale = lr / (1 - beta1**t)
        root = jnp.sqrt(1 - beta2**t)
        params = [p - scale * a / (jnp.sqrt(b) / root + eps) for p, a, b in zip(params, m, v, strict=True)]
        return params, m, v, t, loss

    jitted = jax.jit(step)
    params = [jnp.asarray(w) for w in weights]
    state = [params, [jnp.zeros_like(p) for p in params], [jnp.zeros_like(p) for p in params], jnp.float32(0)]

    def run():
        *state[:], loss = jitted(*state)  # the new params, moments and count replace the old
        return loss.block_until_ready()

    return jitted, run


# ----------------------------------------------------------------------------- timing helpers
def once_ns(fn: Callable[[], object]) -> float:
    start = time.perf_counter_ns()
    fn()
    return float(time.perf_counter_ns() - start)


def one_shot(samples: list[float]) -> Timing:
    """A Timing of one-shot latencies (one sample each, so ``inner`` is 1)."""
    return _summarize(sorted(samples), inner=1)


def _failure(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"failed: {type(error).__name__}: {first[:200]}"


@contextlib.contextmanager
def _cold_torch_compile(torch):
    """torch.compile with a fresh dynamo cache and inductor's on-disk caches off, so every
    compile measured here does the whole work whatever ran before."""
    import torch._inductor.config as inductor_config  # noqa: PLC0415 - only when measuring torch.compile

    torch._dynamo.reset()
    previous = inductor_config.force_disable_caches
    inductor_config.force_disable_caches = True
    try:
        yield
    finally:
        inductor_config.force_disable_caches = previous


# ----------------------------------------------------------------------------- the training step
def _kiln_step_latencies(quick: bool) -> tuple[list[Result], Callable, Callable]:
    """kiln's one-shot latencies on fresh models; returns them with (compiled, eager) steps to time."""
    call1, call2, call3, unexpected = [], [], [], []
    for _ in range(KILN_REPEATS[quick]):
        train_step, _, _ = kiln_setup()
        step = kiln.compile(train_step)
        call1.append(once_ns(step))
        call2.append(once_ns(step))
        call3.append(once_ns(step))
        events = [e.kind for e in step.state.events]
        if events != ["not cached", "compiled"]:  # what the cases' names promise
            unexpected = events
    params = {"batch": BATCH, "sizes": list(SIZES), "optimizer": "Adam", "samples": len(call1)}
    why = f" (WARNING: events {unexpected}, expected ['not cached', 'compiled'])" if unexpected else ""
    totals = [a + b + c for a, b, c in zip(call1, call2, call3, strict=True)]
    results = [
        Result(WORKLOAD, STEP_CALL1, KILN, one_shot(call1), "eager, creates Adam state: not cached" + why, params),
        Result(WORKLOAD, STEP_COMPILE, KILN, one_shot(call2), "call 2: trace + passes + build" + why, params),
        Result(WORKLOAD, STEP_WARMUP, KILN, one_shot(totals), f"call 3 (compiled): {_ms(call3)}", params),
    ]
    compiled, _, _ = kiln_setup()
    compiled = kiln.compile(compiled)
    eager, _, _ = kiln_setup()
    return results, compiled, eager


def _ms(samples: list[float]) -> str:
    return f"{float(np.median(samples)) / 1e6:.3g} ms"


def _torch_step(torch, weights, data, quick: bool) -> tuple[list[Result], dict]:
    """PyTorch eager's first call, torch.compile's first calls; returns the steps to time."""
    eager = torch_setup(torch, weights, data)
    results = [Result(WORKLOAD, STEP_CALL1, "torch", one_shot([once_ns(eager)]), "eager, creates Adam state")]
    steps = {"torch": eager}
    if quick:
        return results + _skips(STEP_COMPILE, "torch.compile", QUICK_SKIP), steps
    try:
        with _cold_torch_compile(torch):
            # Compile something else first: the one-time start-up (imports, workers) is not the step's cost.
            startup = once_ns(lambda: torch.compile(lambda t: t * 3)(torch.ones(2)))
            step = torch.compile(torch_setup(torch, weights, data))
            calls = [once_ns(step) for _ in range(3)]
    except Exception as error:  # noqa: BLE001 - any failure (no C++ compiler, say) means "cannot measure"
        return results + _skips(STEP_COMPILE, "torch.compile", _failure(error)), steps
    params = {"calls_ns": calls, "startup_ns": startup, "caches": "disabled"}
    first = f"call 1, once; start-up before it {startup / 1e9:.2g} s"
    later = f"calls 2, 3: {_ms(calls[1:2])}, {_ms(calls[2:])}"
    results += [
        Result(WORKLOAD, STEP_COMPILE, "torch.compile", one_shot(calls[:1]), first, params),
        Result(WORKLOAD, STEP_WARMUP, "torch.compile", one_shot([sum(calls)]), later, params),
    ]
    steps["torch.compile"] = step
    return results, steps


def _jax_step(jax, weights, data) -> tuple[list[Result], dict]:
    try:
        _, run = jax_setup(jax, weights, data)
        calls = [once_ns(run) for _ in range(3)]
    except Exception as error:  # noqa: BLE001
        why = _failure(error)
        return _skips(STEP_COMPILE, "jax.jit", why), {}
    params = {"calls_ns": calls, "threads": "jax's own"}
    return [
        Result(WORKLOAD, STEP_COMPILE, "jax.jit", one_shot(calls[:1]), "call 1, once", params),
        Result(WORKLOAD, STEP_WARMUP, "jax.jit", one_shot([sum(calls)]), "", params),
    ], {"jax.jit": run}


def _training_step(quick: bool, torch, jax, threads: int) -> list[Result]:
    results, compiled, eager = _kiln_step_latencies(quick)
    _, weights, data = kiln_setup()
    compiled()  # creates Adam state, then the specialization: what follows is steady state
    compiled()
    references: dict[str, Callable] = {}
    if torch is None:
        results += _skips(STEP_CALL1, "torch", "torch is not installed")
        results += _skips(STEP_COMPILE, "torch.compile", "torch is not installed")
    else:
        found, references = _torch_step(torch, weights, data, quick)
        results += found
    if jax is None:
        results += _skips(STEP_COMPILE, "jax.jit", "jax is not installed")
    else:
        found, steps = _jax_step(jax, weights, data)
        results += found
        references.update(steps)
    # kiln's pair interleaved (one BLAS pool); each reference timed apart (their pools spin, see compare).
    timings = compare({KILN: (compiled, None), KILN_EAGER: (eager, None)}, quick=quick)
    for name, step in references.items():
        timings.update(compare({name: (step, None)}, quick=quick))
    params = {"batch": BATCH, "optimizer": "Adam", "dtype": "float32", "threads": threads}
    results += [
        Result(WORKLOAD, STEP_STEADY, impl, t, f"{1e9 / t.median_ns:.0f} steps/s", params)
        for impl, t in timings.items()
    ]
    return results


def _skips(case: str, impl: str, why: str) -> list[Result]:
    """``impl`` skipped on ``case`` and on the cases that need it to have run (all of the step's
    after the compile, all of the trivial function's after its first call)."""
    cases = {
        STEP_CALL1: (STEP_CALL1, STEP_STEADY),
        STEP_COMPILE: (STEP_COMPILE, STEP_WARMUP, STEP_STEADY),
        TRIVIAL_COMPILE: (TRIVIAL_COMPILE, TRIVIAL),
    }[case]
    return [skipped(WORKLOAD, c, impl, why) for c in cases]


# ----------------------------------------------------------------------------- the trivial function
def _trivial(quick: bool, torch, jax) -> list[Result]:
    """``x + 1`` on one float32 element: first call and per-call time, compiled and eager."""
    one = np.ones(1, dtype=np.float32)
    first: dict[str, list[float]] = {KILN: []}
    for _ in range(KILN_REPEATS[quick]):
        f = kiln.compile(lambda x: x + 1)
        first[KILN].append(once_ns(lambda f=f: f(kiln.from_numpy(one.copy()))))
    namespaces = {
        KILN: ("f(x)", {"f": f, "x": kiln.from_numpy(one.copy())}),
        KILN_EAGER: ("x + 1", {"x": kiln.from_numpy(one.copy())}),
    }
    results: list[Result] = []
    if torch is None:
        results += _skips(TRIVIAL_COMPILE, "torch", "torch is not installed")
        results += _skips(TRIVIAL_COMPILE, "torch.compile", "torch is not installed")
    else:
        namespaces["torch"] = ("x + 1", {"x": torch.from_numpy(one.copy())})
        if quick:
            results += _skips(TRIVIAL_COMPILE, "torch.compile", QUICK_SKIP)
        else:
            try:
                with _cold_torch_compile(torch):
                    g = torch.compile(lambda x: x + 1)
                    first["torch.compile"] = [once_ns(lambda: g(torch.from_numpy(one.copy())))]
                namespaces["torch.compile"] = ("g(x)", {"g": g, "x": torch.from_numpy(one.copy())})
            except Exception as error:  # noqa: BLE001
                results += _skips(TRIVIAL_COMPILE, "torch.compile", _failure(error))
    if jax is None:
        results += _skips(TRIVIAL_COMPILE, "jax.jit", "jax is not installed")
    else:
        try:
            h = jax.jit(lambda x: x + 1)
            first["jax.jit"] = [once_ns(lambda: h(jax.numpy.asarray(one)).block_until_ready())]
            namespaces["jax.jit"] = ("h(x).block_until_ready()", {"h": h, "x": jax.numpy.asarray(one)})
        except Exception as error:  # noqa: BLE001
            results += _skips(TRIVIAL_COMPILE, "jax.jit", _failure(error))
    results += [Result(WORKLOAD, TRIVIAL_COMPILE, impl, one_shot(ts), "trace + compile") for impl, ts in first.items()]
    timings = compare(namespaces, quick=quick)  # single-threaded tiny calls: interleaved
    results += [Result(WORKLOAD, TRIVIAL, impl, t, namespaces[impl][0]) for impl, t in timings.items()]
    return results


def run(quick: bool = False) -> list[Result]:
    """The training step's latencies and steady state, then the trivial function; kiln first."""
    jax = optional_import("jax")
    with torch_with_kiln_threads() as (torch, threads):
        results = _training_step(quick, torch, jax, threads) + _trivial(quick, torch, jax)
    cases = [STEP_CALL1, STEP_COMPILE, STEP_WARMUP, STEP_STEADY, TRIVIAL_COMPILE, TRIVIAL]
    impls = [KILN, KILN_EAGER, "torch", "torch.compile", "jax.jit"]
    return sorted(results, key=lambda r: (cases.index(r.case), impls.index(r.impl)))


if __name__ == "__main__":
    from .run import main

    sys.exit(main([*sys.argv[1:], WORKLOAD]))
