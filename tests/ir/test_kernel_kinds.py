"""A kernel kind added from a test, touching no file of kiln (issue 37): the kind and its verifier
rule go into ``kiln.ir.kernel_kinds``, its LLVM and CUDA generators into those backends' tables, and
the graph that holds such a kernel verifies, compiles (or is declined, saying why, and runs on the
interpreter) and computes what eager does. Every registration is undone when its test ends.

The test's kind, ``scaled``: an elementwise body whose every output is a product (its own rule, so a
body the built-in ``elementwise`` kind takes can break it); the LLVM and CUDA generators delegate
to the elementwise ones."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest

from kiln.codegen.core import Unsupported
from kiln.codegen.cuda import kernels as cuda_kernels
from kiln.codegen.cuda.core import CudaModule
from kiln.codegen.llvm import kinds as llvm_kinds
from kiln.compiler import program_cache
from kiln.compiler.driver import compile_graph
from kiln.compiler.options import CompileOptions
from kiln.ir import dtypes as dt
from kiln.ir.graph import KERNEL, Graph, GraphBuilder
from kiln.ir.interpreter import interpret
from kiln.ir.kernel_kinds import (
    ELEMENTWISE,
    BodyRuleError,
    GraphCheck,
    KernelKind,
    kernel_kind,
    kernel_kind_names,
    register_kernel_kind,
    unregister_kernel_kind,
)
from kiln.ir.types import TensorType
from kiln.ir.verifier import VerificationError, verify

BUILT_IN = ("elementwise", "reduction", "horizontal", "conv")


def _scaled_body(body: Graph, check: GraphCheck) -> None:
    """A legal elementwise body whose every output is made by a ``mul``."""
    ELEMENTWISE.verify_body(body, check)
    made_by = {v: node.op for node in body.nodes for v in node.outputs}
    for i, v in enumerate(body.outputs):
        if made_by.get(v) != "mul":
            raise BodyRuleError(f"output {i} of a scaled body is made by {made_by.get(v, 'no node')}, not by mul")


SCALED = KernelKind("scaled", _scaled_body, "an elementwise body whose outputs are products (a test's kind)",
                    pointwise=True)  # fmt: skip


@contextlib.contextmanager
def registered(llvm: bool = False, cuda: bool = False) -> Iterator[None]:
    """The ``scaled`` kind, with the generators asked for, for the duration of the block."""
    register_kernel_kind(SCALED)
    try:
        if llvm:
            elementwise = llvm_kinds.kind_generator(ELEMENTWISE.name)
            assert elementwise is not None
            llvm_kinds.register_kernel_generator(SCALED.name, elementwise)
        if cuda:
            emit = cuda_kernels.cuda_kernel_generator(ELEMENTWISE.name)
            assert emit is not None
            cuda_kernels.register_cuda_kernel_generator(SCALED.name, emit)
        yield
    finally:
        if cuda and cuda_kernels.cuda_kernel_generator(SCALED.name) is not None:
            cuda_kernels.unregister_cuda_kernel_generator(SCALED.name)
        if llvm and llvm_kinds.kind_generator(SCALED.name) is not None:
            llvm_kinds.unregister_kernel_generator(SCALED.name)
        unregister_kernel_kind(SCALED.name)


@pytest.fixture
def own_disk_cache(monkeypatch, tmp_path):
    """A cache directory of this test's own: a program compiled with a generator must not be what a
    later test, without it, loads."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    program_cache.disk_cache.cache_clear()
    yield tmp_path
    program_cache.disk_cache.cache_clear()


def _graph(last_op: str = "mul") -> Graph:
    """``exp(scaled(x, y))`` where the scaled kernel's body is ``last_op(x + y, x)``."""
    t = TensorType((6, 7), dt.float32)
    inner = GraphBuilder()
    x, y = inner.input(t), inner.input(t)
    body = inner.build([inner.node(last_op, [inner.node("add", [x, y]), x])])
    outer = GraphBuilder()
    a, b = outer.input(t), outer.input(t)
    scaled = outer.node(KERNEL, [a, b], {"name": "scaled0", "kind": SCALED.name, "bodies": (body,)}, type=t)
    return outer.build([outer.node("exp", [scaled])])


def _calls() -> list[list[np.ndarray]]:
    rng = np.random.default_rng(0)
    return [[rng.standard_normal((6, 7)).astype(np.float32) for _ in range(2)] for _ in range(3)]


def _check_results(program, graph: Graph) -> None:
    """Over several calls: the program's result is the interpreter's and the formula's by hand."""
    for a, b in _calls():
        (ours,) = program([a, b])
        (theirs,) = interpret(graph, [a, b])
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ours, np.exp((a + b) * a), rtol=1e-5, atol=1e-6)


def test_a_registered_kind_verifies_by_its_own_rule_and_is_gone_afterwards():
    assert kernel_kind_names() == BUILT_IN
    with registered():
        assert kernel_kind_names() == (*BUILT_IN, "scaled")
        verify(_graph())
        with pytest.raises(VerificationError, match="output 0 of a scaled body is made by sub, not by mul"):
            verify(_graph("sub"))
        with pytest.raises(ValueError, match="already registered"):
            register_kernel_kind(SCALED)
    assert kernel_kind_names() == BUILT_IN and kernel_kind(SCALED.name) is None
    with pytest.raises(VerificationError, match="kernel kind 'scaled' is not one of elementwise, reduction"):
        verify(_graph())
    with pytest.raises(ValueError, match="built in"):
        unregister_kernel_kind(ELEMENTWISE.name)


def test_a_kind_with_an_llvm_generator_compiles_and_equals_eager(own_disk_cache):
    graph = _graph()
    with registered(llvm=True):
        compiled = compile_graph(graph, CompileOptions(backend="llvm", passes=(), verify=True))
        steps = [step.describe() for step in compiled.program._steps]
        assert steps[0].startswith("kernel scaled0 (scaled"), steps
        assert compiled.report is not None and compiled.report.declined == []
        _check_results(compiled.program, graph)


def test_a_kind_without_an_llvm_generator_is_declined_and_runs_on_the_interpreter(own_disk_cache):
    graph = _graph()
    with registered():
        compiled = compile_graph(graph, CompileOptions(backend="llvm", passes=(), verify=True))
        steps = [step.describe() for step in compiled.program._steps]
        assert steps[0] == "interpreted kernel scaled0", steps
        assert compiled.report is not None
        assert compiled.report.declined == [("scaled0", "the LLVM backend has no generator for kernel kind 'scaled'")]
        _check_results(compiled.program, graph)


def test_the_cuda_backend_declines_a_kind_it_has_no_generator_for_and_takes_a_registered_one():
    graph = _graph()
    node = graph.nodes[0]
    layouts = [(7, 1), (7, 1)]
    with registered():
        with pytest.raises(Unsupported, match="the CUDA backend has no generator for kernel kind 'scaled'"):
            cuda_kernels.generate(CudaModule(), "k", node, layouts, cuda_kernels.Config())
    with registered(cuda=True):
        module = CudaModule()
        launches = cuda_kernels.generate(module, "k", node, layouts, cuda_kernels.Config())
    as_elementwise = node.__class__(node.op, node.inputs, {**node.attrs, "kind": ELEMENTWISE.name}, node.outputs)
    expected = CudaModule()
    assert launches == cuda_kernels.generate(expected, "k", as_elementwise, layouts, cuda_kernels.Config())
    assert module.kernels == expected.kernels and len(module.kernels) == 1
    assert cuda_kernels.cuda_kernel_generator(SCALED.name) is None
