"""A tensor and a numpy array in one operator (``t + np.ones(3)``), against PyTorch (through numpy,
which is how PyTorch computes them: ``kiln/frontend/ops/numpy_operands.py``) and hand-computed values."""

from __future__ import annotations

import operator
import warnings

import numpy as np
import pytest

import kiln

ARRAYS = {
    "f64": np.array([1.5, -2.0, 3.0]), "f32": np.array([1.5, -2.0, 3.0], np.float32), "i64": np.array([1, -2, 3]),
    "i32": np.array([1, 2, 3], np.int32), "bool": np.array([True, False, True]), "f64[]": np.array(2.5),
    "i64[]": np.array(2), "f64[2,1]": np.array([[0.5], [2.0]]), "f16": np.ones(3, np.float16),
    "u8": np.array([1, 2, 3], np.uint8), "i8": np.array([1, -2, 3], np.int8),
}  # fmt: skip
TENSORS = {
    "f32": ([1.0, 2.0, -3.0], "float32"), "i64": ([4, -5, 6], "int64"), "bool": ([True, False, True], "bool"),
    "f32[]": (2.0, "float32"), "f16": ([1.0, 2.0, -3.0], "float16"), "f64": ([1.0, 2.0, -3.0], "float64"),
}  # fmt: skip
OPERATORS = ["add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "eq", "lt", "le", "gt", "ge", "matmul",
             "and_", "or_", "xor", "lshift", "rshift", "iadd", "imul", "itruediv", "iand", "ilshift"]  # fmt: skip


def _outcome(lib, op: str, tensor_key: str, array_key: str, reflected: bool):
    data, dtype = TENSORS[tensor_key]
    t = lib.tensor(data, dtype=getattr(lib, dtype))
    a = ARRAYS[array_key].copy()
    x, y = (a, t) if reflected else (t, a)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy's own, under PyTorch (division by zero, __array_wrap__)
            out = getattr(operator, op)(x, y)
    except TypeError:
        return "TypeError"
    except (ValueError, RuntimeError, ZeroDivisionError) as error:
        return type(error).__name__
    assert isinstance(out, lib.Tensor)
    return str(out.dtype).split(".")[-1], tuple(out.shape), np.asarray(out.tolist(), dtype=float), out is t


def _differs_on_purpose(op: str, tensor_key: str, array_key: str, outcome) -> bool:
    """kiln's documented difference: integer division by zero raises (numpy gives 0)."""
    return op in ("floordiv", "mod") and outcome == "ZeroDivisionError"


@pytest.mark.parametrize("op", OPERATORS)
def test_matches_torch(torch, op):
    for tensor_key in TENSORS:
        for array_key in ARRAYS:
            for reflected in (False, True):
                want = _outcome(torch, op, tensor_key, array_key, reflected)
                got = _outcome(kiln, op, tensor_key, array_key, reflected)
                if _differs_on_purpose(op, tensor_key, array_key, got):
                    continue
                where = f"{op} {tensor_key} tensor, {array_key} array{' (reflected)' if reflected else ''}"
                if isinstance(want, str) or isinstance(got, str):
                    # (torch's ValueError for a matmul of the wrong shapes is numpy's; kiln's is its own)
                    assert got == want or {got, want} == {"ValueError", "RuntimeError"}, f"{where}: {got} vs {want}"
                    continue
                assert got[:2] == want[:2] and got[3] == want[3], f"{where}: {got} vs {want}"
                np.testing.assert_allclose(got[2], want[2], rtol=1e-3, atol=1e-6, equal_nan=True, err_msg=where)


def test_hand_computed():
    t = kiln.tensor([1.0, 2.0, 4.0])
    out = t + np.array([1.0, 2.0, 3.0])
    assert out.dtype is kiln.float64 and out.tolist() == [2.0, 4.0, 7.0]  # the array's float64 wins
    assert (t * np.array([2, 2, 2], np.int32)).dtype is kiln.float64  # numpy's float32 x int32
    assert (t + np.array([1.0], np.float32)).dtype is kiln.float32
    assert (t + np.array(1.0)).dtype is kiln.float64  # a 0-d array is not a weak scalar (NEP 50)
    assert (t + np.float64(1.0)).dtype is kiln.float32  # a numpy scalar is
    both = kiln.tensor([True, True]) + np.array([True, False])
    assert both.dtype is kiln.uint8 and both.tolist() == [1, 1]  # numpy's bool add, as uint8
    assert (np.array([2.0, 8.0]) / kiln.tensor([4.0, 2.0])).tolist() == [0.5, 4.0]
    assert (t == np.array([1.0, 0.0, 4.0])).tolist() == [True, False, True]
    assert (np.array([1.0, 0.0, 4.0]) == t).tolist() == [True, False, True]
    assert (t != np.array([1.0, 0.0, 4.0])).tolist() == [False, True, False]  # elementwise (PyTorch: True)
    assert (t @ np.array([1.0, 1.0, 1.0])).dtype is kiln.float64
    for refused in (lambda: np.ones(3) + t, lambda: np.ones(3) - t, lambda: t < np.ones(3), lambda: np.ones(3) @ t):
        with pytest.raises(TypeError):
            refused()
    with pytest.raises(TypeError):
        kiln.tensor([True]) - np.array([True])  # numpy's boolean subtract error


def test_augmented_assignment_is_a_new_tensor():
    """PyTorch's ``t += array`` is ``t = t + array``: a new tensor (of numpy's dtype), ``t`` unchanged."""
    t = kiln.tensor([1.0, 2.0])
    before = t
    t += np.array([1.0, 1.0])
    assert t is not before and t.dtype is kiln.float64 and before.tolist() == [1.0, 2.0] and t.tolist() == [2.0, 3.0]
    u = kiln.tensor([1.0, 2.0])
    u += kiln.tensor([1.0, 1.0])  # tensors: in place as before
    assert u.tolist() == [2.0, 3.0]


def test_gradient_flows_through_the_array_operand():
    """(PyTorch refuses a tensor that requires grad here; kiln differentiates through the cast.)"""
    a = np.array([0.5, -2.0, 3.0])
    x = kiln.tensor([1.0, 2.0, 3.0], dtype=kiln.float64, requires_grad=True)
    kiln.autograd.gradcheck(lambda v: (v * a + a / v) ** np.array([2.0, 1.0, 3.0]), (x,), atol=1e-6, rtol=1e-4)
    y = kiln.tensor([1.0, 2.0], requires_grad=True)
    (y * np.array([3.0, 4.0])).sum().backward()
    assert y.grad.dtype is kiln.float32 and y.grad.tolist() == [3.0, 4.0]


TABLE = np.array([1.0, 2.0, 3.0])


def _with_arrays(x):
    return (x + TABLE) * 2 + (x == TABLE) + (x @ TABLE) + (TABLE / x)


def test_compiled_calls_read_the_array_each_call():
    global TABLE
    compiled = kiln.compile(_with_arrays)
    x = kiln.tensor([1.0, 5.0, 3.0])
    for i in range(4):
        TABLE[0] = float(i)  # refilled in place: the compiled call reads the array's memory
        if i == 2:
            TABLE = np.array([4.0, 4.0, 4.0])  # rebound: a new trace
        eager, got = _with_arrays(x), compiled(x)
        assert got.dtype is eager.dtype is kiln.float64
        np.testing.assert_allclose(got.numpy(), eager.numpy(), rtol=1e-12, atol=1e-12)
