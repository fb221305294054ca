"""Shared test helpers: the PyTorch oracle and tolerance-stated comparisons.

Hypothesis runs a small profile in CI (CI=true) and a larger one locally.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

# A compiled function whose backend fails falls back to the interpreter with a warning; the tests
# must see such failures instead.
os.environ.setdefault("KILN_JIT_STRICT", "1")
# Tests assume a compiled function runs its program from the second call on: each traced call waits
# for its compile. The background mode (kiln.compile's default) has tests of its own that ask for it.
os.environ.setdefault("KILN_COMPILE_WAIT", "1")
# Eager ops run their numpy kernels unless a test turns compiled eager kernels on
# (tests/frontend/test_eager_kernels.py): a background compile per shape would make results
# depend on timing.
os.environ.setdefault("KILN_EAGER_KERNELS", "0")
# Compiled programs are cached in a directory of this test session's own.
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-test-cache-"))

try:
    from hypothesis import settings

    settings.register_profile("ci", max_examples=25, deadline=None)
    settings.register_profile("dev", max_examples=150, deadline=None)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")
except ImportError:  # pragma: no cover
    pass

import kiln

# Run as a child process by test_simulator.py only: importing it (the doctest collection would) switches
# numba to its CUDA simulator for the whole process, and on a GPU machine every CUDA test with it.
collect_ignore = ["codegen/cuda/sim_cases.py"]

# Tolerances per dtype, stated once: (rtol, atol).
TOL = {
    kiln.float16: (1e-3, 1e-3),
    kiln.float32: (1e-5, 1e-6),
    kiln.float64: (1e-10, 1e-12),
}


def tol(dtype) -> dict:
    rtol, atol = TOL.get(dtype, (0.0, 0.0))
    return {"rtol": rtol, "atol": atol}


@pytest.fixture(scope="session")
def torch():
    """PyTorch as the parity oracle; tests using it skip cleanly where it is not installed."""
    return pytest.importorskip("torch")


def pytest_collection_modifyitems(config, items):
    """Mark every test that takes the ``torch`` fixture, directly or through another fixture, with
    ``torch``: ``pytest -m torch`` runs exactly the parity tests (CI runs them once torch is installed)."""
    for item in items:
        if "torch" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.torch)
    # tests marked ``cuda`` need a GPU: skipped, saying why, where kiln.cuda.is_available() is False
    if any(item.get_closest_marker("cuda") for item in items) and not kiln.cuda.is_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU with cupy: kiln.cuda.is_available() is False")
        for item in items:
            if item.get_closest_marker("cuda"):
                item.add_marker(skip)


def to_torch(torch, x):
    """A kiln tensor (or numpy array) as a torch tensor with the same values and dtype."""
    array = x.detach().numpy() if isinstance(x, kiln.Tensor) else np.asarray(x)
    return torch.from_numpy(np.array(array, copy=True, order="C"))


def assert_close(actual, expected, *, rtol: float, atol: float, check_dtype: bool = True) -> None:
    """Compare a kiln tensor with a kiln tensor, numpy array, torch tensor or number.

    nan must match nan, inf must match inf of the same sign, and dtypes must agree by name.
    """
    a = actual.detach().numpy() if isinstance(actual, kiln.Tensor) else np.asarray(actual)
    if hasattr(expected, "detach") and not isinstance(expected, kiln.Tensor):  # torch
        e = expected.detach().cpu().numpy()
    elif isinstance(expected, kiln.Tensor):
        e = expected.detach().numpy()
    else:
        e = np.asarray(expected)
    if check_dtype and isinstance(actual, kiln.Tensor) and not np.isscalar(expected):
        assert str(a.dtype) == str(e.dtype), f"dtype {a.dtype} != expected {e.dtype}"
    assert a.shape == e.shape, f"shape {a.shape} != expected {e.shape}"
    np.testing.assert_allclose(a.astype(np.float64) if a.dtype != bool else a,
                               e.astype(np.float64) if e.dtype != bool else e,
                               rtol=rtol, atol=atol, equal_nan=True)  # fmt: skip


def torch_pair(torch, array):
    """The same values as a kiln tensor and a torch tensor, each over its own copy."""
    return kiln.from_numpy(np.array(array, copy=True)), torch.from_numpy(np.array(array, copy=True))


def assert_results_close(ours, theirs, *, rtol: float, atol: float) -> None:
    """A kiln result against torch's: tensors, or tuples and lists of them (named tuples too), each
    of torch's shape and dtype name."""
    if isinstance(theirs, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(theirs)
        for o, t in zip(ours, theirs, strict=True):
            assert_results_close(o, t, rtol=rtol, atol=atol)
        return
    assert tuple(ours.shape) == tuple(theirs.shape), (ours.shape, theirs.shape)
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch."), (ours.dtype, theirs.dtype)
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=rtol, atol=atol)


# What the skipped tests need, said once at the end: "1,874 skipped" alone does not tell a new
# contributor that they are PyTorch's parity tests (run by `pytest -m torch` once torch is installed).
_NEEDS = {
    "torch": "PyTorch, the parity oracle: pip install torch==2.13.0 (CPU build), then pytest -m torch",
    "onnx": "the onnx extra: pip install -e '.[onnx]'",
    "onnxruntime": "the onnx extra: pip install -e '.[onnx]'",
    "mpi4py": "the distributed extra: pip install -e '.[distributed]'",
    "cupy": "an NVIDIA GPU and the cuda12/cuda13 extra",
    "jax": "JAX (benchmark references only)",
}


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    if reason.startswith("could not import "):
        module = reason.split("'")[1] if "'" in reason else reason.split()[-1]
        return "needs " + _NEEDS.get(module.split(".")[0], f"the {module} package")
    return reason


def pytest_terminal_summary(terminalreporter):
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts: dict[str, int] = {}
    for report in skipped:
        reason = _skip_reason(report)
        counts[reason] = counts.get(reason, 0) + 1
    terminalreporter.write_sep("-", f"{len(skipped)} skipped tests, by what they need")
    for reason, n in sorted(counts.items(), key=lambda item: -item[1])[:12]:
        terminalreporter.write_line(f"{n:6d}  {reason}")
    if len(counts) > 12:
        terminalreporter.write_line(f"        ... and {len(counts) - 12} other reasons (pytest -rs lists each test)")


def pytest_configure(config):
    """The suite's tensors are small: its eager kernels compile however little numpy takes
    (``eager_queue.MIN_NUMPY_SECONDS``), as its tests expect; tests/frontend/test_eager_kernel_order.py
    tests that rule with the threshold set."""
    from kiln.frontend import eager_queue  # noqa: PLC0415 - kiln loads after the environment above

    eager_queue.MIN_NUMPY_SECONDS = 0.0


@pytest.fixture
def eager_on(monkeypatch):
    """Eager kernels on, compiling in the caller's thread (the suite runs with them off); off again
    and their cache emptied afterwards."""
    from kiln.frontend import eager_kernels  # noqa: PLC0415 - kiln loads once a test needs it

    monkeypatch.setattr(eager_kernels.CACHE, "synchronous", True)
    eager_kernels.CACHE.clear()
    eager_kernels.set_enabled(True)
    yield eager_kernels
    eager_kernels.set_enabled(False)
    eager_kernels.CACHE.clear()
