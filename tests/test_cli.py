"""The ``kiln`` command line: a round trip in a subprocess (export here, then show, draw, run,
bench, to-onnx there), and its errors (what was expected, what was given)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.__main__ import main
from tests.ir.test_dot import parse_dot

ROOT = Path(kiln.__file__).resolve().parent.parent


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "kiln", *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    if check:
        assert done.returncode == 0, done.stderr
    return done


def _export(tmp_path: Path):
    kiln.manual_seed(0)
    model = kiln.nn.Sequential(kiln.nn.Linear(8, 16), kiln.nn.ReLU(), kiln.nn.Linear(16, 4), kiln.nn.Softmax(-1))
    x = kiln.randn(3, 8)
    path = tmp_path / "model.kiln"
    kiln.export(model, x).save(path)
    return model, path


def test_round_trip_through_the_command_line(tmp_path):
    model, path = _export(tmp_path)

    shown = _cli("show", path).stdout
    assert "argument 0: f32[3, 8]" in shown and "0.weight: f32[16, 8]" in shown and "2.bias: f32[4]" in shown
    assert "result 0 f32[3,4]" in shown and "matmul x2" in shown
    assert "graph(%0: f32[3,8]" in shown  # the full text form after the summary
    assert "graph(" not in _cli("show", path, "--summary").stdout
    fused = _cli("show", path, "--summary", "--fused").stdout
    assert "14 nodes (6 after fusion)" in fused, fused  # 2 permutes, 2 matmuls and 2 kernels
    assert (
        "k0 elementwise -> f32[3,16]: add, le, where" in fused and "k1 reduction -> f32[3,4]: add, reduce_max" in fused
    )

    for fused in (False, True):
        dot = tmp_path / f"graph{int(fused)}.dot"
        _cli("draw", path, "-o", dot, *(["--fused"] if fused else []))
        parsed = parse_dot(dot.read_text())
        labels = [label for label, _, _ in parsed["nodes"].values()]
        assert "argument 0\n%0: f32[3,8]" in labels and "parameter 0.weight\n%1: f32[16,8]" in labels
        assert "result 0\n%19: f32[3,4]" in labels
        assert sum(label.startswith("matmul") for label in labels) == 2
        assert bool(parsed["clusters"]) == fused  # after fusion the kernels are clusters

    for k in range(2):  # several inputs, both ways of running
        x = np.random.default_rng(k).standard_normal((3, 8)).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        with kiln.no_grad():
            expected = model(kiln.tensor(x)).numpy()
        for flags in ([], ["--interpret"]):
            out = tmp_path / "out.npz"
            _cli("run", path, "--inputs", tmp_path / "x.npy", "--out", out, *flags)
            with np.load(out) as got:
                assert got.files == ["output_0"]
                np.testing.assert_allclose(got["output_0"], expected, rtol=1e-5, atol=1e-6)

    bench = _cli("bench", path, "--warmup", "1", "--repeat", "3").stdout
    assert "median" in bench and "ms per call" in bench and "3 calls after 1 warm-up" in bench
    assert "--repeat" in _cli("bench", "--help").stdout


def _has_onnx_export() -> bool:
    return importlib.util.find_spec("kiln.onnx") is not None and hasattr(kiln.ExportedProgram, "to_onnx")


def test_to_onnx_says_when_this_kiln_has_no_onnx_export(tmp_path):
    if _has_onnx_export():
        pytest.skip("this kiln has kiln.onnx: test_to_onnx_through_the_command_line runs instead")
    _, path = _export(tmp_path)
    done = _cli("to-onnx", path, "-o", tmp_path / "model.onnx", check=False)
    assert done.returncode == 2 and "kiln.onnx" in done.stderr


def test_to_onnx_through_the_command_line(tmp_path):
    if not _has_onnx_export():
        pytest.skip("kiln.onnx / ExportedProgram.to_onnx is not part of this kiln")
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    model, path = _export(tmp_path)
    _cli("to-onnx", path, "-o", tmp_path / "model.onnx", "--input-names", "x", "--output-names", "probs")
    onnx.checker.check_model(onnx.load(str(tmp_path / "model.onnx")))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["x"] and [o.name for o in session.get_outputs()] == ["probs"]
    for k in range(2):
        x = np.random.default_rng(k).standard_normal((3, 8)).astype(np.float32)
        (got,) = session.run(None, {"x": x})
        with kiln.no_grad():
            np.testing.assert_allclose(got, model(kiln.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_to_onnx_dynamic_batch_says_how_instead_of_a_traceback(tmp_path, capsys):
    """A file holds one traced batch size; the flag used to end in a traceback from to_onnx."""
    _, path = _export(tmp_path)
    err = _error(capsys, "to-onnx", path, "-o", tmp_path / "model.onnx", "--dynamic-batch")
    assert "kiln.onnx.export(model" in err and "dynamic_axes" in err and "Traceback" not in err
    assert not (tmp_path / "model.onnx").exists()


def test_every_command_has_help():
    for command in ("show", "draw", "to-onnx", "run", "bench"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0


def _error(capsys, *argv) -> str:
    assert main([str(a) for a in argv]) == 2
    return capsys.readouterr().err


def test_errors_say_what_was_expected_and_what_was_given(tmp_path, capsys):
    _, path = _export(tmp_path)
    missing = tmp_path / "missing.kiln"
    assert "no such file" in _error(capsys, "show", missing)
    (tmp_path / "junk.kiln").write_bytes(b"not a kiln file")
    assert "cannot be read as an exported kiln program" in _error(capsys, "show", tmp_path / "junk.kiln")

    err = _error(capsys, "run", path)
    assert "takes 1 tensor input(s) (f32[3, 8]); 0 given" in err and "--inputs" in err
    np.save(tmp_path / "a.npy", np.zeros((3, 8), np.float32))
    assert "1 tensor input(s) (f32[3, 8]); 2 given" in _error(capsys, "run", path, "--inputs", tmp_path / "a.npy",
                                                               tmp_path / "a.npy")  # fmt: skip
    np.save(tmp_path / "b.npy", np.zeros((4, 8), np.float32))
    err = _error(capsys, "run", path, "--inputs", tmp_path / "b.npy")
    assert "expected shape [3, 8] (f32), got float32 of shape [4, 8]" in err
    np.save(tmp_path / "c.npy", np.zeros((3, 8), np.float64))
    assert "expected dtype float32 (f32), got float64" in _error(capsys, "run", path, "--inputs", tmp_path / "c.npy")
    assert "input" in _error(capsys, "bench", path, "--inputs", tmp_path / "nothere.npy")
    assert "expected a path ending in .dot" in _error(capsys, "draw", path, "-o", tmp_path / "graph.txt")


def test_inputs_from_one_npz_and_outputs_printed(tmp_path, capsys):
    model, path = _export(tmp_path)
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
    np.savez(tmp_path / "inputs.npz", x=x)
    assert main(["run", str(path), "--inputs", str(tmp_path / "inputs.npz"), "--out", str(tmp_path / "o.npz")]) == 0
    with np.load(tmp_path / "o.npz") as got, kiln.no_grad():
        np.testing.assert_allclose(got["output_0"], model(kiln.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    capsys.readouterr()
    assert main(["run", str(path), "--inputs", str(tmp_path / "inputs.npz")]) == 0
    assert "output_0: float32[3, 4]" in capsys.readouterr().out


def test_structured_results_and_fixed_python_arguments(tmp_path, capsys):
    def f(x, y, scale=2.0):
        return {"scaled": x * scale, "total": (x @ y).sum(), "count": 3}

    x, y = kiln.randn(2, 3), kiln.randn(3, 4)
    kiln.export(f, x, y, scale=3.0).save(tmp_path / "f.kiln")
    assert main(["show", str(tmp_path / "f.kiln"), "--summary"]) == 0
    shown = capsys.readouterr().out
    assert "argument 2: 3.0 (fixed)" in shown and "result 2 = 3" in shown
    x2, y2 = (np.random.default_rng(1).standard_normal(s).astype(np.float32) for s in ((2, 3), (3, 4)))
    np.save(tmp_path / "x.npy", x2)
    np.save(tmp_path / "y.npy", y2)
    out = tmp_path / "out.npz"
    assert main(["run", str(tmp_path / "f.kiln"), "--inputs", str(tmp_path / "x.npy"), str(tmp_path / "y.npy"),
                 "--out", str(out)]) == 0  # fmt: skip
    assert "output_0 (result['scaled']) float32[2, 3]" in capsys.readouterr().out
    expected = f(kiln.tensor(x2), kiln.tensor(y2), scale=3.0)
    with np.load(out) as got:
        np.testing.assert_allclose(got["output_0"], expected["scaled"].numpy(), rtol=1e-6)
        np.testing.assert_allclose(got["output_1"], expected["total"].numpy(), rtol=1e-5, atol=1e-5)
        assert got["output_2"] == 3


def test_draw_svg_when_graphviz_is_installed(tmp_path):
    from kiln.ir.dot import dot_available

    if not dot_available():
        pytest.skip("Graphviz's dot program (or the graphviz package) is not installed")
    _, path = _export(tmp_path)
    assert main(["draw", str(path), "-o", str(tmp_path / "g.svg"), "--fused"]) == 0
    assert "<svg" in (tmp_path / "g.svg").read_text()
