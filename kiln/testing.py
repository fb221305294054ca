"""``kiln.testing.assert_close``: closeness of tensors (and numbers, and containers of them) for
tests, with PyTorch's default tolerances per dtype and an error that says where and by how much."""

from __future__ import annotations

import numpy as np

from .frontend.tensor import Tensor
from .ir import dtypes as dt

__all__ = ["assert_close", "make_tensor"]

# (rtol, atol) by dtype name, as torch.testing.assert_close defaults them
_TOLERANCES = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5), "float64": (1e-7, 1e-7)}


def _array(x):
    if isinstance(x, Tensor):
        return x.detach().cpu().numpy(), x.dtype
    array = np.asarray(x)
    return array, dt.from_numpy_dtype(array.dtype) if array.dtype.kind in "biuf" else None


def assert_close(actual, expected, *, rtol=None, atol=None, equal_nan: bool = False, check_dtype: bool = True,
                 check_device: bool = True, msg: str | None = None, **_ignored) -> None:  # fmt: skip
    """Raise ``AssertionError`` unless ``|actual - expected| <= atol + rtol * |expected|`` everywhere
    (and shapes and, by default, dtypes agree). Sequences and mappings are compared item by item."""
    if isinstance(actual, dict) and isinstance(expected, dict):
        if actual.keys() != expected.keys():
            raise AssertionError(f"The keys of the mappings do not match: {sorted(actual)} != {sorted(expected)}")
        for key in actual:
            assert_close(actual[key], expected[key], rtol=rtol, atol=atol, equal_nan=equal_nan, check_dtype=check_dtype)
        return
    if isinstance(actual, list | tuple) and isinstance(expected, list | tuple):
        if len(actual) != len(expected):
            raise AssertionError(f"The length of the sequences mismatch: {len(actual)} != {len(expected)}")
        for a, e in zip(actual, expected, strict=True):
            assert_close(a, e, rtol=rtol, atol=atol, equal_nan=equal_nan, check_dtype=check_dtype)
        return
    a, a_dtype = _array(actual)
    e, e_dtype = _array(expected)
    if a.shape != e.shape:
        raise AssertionError(msg or f"The values for attribute 'shape' do not match: {a.shape} != {e.shape}.")
    if check_dtype and isinstance(actual, Tensor) and isinstance(expected, Tensor) and a_dtype is not e_dtype:
        raise AssertionError(msg or f"The values for attribute 'dtype' do not match: {a_dtype} != {e_dtype}.")
    if (rtol is None) != (atol is None):
        raise ValueError("Both 'rtol' and 'atol' must be either specified or omitted, but got no rtol." if rtol is None
                         else "Both 'rtol' and 'atol' must be either specified or omitted, but got no atol.")  # fmt: skip
    if rtol is None:
        name = a_dtype.name if a_dtype is not None else "float64"
        rtol, atol = _TOLERANCES.get(name, (0.0, 0.0))
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    close = np.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=equal_nan)
    if close.all():
        return
    bad = ~close
    diff = np.abs(a64 - e64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = diff / np.abs(e64)
    worst = np.unravel_index(np.nanargmax(np.where(bad, diff, -np.inf)), a.shape) if a.ndim else ()
    worst_rel = np.unravel_index(np.nanargmax(np.where(bad, rel, -np.inf)), a.shape) if a.ndim else ()
    kind = "Tensor-likes" if isinstance(actual, Tensor) or a.ndim else "Scalars"
    raise AssertionError(msg or (
        f"{kind} are not close!\n\nMismatched elements: {int(bad.sum())} / {a.size} "
        f"({100 * bad.sum() / max(a.size, 1):.1f}%)\n"
        f"Greatest absolute difference: {diff[worst]} at index {tuple(map(int, worst))} (up to {atol} allowed)\n"
        f"Greatest relative difference: {rel[worst_rel]} at index {tuple(map(int, worst_rel))} (up to {rtol} allowed)"
    ))  # fmt: skip


def make_tensor(*shape, dtype, device=None, low=None, high=None, requires_grad: bool = False, **_ignored):
    """A random tensor of ``shape`` in [low, high) (default [-9, 9)), as ``torch.testing.make_tensor``."""
    from .frontend.ops import creation  # noqa: PLC0415

    if len(shape) == 1 and isinstance(shape[0], list | tuple):
        shape = tuple(shape[0])
    low = -9 if low is None else low
    high = 9 if high is None else high
    rng = np.random.default_rng()
    values: np.ndarray
    if dtype.category == dt.FLOATING:
        values = rng.uniform(low, high, shape)
    elif dtype.category == dt.BOOL:
        values = rng.integers(0, 2, shape).astype(bool)
    else:
        values = rng.integers(int(low), int(high), shape)
    return creation.tensor(values, dtype=dtype, device=device, requires_grad=requires_grad)
