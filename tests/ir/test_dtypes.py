"""Type promotion: hand-computed cases for the rules that matter, then all pairs against PyTorch."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import kiln
from kiln.ir import dtypes as dt


@pytest.mark.parametrize(
    ("operands", "expected"),
    [
        ((dt.int32, dt.float16), dt.float16),  # the category decides, not the size
        ((dt.int64, dt.float16), dt.float16),  # numpy says float64 here
        ((dt.uint8, dt.int8), dt.int16),
        ((dt.bool_, dt.uint8), dt.uint8),
        ((dt.float16, dt.float32), dt.float32),
    ],
)
def test_promote_types_hand_computed(operands, expected):
    assert dt.promote_types(*operands) is expected


def test_python_scalars_do_not_upcast_tensors():
    assert (kiln.ones(2, dtype=kiln.float16) + 2.5).dtype is kiln.float16
    assert (kiln.ones(2, dtype=kiln.int32) + 7).dtype is kiln.int32
    assert (kiln.ones(2, dtype=kiln.int32) + 2.5).dtype is kiln.float32  # category up: the default float
    assert (kiln.ones(2, dtype=kiln.uint8) * True).dtype is kiln.uint8


def test_zero_dim_tensors_rank_below_dimensioned_ones():
    a = kiln.ones(3, dtype=kiln.float32)
    assert (a + kiln.tensor(1.0, dtype=kiln.float64)).dtype is kiln.float32
    assert (kiln.ones(3, dtype=kiln.int32) + kiln.tensor(1.0, dtype=kiln.float64)).dtype is kiln.float64


def test_integer_division_gives_float():
    q = kiln.tensor([3, 4]) / kiln.tensor([2, 2])
    assert q.dtype is kiln.float32
    assert q.tolist() == [1.5, 2.0]


def test_default_dtype_can_change():
    try:
        kiln.set_default_dtype(kiln.float64)
        assert kiln.tensor([1.0]).dtype is kiln.float64
        assert (kiln.tensor([1]) / 2).dtype is kiln.float64
    finally:
        kiln.set_default_dtype(kiln.float32)
    with pytest.raises(TypeError, match="floating point"):
        kiln.set_default_dtype(kiln.int32)


def test_unknown_dtypes_are_named():
    with pytest.raises(TypeError, match="complex128"):
        dt.as_dtype(np.complex128)
    with pytest.raises(TypeError, match="kiln dtype"):
        dt.as_dtype("float33")


DTYPES = [d.name for d in dt.ALL_DTYPES]


def test_result_type_matches_pytorch_for_all_pairs(torch):
    def sample(name, zero_dim):
        shape = () if zero_dim else (2,)
        return kiln.zeros(*shape, dtype=dt.BY_NAME[name]), torch.zeros(shape, dtype=getattr(torch, name))

    for a, b in itertools.product(DTYPES, DTYPES):
        for za, zb in [(False, False), (True, False), (False, True), (True, True)]:
            (ka, ta), (kb, tb) = sample(a, za), sample(b, zb)
            expected = torch.result_type(ta, tb)
            assert dt.result_type(ka, kb).name == str(expected).removeprefix("torch."), (a, b, za, zb)
    for name in DTYPES:
        for scalar in (True, 3, 2.5):
            k, t = sample(name, False)
            assert dt.result_type(k, scalar).name == str(torch.result_type(t, scalar)).removeprefix("torch.")
