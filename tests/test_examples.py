"""The examples run and learn: each one in its fast mode, as a script, with checks on what it prints.

The digits data set ships with scikit-learn (no download); without scikit-learn these skip.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn")

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "train_digits.py"
ACCURACY = re.compile(r"^(mlp|cnn) test accuracy: (\d+\.\d+)%$", re.MULTILINE)
EPOCH = re.compile(r"^(mlp|cnn) epoch +(\d+)/(\d+) +loss (\d+\.\d+)$", re.MULTILINE)


def run_script(name: str, *args: str) -> str:
    """Run ``examples/<name>`` as a script on this checkout; its stdout (it must exit with 0)."""
    # The checkout, not an installed kiln: the test must exercise this tree's code.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def demo():
    """The demo as a module, to call its ``main(argv)`` in this process (no interpreter start-up)."""
    spec = importlib.util.spec_from_file_location("train_digits", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fast_demo_runs_as_a_script_and_learns():
    out = run_script("train_digits.py", "--fast")
    epochs = EPOCH.findall(out)
    expected = [(model, e, 5) for model in ("mlp", "cnn") for e in range(1, 6)]
    assert [(m, int(e), int(n)) for m, e, n, _ in epochs] == expected
    for model in ("mlp", "cnn"):
        losses = [float(loss) for m, _, _, loss in epochs if m == model]
        assert losses[-1] < losses[0] / 2, (model, losses)  # ten classes start near log(10) = 2.3
    accuracies = dict(ACCURACY.findall(out))
    assert set(accuracies) == {"mlp", "cnn"}, out
    # Five epochs reach about 93-98% (seeds 0-2); the default run >= 95%.
    assert all(float(a) >= 90.0 for a in accuracies.values()), accuracies
    assert re.findall(r"^(mlp|cnn) wall time: \d+\.\d+ s$", out, re.MULTILINE) == ["mlp", "cnn"]


def test_model_flag_selects_one_model(demo, capsys):
    assert demo.main(["--model", "cnn", "--epochs", "1", "--min-accuracy", "0"]) == 0
    out = capsys.readouterr().out
    assert [m for m, *_ in EPOCH.findall(out)] == ["cnn"] and "mlp" not in out
    with pytest.raises(SystemExit):
        demo.parse_args(["--model", "resnet"])


def test_models_are_the_pytorch_layers(demo):
    mlp, cnn = demo.build_model("mlp"), demo.build_model("cnn")
    assert [type(m).__name__ for m in cnn] == [
        "Unflatten", "Conv2d", "ReLU", "MaxPool2d", "Conv2d", "ReLU", "MaxPool2d", "Flatten", "Linear",
    ]  # fmt: skip
    assert sum(p.numel() for p in mlp.parameters()) == 64 * 128 + 128 + 128 * 10 + 10
    assert tuple(cnn(demo.kiln.zeros(3, 64)).shape) == (3, 10)


def test_gan_fast_learns_the_ring():
    out = run_script("gan.py", "--fast")
    before = float(re.search(r"^before training: mean distance to nearest mode (\d+\.\d+)$", out, re.M).group(1))
    after = float(re.search(r"^mean distance to nearest mode: (\d+\.\d+)$", out, re.M).group(1))
    steps = re.findall(r"^step +(\d+)/(\d+) +loss_d (\d+\.\d+) +loss_g (\d+\.\d+)$", out, re.M)
    assert [int(s) for s, *_ in steps] == [200, 400, 600]
    # The untrained generator's points sit near the origin, ~1.9 from every mode; training pulls them onto the ring.
    assert after < before / 2.5, out
    covered = int(re.search(r"^modes covered: (\d)/8$", out, re.M).group(1))
    assert covered >= 6, out
    near = float(re.search(r"^samples within 0.25 of a mode: (\d+\.\d+)%$", out, re.M).group(1))
    assert near >= 10.0, out


def test_custom_function_checks_and_trains():
    out = run_script("custom_function.py", "--fast")
    assert "gradcheck StableSoftplus (float64, |x| up to 60): True" in out
    assert "softplus(100) in float32: naive inf, stable 100.0" in out
    assert "RoundSTE(x, 4) = [0.0, 0.25, 1.0], gradient passed through: [1.0, 2.0, 3.0]" in out
    losses = [float(x) for x in re.findall(r"^step +\d+/600 +loss (\d+\.\d+)$", out, re.M)]
    assert len(losses) == 6 and losses[-1] < 0.6 * losses[0], losses  # starts near log(2) = 0.69
    accuracy = float(re.search(r"^train accuracy: (\d+\.\d+)%$", out, re.M).group(1))
    assert accuracy >= 75.0, out


def test_same_seed_same_run(demo, capsys):
    outputs = []
    for _ in range(2):
        assert demo.main(["--epochs", "2", "--min-accuracy", "0"]) == 0
        outputs.append([line for line in capsys.readouterr().out.splitlines() if "wall time" not in line])
    assert outputs[0] == outputs[1]
    assert demo.main(["--epochs", "2", "--min-accuracy", "0", "--seed", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] != outputs[0][:2]  # another seed: another split and init


def test_exits_nonzero_below_min_accuracy(demo, capsys):
    assert demo.main(["--epochs", "1", "--min-accuracy", "1.01"]) == 1
    err = capsys.readouterr().err
    assert "mlp test accuracy" in err and "cnn test accuracy" in err and "is below --min-accuracy 101.00%" in err


def test_fast_mode_defaults(demo):
    fast, full = demo.parse_args(["--fast"]), demo.parse_args([])
    assert (fast.epochs, fast.min_accuracy) == (demo.FAST_EPOCHS, demo.FAST_MIN_ACCURACY)
    assert (full.epochs, full.min_accuracy) == (demo.EPOCHS, demo.MIN_ACCURACY) == (20, 0.95)
