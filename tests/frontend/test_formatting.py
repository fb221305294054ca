"""repr(tensor) reads as PyTorch's, with ``kiln.`` where PyTorch writes ``torch.``."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend.formatting import printoptions, set_printoptions

rng = np.random.default_rng(0)
INF, NAN = float("inf"), float("nan")

CASES = {
    "vector": [1.0, 2.0, 3.0],
    "matrix_int": [[1, 2], [3, 4]],
    "scalar": 3.5,
    "zero": 0.0,
    "negative_zero": -0.0,
    "nan_only": [0.0, NAN],
    "non_finite": [1.5, INF, -INF, NAN],
    "int_valued_with_inf": [1.0, -INF, 3.0],
    "small": [1e-5, 1.0],
    "large": [1e8, 1.0],
    "huge": [1e9],
    "ratio": [0.1, 1000.0],
    "just_below_ratio": [1.0, 999.0],
    "big_integer_valued": [123456789.0],
    "fractions": [0.1, 0.25],
    "signs": [-1.0, 2.0],
    "bools": [True, False],
    "int_scalar": 7,
    "negative_int": [-3, 10, 200],
    "tiny": [1e-10],
    "extremes": [1e300, 1e-300],
    "normal_2d": rng.normal(size=(3, 4)),
    "normal_3d": rng.normal(size=(2, 3, 4)),
    "wrapping_lines": rng.normal(size=(40,)) * 1000,
    "summarized_vector": rng.normal(size=(2000,)),
    "summarized_ints": rng.integers(-5000, 5000, size=(50, 50)),
    "summarized_3d": rng.normal(size=(10, 10, 12)),
    "summarized_rows": rng.normal(size=(5, 300)) * 1e5,
    "just_over_threshold": rng.normal(size=(1001,)),
    "threshold": rng.normal(size=(1000,)),
    "nested_singletons": [[[1]]],
    "int_valued_floats": np.arange(30.0),
    "precise": [12345.678],
    "one_negative": [-0.5],
    "wide_ints": np.arange(100) * 12345,
    "4d": rng.normal(size=(2, 2, 2, 2)),
}


def pair(torch, data, dtype: str):
    array = np.asarray(data)
    with np.errstate(over="ignore"):
        array = array.astype(np.dtype(dtype)) if dtype != "auto" else array
    if array.dtype == np.float64 and dtype == "auto":
        with np.errstate(over="ignore"):  # 1e300 becomes inf in float32, and prints so
            array = array.astype(np.float32)
    return kiln.from_numpy(array.copy()), torch.from_numpy(array.copy())


def expected(torch_tensor) -> str:
    return repr(torch_tensor).replace("torch.", "kiln.")


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", ["auto", "float64", "float16"])
def test_repr_matches_pytorch(torch, name, dtype):
    data = np.asarray(CASES[name])
    if dtype != "auto" and data.dtype.kind in "bi":
        pytest.skip("integer and bool cases print once, in their own dtype")
    if dtype == "float16" and np.nanmax(np.abs(np.where(np.isinf(data), 0, data)), initial=0) > 6e4:
        pytest.skip("outside float16's range")
    k, t = pair(torch, data, dtype)
    assert repr(k) == expected(t)
    assert str(k) == repr(k)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "uint8", "int64", "bool"])
def test_integer_dtypes_print_their_name_unless_int64_or_bool(torch, dtype):
    k, t = pair(torch, [[0, 1, 1], [1, 0, 1]], dtype)
    assert repr(k) == expected(t)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0, 1), (3, 0)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bool", "int8"])
def test_empty_tensors_print_size_and_dtype(torch, shape, dtype):
    k = kiln.zeros(*shape, dtype=getattr(kiln, dtype))
    assert repr(k) == expected(torch.zeros(*shape, dtype=getattr(torch, dtype)))


def test_autograd_suffixes(torch):
    x, tx = kiln.tensor([1.0, 2.0], requires_grad=True), torch.tensor([1.0, 2.0], requires_grad=True)
    assert repr(x) == expected(tx) == "tensor([1., 2.], requires_grad=True)"
    y, ty = x * 2, tx * 2
    head = expected(ty).split("grad_fn=")[0]
    assert repr(y).split("grad_fn=")[0] == head and repr(y) == "tensor([2., 4.], grad_fn=<MulBackward>)"
    # Suffixes wrap to a new line past 80 columns, as in PyTorch.
    data = np.linspace(0, 1, 100)
    k = kiln.from_numpy(data.copy()).requires_grad_()
    assert repr(k) == expected(torch.from_numpy(data.copy()).requires_grad_())
    assert (
        repr(k * 1).split("grad_fn=")[0]
        == expected(torch.from_numpy(data.copy()).requires_grad_() * 1).split("grad_fn=")[0]
    )


def test_hand_written_forms():
    assert repr(kiln.tensor([1.0, 2.0, 3.0])) == "tensor([1., 2., 3.])"
    assert repr(kiln.tensor([[1, 2], [3, 4]])) == "tensor([[1, 2],\n        [3, 4]])"
    assert repr(kiln.tensor(3.5)) == "tensor(3.5000)"
    assert repr(kiln.tensor([1.5, 2.0], dtype=kiln.float64)) == "tensor([1.5000, 2.0000], dtype=kiln.float64)"
    assert repr(kiln.tensor([1e-5, 1.0])) == "tensor([1.0000e-05, 1.0000e+00])"
    assert repr(kiln.zeros(0, 3)) == "tensor([], size=(0, 3))"
    assert repr(kiln.tensor([], dtype=kiln.int64)) == "tensor([], dtype=kiln.int64)"
    assert repr(kiln.tensor([float("nan"), 1.0])) == "tensor([nan, 1.])"
    assert repr(kiln.arange(2000)) == "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])"


def test_print_options_match_pytorch(torch):
    data = np.array([1.0 / 3, 2.0 / 3, 100.0], dtype=np.float32)
    try:
        for options in [{"precision": 2}, {"sci_mode": True}, {"sci_mode": False}, {"threshold": 2, "edgeitems": 1},
                        {"linewidth": 20}, {"profile": "short"}, {"profile": "full"}]:  # fmt: skip
            torch.set_printoptions(**options)
            set_printoptions(**options)
            for values in (data, np.arange(50.0)):
                assert repr(kiln.from_numpy(values)) == expected(torch.from_numpy(values)), options
            torch.set_printoptions(profile="default")
            set_printoptions(profile="default")
        with printoptions(precision=1):
            assert repr(kiln.tensor([0.25])) == "tensor([0.2])"
        assert repr(kiln.tensor([0.25])) == "tensor([0.2500])"
    finally:
        torch.set_printoptions(profile="default")
        set_printoptions(profile="default")


def test_format_of_scalars(torch):
    assert f"{kiln.tensor(2.5):.2f}" == "2.50"
    assert f"{kiln.tensor([1.0])}" == "tensor([1.])"
    # A 0-d tensor in a format string is its number, with or without a spec (PyTorch's __format__):
    # ``"Accuracy: {} %".format(100 * correct / total)`` prints 8.59375, not tensor(8.5938)
    for value in (torch.tensor(8.59375), torch.tensor(3), torch.tensor(True)):
        assert f"{kiln.tensor(value.item())}" == f"{value}"
        assert format(kiln.tensor(value.item()), "") == format(value, "")


def test_printing_is_not_an_op():
    x = kiln.ones(2, requires_grad=True)
    version = x._version_value
    repr(x)
    assert x.grad_fn is None and x._version_value == version


@pytest.mark.skipif(not kiln.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_suffix():
    assert repr(kiln.ones(2, device="cuda")) == "tensor([1., 1.], device='cuda:0')"
