"""Creating tensors and converting them: inference rules, ranges, fills, to(), copies and views."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import kiln
from tests.conftest import assert_close, to_torch

DTYPE_NAMES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]


def torch_dtype(torch, dtype):
    return getattr(torch, dtype.name)


# ----------------------------------------------------------------------------- tensor() inference
@pytest.mark.parametrize(
    "data",
    [1, 2.5, True, [1, 2, 3], [1.0, 2], [[1, 2], [3, 4]], [True, False], [True, 2], [], [[]], [[1.5], [2.5]], -0.0],
)
def test_tensor_infers_dtypes_as_pytorch(torch, data):
    k, t = kiln.tensor(data), torch.tensor(data)
    assert k.dtype.name == str(t.dtype).removeprefix("torch.") and tuple(k.shape) == tuple(t.shape)
    assert_close(k, t, rtol=0, atol=0)


def test_tensor_keeps_numpy_dtypes_and_copies():
    a = np.arange(3.0)  # float64 stays float64, as torch.tensor(np_array) does
    t = kiln.tensor(a)
    assert t.dtype is kiln.float64
    a[0] = 100
    assert t.tolist() == [0.0, 1.0, 2.0]
    assert kiln.tensor(np.int32(7)).dtype is kiln.int32 and kiln.tensor(np.zeros(2, np.uint8)).dtype is kiln.uint8


def test_tensor_with_dtype_converts_without_rounding_to_float32_first():
    x = kiln.tensor([0.1, 12345.678], dtype=kiln.float64)
    assert x.tolist() == [0.1, 12345.678]
    assert kiln.tensor([1.7, -1.7], dtype=kiln.int64).tolist() == [1, -1]  # truncation, as in PyTorch
    assert kiln.tensor([1, 2], dtype=kiln.int8).dtype is kiln.int8
    assert kiln.tensor(3, dtype=float).dtype is kiln.float32 and kiln.tensor(3.0, dtype="float64").dtype is kiln.float64


def test_tensor_of_tensors_and_flags():
    parts = [kiln.tensor(1.0), kiln.tensor(2.0)]
    assert kiln.tensor(parts).tolist() == [1.0, 2.0]
    source = kiln.ones(2, requires_grad=True)
    copy = kiln.tensor(source.detach())
    assert not copy.requires_grad and copy.data_ptr() != source.data_ptr()
    x = kiln.tensor([1.0, 2.0], requires_grad=True)
    assert x.requires_grad and x.is_leaf
    assert kiln.tensor([1.0]).device == kiln.device("cpu")


def test_tensor_errors():
    with pytest.raises(ValueError, match="nested sequence of equal lengths"):
        kiln.tensor([[1, 2], [3]])
    with pytest.raises(TypeError, match="expected numbers"):
        kiln.tensor(["a"])
    with pytest.raises(RuntimeError, match="floating point dtype.*int64"):
        kiln.tensor([1, 2], requires_grad=True)
    with pytest.raises(TypeError, match="does not support numpy dtype complex128"):
        kiln.tensor(np.zeros(2, dtype=complex))


def test_as_tensor_and_from_numpy_share_memory():
    a = np.zeros(3, dtype=np.float32)
    t = kiln.from_numpy(a)
    t.add_(1)
    assert a.tolist() == [1.0, 1.0, 1.0]
    a[2] = 7
    assert t.tolist() == [1.0, 1.0, 7.0]
    assert kiln.as_tensor(a).data_ptr() == a.ctypes.data
    assert kiln.as_tensor(a, dtype=kiln.float64).data_ptr() != a.ctypes.data  # a conversion copies
    x = kiln.ones(2)
    assert kiln.as_tensor(x) is x and kiln.as_tensor(x, dtype=kiln.int64).dtype is kiln.int64
    assert kiln.as_tensor([1, 2]).tolist() == [1, 2]
    strided = np.arange(12.0).reshape(3, 4)[:, ::2]  # non-contiguous arrays keep their strides
    s = kiln.from_numpy(strided)
    assert s.stride() == (4, 2) and s.data_ptr() == strided.ctypes.data
    with pytest.raises(TypeError, match="expected an np.ndarray, got list"):
        kiln.from_numpy([1, 2])
    with pytest.raises(TypeError, match="does not support numpy dtype uint32"):
        kiln.from_numpy(np.zeros(2, dtype=np.uint32))


# ----------------------------------------------------------------------------- fills
@pytest.mark.parametrize("name", ["zeros", "ones", "empty"])
def test_filled_tensors(torch, name):
    fn = getattr(kiln, name)
    for size in [(2, 3), ((2, 3),), ([4],), ((),), (0, 5), (kiln.Size([1, 2]),)]:
        x = fn(*size)
        assert tuple(x.shape) == tuple(getattr(torch, name)(*size).shape) and x.dtype is kiln.float32
        if name != "empty":
            assert_close(x, getattr(torch, name)(*size), rtol=0, atol=0)
    assert fn(2, dtype=kiln.int8).dtype is kiln.int8
    assert fn(2, requires_grad=True).requires_grad
    with pytest.raises(RuntimeError, match=r"negative dimension: \[2, -1\]"):
        fn(2, -1)
    with pytest.raises(TypeError, match=f"{name}\\(\\): argument 'size' must be a tuple of ints.*float"):
        fn(2.5)


@pytest.mark.parametrize("value, dtype", [(True, kiln.bool), (3, kiln.int64), (2.5, kiln.float32)])
def test_full_infers_the_dtype_from_the_value(torch, value, dtype):
    x = kiln.full((2, 2), value)
    assert x.dtype is dtype
    assert_close(x, torch.full((2, 2), value), rtol=0, atol=0)
    assert kiln.full((3,), 1, dtype=kiln.float64).dtype is kiln.float64


@pytest.mark.parametrize("name", ["zeros_like", "ones_like", "empty_like"])
def test_like_forms_take_shape_dtype_and_device(name):
    base = kiln.tensor([[1, 2, 3]], dtype=kiln.int16)
    x = getattr(kiln, name)(base)
    assert x.shape == (1, 3) and x.dtype is kiln.int16 and x.device == base.device
    assert getattr(kiln, name)(base, dtype=kiln.float64).dtype is kiln.float64
    assert not getattr(kiln, name)(kiln.ones(2, requires_grad=True)).requires_grad
    assert kiln.full_like(base, 9).tolist() == [[9, 9, 9]]


def test_new_methods_follow_self():
    base = kiln.zeros(2, dtype=kiln.float64)
    assert base.new_zeros((3,)).dtype is kiln.float64 and base.new_ones(2, 2).tolist() == [[1.0, 1.0]] * 2
    assert base.new_full((2,), 4).tolist() == [4.0, 4.0] and base.new_empty(0).shape == (0,)
    assert base.new_tensor([1, 2]).dtype is kiln.float64 and base.new_zeros(1, dtype=kiln.int32).dtype is kiln.int32


# ----------------------------------------------------------------------------- ranges
ARANGE_CASES = [
    (5,), (0, 5), (2, 9, 3), (10, 0, -3), (0, 1, 0.1), (0, 1, 0.3), (1, 2.5, 0.5), (-1, 1, 0.25), (10, 0, -1.5),
    (0.1, 0.9, 0.1), (0.5, 3), (0, 0), (3, 3, 1.0),
]  # fmt: skip


@pytest.mark.parametrize("args", ARANGE_CASES)
def test_arange_matches_pytorch(torch, args):
    k, t = kiln.arange(*args), torch.arange(*args)
    assert k.dtype.name == str(t.dtype).removeprefix("torch.")
    assert_close(k, t, rtol=0, atol=0)
    # float64: PyTorch's vectorized kernel may round start + i * step differently by one unit in the last place.
    assert_close(kiln.arange(*args, dtype=kiln.float64), torch.arange(*args, dtype=torch.float64), rtol=3e-16, atol=0)


@pytest.mark.parametrize("args", [(0.5, 5.5, 1), (0.5, 5.2, 1.5), (-2.7, 3.9, 1.3), (0, 5.5, 2.5)])
def test_arange_with_an_integer_dtype_truncates_the_arguments(torch, args):
    assert_close(kiln.arange(*args, dtype=kiln.int64), torch.arange(*args, dtype=torch.int64), rtol=0, atol=0)


def test_arange_errors_and_tensor_arguments():
    assert kiln.arange(kiln.tensor(3)).tolist() == [0, 1, 2]
    assert kiln.arange(np.int64(2)).dtype is kiln.int64
    with pytest.raises(RuntimeError, match="step must be nonzero"):
        kiln.arange(0, 5, 0)
    with pytest.raises(RuntimeError, match="inconsistent with step sign"):
        kiln.arange(0, 5, -1)
    with pytest.raises(RuntimeError, match="unsupported range"):
        kiln.arange(0, float("inf"))
    with pytest.raises(TypeError, match="expected a number, got str"):
        kiln.arange("3")


@pytest.mark.parametrize("args", [(0, 1, 5), (0, 1, 1), (0, 1, 0), (-3, 7, 11), (0.1, 1.7, 7), (5, -2.5, 100)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_linspace_matches_pytorch(torch, args, dtype):
    k = kiln.linspace(*args, dtype=getattr(kiln, dtype))
    t = torch.linspace(*args, dtype=getattr(torch, dtype))
    assert_close(k, t, rtol=1e-6, atol=1e-6)
    if len(k):  # both endpoints are exact
        assert k.tolist()[0] == t.tolist()[0] and k.tolist()[-1] == t.tolist()[-1]


def test_linspace_defaults_and_errors(torch):
    assert kiln.linspace(0, 10, 3).dtype is kiln.float32
    assert kiln.linspace(-3, 7, 11, dtype=kiln.int64).tolist() == torch.linspace(-3, 7, 11, dtype=torch.int64).tolist()
    with pytest.raises(RuntimeError, match="non-negative, got -1"):
        kiln.linspace(0, 1, -1)


@pytest.mark.parametrize("n, m", [(3, None), (2, 4), (4, 2), (0, None), (0, 3)])
def test_eye_matches_pytorch(torch, n, m):
    expected = torch.eye(n) if m is None else torch.eye(n, m)
    assert_close(kiln.eye(n, m), expected, rtol=0, atol=0)
    assert kiln.eye(2, dtype=kiln.int64).dtype is kiln.int64
    with pytest.raises(RuntimeError, match="n must be greater or equal to 0, got -1"):
        kiln.eye(-1)


# ----------------------------------------------------------------------------- clone, to(), casts
def test_clone_copies_and_is_differentiable():
    x = kiln.tensor([[1.0, 2.0], [3.0, 4.0]]).t()  # non-contiguous
    y = x.clone()
    assert y.tolist() == x.tolist() and y.is_contiguous() and y.data_ptr() != x.data_ptr()
    a = kiln.rand(3, 2, dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradcheck(lambda t: (t.clone() * t).sum(), (a,))


@pytest.mark.parametrize("method", ["float", "double", "half", "long", "int", "short", "char", "byte", "bool"])
def test_cast_methods_match_pytorch(torch, method):
    values = [[-1.75, 0.0, 2.5], [3.99, -0.5, 100.0]]
    k, t = getattr(kiln.tensor(values), method)(), getattr(torch.tensor(values), method)()
    assert k.dtype.name == str(t.dtype).removeprefix("torch.")
    assert_close(k, t, rtol=0, atol=0)


def test_to_forms():
    x = kiln.tensor([1.5, -2.5])
    assert x.to(kiln.float32) is x and x.to("cpu") is x and x.cpu() is x
    assert x.to(kiln.int64).tolist() == [1, -2] and x.to(dtype=kiln.float64).dtype is kiln.float64
    assert x.to("cpu", kiln.float64).dtype is kiln.float64 and x.to(float).dtype is kiln.float32
    assert x.to(kiln.zeros(1, dtype=kiln.int32)).dtype is kiln.int32
    y = x.to(kiln.float32, copy=True)
    assert y is not x and y.data_ptr() != x.data_ptr()
    assert x.type_as(kiln.zeros(1, dtype=kiln.float16)).dtype is kiln.float16
    a = kiln.rand(3, dtype=kiln.float64, requires_grad=True)
    (a.to(kiln.float32) * 2).sum().backward()  # the gradient comes back in the input's dtype
    assert a.grad.dtype is kiln.float64 and a.grad.tolist() == [2.0, 2.0, 2.0]


def test_cuda_without_a_gpu_says_so():
    if kiln.cuda.is_available():
        x = kiln.ones(2).cuda()
        assert x.device == kiln.device("cuda:0") and x.cpu().tolist() == [1.0, 1.0]
        assert "device='cuda:0'" in repr(x)
    else:
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            kiln.ones(2).cuda()


# ----------------------------------------------------------------------------- in-place fills and copies
def test_copy_converts_broadcasts_and_passes_gradient():
    x = kiln.zeros(2, 3, dtype=kiln.int32)
    x.copy_(kiln.tensor([1.9, -2.9, 3.0]))
    assert x.tolist() == [[1, -2, 3], [1, -2, 3]]
    src = kiln.tensor([1.0, 2.0, 3.0], requires_grad=True)
    target = kiln.zeros(3)
    target.copy_(src * 2)
    target.sum().backward()
    assert src.grad.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(TypeError, match="argument 'src' must be a Tensor, not list"):
        x.copy_([1, 2, 3])
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        kiln.zeros(2, requires_grad=True).copy_(kiln.ones(2))


def test_fill_and_zero():
    x = kiln.ones(2, 2)
    version = x._version_value
    assert x.fill_(3.5) is x and x.tolist() == [[3.5, 3.5]] * 2 and x._version_value == version + 1
    x.fill_(kiln.tensor(2.0))
    assert x.tolist() == [[2.0, 2.0]] * 2
    x.zero_()
    assert x.tolist() == [[0.0, 0.0]] * 2
    base = kiln.zeros(3, 3)
    base[1].fill_(7)  # through a view: the base sees it
    assert base.tolist()[1] == [7.0, 7.0, 7.0]


# ----------------------------------------------------------------------------- dtypes and empty tensors
@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_every_dtype_round_trips(torch, name):
    dtype = getattr(kiln, name if name != "bool" else "bool")
    x = kiln.tensor([0, 1, 1], dtype=dtype)
    assert x.dtype is dtype and x.element_size() == np.dtype(dtype.np).itemsize
    assert_close(x, torch.tensor([0, 1, 1], dtype=getattr(torch, name)), rtol=0, atol=0)
    assert pickle.loads(pickle.dumps(x)).tolist() == x.tolist()


def test_small_integer_dtypes_wrap_as_pytorch(torch):
    x = kiln.tensor([100, -100], dtype=kiln.int8)
    assert_close(x + x, to_torch(torch, x) + to_torch(torch, x), rtol=0, atol=0)
    assert kiln.tensor([300.0]).to(kiln.uint8).tolist() == torch.tensor([300.0]).to(torch.uint8).tolist()


def test_python_int_out_of_range_for_a_small_dtype_wraps():
    assert (kiln.tensor([1], dtype=kiln.int8) + 300).tolist() == [45]


def test_empty_tensors():
    x = kiln.zeros(0, 3)
    assert x.numel() == 0 and x.shape == (0, 3) and x.sum(0).tolist() == [0.0, 0.0, 0.0]
    assert kiln.tensor([]).shape == (0,) and kiln.tensor([]).dtype is kiln.float32
    assert kiln.arange(0).shape == (0,) and kiln.empty(2, 0, 4).clone().shape == (2, 0, 4)
    assert kiln.ones(0).to(kiln.int64).dtype is kiln.int64 and kiln.zeros(0).tolist() == []


def test_pickle_keeps_values_dtype_and_requires_grad():
    x = kiln.tensor([[1.5, 2.0]], dtype=kiln.float64, requires_grad=True)
    y = pickle.loads(pickle.dumps(x))
    assert y.dtype is kiln.float64 and y.requires_grad and y.tolist() == x.tolist() and y.data_ptr() != x.data_ptr()
