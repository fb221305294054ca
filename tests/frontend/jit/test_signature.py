"""The typed signature of a compiled program: binding each input kind, applying each output kind,
numbering a trace's kinds, the export file's form of it (format version 1), and the autograd error
the compiler tells apart by its type."""

from __future__ import annotations

import math
import weakref
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.frontend.autograd import FreedGraphError
from kiln.frontend.jit.export import signature_from_json, signature_to_json
from kiln.frontend.jit.signature import (
    Argument,
    BornView,
    Captured,
    ClearGrad,
    ExternalResult,
    ExternalView,
    NewGrad,
    Parameter,
    PythonValue,
    Repeat,
    Result,
    Saved,
    Seed,
    SetGrad,
    ShareGrad,
    Signature,
    WriteBack,
    apply,
    bind,
    number_outputs,
)
from kiln.ir import dtypes as dt
from kiln.ir.graph import GraphBuilder
from kiln.ir.serialize import load_graph_file
from kiln.ir.types import CPU, TensorType

V1_FILE = Path(__file__).parent / "data" / "export_v1.kiln"


def _signature(inputs, results, writebacks=(), grads=(), outputs: int = 4) -> Signature:
    return Signature(list(inputs), list(results), list(writebacks), list(grads), devices=(CPU,) * outputs)


# ---------------------------------------------------------------------- binding
def test_bind_reads_every_input_kind_where_the_call_holds_it():
    a, b, captured, param = kiln.ones(2), kiln.zeros(3), kiln.arange(4.0), kiln.full((2,), 7.0)
    seed, saved = np.ones(5), np.zeros(6)
    sig = _signature([Saved(0), Argument(1), Captured(weakref.ref(captured)), Parameter("w"), Seed(0), Argument(0)], [])
    arrays = bind(sig, [a, b], {"w": param}, seeds=[seed], saved=[saved])
    expected = [saved, b._data, captured._data, param._data, seed, a._data]
    assert len(arrays) == len(expected) and all(x is y for x, y in zip(arrays, expected, strict=True))


# ---------------------------------------------------------------------- applying
def test_results_that_are_program_outputs_own_their_memory_unless_eager_would_share_it():
    x = kiln.arange(3.0)
    arrays = bind(_signature([Argument(0)], []), [x])
    fresh = np.array([5.0, 6.0, 7.0], np.float32)
    sig = _signature([Argument(0)], [Result(0), Result(1), Result(1)])
    first, second, again = apply(sig, [arrays[0], fresh], arrays, [x])
    np.testing.assert_array_equal(first.numpy(), [0.0, 1.0, 2.0])
    assert not np.shares_memory(first.numpy(), x.numpy())  # an input's memory is copied
    assert second._data is fresh  # the program's own new array is handed out as it is
    np.testing.assert_array_equal(again.numpy(), fresh)
    assert not np.shares_memory(again.numpy(), second.numpy())  # handed out twice: the second is a copy


def test_born_views_share_one_buffer_laid_out_as_eager_did():
    out = np.arange(6.0, dtype=np.float32).reshape(3, 2)  # the root's value, as the program returns it
    whole = BornView(0, (4, 12), (3, 2), (4, 12), 0)  # eager's root was transposed memory (t.t())
    row = BornView(0, (4, 12), (2,), (12,), 4)  # root[1]
    sig = _signature([], [whole, row])
    a, b = apply(sig, [out], [])
    np.testing.assert_array_equal(a.numpy(), out)
    np.testing.assert_array_equal(b.numpy(), out[1])
    assert a.numpy().strides == (4, 12) and b.numpy().strides == (12,)
    assert np.shares_memory(a.numpy(), b.numpy()) and a._version is b._version and a._base is b._base
    b.add_(1.0)
    np.testing.assert_array_equal(a.numpy()[1], out[1] + 1)


def test_results_made_after_the_write_backs_are_the_inputs_their_views_grads_and_repeats():
    x = kiln.arange(6.0)
    x.grad = kiln.ones(6)
    sig = _signature(
        [Argument(0)],
        [Result(0), ExternalResult(0), ExternalView(0, (2,), (8,), 4), NewGrad(0), Repeat(0), PythonValue("s")],
    )
    arrays = bind(sig, [x])
    made, same, view, grad, repeat, value = apply(sig, [np.zeros(1, np.float32)], arrays, [x])
    assert same is x and grad is x.grad and repeat is made and value == "s"
    np.testing.assert_array_equal(view.numpy(), [1.0, 3.0])
    assert np.shares_memory(view.numpy(), x.numpy()) and view._version is x._version and view._base is x


def test_write_backs_read_every_new_value_before_writing_and_bump_versions():
    a, b = kiln.tensor([1.0, 2.0]), kiln.tensor([3.0, 4.0])
    memory, versions = (a._data, b._data), (a._version[0], b._version[0])
    sig = _signature([Argument(0), Argument(1)], [], [WriteBack(0, 1), WriteBack(1, 0)])
    arrays = bind(sig, [a, b])
    apply(sig, list(arrays), arrays, [a, b])  # a swap: each new value is the other input's memory
    np.testing.assert_array_equal(a.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(b.numpy(), [1.0, 2.0])
    assert (a._data, b._data) == memory  # written into their memory, as the in-place ops do
    assert (a._version[0], b._version[0]) == (versions[0] + 1, versions[1] + 1)


def test_grad_assignments_set_share_and_clear():
    p, q, r = kiln.zeros(2), kiln.zeros(2), kiln.zeros(2)
    r.grad = kiln.ones(2)
    new = np.array([1.5, 2.5], np.float32)
    sig = _signature([Argument(0), Argument(1), Argument(2)], [NewGrad(0)],
                     grads=[SetGrad(0, 0), ShareGrad(1, 0), ClearGrad(2)])  # fmt: skip
    arrays = bind(sig, [p, q, r])
    (grad,) = apply(sig, [new], arrays, [p, q, r])
    np.testing.assert_array_equal(p.grad.numpy(), new)
    assert grad is p.grad and q.grad is p and r.grad is None


# ---------------------------------------------------------------------- from a trace's kinds
def test_number_outputs_turns_values_into_output_indices():
    builder = GraphBuilder()
    v, root, own, mutated = (builder.input(TensorType((2,), dt.float32)) for _ in range(4))
    results = [Result(v), BornView(root, (4,), (2,), (4,), 0, own), BornView(root, (4,), (1,), (4,), 4, own),
               ExternalView(1, (1,), (4,), 0, own), Repeat(0)]  # fmt: skip
    sig, outputs = number_outputs([Argument(0), Argument(1)], results, [WriteBack(1, mutated)], [SetGrad(0, v)])
    assert outputs == [v, root, mutated, v]  # the born views share one output holding their root
    assert sig.results == [Result(0), BornView(1, (4,), (2,), (4,), 0), BornView(1, (4,), (1,), (4,), 4),
                           ExternalView(1, (1,), (4,), 0), Repeat(0)]  # fmt: skip
    assert sig.writebacks == [WriteBack(1, 2)] and sig.grads == [SetGrad(0, 3)] and sig.devices == (CPU,) * 4
    copies, outputs = number_outputs([Argument(0), Argument(1)], results, views=False)  # as export returns views
    assert copies.results == [Result(0), Result(1), Result(2), Result(3), Repeat(0)]
    assert outputs == [v, own, own, own]


# ---------------------------------------------------------------------- the export file's form
def test_a_version_1_file_loads_and_runs_as_the_function_it_was_exported_from(tmp_path):
    """``data/export_v1.kiln`` was written by kiln at commit 8c11fa9 (export format version 1) from
    ``fn`` below, with ``w``, ``b`` and ``running`` the parameters capture_2, capture_3, capture_4."""
    program = kiln.load_exported(V1_FILE)
    w, b, running = (program.parameters[f"capture_{k}"].clone() for k in (2, 3, 4))

    def fn(x, scale, state):
        y = (x @ w + b) * scale
        running.mul_(0.5).add_(y.mean(0))
        state["acc"].add_(1.0)
        return {"y": y, "again": [y], "x": x, "head": x[1:], "scale": scale, "inf": math.inf, "running": running}

    acc, eager_acc = kiln.zeros(2), kiln.zeros(2)
    for step in range(3):
        x = kiln.randn(2, 3)
        out, expected = program(x, 2.0, {"acc": acc}), fn(x, 2.0, {"acc": eager_acc})
        for key in ("y", "head", "running"):
            np.testing.assert_allclose(out[key].numpy(), expected[key].numpy(), rtol=1e-6, err_msg=f"{key}, {step}")
        np.testing.assert_array_equal(acc.numpy(), eager_acc.numpy())
        assert out["again"][0] is out["y"] and out["x"] is x and out["running"] is program.parameters["capture_4"]
        assert out["scale"] == 2.0 and out["inf"] == math.inf
        assert not np.shares_memory(out["head"].numpy(), x.numpy())  # export returns views as values
    program.save(tmp_path / "again.kiln")  # and writes the same version-1 form back
    assert kiln.load_exported(tmp_path / "again.kiln")(x, 2.0, {"acc": acc})["y"].shape == (2, 2)


def test_the_signature_round_trips_through_the_files_json_unchanged():
    graph, tensors, meta = load_graph_file(V1_FILE)
    parameters = {name: kiln.from_numpy(array) for name, array in tensors.items()}
    in_specs = [("tensor", (2, 3), "f32"), ("python", 2.0), ("tensor", (2,), "f32")]
    sig = signature_from_json(meta, graph, in_specs, parameters)
    assert sig.inputs == [Argument(0), Argument(2), Parameter("capture_2"), Parameter("capture_3"),
                          Parameter("capture_4")]  # fmt: skip
    assert sig.results[:3] == [Result(0), Repeat(0), ExternalResult(0)] and sig.results[-1] == ExternalResult(4)
    assert sig.results[5].value == math.inf and sig.writebacks == [WriteBack(1, 2), WriteBack(4, 3)]
    stored = {key: meta[key] for key in ("inputs", "outputs", "writebacks")}
    assert signature_to_json(sig) == stored


def test_a_result_naming_an_argument_the_graph_does_not_read_is_refused():
    graph, tensors, meta = load_graph_file(V1_FILE)
    parameters = {name: kiln.from_numpy(array) for name, array in tensors.items()}
    in_specs = [("tensor", (2, 3), "f32"), ("python", 2.0), ("tensor", (2,), "f32")]
    with pytest.raises(ValueError, match="result 0 reads argument 1, which is 2.0 in the signature, not a tensor"):
        signature_from_json({**meta, "outputs": [["arg", 1]]}, graph, in_specs, parameters)
    unread = [("tensor", (2, 3), "f32"), ("tensor", (3,), "f32"), ("tensor", (2,), "f32")]
    with pytest.raises(ValueError, match="result 0 reads argument 1, no graph input"):
        signature_from_json({**meta, "outputs": [["arg", 1]]}, graph, unread, parameters)


# ---------------------------------------------------------------------- freed graphs
def test_a_second_backward_raises_freed_graph_error_a_runtime_error():
    x = kiln.randn(3, requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(FreedGraphError, match="backward through the graph a second time") as info:
        y.backward()
    assert isinstance(info.value, RuntimeError) and kiln.autograd.FreedGraphError is FreedGraphError

    class Square(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            ctx.save_for_backward(t)
            return t * t

        @staticmethod
        def backward(ctx, g):
            (t,) = ctx.saved_tensors
            return 2 * t * g

    z = Square.apply(x).sum()
    z.backward()
    with pytest.raises(FreedGraphError, match="a second time"):
        z.backward()
    compiled = kiln.compile(lambda t: (t * t).sum())
    for _ in range(2):  # traced, then compiled
        loss = compiled(x)
        loss.backward()
        with pytest.raises(FreedGraphError, match="a second time"):
            loss.backward()
