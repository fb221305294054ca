"""``& | ^ ~ << >>`` and the ``bitwise_*`` functions, methods and in-place forms against PyTorch on
every integer dtype and bool (promotion with Python numbers, negative values, shift counts below zero
and past the width, the errors), and compiled against eager over several calls, with no kernel
declined to the interpreter (``kiln/frontend/ops/bitwise.py``, ``kiln/ir/primitives/bitwise.py``)."""

from __future__ import annotations

import operator

import numpy as np
import pytest

import kiln
from tests.frontend.jit.helpers import check_against_eager, compiled_calls, state_of

INTS = ("uint8", "int8", "int16", "int32", "int64")
rng = np.random.default_rng(11)


def _values(dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    edges = np.array([0, 1, -1, 5, -5, 100, -100, info.min, info.max], np.int64).astype(dtype)
    return np.concatenate([edges, rng.integers(info.min, info.max, size=7, endpoint=True).astype(dtype)])


def _counts(dtype: str) -> np.ndarray:
    width = 8 * np.dtype(dtype).itemsize
    return np.array([-1, 0, 1, 3, width - 1, width, width + 1, 100, -100], np.int64).astype(dtype)


def _outcome(lib, fn, *arrays):
    """What ``fn`` gives in ``lib`` on tensors of ``arrays`` (numbers passed as they are): the dtype
    and values, or the error's type."""
    args = [lib.from_numpy(a.copy()) if isinstance(a, np.ndarray) else a for a in arrays]
    try:
        out = fn(*args)
    except (TypeError, RuntimeError) as error:
        return type(error).__name__
    return str(out.dtype).split(".")[-1], tuple(out.shape), out.tolist()


def _same(torch, fn, *arrays):
    want, got = _outcome(torch, fn, *arrays), _outcome(kiln, fn, *arrays)
    assert got == want, f"{fn} on {[getattr(a, 'dtype', a) for a in arrays]}: {got} vs torch {want}"


def _small(dtype: str) -> np.ndarray:
    values = rng.integers(-50, 50, size=(2, 3))
    return values > 0 if dtype == "bool" else values.astype(dtype)


BINARY = [operator.and_, operator.or_, operator.xor, operator.lshift, operator.rshift]
FUNCTIONS = ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift"]


@pytest.mark.parametrize("dtype", INTS)
def test_operators_and_functions_on_every_pair_of_edge_values(torch, dtype):
    """Every value against every count, as a grid (broadcast), by operator, function and method."""
    a = _values(dtype)[:, None]
    b = np.concatenate([_values(dtype), _counts(dtype)])[None, :]
    for op in BINARY:
        _same(torch, op, a, b)
    for name in FUNCTIONS:
        _same(torch, lambda x, y, n=name: getattr(x.__class__, n)(x, y), a, b)  # the method
        _same(torch, lambda x, y, n=name: getattr(kiln if isinstance(x, kiln.Tensor) else torch, n)(x, y), a, b)
    _same(torch, operator.invert, a)
    _same(torch, lambda x: x.bitwise_not(), a)


@pytest.mark.parametrize("dtype", [*INTS, "bool"])
def test_promotion_with_numbers_tensors_and_zero_dim_tensors(torch, dtype):
    """A number wraps into the tensor's dtype (int8 & 1000, int16 << 2**40); bool with an int is int64;
    mixed tensor dtypes promote (uint8 & int8 is int16); a 0-d tensor does not widen a dimensioned one."""
    x = _small(dtype)
    numbers = [0, 1, -1, 3, 7, 1000, -300, 2**40, 2**63 - 1, True, False]
    for op in BINARY:
        for n in numbers:
            _same(torch, lambda t, o=op, n=n: o(t, n), x)
            _same(torch, lambda t, o=op, n=n: o(n, t), x)  # reflected
        for other in INTS + ("bool",):
            y = rng.integers(0, 9, size=(3,)).astype(other)
            _same(torch, op, x, y)
            _same(torch, op, x, np.array(3).astype(other))  # 0-d


def test_bool_operands(torch):
    """On two bools ``& | ^ ~`` are logical and stay bool; a shift of bools is refused, as in PyTorch."""
    a, b = rng.random((3, 4)) > 0.5, rng.random((4,)) > 0.5
    for op in BINARY:
        _same(torch, op, a, b)
    _same(torch, operator.invert, a)
    _same(torch, lambda x: kiln.bitwise_not(x) if isinstance(x, kiln.Tensor) else torch.bitwise_not(x), a)
    with pytest.raises(NotImplementedError, match="\"lshift_cpu\" not implemented for 'Bool'"):
        kiln.tensor([True]) << kiln.tensor([True])


def test_floats_are_refused_with_pytorchs_errors(torch):
    f = np.array([1.0, 2.0], np.float32)
    i = np.array([1, 2])
    for op in BINARY:
        for args in ((f, i), (i, f), (f, f)):
            _same(torch, op, *args)
        _same(torch, lambda t, o=op: o(t, 1.5), i)
    for name in ("bitwise_not",):
        _same(torch, lambda t, n=name: getattr(t, n)(), f.astype(np.float64))
    _same(torch, operator.invert, f)  # TypeError
    with pytest.raises(NotImplementedError, match="\"bitwise_and_cpu\" not implemented for 'Double'"):
        kiln.bitwise_and(kiln.tensor([1.0], dtype=kiln.float64), 1)


INPLACE = [operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift]
INPLACE_METHODS = ["bitwise_and_", "bitwise_or_", "bitwise_xor_", "bitwise_left_shift_", "bitwise_right_shift_"]


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int64", "bool"])
def test_inplace_forms_write_into_the_tensor(torch, dtype):
    """``&=`` and ``bitwise_and_`` (and the others) keep the tensor, its memory and its dtype (the other
    operand's promoted result is cast back, or refused when it is of a higher kind, as in PyTorch)."""
    x = _small(dtype)
    ops = [*INPLACE, *(lambda t, o, m=m: getattr(t, m)(o) for m in INPLACE_METHODS)]
    for op in ops:
        for other in (3, np.array([1, 2, 70], np.int64), np.array([True, False, True])):

            def inplace(t, op=op, other=other):
                lib = kiln if isinstance(t, kiln.Tensor) else torch
                target = t.clone()
                before = target.data_ptr()
                out = op(target, lib.from_numpy(other.copy()) if isinstance(other, np.ndarray) else other)
                assert out is target and target.data_ptr() == before
                return target

            _same(torch, inplace, x)
    x8 = kiln.tensor([3], dtype=kiln.int8)
    x8 <<= 1000  # the count wraps into int8 (-24): negative, every bit shifted out
    assert x8.tolist() == [0]
    mask = kiln.tensor([True, False])
    with pytest.raises(RuntimeError, match="can't be cast"):
        mask &= kiln.tensor([1, 1])
    t = kiln.tensor([1, 2])
    version = t._version_value
    t |= 4
    assert t.tolist() == [5, 6] and t._version_value == version + 1


def test_views_zero_dim_and_empty(torch):
    base = rng.integers(-100, 100, size=(4, 6)).astype(np.int32)
    for op in BINARY:
        _same(torch, lambda a, o=op: o(a.t(), a.t()[:, 1:2].remainder(9)), base)  # non-contiguous, broadcast
        _same(torch, lambda a, o=op: o(a[0, 0], 3), base)  # 0-d
        _same(torch, lambda a, o=op: o(a[:0], a[:0]), base)  # empty


def _compiled_without_fallback(compiled) -> None:
    assert compiled_calls(compiled) and compiled_calls(compiled)[0] >= 2, "the compiled program did not run"
    for spec in state_of(compiled).specializations:
        assert not spec.report.declined, spec.report.declined


@pytest.mark.parametrize("dtype", INTS)
def test_compiled_matches_eager(dtype):
    """A fused chain of every bit op, counts out of range included, on several calls."""

    def fn(a, b, s):
        x = (a & 0x3C) | (b ^ a)
        y = (x << s) + (a >> s) + ~b
        masks = ((a > 0) & (b < 3)) | ~(a == b)
        return y, masks, kiln.bitwise_left_shift(b, 3), kiln.bitwise_right_shift(-7, s), x.sum()

    width = 8 * np.dtype(dtype).itemsize
    info = np.iinfo(dtype)

    def make():
        a = kiln.from_numpy(rng.integers(info.min, info.max, size=(5, 7), endpoint=True).astype(dtype))
        b = kiln.from_numpy(rng.integers(info.min, info.max, size=(7,), endpoint=True).astype(dtype))
        s = kiln.from_numpy(rng.integers(max(-3, info.min), width + 3, size=(5, 7)).astype(dtype))
        return a, b, s

    compiled = check_against_eager(fn, make, calls=4, rtol=0, atol=0, fullgraph=True)
    _compiled_without_fallback(compiled)


def test_compiled_inplace_and_mixed_dtypes():
    """``&=`` and ``<<=`` on an argument (a mutation written back), int8 with int64, bool with int."""

    def fn(a, b, mask):
        a &= 0x7F
        a <<= 1
        c = a.to(kiln.int8) ^ b  # int8 ^ int64 -> int64
        return c, mask | 2, mask.bitwise_xor(mask)

    def make():
        return (
            kiln.from_numpy(rng.integers(-1000, 1000, size=(3, 4)).astype(np.int32)),
            kiln.from_numpy(rng.integers(-9, 9, size=(4,))),
            kiln.from_numpy(rng.random((3, 4)) > 0.5),
        )

    compiled = check_against_eager(fn, make, calls=4, rtol=0, atol=0, fullgraph=True)
    _compiled_without_fallback(compiled)
