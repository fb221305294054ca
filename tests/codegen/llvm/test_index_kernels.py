"""take and index_put compiled by the LLVM backend as functions of their own (``kiln.codegen.llvm.gather_scatter``): bit
for bit the eager kernels' results (duplicate and negative indices, accumulate or not, broadcast
values, strided inputs, float and integer dtypes, enough work for the thread pool), over several
calls; an index out of range raises the eager kernel's error; other keys stay on the eager kernel."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.compiler.driver import compile_graph
from kiln.compiler.options import CompileOptions
from kiln.ir import dtypes as dt
from kiln.ir.graph import GraphBuilder
from kiln.ir.interpreter import interpret
from kiln.ir.types import TensorType

DTYPES = [dt.float32, dt.float64, dt.int32, dt.int64]


def _graph(op: str, x_type: TensorType, idx_shape: tuple, values_shape: tuple | None = None, accumulate=False):
    b = GraphBuilder()
    x = b.input(x_type)
    if op == "take":
        idx = b.input(TensorType(idx_shape, dt.int64))
        return b.build([b.node("take", [x, idx])])
    values = b.input(TensorType(values_shape, x_type.dtype))
    idx = b.input(TensorType(idx_shape, dt.int64))
    return b.build([b.node("index_put", [x, values, idx], {"accumulate": accumulate})])


def _random(rng, shape, dtype):
    if dtype.is_floating_point:
        return rng.standard_normal(shape).astype(dtype.np)
    return rng.integers(-100, 100, shape).astype(dtype.np)


def _check(graph, inputs_per_call):
    compiled = compile_graph(graph, CompileOptions(backend="llvm"))
    kinds = [step.describe() for step in compiled.program._steps]
    assert all(kind.startswith("compiled ") for kind in kinds), kinds
    for inputs in inputs_per_call:
        (ours,) = compiled.program(inputs)
        (theirs,) = interpret(graph, inputs)
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "x_shape, idx_shape",
    # rows of 5, 1, 6, 31 (copied as vectors of 16 + 8 + 4 + 2 + 1 lanes for 4-byte types) and 64 (a loop)
    [((7, 5), (9,)), ((6,), (4, 3)), ((5, 2, 3), (2, 4)), ((40, 31), (50,)), ((300, 64), (4096,))],
)
def test_take_equals_the_eager_kernel(dtype, x_shape, idx_shape):
    rng = np.random.default_rng(0)
    graph = _graph("take", TensorType(x_shape, dtype), idx_shape)
    calls = [[_random(rng, x_shape, dtype), rng.integers(-x_shape[0], x_shape[0], idx_shape)] for _ in range(3)]
    _check(graph, calls)


@pytest.mark.parametrize("accumulate", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape, idx_shape, values_shape", [
    ((7, 5), (9,), (9, 5)), ((6,), (4, 3), (4, 3)), ((5, 2, 3), (2, 4), (2, 4, 2, 3)),
    ((5, 4), (6,), (4,)), ((5, 4), (6,), ()), ((2000, 64), (4096,), (4096, 64)),
])  # fmt: skip
def test_index_put_equals_the_eager_kernel(dtype, accumulate, x_shape, idx_shape, values_shape):
    rng = np.random.default_rng(1)
    graph = _graph("index_put", TensorType(x_shape, dtype), idx_shape, values_shape, accumulate)
    calls = []
    for _ in range(3):
        idx = rng.integers(-x_shape[0], x_shape[0], idx_shape)
        if not accumulate:  # numpy's assignment keeps the last of duplicates; kiln says nothing about which
            idx = rng.permutation(np.arange(-x_shape[0], x_shape[0]) % x_shape[0])[: np.prod(idx_shape, dtype=int)]
            idx = np.unique(idx)[: np.prod(idx_shape, dtype=int)]
            if idx.size != np.prod(idx_shape, dtype=int):
                continue
            idx = idx.reshape(idx_shape)
        calls.append([_random(rng, x_shape, dtype), _random(rng, values_shape, dtype), idx])
    _check(graph, calls)


def test_strided_inputs_and_a_declined_layout():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6, 5)).astype(np.float32)
    strided = x.transpose(0, 2, 1)  # rows of (5, 6) whose elements are not one stride apart
    graph = _graph("take", TensorType((4, 5, 6), dt.float32), (3,))
    idx = np.array([3, -1, 0])
    compiled = compile_graph(graph, CompileOptions(backend="llvm"), [strided.strides, None])
    (ours,) = compiled.program([strided, idx])
    np.testing.assert_array_equal(ours, strided[idx])
    assert any("strides runs on its eager kernel" in why for _, why in compiled.report.declined)
    column = x[:, :, 0]  # rows of 6 at a stride of 5 elements: compiled
    graph = _graph("take", TensorType((4, 6), dt.float32), (3,))
    compiled = compile_graph(graph, CompileOptions(backend="llvm"), [column.strides, None])
    assert [step.describe().split("(")[0] for step in compiled.program._steps] == ["compiled take"]
    (ours,) = compiled.program([column, idx])
    np.testing.assert_array_equal(ours, column[idx])


@pytest.mark.parametrize("op", ["take", "index_put"])
def test_an_index_out_of_range_raises_the_eager_error_and_the_next_call_runs(op):
    graph = _graph(op, TensorType((5, 3), dt.float32), (4,), (4, 3), accumulate=True)
    compiled = compile_graph(graph, CompileOptions(backend="llvm"))
    x, values = np.ones((5, 3), np.float32), np.ones((4, 3), np.float32)
    inputs = (lambda idx: [x, idx]) if op == "take" else (lambda idx: [x, values, idx])
    for bad in (5, -6, 1 << 40):
        with pytest.raises(IndexError, match="out of bounds"):
            compiled.program(inputs(np.array([0, bad, 1, 2])))
    good = inputs(np.array([0, 4, -5, 2]))
    (ours,) = compiled.program(good)
    np.testing.assert_array_equal(ours, interpret(graph, good)[0])


def test_several_index_tensors_run_on_the_eager_kernel():
    b = GraphBuilder()
    x = b.input(TensorType((4, 5), dt.float32))
    rows, cols = b.input(TensorType((3,), dt.int64)), b.input(TensorType((3,), dt.int64))
    graph = b.build([b.node("take", [x, rows, cols])])
    compiled = compile_graph(graph, CompileOptions(backend="llvm"))
    assert [step.describe().split("(")[0] for step in compiled.program._steps] == ["take"]  # the eager kernel
    inputs = [np.arange(20, dtype=np.float32).reshape(4, 5), np.array([0, 3, -1]), np.array([4, 0, 2])]
    np.testing.assert_array_equal(compiled.program(inputs)[0], interpret(graph, inputs)[0])


def test_embedding_training_step_compiled_equals_eager():
    """An embedding bag of a recommender: forward gather, backward scatter-add, Adam, several calls."""

    def run(compiled: bool) -> list[np.ndarray]:
        kiln.manual_seed(0)
        table = kiln.nn.Embedding(40, 16)
        head = kiln.nn.Linear(16, 1)
        optimizer = kiln.optim.Adam([*table.parameters(), *head.parameters()], lr=0.1)
        rng = np.random.default_rng(3)
        batches = [kiln.from_numpy(rng.integers(0, 40, 64)) for _ in range(4)]

        def step(idx):
            loss = head(table(idx)).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss.detach()

        fn = kiln.compile(step) if compiled else step
        losses = [fn(idx).numpy() for idx in batches]
        if compiled:  # the gather and the scatter-add are said to be compiled, not on eager kernels
            line = next(line for line in str(kiln.explain(fn)).splitlines() if "compiled primitives:" in line)
            assert "index_put x1" in line and "take x1" in line, line
        return [*losses, table.weight.detach().numpy().copy()]

    for ours, theirs in zip(run(True), run(False), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op", ["take", "index_put"])
def test_rows_of_no_elements_run_on_the_eager_kernel_which_checks_the_indices(op):
    graph = _graph(op, TensorType((5, 0), dt.float32), (2,), (2, 0), accumulate=True)
    compiled = compile_graph(graph, CompileOptions(backend="llvm"))
    x, values = np.ones((5, 0), np.float32), np.ones((2, 0), np.float32)
    inputs = [x, np.array([0, 7])] if op == "take" else [x, values, np.array([0, 7])]
    with pytest.raises(IndexError, match="out of bounds"):
        compiled.program(inputs)


@pytest.mark.parametrize("op, accumulate", [("take", False), ("index_put", True), ("index_put", False)])
def test_positions_that_no_one_stride_walks_are_compiled(op, accumulate):
    """Index positions over a permuted layout (an LSTM LM's embedding gradient: (B, T, H) values of
    time-major memory, and its (B, T) tokens as a transposed view) are walked dim by dim, in the
    positions' C order: an index_put adds each row's values in index order, as eager does."""
    rng = np.random.default_rng(4)
    rows, batch, steps, width = 40, 4, 6, 5
    graph = _graph(op, TensorType((rows, width), dt.float32), (batch, steps), (batch, steps, width), accumulate)
    calls = []
    for _ in range(3):
        if accumulate:  # repeated rows, negative indices
            idx = rng.integers(-rows, rows, (steps, batch)).T  # (batch, steps) of (steps, batch) memory
        else:  # distinct rows: numpy keeps the last of duplicates, kiln says nothing about which
            idx = rng.permutation(rows)[: batch * steps].reshape(steps, batch).T
        if op == "take":
            calls.append([rng.standard_normal((rows, width)).astype(np.float32), idx])
            continue
        zeros = np.broadcast_to(np.zeros((1, 1), np.float32), (rows, width))  # an embedding gradient's
        values = rng.standard_normal((steps, batch, width)).astype(np.float32).transpose(1, 0, 2)
        calls.append([zeros, values, idx])
    compiled = compile_graph(graph, CompileOptions(backend="llvm"), [a.strides for a in calls[0]])
    kinds = [step.describe() for step in compiled.program._steps]
    assert kinds and all(kind.startswith("compiled ") for kind in kinds), kinds
    for inputs in calls:
        (ours,) = compiled.program(inputs)
        (theirs,) = interpret(graph, inputs)
        np.testing.assert_array_equal(ours, theirs)


def test_language_model_step_compiles_its_embedding_gradient():
    """An LSTM language model's step (embedding, batch_first LSTM, decoder, SGD): the embedding's
    gradient arrives from the recurrence's backward in time-major memory and is still a compiled
    index_put, several calls equal to eager."""

    def run(compiled: bool) -> list[np.ndarray]:
        kiln.manual_seed(0)
        embed, lstm, head = kiln.nn.Embedding(30, 8), kiln.nn.LSTM(8, 8, batch_first=True), kiln.nn.Linear(8, 30)
        params = [*embed.parameters(), *lstm.parameters(), *head.parameters()]
        optimizer = kiln.optim.SGD(params, lr=0.5)
        rng = np.random.default_rng(5)
        batches = [kiln.from_numpy(rng.integers(0, 30, (3, 6))) for _ in range(4)]

        def step(idx):
            optimizer.zero_grad()
            out, _ = lstm(embed(idx))
            loss = kiln.nn.functional.cross_entropy(head(out).reshape(-1, 30), idx.reshape(-1))
            loss.backward()
            optimizer.step()
            return loss.detach()

        fn = kiln.compile(step) if compiled else step
        losses = [fn(idx).numpy() for idx in batches]
        if compiled:
            line = next(line for line in str(kiln.explain(fn)).splitlines() if "compiled primitives:" in line)
            assert "index_put x1" in line, line
        return [*losses, *(p.detach().numpy().copy() for p in params)]

    for ours, theirs in zip(run(True), run(False), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
