"""The compile driver and its backend seam: the pipeline is data, every stage is dumped, the backend
comes from the graph's device, a backend registered by a test compiles functions that agree with
eager, a failing backend falls back to the interpreter, and the disk cache is consulted.

Compiled functions are called four times (the first call is the traced eager run) and compared
with the eager function on the same inputs each time."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import kiln
import kiln.codegen.backend as registry
from kiln.codegen.backend import (
    InterpreterBackend,
    backend_for,
    backend_named,
    graph_device,
    register_backend,
    unregister_backend,
)
from kiln.compiler import program_cache
from kiln.compiler.driver import LOWERING_STAGES, compile_graph, pipeline
from kiln.compiler.options import CompileOptions
from kiln.ir.dtypes import float32
from kiln.ir.graph import KERNEL, GraphBuilder
from kiln.ir.interpreter import interpret
from kiln.ir.types import TensorType, device
from kiln.runtime.cache import DiskCache
from kiln.runtime.executor import CompiledProgram

GRAPH_PASSES = ["fold_constants", "simplify", "eliminate_common_subexpressions", "eliminate_dead_code"]
LOWERING = ["fuse", "infer_layouts", "choose_write_backs", "plan_memory"]


def _rand(*shape, seed=0) -> kiln.Tensor:
    return kiln.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _agree(fn, *args, options=None, calls: int = 4):
    """Call the compiled ``fn`` and ``fn`` on clones of ``args``; the compiled program must have run."""
    cf = kiln.compile(fn, options=options)
    for _ in range(calls):
        mine = [a.clone() for a in args]
        theirs = [a.clone() for a in args]
        got, expected = cf(*mine), fn(*theirs)
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
        for a, b in zip(mine, theirs, strict=True):  # in-place changes of the arguments too
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    spec = cf.state.specializations[-1]
    assert spec.calls == calls - 1, "the compiled program did not run"
    return spec


def _graph(on="cpu"):
    """exp(x @ w) * 2 + x: a matmul (planned in the arena) between two elementwise kernels."""
    b = GraphBuilder()
    x = b.input(TensorType((4, 4), float32, device(on)))
    w = b.input(TensorType((4, 4), float32, device(on)))
    h = b.node("exp", [b.node("matmul", [b.node("neg", [x]), w])])
    two = b.constant(np.array(2.0, np.float32), TensorType((), float32, device(on)))
    return b.build([b.node("add", [b.node("mul", [h, two]), x])])


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((4, 4)).astype(np.float32) for _ in range(2)]


# ----------------------------------------------------------------------------- the pipeline is data
def test_the_stages_are_a_tuple_of_named_steps_chosen_by_the_backend():
    llvm, interpreter = backend_named("llvm"), backend_named("interpreter")
    assert [s.name for s in pipeline(CompileOptions(), llvm)] == ["roll_loops"] + GRAPH_PASSES + LOWERING
    assert [s.name for s in pipeline(CompileOptions(), interpreter)] == ["roll_loops"] + GRAPH_PASSES
    assert [s.name for s in pipeline(CompileOptions(loops=False), llvm)] == GRAPH_PASSES + LOWERING
    assert [s.name for s in LOWERING_STAGES] == LOWERING
    custom = CompileOptions(passes=(kiln.passes.eliminate_dead_code,))
    assert [s.name for s in pipeline(custom, llvm)] == ["roll_loops", "eliminate_dead_code", *LOWERING]


def test_dump_dir_holds_one_file_per_stage_with_the_fused_graph_and_the_memory_plan(tmp_path):
    def f(x, w):
        return ((x * 1 + 0).exp() @ w).tanh()

    x, w = _rand(4, 4), _rand(4, 4, seed=1)
    cf = kiln.compile(f, options=CompileOptions(dump_dir=str(tmp_path)))
    for _ in range(2):
        cf(x, w)
    # in the order of their numbers (``.9-`` before ``.10-``)
    names = sorted((p.name for p in tmp_path.iterdir()), key=lambda n: int(n.split("-", 1)[0].rsplit(".", 1)[1]))
    stages = [n.split("-", 1)[1].rsplit(".", 1)[0] for n in names]
    assert stages == ["traced", "roll_loops", *GRAPH_PASSES, *LOWERING, "timings"], names
    text = {n.split("-", 1)[1].rsplit(".", 1)[0]: (tmp_path / n).read_text() for n in names}
    assert "= mul(" in text["traced"] and "= mul(" not in text["simplify"]  # x * 1 simplified away
    assert "kernel(" in text["fuse"] and "kernel(" not in text["eliminate_dead_code"]
    assert "memory plan: arena" in text["plan_memory"]
    assert "output(s) written in place" in text["choose_write_backs"]
    assert text["fuse"] == str(cf.graph)


# ----------------------------------------------------------------------------- the backend from the device
def test_the_backend_is_chosen_from_the_graphs_device_and_the_option_overrides_it():
    assert graph_device(_graph()) == "cpu" and backend_for(_graph()).name == "llvm"
    assert backend_for(_graph("cuda")).name == "cuda"  # kiln/codegen/cuda
    spec = _agree(lambda x: (x * 2).exp(), _rand(3, 5))
    assert isinstance(spec.program, CompiledProgram) and spec.report.kernels == 1
    spec = _agree(lambda x: (x * 2).exp(), _rand(3, 5), options=CompileOptions(backend="interpreter"))
    assert not isinstance(spec.program, CompiledProgram) and spec.report is None
    assert [n.op for n in spec.graph.nodes] == ["constant", "mul", "exp"]  # not fused


class NoFusion:
    """A third backend: fuses nothing, generates nothing, and runs the graph on the runtime's executor
    with the memory plan (so the matmul writes into the arena)."""

    name = "no-fusion"
    stages = ("fuse", "infer_layouts", "choose_write_backs", "plan_memory")

    def __init__(self) -> None:
        self.loaded = 0

    def declines(self, node):
        return "this backend fuses nothing"

    def signature(self):
        return None  # never cached

    def generate(self, lowered, report):
        return {}

    def load(self, lowered, code):
        self.loaded += 1
        return CompiledProgram(lowered.graph, code, lowered.plan, lowered.layouts, lowered.write_backs)

    def encode(self, code):
        return b""

    def decode(self, data, graph):
        return {}


class InterpretedKernels(NoFusion):
    """Fuses like LLVM but compiles no kernel: every kernel runs interpreted, write-backs included."""

    name = "interpreted-kernels"

    def declines(self, node):
        return None


@pytest.fixture
def registered():
    """Register backends for one test; the registry is as it was afterwards."""
    saved = dict(registry._BY_DEVICE)
    made = []

    def register(cls, devices=()):
        backend = cls()
        register_backend(cls.name, lambda: backend, devices)
        made.append(cls.name)
        return backend

    yield register
    for name in made:
        unregister_backend(name)
    registry._BY_DEVICE.update(saved)


def test_a_backend_registered_by_a_test_runs_compiled_functions(registered):
    backend = registered(NoFusion)
    w = _rand(6, 6, seed=3)

    def f(x):
        return ((x @ w).exp() * 2 + x).tanh()

    spec = _agree(f, _rand(6, 6), options=CompileOptions(backend="no-fusion"))
    assert backend.loaded == 1 and isinstance(spec.program, CompiledProgram)
    assert not any(n.op == KERNEL for n in spec.graph.nodes)
    assert spec.program.plan.offsets, "the matmul's result lives in the arena"
    assert spec.report.externs["matmul"] == 1
    assert ("(not fused)", "this backend fuses nothing; add x1, exp x1, mul x1, tanh x1 run on their eager "
            "kernels") in spec.report.declined  # fmt: skip


def test_a_backend_registered_for_the_cpu_is_chosen_from_the_device(registered):
    backend = registered(InterpretedKernels, devices=("cpu",))
    assert backend_for(_graph()) is backend

    def update(p, g):  # an optimizer-like update: written into p's memory, by an interpreted kernel
        p.mul_(0.9).add_(g.exp())
        return g * 2

    p, g = _rand(5, 4), _rand(5, 4, seed=1)
    spec = _agree(update, p, g)
    assert backend.loaded == 1
    assert [n.attrs["kind"] for n in spec.graph.nodes if n.op == KERNEL] and spec.report.kernels == 0
    ((o, i),) = spec.program.write_backs.items()  # p's update, chosen to be written in place
    arrays = [p.numpy().copy(), g.numpy().copy()]
    expected = arrays[0] * np.float32(0.9) + np.exp(arrays[1])
    outputs = spec.program(arrays)
    assert outputs[o] is arrays[i], "the interpreted kernel did not write into the input's memory"
    np.testing.assert_allclose(arrays[i], expected, rtol=1e-6)


class Failing(NoFusion):
    name = "failing"

    def generate(self, lowered, report):
        raise RuntimeError("an injected backend bug")


def test_a_failing_backend_falls_back_to_the_interpreter_loudly(registered, monkeypatch, caplog):
    registered(Failing)
    options = CompileOptions(backend="failing")
    monkeypatch.delenv("KILN_JIT_STRICT", raising=False)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        spec = _agree(lambda x: x.exp() + 1, _rand(3), options=options)
    assert spec.report is None and not isinstance(spec.program, CompiledProgram)
    assert "the failing backend failed (RuntimeError: an injected backend bug)" in caplog.text
    monkeypatch.setenv("KILN_JIT_STRICT", "1")
    with pytest.raises(RuntimeError, match="injected backend bug"):
        compile_graph(_graph(), options)


# ----------------------------------------------------------------------------- the disk cache
@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    cache = DiskCache(tmp_path / "cache")
    monkeypatch.setattr(program_cache, "disk_cache", lambda: cache)
    keys = []
    put = cache.put
    monkeypatch.setattr(cache, "put", lambda key, payload: (keys.append(key), put(key, payload))[1])
    return cache, keys


def test_the_driver_consults_the_cache_and_rebuilds_an_entry_that_does_not_load(private_cache):
    cache, keys = private_cache
    inputs = _inputs()
    expected = interpret(_graph(), inputs)[0]
    llvm = CompileOptions(backend="llvm")
    first = compile_graph(_graph(), llvm)
    assert first.report.cache == "miss" and len(keys) == 1
    second = compile_graph(_graph(), llvm)  # a new graph object with the same text: a hit
    assert second.report.cache == "hit" and len(keys) == 1
    assert second.report.kernels == first.report.kernels == 2
    assert [name for name, _ in second.stages] == LOWERING  # the passes and fusion were skipped
    assert str(second.graph) == str(first.graph)
    for compiled in (first, second):
        np.testing.assert_allclose(compiled.program(inputs)[0], expected, rtol=1e-5, atol=1e-6)
    cache.put(keys[0], b"signed by this cache, yet not a program")  # does not load: rebuilt
    third = compile_graph(_graph(), llvm)
    assert third.report.cache == "miss" and len(keys) == 3
    np.testing.assert_allclose(third.program(inputs)[0], expected, rtol=1e-5, atol=1e-6)
    assert compile_graph(_graph(), llvm).report.cache == "hit"
    interpreted = compile_graph(_graph(), CompileOptions(backend="interpreter"))  # never cached
    assert interpreted.report is None and len(keys) == 3
    assert isinstance(backend_named("interpreter"), InterpreterBackend)


def test_the_analyses_texts_are_written_when_first_read(private_cache, monkeypatch):
    """The layouts', write-backs' and memory plan's texts of ``compiled.stages`` are made when read
    (a cache hit, a warm process's first call, made them and never read them), once, and equal to
    what the analyses say; on a miss and on a hit alike."""
    import kiln.compiler.driver as driver  # noqa: PLC0415
    from kiln.passes.layouts import describe_layouts, infer_layouts  # noqa: PLC0415

    calls = []
    monkeypatch.setattr(driver, "describe_layouts", lambda layouts: (calls.append(1), describe_layouts(layouts))[1])
    for cache in ("miss", "hit"):
        compiled = compile_graph(_graph(), CompileOptions(backend="llvm"))
        assert compiled.report.cache == cache
        assert calls == [], "no text made before it is read"
        texts = dict(compiled.stages)
        layouts = infer_layouts(compiled.graph, (None,) * len(compiled.graph.inputs))
        assert str(texts["infer_layouts"]) == describe_layouts(layouts) == texts["infer_layouts"]
        assert str(texts["infer_layouts"]) and calls == [1], "made once"
        assert str(texts["plan_memory"]) == compiled.report.memory + "\n"
        assert str(texts["choose_write_backs"]) == "0 output(s) written in place into the input they update:\n"
        calls.clear()
