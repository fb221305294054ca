"""kiln.utils.tensorboard.SummaryWriter writes event files that TensorBoard's own reader reads back:
scalars, add_scalars' runs, histograms, text and hyperparameters; the same as PyTorch's writer writes."""

from __future__ import annotations

import numpy as np
import pytest

import kiln

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
from kiln.utils.tensorboard import SummaryWriter  # noqa: E402


def _read(folder):
    accumulator = event_accumulator.EventAccumulator(str(folder), size_guidance={"histograms": 0, "tensors": 0})
    return accumulator.Reload()


def _write_everything(writer_type, folder, values, torchlike):
    with writer_type(str(folder)) as writer:
        for step in range(3):
            writer.add_scalar("train/loss", torchlike(np.float32(1.0 / (step + 1))), step)
        writer.add_scalars("curves", {"a": 1.0, "b": torchlike(np.float64(2.0))}, 7)
        writer.add_histogram("weights", torchlike(values), 4)
        writer.add_histogram("weights_auto", torchlike(values), 5, bins="auto")
        writer.add_text("notes", "**hello** from step 2", 2)
        writer.add_hparams({"lr": 0.1, "optimizer": "adam", "layers": 2}, {"hparam/accuracy": 0.75}, run_name="trial")


def test_written_events_read_back(tmp_path):
    values = np.random.default_rng(0).normal(size=1000)
    _write_everything(SummaryWriter, tmp_path, values, kiln.tensor)
    run = _read(tmp_path)
    assert [(e.step, round(e.value, 6)) for e in run.Scalars("train/loss")] == [(0, 1.0), (1, 0.5), (2, 0.333333)]
    histogram = run.Histograms("weights")[0]
    assert histogram.step == 4
    assert histogram.histogram_value.num == 1000
    assert histogram.histogram_value.min == pytest.approx(values.min())
    assert histogram.histogram_value.sum == pytest.approx(values.sum())
    assert sum(histogram.histogram_value.bucket) == 1000
    auto = run.Histograms("weights_auto")[0].histogram_value
    assert sum(auto.bucket) == 1000 and len(auto.bucket) == 1 + len(
        np.histogram(values, bins="auto")[0]
    )  # an empty first
    (text,) = run.Tensors("notes/text_summary")
    assert text.step == 2 and text.tensor_proto.string_val == [b"**hello** from step 2"]
    for tag, expected in (("a", 1.0), ("b", 2.0)):
        (point,) = _read(tmp_path / f"curves_{tag}").Scalars("curves")
        assert (point.step, point.value) == (7, expected)
    trial = _read(tmp_path / "trial")
    assert trial.Scalars("hparam/accuracy")[0].value == 0.75
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(trial.Tags()["tensors"])


def test_the_same_files_as_pytorch_writes(torch, tmp_path):
    pytest.importorskip("torch.utils.tensorboard")
    from torch.utils.tensorboard import SummaryWriter as TorchWriter

    values = np.random.default_rng(1).normal(size=500)
    _write_everything(SummaryWriter, tmp_path / "kiln", values, kiln.tensor)
    _write_everything(TorchWriter, tmp_path / "torch", values, torch.tensor)
    ours, theirs = _read(tmp_path / "kiln"), _read(tmp_path / "torch")
    assert {k: sorted(v) for k, v in ours.Tags().items() if isinstance(v, list)} == {
        k: sorted(v) for k, v in theirs.Tags().items() if isinstance(v, list)
    }
    assert [(e.step, e.value) for e in ours.Scalars("train/loss")] == [
        (e.step, e.value) for e in theirs.Scalars("train/loss")
    ]
    for tag in ("weights", "weights_auto"):
        a, b = ours.Histograms(tag)[0].histogram_value, theirs.Histograms(tag)[0].histogram_value
        assert (a.num, a.min, a.max) == (b.num, b.min, b.max) and a.sum == pytest.approx(b.sum)
        assert list(a.bucket) == list(b.bucket)
        np.testing.assert_allclose(a.bucket_limit, b.bucket_limit, rtol=1e-12)
    assert (
        ours.Tensors("notes/text_summary")[0].tensor_proto.string_val
        == theirs.Tensors("notes/text_summary")[0].tensor_proto.string_val
    )


def test_bad_values_say_what_was_expected(tmp_path):
    with SummaryWriter(str(tmp_path)) as writer:
        with pytest.raises(ValueError, match="one-element"):
            writer.add_scalar("x", kiln.ones(3))
        with pytest.raises(ValueError, match="nan or inf"):
            writer.add_histogram("h", kiln.tensor([1.0, float("nan")]))
        with pytest.raises(TypeError, match="number, string or bool"):
            writer.add_hparams({"layers": [1, 2]}, {"m": 1.0})
