"""Getting values in and out: numpy views, DLPack with numpy/PyTorch/cupy, item() and tolist()."""

from __future__ import annotations

import numpy as np
import pytest

import kiln


# ----------------------------------------------------------------------------- numpy
def test_numpy_shares_memory_both_ways():
    x = kiln.zeros(2, 3)
    a = x.numpy()
    a[0, 1] = 5.0
    assert x.tolist()[0][1] == 5.0
    x.add_(1)
    assert a[1, 0] == 1.0
    t = x.t()  # a view's numpy() is a view with the same strides
    assert np.shares_memory(t.numpy(), a) and t.numpy().strides == a.T.strides


def test_numpy_refuses_tensors_that_require_grad():
    x = kiln.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"requires grad. Use tensor.detach\(\).numpy\(\)"):
        x.numpy()
    assert x.detach().numpy().tolist() == [1.0, 1.0] and x.numpy(force=True).tolist() == [1.0, 1.0]


def test_array_protocol():
    x = kiln.tensor([[1, 2], [3, 4]], dtype=kiln.int32)
    a = np.asarray(x)
    assert a.dtype == np.int32 and a.tolist() == [[1, 2], [3, 4]] and np.shares_memory(a, x.numpy())
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    assert (np.add(x, 1) == np.array([[2, 3], [4, 5]])).all()


def test_np_array_copies():
    x = kiln.zeros(3)
    a = np.array(x)
    a[0] = 1.0
    assert x.tolist() == [0.0, 0.0, 0.0]


# ----------------------------------------------------------------------------- DLPack
def test_from_dlpack_numpy_is_zero_copy():
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    t = kiln.from_dlpack(a)
    assert t.dtype is kiln.float64 and t.shape == (2, 3) and t.data_ptr() == a.ctypes.data
    t.mul_(2)
    assert a[1, 2] == 10.0
    back = np.from_dlpack(t)  # and numpy reads a kiln tensor the same way
    back[0, 0] = -1
    assert t.tolist()[0][0] == -1.0


def test_from_dlpack_kiln_tensor_and_copy_option():
    x = kiln.tensor([1, 2, 3], dtype=kiln.int16)
    y = kiln.from_dlpack(x)
    assert y.dtype is kiln.int16 and y.data_ptr() == x.data_ptr()
    z = kiln.from_dlpack(x, copy=True)
    z.add_(1)
    assert x.tolist() == [1, 2, 3] and z.tolist() == [2, 3, 4]
    assert kiln.from_dlpack(x, device="cpu").data_ptr() == x.data_ptr()


def test_from_dlpack_errors():
    with pytest.raises(TypeError, match="__dlpack__ or a DLPack capsule, got list"):
        kiln.from_dlpack([1, 2])
    with pytest.raises(TypeError, match="does not support numpy dtype complex64"):
        kiln.from_dlpack(np.zeros(2, dtype=np.complex64))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "uint8", "bool", "float16"])
def test_dlpack_with_torch_is_zero_copy_both_ways(torch, dtype):
    # kiln -> torch: torch.from_dlpack(kiln_tensor) sees kiln's memory, and writes come back.
    x = kiln.zeros(2, 3, dtype=getattr(kiln, dtype))
    t = torch.from_dlpack(x)
    assert t.dtype == getattr(torch, dtype) and t.data_ptr() == x.data_ptr()
    t[1, 2] = 1
    assert x.tolist()[1][2] == 1
    # torch -> kiln: kiln.from_dlpack(torch_tensor) sees torch's memory.
    source = torch.zeros(4, dtype=getattr(torch, dtype))
    k = kiln.from_dlpack(source)
    assert k.dtype.name == dtype and k.data_ptr() == source.data_ptr()
    k.fill_(1)
    assert source.tolist() == torch.ones(4, dtype=getattr(torch, dtype)).tolist()
    source[0] = 0
    assert k.tolist()[0] == 0


def test_dlpack_with_torch_views_and_capsules(torch):
    base = torch.arange(12.0).reshape(3, 4)
    view = kiln.from_dlpack(base.t())  # strides travel with the data
    assert view.shape == (4, 3) and view.stride() == (1, 4) and view.tolist() == base.t().tolist()
    capsule = torch.utils.dlpack.to_dlpack(base)  # the legacy capsule form
    k = kiln.from_dlpack(capsule)
    assert k.data_ptr() == base.data_ptr() and k.tolist() == base.tolist()
    with pytest.raises(BufferError, match="require gradient"):
        kiln.from_dlpack(torch.ones(2, requires_grad=True))


def test_dlpack_with_cupy():
    cp = pytest.importorskip("cupy")
    if not kiln.cuda.is_available():
        pytest.skip("no CUDA device")
    a = cp.zeros(3, dtype=cp.float32)
    k = kiln.from_dlpack(a)
    assert k.device == kiln.device("cuda:0") and k.data_ptr() == a.data.ptr
    k.fill_(2)
    assert a.get().tolist() == [2.0, 2.0, 2.0]
    b = cp.from_dlpack(k)
    b[0] = 5
    assert k.cpu().tolist()[0] == 5.0


# ----------------------------------------------------------------------------- Python values
@pytest.mark.parametrize(
    "dtype, value, expected_type",
    [("float32", 1.5, float), ("float64", -2.25, float), ("float16", 0.5, float), ("int64", 7, int),
     ("int8", -3, int), ("uint8", 200, int), ("bool", True, bool)],
)  # fmt: skip
def test_item_gives_python_numbers(torch, dtype, value, expected_type):
    x = kiln.tensor(value, dtype=getattr(kiln, dtype))
    item = x.item()
    assert type(item) is expected_type and item == torch.tensor(value, dtype=getattr(torch, dtype)).item()
    assert kiln.tensor([[value]], dtype=getattr(kiln, dtype)).item() == item  # any single element


def test_item_of_many_elements_is_an_error():
    with pytest.raises(RuntimeError, match="a Tensor with 2 elements cannot be converted to Scalar"):
        kiln.ones(2).item()
    with pytest.raises(RuntimeError, match="0 elements"):
        kiln.ones(0).item()


def test_tolist(torch):
    x = kiln.arange(6).reshape(2, 3)
    assert x.tolist() == torch.arange(6).reshape(2, 3).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert kiln.tensor(2.5).tolist() == 2.5  # a 0-d tensor gives a number
    assert kiln.tensor([True, False]).tolist() == [True, False]
    assert kiln.zeros(2, 0).tolist() == [[], []]
    assert x.t().tolist() == [[0, 3], [1, 4], [2, 5]]
    values = kiln.tensor([0.1, 1e-8]).tolist()
    assert all(type(v) is float for v in values) and values == torch.tensor([0.1, 1e-8]).tolist()


def test_python_number_conversions():
    assert float(kiln.tensor([2.5])) == 2.5 and int(kiln.tensor(3.9)) == 3 and bool(kiln.tensor([1]))
    assert [10, 20, 30][kiln.tensor(1)] == 20  # __index__
