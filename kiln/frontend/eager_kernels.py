"""Eager ops on kiln's own compiled kernels (DESIGN.md, "Eager on compiled kernels").

A heavy eager op asks ``compiled_outputs(name, arrays, attrs_key, build)`` for its results. The
key is the op's name, each input's shape, dtype and byte strides, and its attributes. On a miss,
``build()`` makes the op's graph (one primitive node, or a small decomposition such as a fused
optimizer step) and a background thread compiles it through ``kiln.compile``'s driver
(``kiln.compiler.driver.compile_graph``, whose disk cache makes the compile almost free in the
next process); the caller runs its numpy kernel meanwhile (``compiled_outputs`` returns None).
Later calls with the key run the compiled program.

A compile that fails leaves the key on numpy: the reason is said once per op, at the next call of
that op (a ``kiln.CompileWarning`` and the ``kiln`` logger). A graph whose node the backend does
not compile as a kernel of its own (an unsupported stride, float16) stays on numpy too, logged
at debug level: the program would only call the same numpy kernel.

Three kinds of op use it, all measured faster compiled than on numpy (numbers in the commits):

- primitives, through ``ROUTES``, which ``dispatch.apply`` consults for each op: ``route(prim)``
  is a kernel with the primitive's eager signature, so every caller of ``PRIMITIVES_ON`` -- the
  ops and their VJPs alike -- benefits;
- composite ops with their gradients (``COMPOSITES_ON``: softmax, normalizations, pooling...),
  decorated with ``eager_composites.compiled_composite``;
- horizontal in-place steps over many tensors (``fused_steps``: ``Adam(fused=True)``).

Off: ``KILN_EAGER_KERNELS=0`` in the environment, or ``kiln.backends.cpu.eager_kernels = False``
(``set_enabled``); ``KILN_EAGER_KERNELS=sync`` compiles in the caller's thread at a key's first
call (tests and debugging: every eligible call runs compiled). The in-memory cache keeps the
``CAPACITY`` most recently used keys (LRU). ``wait()`` blocks until the pending compiles are done.
The thread compiles the pending key worth most first, and skips those a run would not use (a
composite's primitives once the composite is compiled, keys no longer called, ops numpy runs in a
few microseconds): ``eager_queue``.
A caller for which numpy would cost more than the compile (a long recurrence: ``eager_recurrence``)
asks ``ready(..., now=True)``: the key compiles in its thread, or its running compile is waited for.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import time
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..ir.dtypes import from_numpy_dtype
from ..ir.graph import Graph, GraphBuilder
from ..ir.primitives import PRIMITIVES, Primitive
from ..ir.types import CPU, TensorType
from ..runtime import profiling as _profiling
from .eager_queue import Entry, KernelCache, in_this_thread

logger = logging.getLogger("kiln")

ENV = "KILN_EAGER_KERNELS"
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: How many keys the in-memory cache keeps (least recently used first out).
CAPACITY = 256
#: Inputs smaller than this (bytes: a primitive's first input, a composite's tensors together) stay
#: on numpy: a compiled call's fixed cost (a few microseconds) is then a large part of the op.
MIN_BYTES = 1 << 14
#: The primitives whose eager calls may run compiled kernels: each measured faster compiled for
#: large inputs (numpy's ``where`` and ``maximum`` with a 0-d operand take a slow path: ReLU's
#: backward; ``sigmoid`` and ``erf`` are several numpy passes; ``index_put`` accumulating rows, an
#: embedding's gradient, is numpy's ``add.at`` or rounds of row gathers: 110 -> 10 us for (512, 128)
#: rows into (256, 128), one thread; numpy's ``pow`` of a negative base takes C's slow path, 7.8 ms
#: against 0.43 compiled for ``x ** 4.0`` over (32, 16, 256) normal float32 values; over positive
#: ones the two are even and the trial keeps numpy). Each key keeps the compiled kernel only if its first
#: ``TRIALS`` compiled runs beat the numpy runs timed while it compiled.
PRIMITIVES_ON = ("conv", "conv_weight", "unfold", "fold", "tile_transform", "untile_transform", "where", "maximum",
                 "minimum", "exp", "tanh", "sigmoid", "erf", "sqrt", "pow", "index_put")  # fmt: skip
#: Compiled runs of a key timed against its numpy runs before it settles (``trial``).
TRIALS = 3
#: The composite ops whose eager calls run compiled programs (``eager_composites``): each measured
#: faster compiled, forward and backward.
COMPOSITES_ON = ("softmax", "log_softmax", "layer_norm", "batch_norm", "group_norm", "cross_entropy", "max_pool2d",
                 "avg_pool2d", "gelu", "scaled_dot_product_attention",
                 # ops/more_elementwise.py: 3-20x forward, 3-14x with the backward (float32, 1e4 and 1e6 elements)
                 "atan", "atan2", "asin", "acos", "sinh", "cosh", "asinh", "acosh", "atanh", "hypot", "logaddexp",
                 "logaddexp2",
                 # ops/more_reductions.py, the doubling scans: 2.5-4x (1000x1000 float32)
                 "cumprod", "logcumsumexp")  # fmt: skip
#: The dtypes of the arrays a routed primitive compiles for (others, float16 for one, stay on numpy).
_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int64, np.int32, np.bool_))

#: Each input's (shape, dtype character, byte strides): what a key says of the inputs.
Layouts = tuple[tuple[tuple[int, ...], str, tuple[int, ...]], ...]


#: What ``build`` returns: the graph, its inputs' byte strides, and the (output, input) pairs whose
#: output the program may write into that input's memory (``compile_graph``'s ``write_backs``).
Built = tuple[Graph, list[tuple[int, ...]], tuple[tuple[int, int], ...]]


def _compile(name: str, build: Callable[[Layouts], Built], layouts: Layouts) -> Entry:
    """Compile the graph of ``build(layouts)``; an ``Entry`` on numpy (with the reason) should anything fail."""
    from ..compiler.driver import compile_graph  # noqa: PLC0415 - the compiler loads only when first needed
    from ..compiler.options import CompileOptions  # noqa: PLC0415

    start = time.perf_counter()
    try:
        graph, strides, write_backs = build(layouts)
        compiled = compile_graph(graph, CompileOptions(), strides, write_backs)
    except Exception as error:  # noqa: BLE001 - any failure leaves the op on numpy, said once
        return Entry(reason=f"its compile failed ({type(error).__name__}: {error})", failed=True)
    report = compiled.report
    seconds = time.perf_counter() - start
    if report is None or report.externs or report.abandoned:
        why = "; ".join(f"{what}: {text}" for what, text in (report.declined if report else ())) or "no kernel"
        logger.debug("kiln: eager %s stays on numpy: the backend runs it on its eager kernel (%s)", name, why)
        return Entry(reason=f"not compiled by the backend ({why})", seconds=seconds)
    logger.debug("kiln: eager %s compiled in %.3f s (disk cache: %s)", name, seconds, report.cache)
    return Entry(program=compiled.program, write_backs=tuple(write_backs), cache=report.cache, seconds=seconds)


CACHE = KernelCache(CAPACITY)
_state = {"enabled": os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")}
CACHE.synchronous = os.environ.get(ENV, "").strip().lower() == "sync"


def key_of(name: str, arrays: Sequence[np.ndarray], attrs_key: tuple) -> tuple:
    """The cache key of an op: its name, each input's shape, dtype and byte strides, its attributes."""
    return (name, tuple((a.shape, a.dtype.char, a.strides) for a in arrays), attrs_key)


def input_types(layouts: Layouts) -> list[TensorType]:
    """The graph input types of inputs laid out as ``layouts`` say."""
    return [TensorType(shape, from_numpy_dtype(np.dtype(char)), CPU) for shape, char, _ in layouts]


@contextlib.contextmanager
def deferred():
    """In this thread, eager ops whose kernel is not compiled yet run their numpy kernels without
    queueing its compile (those compiled run as ever): the traced call of a ``kiln.compile``'d
    function, and the calls that run eagerly while its program compiles in the background (for a
    while: ``jit/background.py``) -- the program replaces every op of those calls, and their
    compiles would only delay it. Kernels ``shared`` with compiled programs (``ready``) are compiled
    as ever: the program would compile them at its first call."""
    with in_this_thread("on", True):
        yield


@contextlib.contextmanager
def moot_once(moot: Callable[[], bool]):
    """In this thread, kernels queued meanwhile are dropped rather than compiled if ``moot()`` is true
    when their compile would start: the calls of a ``kiln.compile``'d function whose program was
    still compiling, once it is ready (``jit/background.py``) -- nothing runs them then, and their
    compiles would take the cores and the interpreter from the compiled calls (a GPT's 20 kernels,
    1.4 s on a loaded machine after its program was ready). The key is forgotten: a later eager call
    queues it again."""
    with in_this_thread("moot", moot):
        yield


def ready_entry(name: str, arrays: Sequence[np.ndarray], attrs_key: tuple,
                build: Callable[[Layouts], Built]) -> Entry | None:  # fmt: skip
    """The compiled entry of the op for these inputs, or None: run its numpy kernel (a miss, which
    queues the compile of ``build(layouts)``; a compile still running; an op left on numpy, whose
    failure is said at its first such call)."""
    key = key_of(name, arrays, attrs_key)
    return ready(name, key, functools.partial(_compile, name, build, key[1]))


def ready(name: str, key: tuple, make: Callable[[], Entry], shared: bool = False, now: bool = False) -> Entry | None:
    """The compiled entry of ``key``, or None (a miss queues ``make``; see ``ready_entry``).
    ``shared``: compiled programs call the kernel too (the native recurrences), so it compiles even
    while ``deferred()``. ``now``: compile it in this thread on a miss, or wait for its compile, rather
    than run numpy meanwhile (None then only for a kernel that failed or was declined)."""
    entry = CACHE.now(key, make) if now else CACHE.lookup(key, make, shared)
    if entry is None or entry.program is None:
        if entry is not None and entry.failed and name not in CACHE.said:
            _say(name, entry.reason)
        return None
    if _profiling.active:
        _profiling.note_compiled_kernel()
    return entry


def on_numpy(key: tuple) -> bool:
    """Whether ``key`` stays on numpy for good (its trial kept numpy, its compile failed or was
    declined): its calls need not be timed nor cover the keys they meet."""
    entry = CACHE.entries.get(key)
    return entry is not None and entry.reason is not None


def compiled_outputs(name: str, arrays: Sequence[np.ndarray], attrs_key: tuple,
                     build: Callable[[Layouts], Built]) -> list | None:  # fmt: skip
    """The outputs of the op's compiled program for these inputs, or None (``ready_entry``)."""
    entry = ready_entry(name, arrays, attrs_key, build)
    return None if entry is None or entry.program is None else entry.program(list(arrays))


def _say(name: str, reason: str | None) -> None:
    from .jit.outcomes import CompileWarning  # noqa: PLC0415 - the compiler loads only when first needed

    CACHE.said.add(name)
    text = f"kiln: eager {name} runs its numpy kernel: {reason}"
    logger.warning(text)
    warnings.warn(text, CompileWarning, stacklevel=_user_level())


def _user_level() -> int:
    """``warnings.warn``'s stacklevel, called from the caller of this, of the first frame outside kiln."""
    frame: types.FrameType | None = sys._getframe(1)  # the caller, whose level is 1
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_KILN_DIR):
        frame, level = frame.f_back, level + 1
    return level


def primitive_graph(prim: Primitive, attrs: dict, layouts: Layouts) -> Built:
    """``build`` for one primitive: a graph of one node over inputs laid out as ``layouts`` say."""
    b = GraphBuilder()
    inputs = [b.input(t) for t in input_types(layouts)]
    return b.build([b.node(prim.name, inputs, attrs)]), [strides for _, _, strides in layouts], ()


def route(prim: Primitive) -> Callable:
    """A kernel with ``prim.eager``'s signature that runs the compiled program when there is one."""
    eager = prim.eager

    def kernel(xp, *arrays, **attrs):
        # the first input is the large one of every routed primitive: one check for the many small calls
        if arrays[0].nbytes < MIN_BYTES or xp is not np or any(a.dtype not in _DTYPES for a in arrays):
            return eager(xp, *arrays, **attrs)
        try:
            attrs_key = tuple(sorted(attrs.items()))
            hash(attrs_key)
        except TypeError:  # an attribute that cannot be a key: numpy
            return eager(xp, *arrays, **attrs)
        key = key_of(prim.name, arrays, attrs_key)
        build = functools.partial(primitive_graph, prim, attrs)
        entry = ready(prim.name, key, functools.partial(_compile, prim.name, build, key[1]))
        if entry is None:
            if on_numpy(key):
                return eager(xp, *arrays, **attrs)
            return timed_eager(key, lambda: eager(xp, *arrays, **attrs))
        program = entry.program
        assert program is not None
        if entry.trials >= TRIALS:
            return program(list(arrays))[0]
        return trial(prim.name, entry, lambda: program(list(arrays))[0])

    kernel.__qualname__ = f"compiled {prim.name}"
    return kernel


def timed_eager(key: tuple, run: Callable[[], Any]):
    """``run()`` (the op's eager kernel); its time is noted while the key compiles (``trial`` compares)."""
    start = time.perf_counter()
    out = run()
    note_numpy_seconds(key, time.perf_counter() - start)
    return out


def note_numpy_seconds(key: tuple, seconds: float) -> None:
    """Note a numpy run of ``key`` that took ``seconds``: the fastest is kept, for ``trial`` and for the
    order of the compiles (``eager_queue``)."""
    entry = CACHE.entries.get(key)
    if entry is not None and entry.reason is None:
        entry.numpy_seconds = min(entry.numpy_seconds, seconds)


def trial(name: str, entry: Entry, run: Callable[[], Any]):
    """``run()`` (the compiled program), timed; after ``TRIALS`` of them the key keeps the faster
    kernel (numpy: said at debug level), so that a size the compiled call's fixed cost dominates
    stays on numpy."""
    start = time.perf_counter()
    out = run()
    entry.compiled_seconds = min(entry.compiled_seconds, time.perf_counter() - start)
    entry.trials += 1
    if entry.trials == TRIALS and entry.compiled_seconds >= entry.numpy_seconds:
        entry.program = None
        entry.reason = (f"numpy is faster ({entry.numpy_seconds * 1e6:.0f} us against "
                        f"{entry.compiled_seconds * 1e6:.0f} us compiled)")  # fmt: skip
        logger.debug("kiln: eager %s stays on numpy for this key: %s", name, entry.reason)
    return out


#: Primitive -> the kernel ``dispatch.apply`` runs instead of ``prim.eager`` (empty when off).
ROUTES: dict[Primitive, Callable] = {}
#: The composite ops that run compiled programs now (``COMPOSITES_ON``; empty when off).
ROUTED_COMPOSITES: set[str] = set()


def set_enabled(enabled: bool) -> None:
    """Turn eager compiled kernels on or off (``kiln.backends.cpu.eager_kernels``)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"eager_kernels: expected True or False, got {enabled!r}")
    _state["enabled"] = enabled
    ROUTES.clear()
    ROUTED_COMPOSITES.clear()
    if enabled:
        ROUTES.update({PRIMITIVES[name]: route(PRIMITIVES[name]) for name in PRIMITIVES_ON})
        ROUTED_COMPOSITES.update(COMPOSITES_ON)


def enabled() -> bool:
    """Whether eager heavy ops run compiled kernels."""
    return _state["enabled"]


def wait(timeout: float | None = None) -> bool:
    """Block until the pending compiles are done (True), or ``timeout`` seconds pass (False)."""
    return CACHE.wait(timeout)


set_enabled(_state["enabled"])
