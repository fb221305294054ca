"""bfloat16: the dtype, promotion, conversion, printing, eager kernels (float32 inside, rounded once),
autograd, compiled vs eager, checkpoints, and the error without ml_dtypes."""

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

import kiln  # noqa: E402
from kiln.ir.primitives import PRIMITIVES  # noqa: E402
from kiln.ir.primitives.widen import _COMPUTING  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
bf16 = kiln.bfloat16
BF = np.dtype(ml_dtypes.bfloat16)
#: one bfloat16 ulp relative, for results computed differently from torch's (other float32 libm, other order)
BF_TOL = {"rtol": 2**-7, "atol": 1e-6}


def _rounded(array) -> np.ndarray:
    return np.asarray(array, np.float32).astype(BF).astype(np.float32)


def test_the_dtype():
    assert kiln.bfloat16 is bf16 is kiln.ir.dtypes.as_dtype("bfloat16") is kiln.ir.dtypes.as_dtype(BF)
    assert repr(bf16) == "kiln.bfloat16" and bf16.itemsize == 2 and bf16.is_floating_point and bf16.is_signed
    x = kiln.tensor([1.0, 2.0], dtype=bf16)
    assert x.dtype is bf16 and x.element_size() == 2 and x.is_floating_point()
    assert x.numpy().dtype == BF and kiln.from_numpy(np.ones(2, BF)).dtype is bf16


def test_promotion_is_torchs(torch):
    names = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
    for a in names:
        for b in names:
            expected = str(torch.promote_types(getattr(torch, a), getattr(torch, b))).removeprefix("torch.")
            assert kiln.promote_types(getattr(kiln, a), getattr(kiln, b)).name == expected, (a, b)
    x = kiln.ones(2, dtype=bf16)
    assert (x + 1.5).dtype is bf16 and (x + kiln.arange(2)).dtype is bf16 and (x * 2).dtype is bf16
    assert (x + kiln.ones(2, dtype=kiln.float16)).dtype is kiln.float32
    assert (x + kiln.tensor(1.0)).dtype is bf16  # a 0-d float32 does not widen a bfloat16 tensor


def test_conversions_round_as_torch(torch):
    values = np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, 3.14159, -1e-40, 3.4e38, 3.39e38, np.inf, -np.inf,
                       np.nan, 65504.0, 1e-3, -7.5, 300.7], dtype=np.float32)  # fmt: skip
    ours = kiln.from_numpy(values).bfloat16()
    theirs = torch.from_numpy(values).bfloat16()
    np.testing.assert_array_equal(ours.float().numpy(), theirs.float().numpy())
    assert ours.to(kiln.float64).dtype is kiln.float64 and kiln.from_numpy(values).to(bf16).dtype is bf16
    finite = values[np.isfinite(values) & (np.abs(values) < 1e9)]
    np.testing.assert_array_equal(kiln.from_numpy(finite).bfloat16().long().numpy(),
                                  torch.from_numpy(finite).bfloat16().long().numpy())  # fmt: skip
    assert kiln.arange(5).bfloat16().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert kiln.tensor(257).bfloat16().item() == 256.0  # 8 bits of mantissa, to nearest even


def test_printing_matches_torch(torch):
    for values in ([1e-3, 123456.0, -2.5, float("nan"), float("inf")], [[1.5, 2.0]], 3.0):
        ours = repr(kiln.tensor(values).bfloat16())
        assert ours == repr(torch.tensor(values).bfloat16()).replace("torch.", "kiln.")


def _bf16_samples():
    rng = np.random.default_rng(0)
    for name, prim in sorted(PRIMITIVES.items()):
        if prim.kind in _COMPUTING and prim.samples is not None:
            for i, sample in enumerate(prim.samples(rng)):
                if any(isinstance(a, np.ndarray) and a.dtype.kind == "f" for a in sample.args):
                    yield pytest.param(prim, sample, id=f"{name}-{i}")


@pytest.mark.parametrize("prim, sample", list(_bf16_samples()))
def test_every_computing_kernel_is_float32_rounded_once(prim, sample):
    """PyTorch's CPU kernels compute bfloat16 in float32 and round the result: kiln's must give exactly that."""
    args = [a.astype(BF) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in sample.args]
    wide = [a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == BF else a for a in args]
    out, reference = prim.eager(np, *args, **sample.attrs), prim.eager(np, *wide, **sample.attrs)
    for got, want in zip(*(r if isinstance(r, tuple) else (r,) for r in (out, reference)), strict=True):
        got, want = np.asarray(got), np.asarray(want)
        if want.dtype == np.float32:
            assert got.dtype == BF, prim.name
            np.testing.assert_array_equal(got.astype(np.float32), _rounded(want))
        else:
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "op",
    [
        lambda m, x, y: x + y, lambda m, x, y: x * y - y, lambda m, x, y: x / (y.abs() + 1), lambda m, x, y: x.exp(),
        lambda m, x, y: x.tanh(), lambda m, x, y: x.sigmoid(), lambda m, x, y: x.relu(), lambda m, x, y: x @ y.T,
        lambda m, x, y: x.sum(), lambda m, x, y: x.sum(1), lambda m, x, y: x.mean(0), lambda m, x, y: x.amax(1),
        lambda m, x, y: x.abs().sqrt(), lambda m, x, y: m.nn.functional.gelu(x), lambda m, x, y: x.softmax(-1),
        lambda m, x, y: m.nn.functional.layer_norm(x, (x.shape[-1],)), lambda m, x, y: x.cumsum(1),
        lambda m, x, y: m.nn.functional.linear(x, y), lambda m, x, y: m.where(x > 0, x, y),
    ],
)  # fmt: skip
def test_ops_match_torch(torch, op):
    rng = np.random.default_rng(1)
    x32, y32 = rng.standard_normal((2, 6, 40)).astype(np.float32)
    ours = op(kiln, kiln.from_numpy(x32).bfloat16(), kiln.from_numpy(y32).bfloat16())
    theirs = op(torch, torch.from_numpy(x32).bfloat16(), torch.from_numpy(y32).bfloat16())
    assert ours.dtype is bf16 and theirs.dtype == torch.bfloat16
    np.testing.assert_allclose(ours.float().numpy(), theirs.float().numpy(), **BF_TOL)


def test_an_explicit_dtype_wins_over_float32_compute():
    x = kiln.randn(2, 5).bfloat16()
    assert x.softmax(-1, kiln.float32).dtype is kiln.float32 and x.softmax(-1, dtype=kiln.float32).dtype is kiln.float32
    assert x.mean(dtype=kiln.float64).dtype is kiln.float64 and x.softmax(-1).dtype is bf16


def test_sums_accumulate_in_float32(torch):
    x = kiln.full((4096,), 0.01, dtype=bf16)
    expected = torch.full((4096,), 0.01, dtype=torch.bfloat16).sum()
    assert x.sum().item() == expected.item()  # rounding after each addition would stall at 2.0 or so
    assert abs(x.sum().item() - 40.96) < 0.2
    a = kiln.full((1, 4096), 0.01, dtype=bf16)
    assert (a @ a.T).item() == (torch.full((1, 4096), 0.01, dtype=torch.bfloat16) @ torch.full((4096, 1), 0.01,
                                dtype=torch.bfloat16)).item()  # fmt: skip


def test_gradients_in_bfloat16_match_torch(torch):
    rng = np.random.default_rng(2)
    x32, w32 = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((3, 8)).astype(np.float32)
    results = []
    for m, x, w in (
        (kiln, kiln.from_numpy(x32), kiln.from_numpy(w32)),
        (torch, torch.from_numpy(x32), torch.from_numpy(w32)),
    ):
        x, w = x.bfloat16().requires_grad_(), w.bfloat16().requires_grad_()
        loss = (m.nn.functional.linear(x, w).tanh() ** 2).sum()
        loss.backward()
        assert x.grad.dtype == x.dtype and w.grad.dtype == w.dtype
        results.append([loss.detach().float().numpy(), x.grad.float().numpy(), w.grad.float().numpy()])
    for ours, theirs in zip(*results, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=2**-6, atol=2**-7)


def test_a_module_in_bfloat16_matches_torch(torch):
    model = kiln.nn.Sequential(kiln.nn.Linear(8, 4), kiln.nn.BatchNorm1d(4))
    theirs = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    theirs.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in model.state_dict().items()})
    assert model.bfloat16() is model and theirs.bfloat16() is theirs
    dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    assert (
        dtypes["0.weight"] is bf16
        and dtypes["1.running_mean"] is bf16
        and dtypes["1.num_batches_tracked"] is kiln.int64
    )
    x = np.random.default_rng(3).standard_normal((6, 8)).astype(np.float32)
    out = model(kiln.from_numpy(x).bfloat16())
    np.testing.assert_allclose(out.float().detach().numpy(), theirs(torch.from_numpy(x).bfloat16()).float().detach().numpy(),
                               rtol=2**-6, atol=2**-6)  # fmt: skip


def test_compiled_graphs_with_bfloat16_decline_to_eager_kernels_and_agree(caplog):
    def step(x, w):
        h = (x @ w).relu()
        return h.sum(1) * 2 + h.mean(), (x.float() * 3).exp(), h.sigmoid().bfloat16()

    compiled = kiln.compile(step)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = kiln.from_numpy(rng.standard_normal((4, 3)).astype(np.float32)).bfloat16()
        w = kiln.from_numpy(rng.standard_normal((3, 5)).astype(np.float32)).bfloat16()
        got, want = compiled(x, w), step(x, w)
        for a, b in zip(got, want, strict=True):
            assert a.dtype is b.dtype
            if a.dtype is bf16:
                np.testing.assert_array_equal(a.float().numpy(), b.float().numpy())
            else:
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    report = str(kiln.explain(step, x, w))
    assert "bf16[4,3]" in report and "bfloat16 has no LLVM kernels" in report and "eager kernels:" in report


def test_checkpoints_keep_bfloat16(torch, tmp_path):
    from safetensors.torch import load_file, save_file

    values = kiln.randn(3, 4).bfloat16()
    path = tmp_path / "bf.safetensors"
    kiln.save({"w": values}, path)
    back = kiln.load(path)["w"]
    assert back.dtype is bf16 and np.array_equal(back.float().numpy(), values.float().numpy())
    loaded = load_file(str(path))["w"]
    assert loaded.dtype == torch.bfloat16 and np.array_equal(loaded.float().numpy(), values.float().numpy())
    save_file({"t": torch.tensor([1.5, -3.0], dtype=torch.bfloat16)}, str(path))
    assert kiln.load(path)["t"].dtype is bf16
    buffer = io.BytesIO()
    torch.save({"t": torch.tensor([1.5, -3.0], dtype=torch.bfloat16)}, buffer)
    buffer.seek(0)
    assert kiln.load(buffer)["t"].tolist() == [1.5, -3.0]


def test_import_kiln_neither_needs_nor_imports_ml_dtypes():
    script = (
        "import sys\n"
        "sys.modules['ml_dtypes'] = None\n"  # as if not installed
        "import kiln\n"
        "x = kiln.ones(2) + 1\n"
        "try:\n"
        "    kiln.bfloat16\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "kiln.bfloat16 stores its values through the ml_dtypes package, which is not installed" in done.stdout
    fresh = subprocess.run([sys.executable, "-c", "import sys, kiln; print('ml_dtypes' in sys.modules)"],
                           capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert fresh.stdout.strip() == "False", fresh.stderr
