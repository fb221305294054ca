"""Programs with dynamic sizes as ONNX (issue 33, item 6): ``kiln.export(..., dynamic_shapes=...)`` and
``kiln.onnx.export(..., dynamic_axes=...)`` write symbolic dims, compute sizes such as ``batch*seq`` at
run time, and run in onnxruntime at several (batch, seq) pairs equal to kiln eager; what ONNX cannot
express is refused with what and where, never a KeyError."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import kiln  # noqa: E402
import kiln.nn as nn  # noqa: E402
import kiln.onnx  # noqa: E402
from kiln.ir import dtypes as dt  # noqa: E402
from kiln.ir.graph import Graph, GraphBuilder  # noqa: E402
from kiln.ir.types import Sym, TensorType, sym_product  # noqa: E402
from kiln.onnx import RULES  # noqa: E402
from kiln.onnx._builder import ModelBuilder  # noqa: E402
from tests.frontend.jit.test_dynamic_inner_sizes import TinyGPT  # noqa: E402
from tests.frontend.jit.test_export_dynamic import GuardedGPT  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5
rng = np.random.default_rng(7)
PAIRS = [(2, 8), (1, 1), (3, 17), (4, 32), (2, 5)]  # (batch, seq): the traced pair first


def _session(path):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def _eager(fn, *args):
    with kiln.no_grad():
        out = fn(*args)
    return out if isinstance(out, tuple) else (out,)


def _agrees(session, fn, names, make_inputs, pairs):
    for b, t in pairs:
        inputs = make_inputs(b, t)
        got = session.run(None, {n: x.numpy() for n, x in zip(names, inputs, strict=True)})
        want = _eager(fn, *inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w.numpy(), rtol=RTOL, atol=ATOL, err_msg=f"(batch, seq) = {(b, t)}")


def _tokens(b, t):
    return (kiln.tensor(rng.integers(0, 13, (b, t))),)


@pytest.mark.parametrize("dims", [{1: "seq"}, {0: "batch", 1: "seq"}])
def test_an_exported_gpt_with_dynamic_sizes_runs_in_onnxruntime_at_other_sizes(tmp_path, dims):
    kiln.manual_seed(0)
    model = TinyGPT().eval()
    with kiln.no_grad():
        program = kiln.export(model, *_tokens(2, 8), dynamic_shapes=[dims])
    program.to_onnx(tmp_path / "gpt.onnx", input_names=["idx"], output_names=["logits"])
    proto = onnx.load(tmp_path / "gpt.onnx")
    names = [dims.get(0, 2), "seq"]
    assert _dims(proto.graph.input[0]) == names and _dims(proto.graph.output[0]) == [*names, 13]
    ops = [node.op_type for node in proto.graph.node]
    assert ops.count("LayerNormalization") == 3 and "Softmax" in ops  # the composite ops survive dynamic export
    pairs = PAIRS if 0 in dims else [(2, t) for _, t in PAIRS]
    _agrees(_session(tmp_path / "gpt.onnx"), model, ["idx"], _tokens, pairs)


def test_reshapes_to_products_of_dynamic_sizes_compute_them_at_run_time(tmp_path):
    kiln.manual_seed(0)
    model = TinyGPT().eval()

    def f(idx, x):
        logits = model(idx)  # (batch, seq, 13)
        pairs = x.reshape(x.shape[0], -1, 2)  # (batch, 2*seq, 2)
        return logits.view(-1, logits.shape[-1]), pairs * 2.0, pairs.reshape(-1)

    def inputs(b, t):
        return (_tokens(b, t)[0], kiln.randn(b, t, 4))

    with kiln.no_grad():
        program = kiln.export(f, *inputs(2, 8), dynamic_shapes=[{0: "batch", 1: "seq"}, {0: "batch", 1: "seq"}])
    program.to_onnx(tmp_path / "p.onnx", input_names=["idx", "x"])
    proto = onnx.load(tmp_path / "p.onnx")
    assert [_dims(v) for v in proto.graph.output] == [["batch*seq", 13], ["batch", "2*seq", 2], ["4*batch*seq"]]
    sizes = {n for node in proto.graph.node if node.op_type == "Mul" for n in node.output if n.startswith("size_")}
    assert {"size_p_1_batch_seq", "size_p_2_seq", "size_p_4_batch_seq"} <= sizes  # computed by Shape, Mul and Concat
    _agrees(_session(tmp_path / "p.onnx"), f, ["idx", "x"], inputs, PAIRS)


def test_to_onnx_dynamic_axes_rename_the_programs_dynamic_dims_only(tmp_path):
    kiln.manual_seed(0)
    model = TinyGPT().eval()
    with kiln.no_grad():
        program = kiln.export(model, *_tokens(2, 8), dynamic_shapes=[{1: "seq"}])
    axes = {"idx": {1: "T"}, "logits": {1: "T"}}
    program.to_onnx(tmp_path / "g.onnx", input_names=["idx"], output_names=["logits"], dynamic_axes=axes)
    proto = onnx.load(tmp_path / "g.onnx")
    assert _dims(proto.graph.input[0]) == [2, "T"] and _dims(proto.graph.output[0]) == [2, "T", 13]
    _agrees(_session(tmp_path / "g.onnx"), model, ["idx"], _tokens, [(2, 8), (2, 3)])
    with pytest.raises(kiln.onnx.OnnxExportError, match=r"axis 0 of input 'idx' dynamic, but the program was "
                                                         r"exported for its size \(shape \[2, seq\]\)"):  # fmt: skip
        program.to_onnx(tmp_path / "h.onnx", input_names=["idx"], dynamic_axes={"idx": {0: "batch"}})


def test_a_gpt_read_back_from_its_file_exports_with_dynamic_sizes(tmp_path):
    kiln.manual_seed(0)
    model = TinyGPT().eval()
    with kiln.no_grad():
        kiln.export(model, *_tokens(2, 8), dynamic_shapes=[{0: "batch", 1: "seq"}]).save(tmp_path / "gpt.kiln")
    loaded = kiln.load_exported(tmp_path / "gpt.kiln")
    assert {"layer_norm", "softmax", "linear", "embedding"} <= {r.name for r in loaded.regions}
    loaded.to_onnx(tmp_path / "gpt.onnx", input_names=["idx"])
    assert "LayerNormalization" in [node.op_type for node in onnx.load(tmp_path / "gpt.onnx").graph.node]
    _agrees(_session(tmp_path / "gpt.onnx"), model, ["idx"], _tokens, PAIRS[:3])
    loaded = kiln.onnx.load(tmp_path / "gpt.onnx")  # kiln's own ONNX reader, at another size
    idx = _tokens(3, 11)[0]
    np.testing.assert_allclose(loaded(idx).numpy(), _eager(model, idx)[0].numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_an_exported_recurrence_with_dynamic_batch_and_length_is_onnx_lstm(tmp_path, kind):
    kiln.manual_seed(1)
    layer = getattr(nn, kind)(4, 6, num_layers=2, batch_first=True).eval()

    def f(x):
        out, state = layer(x)
        return (out, *state) if isinstance(state, tuple) else (out, state)

    with kiln.no_grad():
        program = kiln.export(f, kiln.randn(3, 7, 4), dynamic_shapes=[{0: "batch", 1: "seq"}])
    program.to_onnx(tmp_path / "rnn.onnx", input_names=["x"])
    proto = onnx.load(tmp_path / "rnn.onnx")
    assert [node.op_type for node in proto.graph.node].count(kind) == 2  # one ONNX operator per layer
    assert _dims(proto.graph.input[0]) == ["batch", "seq", 4]
    _agrees(_session(tmp_path / "rnn.onnx"), f, ["x"], lambda b, t: (kiln.randn(b, t, 4),), [(3, 7), (1, 1), (2, 12)])
    # read back from its file (its regions checked at sample sizes), it is written the same way
    program.save(tmp_path / "rnn.kiln")
    kiln.load_exported(tmp_path / "rnn.kiln").to_onnx(tmp_path / "again.onnx", input_names=["x"])
    assert [node.op_type for node in onnx.load(tmp_path / "again.onnx").graph.node].count(kind) == 2
    _agrees(_session(tmp_path / "again.onnx"), f, ["x"], lambda b, t: (kiln.randn(b, t, 4),), [(2, 5)])


def test_onnx_export_with_a_dynamic_sequence_axis_of_a_gpt(tmp_path):
    kiln.manual_seed(2)
    model = TinyGPT().eval()
    axes = {"idx": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    proto = kiln.onnx.export(model, _tokens(2, 8), tmp_path / "gpt.onnx", input_names=["idx"],
                             output_names=["logits"], dynamic_axes=axes)  # fmt: skip
    assert _dims(proto.graph.input[0]) == ["batch", "seq"] and _dims(proto.graph.output[0]) == ["batch", "seq", 13]
    _agrees(_session(tmp_path / "gpt.onnx"), model, ["idx"], _tokens, PAIRS)


class NanoBlock(nn.Module):
    """Attention as nanoGPT writes it: a block-sized position table and causal mask, sliced to T."""

    def __init__(self, vocab: int = 13, c: int = 16, block: int = 32) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, c), nn.Parameter(kiln.randn(block, c) * 0.1)
        self.qkv, self.head = nn.Linear(c, 3 * c), nn.Linear(c, vocab)
        self.register_buffer("bias", kiln.tril(kiln.ones(block, block)).view(1, 1, block, block))

    def forward(self, idx):
        B, T = idx.shape
        x = self.tok(idx) + self.pos[:T]
        q, k, v = (t.view(B, T, 2, 8).transpose(1, 2) for t in self.qkv(x).split(16, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / 8**0.5)
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = kiln.softmax(att, dim=-1) @ v
        return self.head(y.transpose(1, 2).contiguous().view(B, T, 16))


def test_onnx_export_of_a_nanogpt_block_slicing_its_buffers_to_the_length(tmp_path):
    kiln.manual_seed(8)
    model = NanoBlock().eval()
    proto = kiln.onnx.export(model, _tokens(2, 8), tmp_path / "nano.onnx", input_names=["idx"],
                             dynamic_axes={"idx": {0: "batch", 1: "seq"}})  # fmt: skip
    constants = {t.name for t in proto.graph.initializer}
    ends = [node.input[2] for node in proto.graph.node if node.op_type == "Slice"]
    assert sum(end not in constants for end in ends) >= 2  # pos[:T] and bias[..., :T, :T]: T read at run time
    _agrees(_session(tmp_path / "nano.onnx"), model, ["idx"], _tokens, PAIRS)


def test_onnx_export_of_an_lstm_over_a_dynamic_length(tmp_path):
    kiln.manual_seed(3)
    layer = nn.LSTM(5, 7, batch_first=True).eval()

    def f(x):
        out, (h, c) = layer(x)
        return out, h, c

    proto = kiln.onnx.export(f, (kiln.randn(2, 6, 5),), tmp_path / "lstm.onnx", input_names=["x"],
                             dynamic_axes={"x": {0: "batch", 1: "seq"}})  # fmt: skip
    assert [node.op_type for node in proto.graph.node].count("LSTM") == 1
    _agrees(_session(tmp_path / "lstm.onnx"), f, ["x"], lambda b, t: (kiln.randn(b, t, 5),), [(2, 6), (1, 1), (3, 9)])


def test_a_mean_over_a_dynamic_axis_divides_by_the_size_at_run_time(tmp_path):
    def centered(x):
        return x - x.mean(dim=0)  # the divisor is the batch size

    kiln.onnx.export(centered, (kiln.randn(4, 3),), tmp_path / "c.onnx", dynamic_axes={"x": {0: "batch"}})
    _agrees(_session(tmp_path / "c.onnx"), centered, ["x"], lambda b, _: (kiln.randn(b, 3),), [(4, 0), (1, 0), (7, 0)])


def test_a_slice_by_a_computed_size_is_refused_with_the_users_line(tmp_path):
    def half(x):
        return x[: x.shape[0] // 2]

    with pytest.raises(kiln.onnx.OnnxExportError, match=r"slice.*test_dynamic_programs.py:\d+ in half"):
        kiln.onnx.export(half, (kiln.randn(4, 3),), tmp_path / "h.onnx", dynamic_axes={"x": {0: "batch"}})


def test_a_size_guard_the_model_cannot_check_is_warned_of(tmp_path):
    kiln.manual_seed(0)
    model = GuardedGPT().eval()
    with kiln.no_grad():
        program = kiln.export(model, *_tokens(2, 8), dynamic_shapes=[{1: "seq"}])
    with pytest.warns(UserWarning, match=r"idx dim 1: size <= 32 is True \(.*test_export_dynamic.py:\d+"):
        program.to_onnx(tmp_path / "g.onnx", input_names=["idx"])
    _agrees(_session(tmp_path / "g.onnx"), model, ["idx"], _tokens, [(2, 8), (2, 32)])


def test_a_size_no_input_binds_is_a_clear_error_not_a_key_error():
    builder = ModelBuilder(Graph((), (), (), {}), 17)
    with pytest.raises(kiln.onnx.OnnxExportError, match="the size seq is no dimension of any graph input"):
        builder.dim(Sym("seq"))
    with pytest.raises(kiln.onnx.OnnxExportError, match="the size batch is no dimension"):
        builder.dim(sym_product(2, [Sym("batch"), Sym("seq")]))
    with pytest.raises(kiln.onnx.OnnxExportError, match=r"sizes \['seq', '4'\] where this op's ONNX form needs"):
        builder.ints([Sym("seq"), 4])


# ----------------------------------------------------------------------------- rnn_scan without a region
@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_rnn_scan_without_its_layers_region_is_onnxs_recurrence(tmp_path, kind):
    kiln.manual_seed(4)
    layer = getattr(nn, kind)(4, 6, num_layers=2, bidirectional=True, batch_first=True).eval()

    def f(x):
        out, state = layer(x)
        return (out, *state) if isinstance(state, tuple) else (out, state)

    with kiln.no_grad():
        program = kiln.export(f, kiln.randn(3, 7, 4), dynamic_shapes=[{0: "batch", 1: "seq"}])
    program.regions = ()  # as a region the writer does not take leaves it: rnn_scan written by its own rule
    program.to_onnx(tmp_path / "scan.onnx", input_names=["x"])
    ops = [node.op_type for node in onnx.load(tmp_path / "scan.onnx").graph.node]
    assert ops.count(kind) == 4 and "MatMul" in ops  # one per layer and direction, after the input projection
    _agrees(_session(tmp_path / "scan.onnx"), f, ["x"], lambda b, t: (kiln.randn(b, t, 4),), [(3, 7), (1, 1), (2, 12)])


def test_an_lstm_cell_looped_in_python_runs_in_onnxruntime_at_other_batch_sizes(tmp_path):
    kiln.manual_seed(5)
    cell = nn.LSTMCell(4, 5).eval()

    def steps(x):
        h, c = kiln.zeros(x.shape[0], 5), kiln.zeros(x.shape[0], 5)
        for t in range(x.shape[1]):
            h, c = cell(x[:, t], (h, c))
        return h, c

    with kiln.no_grad():
        program = kiln.export(steps, kiln.randn(3, 4, 4), dynamic_shapes=[{0: "batch"}])
    program.to_onnx(tmp_path / "cells.onnx", input_names=["x"])
    assert [node.op_type for node in onnx.load(tmp_path / "cells.onnx").graph.node].count("LSTM") == 4
    _agrees(
        _session(tmp_path / "cells.onnx"), steps, ["x"], lambda b, _: (kiln.randn(b, 4, 4),), [(3, 0), (1, 0), (6, 0)]
    )


def test_onnx_export_of_a_plain_rnn_over_a_dynamic_length(tmp_path):
    kiln.manual_seed(6)
    layer = nn.RNN(3, 4, nonlinearity="relu").eval()  # no composite rule: written by rnn_scan's

    def f(x):
        out, h = layer(x)
        return out, h

    proto = kiln.onnx.export(f, (kiln.randn(5, 2, 3),), tmp_path / "rnn.onnx", input_names=["x"],
                             dynamic_axes={"x": {0: "seq", 1: "batch"}})  # fmt: skip
    assert [node.op_type for node in proto.graph.node].count("RNN") == 1
    _agrees(_session(tmp_path / "rnn.onnx"), f, ["x"], lambda b, t: (kiln.randn(t, b, 3),), [(2, 5), (1, 1), (3, 8)])


def _scan(mode: str, hidden: int, readers):
    """A graph of one ``rnn_scan`` over (T, B) = (5, 2) and what ``readers(graph_builder, scan)`` reads of
    it; the ModelBuilder over it (inputs named in0...) and the scan node."""
    gates = {"LSTM": 4, "GRU": 3}[mode]
    types = [(5, 2, gates * hidden), (gates * hidden,), (2, hidden)]
    types += [(2, hidden), (4 * hidden, hidden)] if mode == "LSTM" else [(3 * hidden, hidden), (hidden,)]
    g = GraphBuilder()
    inputs = [g.input(TensorType(shape, dt.float32)) for shape in types]
    scan = g.node("rnn_scan", inputs, {"mode": mode, "reverse": mode == "GRU"})
    builder = ModelBuilder(g.build(readers(g, scan)), 17)
    for k, v in enumerate(inputs):
        builder.bind(v, f"in{k}")
    return builder, builder.graph.nodes[0]


def test_rnn_scan_read_beyond_h_and_the_final_states_is_refused():
    def gates(g, scan):
        width = scan.type.shape[-1]
        return [g.node("slice", [scan], {"starts": (0, 0, width - 15), "stops": (5, 2, width - 3), "steps": (1, 1, 1)})]

    builder, node = _scan("LSTM", 3, gates)
    with pytest.raises(kiln.onnx.OnnxExportError, match=r"LSTM recurrence \(rnn_scan\) whose packed result is read by "
                                                         r"slice of \[\d+:\d+\]: ONNX's LSTM gives each step's h and "
                                                         r"the final states \(the first 9 of"):  # fmt: skip
        RULES["rnn_scan"](builder, node, *(f"in{k}" for k in range(5)))


def test_rnn_scan_whose_whole_result_is_an_output_is_refused():
    builder, node = _scan("GRU", 3, lambda g, scan: [scan])
    with pytest.raises(kiln.onnx.OnnxExportError, match=r"GRU recurrence \(rnn_scan\) whose whole packed result is"):
        RULES["rnn_scan"](builder, node, *(f"in{k}" for k in range(5)))
