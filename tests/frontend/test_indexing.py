"""Indexing against PyTorch: x[key], x[key] = v, gather/scatter, index_put, masks, one_hot.

Checks values and dtypes, that basic indexing returns views (shared memory and version
counter), gradients (finite differences in float64, and PyTorch for autograd through
``__setitem__``), and errors.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck
from tests.conftest import assert_close, to_torch

RNG = np.random.default_rng(1)
EXACT = {"rtol": 0.0, "atol": 0.0}
GRAD_TOL = {"rtol": 1e-12, "atol": 1e-12}


def data(*shape):
    return RNG.normal(size=shape)


def leaf(*shape):
    return kiln.tensor(data(*shape), dtype=kiln.float64, requires_grad=True)


def convert(key, module):
    """A key written with numpy arrays, as kiln or torch tensors (other parts unchanged)."""
    if isinstance(key, tuple):
        return tuple(convert(k, module) for k in key)
    if isinstance(key, np.ndarray):
        return kiln.from_numpy(key.copy()) if module is kiln else module.from_numpy(key.copy())
    return key


# ----------------------------------------------------------------------------- __getitem__
BASIC_KEYS = {
    "int": 1,
    "negative_int": -1,
    "ints": (1, -2),
    "slice": slice(1, None),
    "step": (slice(None), slice(None, None, 2)),
    "clamped": (slice(-10, 10), slice(5, 9)),
    "empty_slice": slice(2, 1),
    "ellipsis": (Ellipsis, 1),
    "ellipsis_middle": (0, Ellipsis, slice(1, 3)),
    "none": (None, 0, None),
    "all": Ellipsis,
    "empty_tuple": (),
    "full": (0, 1, 2),
}
ADVANCED_KEYS = {
    "int_tensor": np.array([1, 0, 1]),
    "list": [1, 0],
    "empty_list": [],
    "negative": np.array([-1, -2]),
    "2d_index": np.array([[0, 1], [1, 1]]),
    "adjacent": (slice(None), np.array([0, 2]), np.array([1, 3])),
    "separated": (np.array([0, 1]), slice(None), np.array([1, 3])),
    "int_then_advanced": (0, slice(None), np.array([1, 2])),
    "broadcast": (np.array([[0], [1]]), slice(1, 3), np.array([3, 2, 1])),
    "with_none": (None, np.array([0, 1]), None, np.array([1, 2])),
    "mask_tensor": np.array([True, False]),
    "mask_2d": np.array([[True, False, True], [False, True, True]]),
    "mask_after_slice": (slice(None), np.array([True, False, True])),
    "mask_list": [True, False],
    "mask_and_int_index": (np.array([True, False]), slice(None), np.array([0, 3])),
    "true": True,
    "false": False,
    "true_with_index": (slice(None), True, np.array([0, 1])),
    "ellipsis_index": (Ellipsis, np.array([3, 0])),
    "step_and_index": (slice(None, None, 2), np.array([1, 2]), slice(1, None, 2)),
}


@pytest.mark.parametrize("key", list(BASIC_KEYS.values()) + list(ADVANCED_KEYS.values()),
                         ids=list(BASIC_KEYS) + list(ADVANCED_KEYS))  # fmt: skip
def test_getitem_matches_pytorch(key, torch):
    array = data(2, 3, 4)
    expected = to_torch(torch, array)[convert(key, torch)]
    got = kiln.from_numpy(array.copy())[convert(key, kiln)]
    assert_close(got, expected, **EXACT)


def test_advanced_index_placement_hand_computed():
    x = kiln.arange(24).reshape(2, 3, 4)
    # ints apply first (a view), so [1, 2] is the only advanced index: its dim stays last
    assert x[0, :, [1, 2]].tolist() == [[1, 2], [5, 6], [9, 10]]
    # separated advanced indices: the broadcast dim goes first
    assert x[[0, 1], :, [1, 2]].tolist() == [[1, 5, 9], [14, 18, 22]]
    # adjacent advanced indices: the broadcast dim takes their place
    assert x[:, [0, 2], [3, 0]].tolist() == [[3, 8], [15, 20]]
    assert x[x > 20].tolist() == [21, 22, 23]
    assert x[True].shape == (1, 2, 3, 4) and x[False].shape == (0, 2, 3, 4)


def test_getitem_on_a_non_contiguous_tensor(torch):
    array = data(4, 3)
    k, t = kiln.from_numpy(array.copy()).T, to_torch(torch, array).T
    for key in [(slice(None), 1), (np.array([2, 0]), slice(1, None, 2)), np.array([[True, False, True, True]] * 3)]:
        assert_close(k[convert(key, kiln)], t[convert(key, torch)], **EXACT)


def test_getitem_keeps_integer_and_bool_dtypes():
    x = kiln.tensor([[1, 2], [3, 4]], dtype=kiln.int32)
    assert x[1].dtype is kiln.int32 and x[[1, 0]].dtype is kiln.int32
    b = kiln.tensor([True, False])
    assert b[1:].dtype is kiln.bool and b[b].tolist() == [True]


def test_a_0d_integer_tensor_indexes_like_an_int():
    x = kiln.arange(12.0).reshape(3, 4)
    y = x[kiln.tensor(1)]
    assert y.tolist() == [4.0, 5.0, 6.0, 7.0] and np.shares_memory(y.numpy(), x.numpy())


@pytest.mark.parametrize("key", list(BASIC_KEYS.values()), ids=list(BASIC_KEYS))
def test_basic_indexing_returns_a_view(key):
    x = kiln.arange(24.0).reshape(2, 3, 4)
    y = x[key]
    assert y is not x
    assert y._version is x._version
    if y.numel():
        assert np.shares_memory(y.numpy(), x.numpy())
        before = x.clone()
        y.add_(1000.0)
        assert x._version_value == 1
        assert (x.numpy() - before.numpy()).sum() == 1000.0 * y.numel()


def test_view_offsets_and_strides_match_pytorch(torch):
    x, t = kiln.zeros(4, 6), torch.zeros(4, 6)
    for key in [(slice(1, 3), slice(None, None, 2)), (2, slice(3, None)), (Ellipsis, 5)]:
        assert x[key].stride() == t[key].stride()
        assert x[key].data_ptr() - x.data_ptr() == t[key].data_ptr() - t.data_ptr()


def test_advanced_indexing_returns_a_copy():
    x = kiln.arange(6.0)
    y = x[[0, 1]]
    y.fill_(-1.0)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize(
    "key,error,match",
    [
        (3, IndexError, "index 3 is out of bounds for dimension 0 with size 2"),
        ((0, -4), IndexError, "index -4 is out of bounds for dimension 1 with size 3"),
        ((0, 0, 0, 0), IndexError, "too many indices for tensor of dimension 3"),
        (slice(None, None, -1), ValueError, "step must be greater than zero"),
        ((slice(None), slice(None, None, 0)), ValueError, "step must be greater than zero"),
        ((Ellipsis, Ellipsis), IndexError, "single ellipsis"),
        (1.5, IndexError, r"only integers, slices .* are valid indices \(got float\)"),
        (np.array([0, 2]), IndexError, "index 2 is out of bounds for dimension 0 with size 2"),
        ((slice(None), np.array([-4])), IndexError, "index -4 is out of bounds for dimension 1 with size 3"),
        (np.array([True, False, True]), IndexError, r"mask \[3\] at index 0 does not match .* \[2, 3, 4\] at index 0"),
        ((np.array([0, 1]), np.array([0, 1, 2])), IndexError, "could not be broadcast together"),
        (np.array([0.5]), IndexError, "must be long, int, byte or bool tensors"),
    ],
)
def test_getitem_errors(key, error, match):
    with pytest.raises(error, match=match):
        kiln.zeros(2, 3, 4)[convert(key, kiln)]


def test_float_tensor_index_is_rejected():
    with pytest.raises(IndexError, match="tensors used as indices must be long, int, byte or bool tensors"):
        kiln.zeros(3)[kiln.tensor([0.0])]


GETITEM_GRADS = {
    "int": 1,
    "slice_step": (slice(None), slice(0, 4, 3)),
    "none_ellipsis": (None, Ellipsis, 1),
    "mask": np.array([[True, False, True, True], [False, False, True, False], [True, True, True, True]]),
    "int_tensor_repeats": np.array([2, 0, 2, 2]),
    "adjacent": (slice(None), np.array([0, 3, 0]), np.array([1, 1, 0])),
    "separated": (np.array([0, 2]), slice(None), np.array([1, 0])),
    "int_and_index": (np.array([[1], [2]]), 1, slice(None)),
}


@pytest.mark.parametrize("key", list(GETITEM_GRADS.values()), ids=list(GETITEM_GRADS))
def test_getitem_gradcheck(key):
    x = leaf(3, 4, 2) if key is not GETITEM_GRADS["mask"] else leaf(3, 4)
    assert gradcheck(lambda x: x[convert(key, kiln)], (x,), atol=1e-7, rtol=1e-6)


def test_getitem_second_order():
    x = leaf(4, 3)
    assert kiln.autograd.gradgradcheck(lambda x: x[[0, 2, 2]][:, 1:] ** 3, (x,))


# ----------------------------------------------------------------------------- __setitem__
SET_KEYS = {
    "int": (1, 7.5),
    "slice_row": ((slice(1, None), 0), np.array([1.0, 2.0])),
    "ellipsis_number": (Ellipsis, -1.0),
    "step_broadcast": ((slice(None), slice(None, None, 2)), np.array([[3.0], [4.0], [5.0]])),
    "leading_ones": (0, np.array([[1.0, 2.0, 3.0, 4.0]])),
    "index": (np.array([2, 0]), np.array([9.0, 8.0, 7.0, 6.0])),
    "index_number": ((np.array([0, 2]), np.array([1, 3])), 0.5),
    "separated": ((np.array([0, 2]), slice(1, 3)), np.array([[1.0, 2.0], [3.0, 4.0]])),
    "mask": (np.array([[True, False, False, True]] * 3), 2.0),
    "mask_rows": (np.array([False, True, True]), np.array([1.0, 2.0, 3.0, 4.0])),
    "column_index": ((slice(None), np.array([3, 1])), np.array([1.0, 2.0])),
    "none": ((None, 1), 3.0),
}


@pytest.mark.parametrize("key,value", list(SET_KEYS.values()), ids=list(SET_KEYS))
def test_setitem_matches_pytorch(key, value, torch):
    array = data(3, 4)
    k, t = kiln.from_numpy(array.copy()), to_torch(torch, array)
    ptr = k.data_ptr()
    k[convert(key, kiln)] = convert(value, kiln)
    t[convert(key, torch)] = convert(value, torch)
    assert_close(k, t, **EXACT)
    assert k.data_ptr() == ptr, "setitem must write in place"
    assert k._version_value == 1


def test_setitem_casts_the_value_to_the_tensor_dtype(torch):
    k, t = kiln.zeros(3, dtype=kiln.int32), torch.zeros(3, dtype=torch.int32)
    for m, x in ((kiln, k), (torch, t)):
        x[0] = 2.7
        x[1:] = m.tensor([1.5, -2.5], dtype=m.float64)
    assert_close(k, t, **EXACT)


def test_setitem_through_a_view_reaches_the_base():
    x = kiln.zeros(3, 4)
    row = x[1]
    row[1:3] = 5.0
    x.T[0] = 1.0
    assert x.tolist() == [[1, 0, 0, 0], [1, 5, 5, 0], [1, 0, 0, 0]]
    assert row._version_value == 2


def test_setitem_shape_mismatch_errors():
    x = kiln.zeros(3, 4)
    with pytest.raises(RuntimeError, match=r"shape \(4,\) doesn't match the broadcast shape \(3,\)"):
        x[0] = kiln.ones(3)
    with pytest.raises(RuntimeError, match=r"value tensor of shape \[3\] cannot be broadcast to indexing result of "
                                           r"shape \[2, 4\]"):  # fmt: skip
        x[[0, 1]] = kiln.ones(3)
    with pytest.raises(RuntimeError, match=r"cannot be broadcast to indexing result of shape \[2, 2\]"):
        x[[0, 1], 1:3] = kiln.ones(3)


def test_setitem_on_a_leaf_that_requires_grad_raises():
    w = leaf(3)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad is being used in an in-place"):
        w[0] = 1.0
    with pytest.raises(RuntimeError, match="view of a leaf Variable"):
        w[1:][0] = 1.0
    with kiln.no_grad():
        w[0] = 1.0
    assert w[0].item() == 1.0


def _autograd_pair(torch, *shapes):
    arrays = [data(*s) for s in shapes]
    ks = [kiln.tensor(a, dtype=kiln.float64, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    return ks, ts


def test_setitem_with_autograd_matches_pytorch(torch):
    (kx, kw), (tx, tw) = _autograd_pair(torch, (3, 4), (2,))
    weights = data(3, 4)
    for m, x, w in ((kiln, kx, kw), (torch, tx, tw)):
        y = x.clone()
        y[1:, 0] = w * 2  # basic key: a write through a view
        y[0] = 5.0
        y[[0, 2], [3, 3]] = w.exp()  # advanced key: index_put, after two earlier writes to y
        y[:, [1, 2]] *= 3.0
        (y * m.from_numpy(weights)).sum().backward()
    assert_close(kx.grad, tx.grad, **GRAD_TOL)
    assert_close(kw.grad, tw.grad, **GRAD_TOL)


def test_setitem_gradcheck():
    def basic(x, w):
        y = x * 1.0
        y[1:, 0] = w * 2
        y[0, ::2] = w.sum()
        return y * y

    def advanced(x, w):
        y = x * 1.0
        y[[2, 0], [1, 3]] = w**2
        y[y.detach() > 0.5] = 0.0
        return y * x

    for fn in (basic, advanced):
        assert gradcheck(fn, (leaf(3, 4), leaf(2)), atol=1e-7, rtol=1e-6)


def test_inplace_on_a_view_of_a_non_leaf_reaches_the_base_gradient(torch):
    (kx,), (tx,) = _autograd_pair(torch, (3, 4))
    weights = data(3, 4)
    for m, x in ((kiln, kx), (torch, tx)):
        y = x * 1.0
        v = y[:, 1:3]
        v.mul_(y[:, :2] + 1.0)
        (y * m.from_numpy(weights)).sum().backward()
    assert_close(kx.grad, tx.grad, **GRAD_TOL)


# ----------------------------------------------------------------------------- gather / scatter
def _index(rng, shape, n):
    return rng.integers(0, n, size=shape)


def test_gather_matches_pytorch(torch):
    array = data(3, 4)
    for dim, index in [(0, _index(RNG, (2, 4), 3)), (1, _index(RNG, (3, 6), 4)), (-1, _index(RNG, (2, 2), 4))]:
        got = kiln.gather(kiln.from_numpy(array), dim, kiln.from_numpy(index))
        assert_close(got, torch.gather(to_torch(torch, array), dim, torch.from_numpy(index)), **EXACT)


def test_scatter_and_scatter_add_match_pytorch(torch):
    array, src = data(3, 4), data(3, 5)
    index = np.array([[0, 1, 2, 0], [2, 0, 1, 1]])
    k, t = kiln.from_numpy(array), to_torch(torch, array)
    ki, ti = kiln.from_numpy(index), torch.from_numpy(index)
    ks, ts = kiln.from_numpy(src), to_torch(torch, src)
    assert_close(kiln.scatter_add(k, 0, ki, ks), torch.scatter_add(t, 0, ti, ts), **EXACT)
    assert_close(k.scatter(0, ki, ks), t.scatter(0, ti, ts), **EXACT)
    assert_close(k.scatter(0, ki, 2.5), t.scatter(0, ti, 2.5), **EXACT)
    assert_close(kiln.scatter(k, 1, ki, value=-1.0), torch.scatter(t, 1, ti, value=-1.0), **EXACT)
    assert_close(k.scatter(1, ki, ks, reduce="add"), t.scatter_add(1, ti, ts), **EXACT)
    k2, t2 = k.clone(), t.clone()
    k2.scatter_add_(1, ki, ks)
    t2.scatter_add_(1, ti, ts)
    assert_close(k2, t2, **EXACT)
    k2.scatter_(0, ki, 0.0)
    t2.scatter_(0, ti, 0.0)
    assert_close(k2, t2, **EXACT)


def test_scatter_add_hand_computed():
    out = kiln.zeros(3).scatter_add(0, kiln.tensor([0, 2, 0, 0]), kiln.tensor([1.0, 2.0, 3.0, 4.0]))
    assert out.tolist() == [8.0, 0.0, 2.0]


def test_gather_scatter_gradcheck():
    x, src = leaf(3, 4), leaf(3, 5)
    index = kiln.tensor([[0, 1, 2, 0], [2, 0, 1, 1]])
    unique = kiln.tensor([[0, 1, 2, 0], [2, 0, 1, 1]]).T[:3].T.contiguous()  # rows distinct per column
    assert gradcheck(lambda x: kiln.gather(x, 0, index), (x,), atol=1e-7, rtol=1e-6)
    assert gradcheck(lambda x, s: kiln.scatter_add(x, 0, index, s), (x, src), atol=1e-7, rtol=1e-6)
    assert gradcheck(lambda x, s: kiln.scatter(x, 0, unique, s), (x, src), atol=1e-7, rtol=1e-6)
    assert gradcheck(lambda x: kiln.scatter(x, 1, index, 3.0) * x, (x,), atol=1e-7, rtol=1e-6)


def test_gather_scatter_errors():
    x = kiln.zeros(3, 4)
    with pytest.raises(RuntimeError, match="Expected dtype int64 for index, got int32"):
        x.gather(0, kiln.zeros(2, 2, dtype=kiln.int32))
    with pytest.raises(RuntimeError, match="index 3 is out of bounds for dimension 0 with size 3"):  # PyTorch's type
        x.gather(0, kiln.tensor([[3]]))
    with pytest.raises(RuntimeError, match="index -1 is out of bounds for dimension 1 with size 4"):
        x.scatter_add(1, kiln.tensor([[-1]]), kiln.ones(1, 1))  # no wrap-around, as in PyTorch
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        x.gather(0, kiln.tensor([0]))
    with pytest.raises(
        RuntimeError, match=r"size of index \[2, 5\] must not exceed the input's \[3, 4\] at dimension 1"
    ):
        x.gather(0, kiln.zeros(2, 5, dtype=kiln.int64))
    with pytest.raises(RuntimeError, match="Expected self.dtype to be equal to src.dtype"):
        x.scatter_add(0, kiln.tensor([[0]]), kiln.ones(1, 1, dtype=kiln.float64))
    with pytest.raises(RuntimeError, match=r"index shape \[2, 2\] must not exceed the src shape \[1, 1\]"):
        x.scatter(0, kiln.zeros(2, 2, dtype=kiln.int64), kiln.ones(1, 1))
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.gather(2, kiln.tensor([[0]]))


# ----------------------------------------------------------------------------- index_put, take, index_select...
def test_index_put_matches_pytorch(torch):
    array = data(4, 3)
    rows, cols = np.array([0, 2, 0]), np.array([1, 1, 1])
    values = data(3)
    k, t = kiln.from_numpy(array), to_torch(torch, array)
    kidx, tidx = (kiln.from_numpy(rows), kiln.from_numpy(cols)), (torch.from_numpy(rows), torch.from_numpy(cols))
    kv, tv = kiln.from_numpy(values), torch.from_numpy(values)
    assert_close(kiln.index_put(k, kidx, kv, accumulate=True), torch.index_put(t, tidx, tv, accumulate=True),
                 rtol=1e-15, atol=1e-15)  # fmt: skip
    assert_close(k.index_put(kidx[:1], kiln.tensor(2.0, dtype=kiln.float64)),
                 t.index_put(tidx[:1], torch.tensor(2.0, dtype=torch.float64)), **EXACT)  # fmt: skip
    mask = np.array([True, False, True, False])
    assert_close(k.index_put((kiln.from_numpy(mask),), kiln.ones(3, dtype=kiln.float64)),
                 t.index_put((torch.from_numpy(mask),), torch.ones(3, dtype=torch.float64)), **EXACT)  # fmt: skip
    expected = t.clone()
    expected[:, tidx[1][:2]] = tv[:1]  # torch.index_put takes no None; the same as a key with a whole dim
    assert_close(k.index_put((None, kidx[1][:2]), kv[:1]), expected, **EXACT)
    k.index_put_(kidx, kv, accumulate=True)
    t.index_put_(tidx, tv, accumulate=True)
    assert_close(k, t, rtol=1e-15, atol=1e-15)
    with pytest.raises(RuntimeError, match="dtypes match, got float64 for the destination and float32 for the source"):
        k.index_put(kidx, kiln.ones(3))


def test_index_put_gradcheck():
    idx = (kiln.tensor([0, 2, 0]), kiln.tensor([1, 1, 2]))
    unique = (kiln.tensor([0, 2, 3]), kiln.tensor([1, 1, 2]))
    assert gradcheck(lambda x, v: kiln.index_put(x, idx, v, accumulate=True), (leaf(4, 3), leaf(3)))
    assert gradcheck(lambda x, v: kiln.index_put(x, unique, v), (leaf(4, 3), leaf(1)))


def test_take_and_take_flat(torch):
    array = data(3, 4)
    positions = np.array([[0, 11], [-1, 5]])
    k, t = kiln.from_numpy(array), to_torch(torch, array)
    assert_close(kiln.take(k, kiln.from_numpy(positions)), torch.take(t, torch.from_numpy(positions)), **EXACT)
    assert_close(kiln.take_flat(k.T, kiln.tensor([1, 2])), t.T.reshape(-1)[[1, 2]], **EXACT)
    with pytest.raises(IndexError, match="tried to access index 12 on a tensor of 12 elements"):
        kiln.take(k, kiln.tensor([12]))
    assert gradcheck(lambda x: kiln.take(x, kiln.tensor([[0, 0], [5, 3]])), (leaf(2, 3),))


def test_index_select_and_index_add(torch):
    array, source = data(3, 4), data(3, 3)
    index = np.array([3, 0, 3])
    k, t = kiln.from_numpy(array), to_torch(torch, array)
    ki, ti = kiln.from_numpy(index), torch.from_numpy(index)
    for dim in (0, 1, -1):
        assert_close(k.index_select(dim, ki[:2] % 3), t.index_select(dim, ti[:2] % 3), **EXACT)
    assert_close(kiln.index_select(k, 1, ki.int()), torch.index_select(t, 1, ti.int()), **EXACT)
    ks, ts = kiln.from_numpy(source), to_torch(torch, source)
    assert_close(k.index_add(1, ki, ks, alpha=2.0), t.index_add(1, ti, ts, alpha=2.0), rtol=1e-15, atol=1e-15)
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        k.index_select(0, ki)
    with pytest.raises(IndexError, match="index -1 is out of bounds for dimension 1 with size 4"):
        k.index_select(1, kiln.tensor([-1]))
    assert gradcheck(lambda x: x.index_select(1, ki), (leaf(2, 4),))
    assert gradcheck(lambda x, s: x.index_add(1, ki, s), (leaf(3, 4), leaf(3, 3)))


def test_masked_fill_and_masked_select(torch):
    array = data(3, 4)
    mask = array > 0.3
    k, t = kiln.from_numpy(array), to_torch(torch, array)
    km, tm = kiln.from_numpy(mask), torch.from_numpy(mask)
    assert_close(k.masked_fill(km, -1.0), t.masked_fill(tm, -1.0), **EXACT)
    assert_close(k.masked_fill(km[0], kiln.tensor(2.0)), t.masked_fill(tm[0], torch.tensor(2.0)), **EXACT)
    ints = kiln.tensor([1, 2, 3])
    assert ints.masked_fill(kiln.tensor([True, False, True]), 2.7).tolist() == [2, 2, 2]
    assert_close(kiln.masked_select(k, km[:1]), torch.masked_select(t, tm[:1]), **EXACT)
    k2, t2 = k.clone(), t.clone()
    k2.masked_fill_(km, 0.0)
    t2.masked_fill_(tm, 0.0)
    assert_close(k2, t2, **EXACT)
    with pytest.raises(RuntimeError, match="only supports boolean masks, but got mask with dtype int64"):
        k.masked_fill(kiln.tensor([1, 0, 0, 1]), 0.0)
    with pytest.raises(RuntimeError, match="0-dimensional value tensor"):
        k.masked_fill(km, kiln.ones(1))
    value = kiln.tensor(3.0, dtype=kiln.float64, requires_grad=True)
    assert gradcheck(lambda x, v: kiln.masked_fill(x, km, v), (leaf(3, 4), value))


def test_one_hot(torch):
    labels = np.array([[0, 3], [1, 1]])
    got, expected = kiln.one_hot(kiln.from_numpy(labels)), torch.nn.functional.one_hot(torch.from_numpy(labels))
    assert_close(got, expected, **EXACT)
    assert got.dtype is kiln.int64
    assert kiln.one_hot(kiln.tensor([1]), 3).tolist() == [[0, 1, 0]]
    assert kiln.one_hot(kiln.tensor(2), 4).tolist() == [0, 0, 1, 0]
    with pytest.raises(RuntimeError, match="smaller than num_classes"):
        kiln.one_hot(kiln.tensor([3]), 3)
    with pytest.raises(RuntimeError, match="non-negative"):
        kiln.one_hot(kiln.tensor([-1]))
    with pytest.raises(RuntimeError, match="int64"):
        kiln.one_hot(kiln.tensor([1], dtype=kiln.int32))


def test_nonzero(torch):
    array = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]])
    k, t = kiln.from_numpy(array), to_torch(torch, array)
    assert_close(kiln.nonzero(k), torch.nonzero(t), **EXACT)
    for got, expected in zip(k.nonzero(as_tuple=True), t.nonzero(as_tuple=True), strict=True):
        assert_close(got, expected, **EXACT)
    assert kiln.nonzero(kiln.tensor(1.0)).shape == torch.nonzero(torch.tensor(1.0)).shape


def test_accumulating_whole_rows_of_a_big_table_equals_add_at():
    """index_put(accumulate=True) of whole rows (an embedding's gradient) takes a sorted, summed path
    above 4096 values: duplicates, negative indices and untouched rows as numpy's add.at gives them."""
    from kiln.ir.primitives.indexing import _index_put_eager

    rng = np.random.default_rng(7)
    table = rng.standard_normal((300, 32))
    index = rng.integers(-300, 300, 512)
    index[:40] = 5  # many duplicates of one row, and of its negative alias
    index[40:60] = -295
    values = rng.standard_normal((512, 32))
    expected = table.copy()
    np.add.at(expected, (index,), values)
    np.testing.assert_allclose(_index_put_eager(np, table, values, index, accumulate=True), expected,
                               rtol=1e-12, atol=1e-12)  # fmt: skip
    x = kiln.from_numpy(table.copy())
    out = x.index_put((kiln.from_numpy(index),), kiln.from_numpy(values), accumulate=True)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12, atol=1e-12)
