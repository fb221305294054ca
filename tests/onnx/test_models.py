"""Whole models through ONNX: onnxruntime (CPU) and ``kiln.onnx.load`` against kiln eager, at the
exported batch size and another one when the batch axis is dynamic."""

from __future__ import annotations

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import kiln  # noqa: E402
import kiln.nn as nn  # noqa: E402
import kiln.nn.functional as F  # noqa: E402
import kiln.onnx  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5


def _ort(path):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _eager(model, *args):
    with kiln.no_grad():
        out = model(*args)
    return out


def _ops(model_proto) -> list[str]:
    return [n.op_type for n in model_proto.graph.node]


def _check(model, make_inputs, path, names, batches, **export_kwargs):
    """Export at ``batches[0]``; kiln.onnx.load and onnxruntime (when installed: the round trip through
    load is tested without it) agree with eager at every batch size."""
    kiln.manual_seed(0)
    proto = kiln.onnx.export(model, make_inputs(batches[0]), path, input_names=names, **export_kwargs)
    try:
        session = _ort(path)
    except pytest.skip.Exception:
        session = None
    loaded = kiln.onnx.load(path)
    for batch in batches:
        inputs = make_inputs(batch)
        want = _eager(model, *inputs)
        want = want if isinstance(want, tuple) else (want,)
        if session is not None:
            got = session.run(None, {n: t.numpy() for n, t in zip(names, inputs, strict=True)})
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w.numpy(), rtol=RTOL, atol=ATOL, err_msg=f"onnxruntime, batch {batch}")
        back = loaded(*inputs)
        back = back if isinstance(back, tuple) else (back,)
        for g, w in zip(back, want, strict=True):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=RTOL, atol=ATOL, err_msg=f"load, batch {batch}")
    return proto


def test_digits_mlp_dynamic_batch(tmp_path):
    kiln.manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)).eval()
    proto = _check(model, lambda n: (kiln.randn(n, 64),), tmp_path / "mlp.onnx", ["pixels"], (8, 3, 1, 17),
                   output_names=["logits"], dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}})  # fmt: skip
    assert _ops(proto).count("Gemm") == 2
    assert [i.name for i in proto.graph.input] == ["pixels"]
    assert [o.name for o in proto.graph.output] == ["logits"]
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and dims[1].dim_value == 64
    assert {t.name for t in proto.graph.initializer} >= {"0.weight", "0.bias", "2.weight", "2.bias"}


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 3, stride=1, padding="same")
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(2)
        self.fc = nn.Linear(8 * 2 * 2, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.norm(self.conv1(x))))
        x = self.avg(F.relu(self.conv2(x)))
        return F.log_softmax(self.fc(x.flatten(1)), dim=1)


def test_small_cnn(tmp_path):
    kiln.manual_seed(2)
    model = SmallCNN()
    with kiln.no_grad():  # running statistics other than 0 and 1
        model.norm.running_mean.copy_(kiln.randn(4))
        model.norm.running_var.copy_(kiln.rand(4) + 0.5)
    model.eval()
    proto = _check(model, lambda n: (kiln.randn(n, 1, 8, 8),), tmp_path / "cnn.onnx", ["image"], (4, 2),
                   dynamic_axes={"image": {0: "batch"}})  # fmt: skip
    ops = _ops(proto)
    assert ops.count("Conv") == 2 and "MaxPool" in ops and "AveragePool" in ops and "LogSoftmax" in ops
    assert "BatchNormalization" in ops
    assert "Gather" not in ops  # no im2col


class CharBlock(nn.Module):
    """A char-level transformer block: embedding, pre-norm causal attention, GELU MLP."""

    def __init__(self, vocab=13, dim=16, context=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(kiln.randn(context, dim) * 0.1)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", kiln.tril(kiln.ones(context, context)) == 0)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        attention = F.softmax(scores.masked_fill(self.mask, float("-inf")), dim=-1)
        x = x + self.proj(attention @ v)
        x = x + self.mlp(self.norm2(x))
        return self.head(x)


@pytest.mark.parametrize("opset", [17, 20])
def test_char_transformer_block(tmp_path, opset):
    kiln.manual_seed(3)
    model = CharBlock().eval()
    proto = _check(model, lambda n: (kiln.randint(0, 13, (n, 6)),), tmp_path / "block.onnx", ["tokens"], (3, 5),
                   dynamic_axes={"tokens": {0: "batch"}}, opset_version=opset)  # fmt: skip
    ops = _ops(proto)
    assert ops.count("LayerNormalization") == 2 and "Softmax" in ops
    assert ("Gelu" in ops) == (opset >= 20)


@pytest.mark.parametrize(("layers", "bidirectional"), [(1, False), (2, True)])
def test_lstm(tmp_path, layers, bidirectional):
    kiln.manual_seed(4)

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(5, 7, num_layers=layers, batch_first=True, bidirectional=bidirectional)
            self.out = nn.Linear(7 * (1 + bidirectional), 3)

        def forward(self, x):
            output, (h, c) = self.lstm(x)
            return self.out(output), h, c

    proto = _check(Tagger().eval(), lambda n: (kiln.randn(n, 4, 5),), tmp_path / "lstm.onnx", ["x"], (2, 5),
                   dynamic_axes={"x": {0: "batch"}})  # fmt: skip
    assert _ops(proto).count("LSTM") == layers * (1 + bidirectional)  # one per layer and direction


def test_exported_program_to_onnx(tmp_path):
    kiln.manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 4), nn.Tanh()).eval()
    x = kiln.randn(3, 6)
    program = kiln.export(model, x)
    program.to_onnx(tmp_path / "p.onnx", input_names=["x"], output_names=["y"])
    (got,) = _ort(tmp_path / "p.onnx").run(None, {"x": x.numpy()})
    np.testing.assert_allclose(got, _eager(model, x).numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(kiln.onnx.load(tmp_path / "p.onnx")(x).numpy(), got, rtol=RTOL, atol=ATOL)
    with pytest.raises(kiln.onnx.OnnxExportError, match="kiln.onnx.export"):
        program.to_onnx(tmp_path / "q.onnx", input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    # a program read back from its file keeps its composite ops
    program.save(tmp_path / "p.kiln")
    again = kiln.load_exported(tmp_path / "p.kiln")
    assert [r.name for r in again.regions] == ["linear"]
    again.to_onnx(tmp_path / "r.onnx", input_names=["x"])
    assert "Gemm" in _ops(onnx.load(tmp_path / "r.onnx"))
    (out,) = _ort(tmp_path / "r.onnx").run(None, {"x": x.numpy()})
    np.testing.assert_allclose(out, got, rtol=RTOL, atol=ATOL)


def test_saved_regions_of_an_lstm_and_a_cnn(tmp_path):
    kiln.manual_seed(7)
    for model, x, op in ((nn.LSTM(3, 4).eval(), kiln.randn(5, 2, 3), "LSTM"),
                         (SmallCNN().eval(), kiln.randn(2, 1, 8, 8), "Conv")):  # fmt: skip
        kiln.export(model, x).save(tmp_path / "m.kiln")
        loaded = kiln.load_exported(tmp_path / "m.kiln")
        loaded.to_onnx(tmp_path / "m.onnx", input_names=["x"])
        ops = _ops(onnx.load(tmp_path / "m.onnx"))
        want = _eager(model, x)
        want = want[0] if isinstance(want, tuple) else want
        got = _ort(tmp_path / "m.onnx").run(None, {"x": x.numpy()})[0]
        np.testing.assert_allclose(got, want.numpy(), rtol=RTOL, atol=ATOL)
        assert op in ops  # the LSTM's zero states, merged by CSE, are found again


def test_damaged_regions_in_a_file_are_refused(tmp_path):
    import json

    from kiln.ir.serialize import load_graph_file, save_graph_file

    program = kiln.export(nn.Linear(3, 2).eval(), kiln.randn(4, 3))
    program.save(tmp_path / "p.kiln")
    graph, tensors, meta = load_graph_file(tmp_path / "p.kiln")
    meta = json.loads(json.dumps(meta))
    meta["regions"][0]["outputs"] = [999]
    save_graph_file(tmp_path / "bad.kiln", graph, tensors=tensors, metadata=meta)
    with pytest.raises(kiln.jit.ExportError, match="value '999'"):
        kiln.load_exported(tmp_path / "bad.kiln")


def test_unmappable_op_names_op_and_line(tmp_path):
    def noisy(x):
        return F.dropout(x, 0.5, training=True)  # the line the error names

    with pytest.raises(kiln.onnx.OnnxExportError, match=r"random_bits.*Philox.*test_models.py:\d+ in noisy"):
        kiln.onnx.export(noisy, (kiln.randn(4),), tmp_path / "x.onnx")


def test_size_dependent_constant_at_a_fixed_size(tmp_path):
    def centered(x):
        return x - x.mean(dim=0)  # the divisor is the batch size (over a dynamic axis: test_dynamic_programs.py)

    kiln.onnx.export(centered, (kiln.randn(4, 3),), tmp_path / "c.onnx")
    x = kiln.randn(4, 3)
    (got,) = _ort(tmp_path / "c.onnx").run(None, {"x": x.numpy()})
    np.testing.assert_allclose(got, centered(x).numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("bias", [True, False])
def test_gru(tmp_path, bias):
    kiln.manual_seed(6)
    model = nn.GRU(3, 4, num_layers=2, bias=bias).eval()
    proto = _check(model, lambda n: (kiln.randn(5, n, 3),), tmp_path / "gru.onnx", ["x"], (2, 3),
                   dynamic_axes={"x": [1]})  # fmt: skip
    assert _ops(proto).count("GRU") == 2
    assert proto.graph.input[0].type.tensor_type.shape.dim[1].dim_param == "x_dynamic_axes_2"


def test_output_names_and_repeated_results(tmp_path):
    def f(x, y):
        s = x + y
        return s, s, x  # a result twice and an argument returned as it is

    x, y = kiln.randn(3), kiln.randn(3)
    proto = kiln.onnx.export(f, (x, y), tmp_path / "f.onnx", output_names=["add", "again"])
    assert [i.name for i in proto.graph.input] == ["x", "y"]  # the function's parameter names
    assert [o.name for o in proto.graph.output] == ["add", "again", "output_2"]
    got = _ort(tmp_path / "f.onnx").run(None, {"x": x.numpy(), "y": y.numpy()})
    for g, w in zip(got, f(x, y), strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=RTOL, atol=ATOL)
    back = kiln.onnx.load(tmp_path / "f.onnx")(x, y=y)
    np.testing.assert_allclose(back[1].numpy(), (x + y).numpy(), rtol=RTOL, atol=ATOL)


def test_opset_range_is_checked(tmp_path):
    with pytest.raises(kiln.onnx.OnnxExportError, match=r"opset_version must be in \[16, \d+\], got 12"):
        kiln.onnx.export(lambda x: x * 2, (kiln.randn(2),), tmp_path / "o.onnx", opset_version=12)


def test_load_checks_its_inputs(tmp_path):
    kiln.onnx.export(lambda x: x.sum(0), (kiln.randn(2, 3),), tmp_path / "s.onnx", dynamic_axes={"x": {0: "n"}})
    run = kiln.onnx.load(tmp_path / "s.onnx")
    np.testing.assert_allclose(run(np.ones((4, 3), np.float32)).numpy(), np.full(3, 4.0, np.float32))
    with pytest.raises(TypeError, match=r"input 'x': expected kiln.float32, got kiln.float64"):
        run(np.ones((4, 3)))
    with pytest.raises(ValueError, match=r"input 'x': expected shape \[\?, 3\], got \[4, 2\]"):
        run(kiln.ones(4, 2))


def test_training_mode_state_is_refused(tmp_path):
    model = nn.BatchNorm1d(3)  # training mode: the call updates the running statistics
    with pytest.raises(kiln.onnx.OnnxExportError, match="export in eval mode"):
        kiln.onnx.export(model, (kiln.randn(4, 3),), tmp_path / "bn.onnx")


def test_the_same_model_is_the_same_file(tmp_path):
    model, x = CharBlock().eval(), kiln.randint(0, 13, (2, 6))
    first = kiln.onnx.export(model, (x,), tmp_path / "a.onnx", dynamic_axes={"tokens": {0: "b"}})
    second = kiln.onnx.export(model, (x,), tmp_path / "b.onnx", dynamic_axes={"tokens": {0: "b"}})
    assert first.SerializeToString() == second.SerializeToString()
