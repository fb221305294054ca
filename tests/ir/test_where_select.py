"""The where primitive's numpy kernel: a branch-free select on the bits, equal to numpy.where bit
for bit (nan payloads, -0.0, every dtype and broadcast), and faster on a condition without pattern."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kiln.ir.primitives import PRIMITIVES

WHERE = PRIMITIVES["where"].eager
SHAPE = (37, 29)  # over the select's threshold, and no multiple of a vector width


def _values(dtype, shape, rng):
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    values = rng.standard_normal(shape).astype(dtype)
    if np.dtype(dtype).kind == "c":
        values = values + 1j * rng.standard_normal(shape).astype(dtype)
    flat = values.reshape(-1)
    flat[:4] = [np.nan, -0.0, np.inf, -np.inf]
    return values


def _same_bits(found: np.ndarray, expected: np.ndarray) -> None:
    assert found.dtype == expected.dtype and found.shape == expected.shape
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}[expected.dtype.itemsize]
    np.testing.assert_array_equal(np.ascontiguousarray(found).view(width), np.ascontiguousarray(expected).view(width))


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64, np.uint8, np.bool_,
              np.complex64, np.complex128],
)  # fmt: skip
def test_where_equals_numpy_bit_for_bit(dtype):
    rng = np.random.default_rng(0)
    cond = rng.random(SHAPE) > 0.5
    a, b = _values(dtype, SHAPE, rng), _values(dtype, SHAPE, rng)
    _same_bits(WHERE(np, cond, a, b), np.where(cond, a, b))


def test_where_keeps_a_nan_payload_and_the_sign_of_zero():
    rng = np.random.default_rng(1)
    payload = np.array([0x7FC01234], dtype=np.uint32).view(np.float32)[0]
    a = np.full(SHAPE, payload, dtype=np.float32)
    b = np.full(SHAPE, -0.0, dtype=np.float32)
    cond = rng.random(SHAPE) > 0.5
    found = WHERE(np, cond, a, b)
    _same_bits(found, np.where(cond, a, b))
    assert (found.view(np.uint32)[cond] == 0x7FC01234).all()
    assert np.signbit(found[~cond]).all()


@pytest.mark.parametrize(
    "shapes",
    [((37, 29), (), (37, 29)), ((37, 29), (37, 29), ()), ((37, 1), (1, 29), (37, 29)), ((29,), (37, 29), (37, 1)),
     ((), (37, 29), (37, 29)), ((2, 37, 29), (37, 29), (1, 1, 29))],
)  # fmt: skip
def test_where_broadcasts_as_numpy(shapes):
    rng = np.random.default_rng(2)
    cond = rng.random(shapes[0]) > 0.5
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes[1:])
    _same_bits(WHERE(np, cond, a, b), np.where(cond, a, b))


def test_where_on_strided_views_and_fresh_memory():
    rng = np.random.default_rng(3)
    base = rng.standard_normal((64, 80)).astype(np.float64)
    cond = (rng.random((80, 64)) > 0.5).T  # a transposed condition
    a, b = base[:, ::-1], base[::-1, :]
    found = WHERE(np, cond, a, b)
    _same_bits(found, np.where(cond, a, b))
    assert not np.shares_memory(found, base)
    assert found.flags.writeable


def test_where_small_and_zero_dim():
    cond = np.array([True, False, True])
    a, b = np.arange(3, dtype=np.float32), np.array(-1.0, dtype=np.float32)
    _same_bits(WHERE(np, cond, a, b), np.where(cond, a, b))
    zero_d = WHERE(np, np.array(True), np.array(2.0), np.array(3.0))
    assert np.ndim(zero_d) == 0 and float(zero_d) == 2.0


def test_where_without_branches_is_faster_than_numpys_on_a_random_condition():
    """The reason for the select: numpy.where mispredicts on a ReLU's condition. (Loose: 1.5x of
    the ~7x measured, medians of interleaved calls over conditions the predictor cannot learn.)"""
    rng = np.random.default_rng(4)
    values = [rng.standard_normal((64, 128)).astype(np.float32) for _ in range(16)]
    conds = [v <= 0 for v in values]
    zero = np.array(0.0, dtype=np.float32)
    ours, numpys = [], []
    for i in range(400):
        cond, x = conds[i % 16], values[(i * 7) % 16]
        start = time.perf_counter()
        WHERE(np, cond, zero, x)
        middle = time.perf_counter()
        np.where(cond, zero, x)
        ours.append(middle - start)
        numpys.append(time.perf_counter() - middle)
    assert np.median(ours) * 1.5 < np.median(numpys)
