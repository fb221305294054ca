"""The examples run and learn: each one in its fast mode, as a script, with checks on what it prints.

The digits data set ships with scikit-learn (no download); without scikit-learn these skip.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn")

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "train_digits.py"
# The examples import their sibling progress.py, as they do when run as scripts.
if str(ROOT / "examples") not in sys.path:
    sys.path.append(str(ROOT / "examples"))
ACCURACY = re.compile(r"^(mlp|cnn) test accuracy: (\d+\.\d+)%$", re.MULTILINE)
EPOCH = re.compile(r"^(mlp|cnn) epoch +(\d+)/(\d+) +loss (\d+\.\d+)$", re.MULTILINE)


def run_script(name: str, *args: str) -> str:
    """Run ``examples/<name>`` as a script on this checkout; its stdout (it must exit with 0)."""
    # The checkout, not an installed kiln: the test must exercise this tree's code.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    # One BLAS thread: the examples' matrices are small, and on a busy 2-core machine competing
    # BLAS threads made a 15 s run take 100 s (measured with char_lm --fast).
    env.setdefault("OMP_NUM_THREADS", "1")
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


CHAR_LM = re.compile(
    r"^(transformer|lstm): val loss (\d+\.\d+) nats/char \(unigram (\d+\.\d+), ratio (\d+\.\d+)\), "
    r"\d+\.\d+ ms/step, \d+\.\d+ s$",
    re.MULTILINE,
)


@pytest.fixture(scope="module")
def char_lm():
    """``examples/char_lm.py`` as a module."""
    spec = importlib.util.spec_from_file_location("char_lm", ROOT / "examples" / "char_lm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_char_lm_fast_beats_the_unigram_baseline():
    out = run_script("char_lm.py", "--fast")
    unigram = float(re.search(r"^unigram baseline: (\d+\.\d+) nats/char$", out, re.M).group(1))
    assert 2.5 < unigram < math.log(57), out  # English letters are far from uniform over the 57 characters
    results = {m: (float(v), float(u), float(r)) for m, v, u, r in CHAR_LM.findall(out)}
    assert set(results) == {"transformer", "lstm"}, out
    for model, (val, reported_unigram, ratio) in results.items():
        assert reported_unigram == unigram and abs(val / unigram - ratio) < 2e-3, out
        # Seeds 0-3 reach about 0.76 (transformer) and 0.62 (lstm) in 120/100 steps; the full run 0.58 and 0.49.
        assert ratio <= 0.85, (model, out)
        losses = [float(x) for x in re.findall(rf"^{model} step +\d+/\d+ +loss (\d+\.\d+)$", out, re.M)]
        assert len(losses) >= 2 and losses[-1] < losses[0] - 0.3, (model, losses)
        assert re.search(rf"^{model} sample: (['\"])The potter .{{20,}}\1$", out, re.M), out  # repr: one line


def test_char_lm_pieces(char_lm, capsys):
    # Unigram baseline by hand: training "aab" gives add-one smoothed p(a) = 3/5, p(b) = 2/5.
    kiln = char_lm.kiln
    loss = char_lm.unigram_loss(kiln.tensor([0, 0, 1]), kiln.tensor([0, 1]), 2)
    assert abs(loss - -(math.log(0.6) + math.log(0.4)) / 2) < 1e-9
    # The causal mask: changing the last character changes no earlier position's logits.
    kiln.manual_seed(0)
    model = char_lm.CharTransformer(vocab_size=10, block=8, d_model=16, nhead=2).eval()
    ids = kiln.randint(0, 10, (2, 8), generator=kiln.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, -1] = (ids[:, -1] + 1) % 10
    with kiln.no_grad():
        before, after = model(ids), model(changed)
    difference = (before - after).abs().amax(dim=(0, 2))  # per position
    assert difference[:-1].max().item() < 1e-6 and difference[-1].item() > 1e-3, difference.tolist()
    # A bound the run cannot meet gives exit status 1 and says why.
    assert char_lm.main(["--model", "lstm", "--steps", "2", "--sample-length", "5", "--max-ratio", "0.1"]) == 1
    captured = capsys.readouterr()
    assert "lstm val loss" in captured.err and "is above --max-ratio 0.1 x unigram" in captured.err
    assert "transformer" not in captured.out
    fast, full = char_lm.parse_args(["--fast"]), char_lm.parse_args([])
    assert (fast.max_ratio, full.max_ratio) == (0.85, 0.7)
