"""Shape and view ops against PyTorch: values, dtypes, views sharing memory, gradients, errors."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck
from tests.conftest import assert_close, to_torch

RNG = np.random.default_rng(0)
EXACT = {"rtol": 0.0, "atol": 0.0}


def data(*shape, dtype=np.float64):
    return RNG.normal(size=shape).astype(dtype)


def pair(torch, array):
    """The same values as a kiln tensor and a torch tensor."""
    return kiln.from_numpy(np.array(array)), to_torch(torch, array)


def leaf(*shape):
    return kiln.tensor(data(*shape), dtype=kiln.float64, requires_grad=True)


def shares_memory(view, base) -> bool:
    return np.shares_memory(view.numpy(), base.numpy())


# ----------------------------------------------------------------------------- parity, op by op
CASES = [
    ("flatten", (2, 3, 4), lambda m, x: m.flatten(x)),
    ("flatten_mid", (2, 3, 4), lambda m, x: m.flatten(x, 1, -1)),
    ("flatten_0d", (), lambda m, x: m.flatten(x)),
    ("unflatten", (2, 12), lambda m, x: m.unflatten(x, 1, (3, -1))),
    ("squeeze_all", (1, 3, 1, 2), lambda m, x: m.squeeze(x)),
    ("squeeze_dim", (1, 3, 1, 2), lambda m, x: x.squeeze(2)),
    ("squeeze_not_one", (1, 3, 1, 2), lambda m, x: x.squeeze(1)),
    ("squeeze_tuple", (1, 3, 1, 2), lambda m, x: x.squeeze((0, -2))),
    ("unsqueeze", (2, 3), lambda m, x: m.unsqueeze(x, -1)),
    ("unsqueeze_0d", (), lambda m, x: x.unsqueeze(0)),
    ("permute", (2, 3, 4), lambda m, x: x.permute(2, 0, 1)),
    ("permute_tuple", (2, 3, 4), lambda m, x: m.permute(x, (-1, 1, 0))),
    ("transpose", (2, 3, 4), lambda m, x: m.transpose(x, 0, -1)),
    ("swapaxes", (2, 3, 4), lambda m, x: x.swapaxes(1, 2)),
    ("swapdims", (2, 3, 4), lambda m, x: m.swapdims(x, 0, 1)),
    ("t", (2, 3), lambda m, x: x.t()),
    ("t_1d", (3,), lambda m, x: m.t(x)),
    ("T", (2, 3, 4), lambda m, x: x.T if m is kiln else x.permute(2, 1, 0)),
    ("mT", (2, 3, 4), lambda m, x: x.mT),
    ("movedim", (2, 3, 4), lambda m, x: m.movedim(x, 0, -1)),
    ("movedim_tuple", (2, 3, 4, 5), lambda m, x: m.movedim(x, (0, 1), (3, 0))),
    ("narrow", (4, 5), lambda m, x: m.narrow(x, 1, -3, 2)),
    ("select", (4, 5), lambda m, x: x.select(-1, -2)),
    ("expand_as", (3, 1), lambda m, x: x.expand_as(m.zeros(2, 3, 4, dtype=m.float64))),
    ("flip", (2, 3, 4), lambda m, x: m.flip(x, (0, 2))),
    ("flip_int", (2, 3), lambda m, x: x.flip(-1)),
    ("roll", (3, 4), lambda m, x: m.roll(x, 1, 0)),
    ("roll_multi", (3, 4), lambda m, x: m.roll(x, (-5, 2), (1, 0))),
    ("roll_flat", (3, 4), lambda m, x: m.roll(x, 5)),
    ("repeat", (2, 3), lambda m, x: x.repeat(2, 1, 3)),
    ("repeat_0d", (), lambda m, x: x.repeat(3)),
    ("tile", (2, 3), lambda m, x: m.tile(x, (2,))),
    ("tril", (4, 5), lambda m, x: m.tril(x)),
    ("tril_k", (2, 4, 3), lambda m, x: m.tril(x, -1)),
    ("triu_k", (4, 5), lambda m, x: x.triu(2)),
    ("triu_neg", (3, 3), lambda m, x: m.triu(x, -1)),
    ("diagonal", (4, 5), lambda m, x: m.diagonal(x)),
    ("diagonal_offset", (4, 5), lambda m, x: m.diagonal(x, 2)),
    ("diagonal_neg", (3, 4, 5), lambda m, x: m.diagonal(x, -1, 2, 0)),
    ("split_int", (7, 2), lambda m, x: m.split(x, 3)),
    ("split_list", (7, 2), lambda m, x: x.split([1, 0, 6])),
    ("chunk", (7, 2), lambda m, x: m.chunk(x, 3)),
    ("chunk_dim", (2, 5), lambda m, x: x.chunk(2, 1)),
    ("chunk_uneven", (5, 1), lambda m, x: x.chunk(4)),
    ("chunk_empty", (0, 2), lambda m, x: x.chunk(3)),
    ("split_empty", (0, 2), lambda m, x: x.split(2)),
    ("unbind", (3, 2), lambda m, x: m.unbind(x, 1)),
    ("empty_flip", (0, 3), lambda m, x: m.flip(x, (0, 1))),
    ("empty_permute", (0, 3), lambda m, x: x.permute(1, 0)),
]


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name,shape,fn", CASES, ids=[c[0] for c in CASES])
def test_matches_pytorch(name, shape, fn, torch):
    k, t = pair(torch, data(*shape))
    for got, expected in zip(_as_tuple(fn(kiln, k)), _as_tuple(fn(torch, t)), strict=True):
        assert_close(got, expected, **EXACT)


@pytest.mark.parametrize("name,shape,fn", CASES, ids=[c[0] for c in CASES])
def test_matches_pytorch_on_non_contiguous_input(name, shape, fn, torch):
    if len(shape) < 2 or min(shape[:2]) < 2:
        pytest.skip("needs two dims of size > 1 to make a non-contiguous input")
    array = np.ascontiguousarray(data(*shape).swapaxes(0, 1))
    k = kiln.from_numpy(array.copy()).transpose(0, 1)
    t = to_torch(torch, array).transpose(0, 1)
    assert not k.is_contiguous()
    for got, expected in zip(_as_tuple(fn(kiln, k)), _as_tuple(fn(torch, t)), strict=True):
        assert_close(got, expected, **EXACT)


# ----------------------------------------------------------------------------- views and copies
VIEWS = {
    "flatten": lambda x: x.flatten(1),
    "squeeze": lambda x: x.unsqueeze(0).squeeze(),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "permute": lambda x: x.permute(1, 2, 0),
    "transpose": lambda x: x.transpose(0, 2),
    "T": lambda x: x.T,
    "movedim": lambda x: x.movedim(0, 2),
    "narrow": lambda x: x.narrow(1, 1, 2),
    "select": lambda x: x.select(2, 3),
    "unbind": lambda x: x.unbind(1)[2],
    "split": lambda x: x.split(2, dim=2)[1],
    "chunk": lambda x: x.chunk(2, dim=1)[1],
    "diagonal": lambda x: x.diagonal(0, 1, 2),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_view_ops_share_memory_and_the_version_counter(name):
    base = kiln.arange(24, dtype=kiln.float32).reshape(2, 3, 4)
    view = VIEWS[name](base)
    assert shares_memory(view, base)
    assert view._version is base._version
    before = base.clone()
    with kiln.no_grad():
        view.add_(100)
    assert base._version_value == 1
    changed = (base.numpy() != before.numpy()).sum()
    assert changed > 0, "writing through the view did not reach the base"


def test_expand_as_is_a_view():
    base = kiln.arange(3.0).reshape(3, 1)
    out = base.expand_as(kiln.zeros(2, 3, 4))
    assert shares_memory(out, base) and out._version is base._version and out.stride() == (0, 1, 0)


def test_narrow_view_writes_the_expected_elements():
    base = kiln.zeros(3, 4)
    base.narrow(1, 1, 2).fill_(1.0)
    assert base.tolist() == [[0.0, 1.0, 1.0, 0.0]] * 3
    assert base.narrow(0, 1, 1).data_ptr() == base.data_ptr() + 4 * base.element_size()


@pytest.mark.parametrize(
    "fn",
    [lambda x: x.flip(0), lambda x: x.roll(1, 0), lambda x: x.repeat(1, 1), lambda x: x.tile((1,)),
     lambda x: kiln.cat([x]), lambda x: kiln.stack([x]), lambda x: x.tril(5), lambda x: kiln.pad(x, (0, 0))],
    ids=["flip", "roll", "repeat", "tile", "cat", "stack", "tril", "pad"],
)  # fmt: skip
def test_copying_ops_do_not_share_memory(fn):
    base = kiln.arange(6, dtype=kiln.float32).reshape(2, 3)
    out = fn(base)
    assert not shares_memory(out, base)
    out.fill_(-1.0)
    assert base.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_flip_of_size_one_dims_still_copies():
    base = kiln.ones(1, 1)
    assert not shares_memory(base.flip((0, 1)), base)


def test_repeat_of_one_element_is_independent_memory():
    out = kiln.tensor([2.0]).repeat(3)
    out[0] = 5.0
    assert out.tolist() == [5.0, 2.0, 2.0]


def test_T_and_mT_values():
    x = kiln.arange(6).reshape(2, 3)
    assert x.T.tolist() == [[0, 3], [1, 4], [2, 5]]
    assert x.mT.tolist() == [[0, 3], [1, 4], [2, 5]]
    assert kiln.arange(24).reshape(2, 3, 4).T.shape == (4, 3, 2)


# ----------------------------------------------------------------------------- cat and stack
@pytest.mark.parametrize(
    "dtypes",
    [("int32", "float32"), ("int64", "float16"), ("bool", "int8"), ("uint8", "int8"), ("float32", "float64"),
     ("bool", "bool")],
)  # fmt: skip
def test_cat_promotes_like_pytorch(dtypes, torch):
    ks, ts = [], []
    for i, name in enumerate(dtypes):
        array = (np.arange(6).reshape(2, 3) - 2 * i).astype(name)
        ks.append(kiln.from_numpy(array))
        ts.append(torch.from_numpy(array))
    assert_close(kiln.cat(ks, 1), torch.cat(ts, 1), **EXACT)
    assert_close(kiln.concat(ks, -2), torch.concat(ts, -2), **EXACT)


def test_cat_skips_legacy_empty_1d_tensors(torch):
    k, t = pair(torch, data(2, 3))
    ke, te = kiln.zeros(0, dtype=kiln.float64), torch.zeros(0, dtype=torch.float64)
    assert_close(kiln.cat([ke, k, ke], 0), torch.cat([te, t, te], 0), **EXACT)
    assert_close(kiln.cat([k, kiln.zeros(0, 3, dtype=kiln.float64)], 0), t, **EXACT)
    assert kiln.cat([ke, ke]).shape == (0,)
    # an empty (0,) tensor still takes part in promotion
    assert kiln.cat([kiln.zeros(0, dtype=kiln.float64), kiln.ones(2, 2)]).dtype is kiln.float64


def test_stack_matches_pytorch(torch):
    arrays = [data(2, 3) for _ in range(3)]
    for dim in (0, 1, 2, -1):
        got = kiln.stack([kiln.from_numpy(a) for a in arrays], dim)
        assert_close(got, torch.stack([torch.from_numpy(a) for a in arrays], dim), **EXACT)
    # mixed dtypes promote; empty, 0-d and many small tensors (a DataLoader's collate)
    for arrays in ([data(2, 3), data(2, 3).astype(np.float32), np.ones((2, 3), np.int64)], [np.zeros((0, 3))] * 2,
                   [np.float64(1.5), np.float64(2.0)], [np.arange(16) + i for i in range(32)]):  # fmt: skip
        for dim in range(-np.ndim(arrays[0]) - 1, np.ndim(arrays[0]) + 1):
            got = kiln.stack([kiln.tensor(a) for a in arrays], dim)
            assert_close(got, torch.stack([torch.tensor(a) for a in arrays], dim), **EXACT)


def test_cat_errors_name_the_mismatch():
    with pytest.raises(RuntimeError, match=r"Sizes of tensors must match except in dimension 0. Expected size 4 but got "
                                           r"size 3 for tensor number 1"):  # fmt: skip
        kiln.cat([kiln.zeros(2, 4), kiln.zeros(2, 3)])
    with pytest.raises(RuntimeError, match="same number of dimensions: got 2 and 3"):
        kiln.cat([kiln.zeros(2, 4), kiln.zeros(2, 4, 1)])
    with pytest.raises(ValueError, match="non-empty list"):
        kiln.cat([])
    with pytest.raises(RuntimeError, match=r"zero-dimensional tensor \(at position 1\)"):
        kiln.cat([kiln.zeros(2), kiln.tensor(1.0)])
    with pytest.raises(TypeError, match="must be a tuple or list of Tensors"):
        kiln.cat(kiln.zeros(2))
    with pytest.raises(RuntimeError, match=r"stack expects each tensor to be equal size, but got \[2\] at entry 0 and "
                                           r"\[3\] at entry 1"):  # fmt: skip
        kiln.stack([kiln.zeros(2), kiln.zeros(3)])
    with pytest.raises(IndexError, match="Dimension out of range"):
        kiln.cat([kiln.zeros(2), kiln.zeros(2)], 1)


# ----------------------------------------------------------------------------- pad
@pytest.mark.parametrize(
    "pad_,mode,value,shape",
    [((1, 2), "constant", None, (2, 3)), ((1, 0, 2, 1), "constant", -3.5, (2, 3)), ((-1, 2, 0, -1), "constant", 0.0,
     (3, 4)), ((0, 0, 1, 1, 2, 0), "constant", 1.0, (1, 2, 3)), ((2, 1), "reflect", None, (2, 4)), ((1, 2, 2, 1),
     "replicate", None, (1, 2, 3)), ((1, 3, 2, 0), "circular", None, (1, 3, 4)), ((1, 1, 1, 1), "reflect", None,
     (1, 3, 3))],
)  # fmt: skip
def test_pad_matches_pytorch(pad_, mode, value, shape, torch):
    k, t = pair(torch, data(*shape))
    kwargs = {} if value is None else {"value": value}
    expected = torch.nn.functional.pad(t, pad_, mode=mode, **kwargs)
    assert_close(kiln.pad(k, pad_, mode=mode, **kwargs), expected, **EXACT)


def test_pad_keeps_integer_dtype_and_errors():
    out = kiln.pad(kiln.tensor([1, 2]), (1, 1), value=7)
    assert out.dtype is kiln.int64 and out.tolist() == [7, 1, 2, 7]
    with pytest.raises(RuntimeError, match="divisible by 2"):
        kiln.pad(kiln.zeros(2), (1,))
    with pytest.raises(RuntimeError, match="reflect padding: padding \\(3, 0\\) at dimension 1 must be at most 2"):
        kiln.pad(kiln.zeros(2, 3), (3, 0), mode="reflect")


# ----------------------------------------------------------------------------- gradients
GRADS = {
    "flatten": ((2, 3, 4), lambda x: x.flatten(1)),
    "unflatten": ((2, 6), lambda x: x.unflatten(1, (2, 3))),
    "squeeze": ((1, 3, 1), lambda x: x.squeeze()),
    "unsqueeze": ((3,), lambda x: x.unsqueeze(0)),
    "permute": ((2, 3, 4), lambda x: x.permute(2, 0, 1)),
    "transpose": ((2, 3), lambda x: x.transpose(0, 1)),
    "mT": ((2, 3, 4), lambda x: x.mT),
    "movedim": ((2, 3, 4), lambda x: x.movedim(0, 2)),
    "narrow": ((4, 3), lambda x: x.narrow(0, 1, 2)),
    "select": ((4, 3), lambda x: x.select(1, 2)),
    "unbind": ((2, 3), lambda x: x.unbind(1)),
    "split": ((5, 2), lambda x: x.split([2, 3])),
    "chunk": ((5, 2), lambda x: x.chunk(2)),
    "flip": ((2, 3), lambda x: x.flip((0, 1))),
    "roll": ((3, 4), lambda x: x.roll((1, -1), (0, 1))),
    "repeat": ((2, 3), lambda x: x.repeat(2, 1, 2)),
    "tile": ((3,), lambda x: x.tile((2, 2))),
    "tril": ((3, 4), lambda x: x.tril(1)),
    "triu": ((2, 3, 3), lambda x: x.triu()),
    "diagonal": ((3, 4), lambda x: x.diagonal(1)),
    "expand_as": ((3, 1), lambda x: x.expand_as(kiln.zeros(2, 3, 4))),
    "pad_constant": ((2, 3), lambda x: kiln.pad(x, (1, -1, 0, 2), value=0.5)),
    "pad_reflect": ((1, 2, 4), lambda x: kiln.pad(x, (2, 1), mode="reflect")),
    "pad_replicate": ((1, 2, 3), lambda x: kiln.pad(x, (2, 3), mode="replicate")),
    "strided_slice": ((5, 6), lambda x: kiln.strided_slice(x, (1, 0), (5, 6), (2, 4))),
}


@pytest.mark.parametrize("name", list(GRADS))
def test_gradcheck(name):
    shape, fn = GRADS[name]
    assert gradcheck(fn, (leaf(*shape),), atol=1e-7, rtol=1e-6)


def test_gradcheck_cat_and_stack_with_promotion():
    a, b, c = leaf(2, 3), leaf(1, 3), leaf(0, 3)
    assert gradcheck(lambda a, b, c: kiln.cat([a, b, c]), (a, b, c), atol=1e-7, rtol=1e-6)
    i = kiln.ones(2, 3, dtype=kiln.int32)
    assert gradcheck(lambda a: kiln.cat([i, a], 1), (a,), atol=1e-7, rtol=1e-6)
    assert gradcheck(lambda a, b: kiln.stack([a, b], 1), (a, leaf(2, 3)), atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize(("shape", "dim"), [((), 0), ((3,), 0), ((3,), 1), ((2, 3), 1), ((2, 3), -1), ((0, 2), 0)])
def test_stack_is_one_node_as_pytorch(torch, shape, dim):
    """An eager stack of plain float tensors is one node (StackBackward0), as PyTorch's: it was an
    unsqueeze node per tensor and a view per tensor backward (500 stacked losses). Its gradient is
    PyTorch's, an input changed in place after the stack is no error, and second derivatives hold."""
    arrays = [data(*shape) for _ in range(4)]
    ks = [kiln.tensor(a, dtype=kiln.float64, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    got, expected = kiln.stack(ks, dim), torch.stack(ts, dim)
    assert got.grad_fn.name() == "StackBackward0"
    weights = data(*expected.shape)
    with kiln.no_grad():
        ks[0].add_(1.0)
    (got * kiln.from_numpy(weights)).sum().backward()
    (expected * torch.from_numpy(weights)).sum().backward()
    for k, t in zip(ks, ts, strict=True):
        assert_close(k.grad, t.grad, **EXACT)
    x = kiln.tensor([0.5, -1.0, 2.0], dtype=kiln.float64, requires_grad=True)
    (g,) = kiln.autograd.grad((kiln.stack([x, x * x]) ** 2).sum(), x, create_graph=True)
    assert_close(g, 2 * x.detach() + 4 * x.detach() ** 3, rtol=1e-15, atol=0)  # (a partial derivative per input)
    (gg,) = kiln.autograd.grad(g.sum(), x)
    assert_close(gg, 2 + 12 * x.detach() ** 2, rtol=1e-15, atol=0)


def test_gradient_of_non_contiguous_input_matches_pytorch(torch):
    array = data(3, 4)
    k = kiln.tensor(array, dtype=kiln.float64, requires_grad=True)
    t = torch.tensor(array, requires_grad=True)
    weights = data(4, 3, 2)
    for m, x in ((kiln, k), (torch, t)):
        y = x.T.unsqueeze(-1).repeat(1, 1, 2).flip(1).roll(1, 0)
        (y * m.from_numpy(weights)).sum().backward()
    assert_close(k.grad, t.grad, rtol=1e-12, atol=1e-12)


def test_second_order_through_pad_and_slice():
    x = leaf(3, 4)
    assert kiln.autograd.gradgradcheck(lambda x: kiln.pad(x, (1, 2)).narrow(1, 1, 3) ** 2, (x,))


# ----------------------------------------------------------------------------- errors
def test_view_of_incompatible_strides_raises():
    x = kiln.zeros(3, 4).t()
    with pytest.raises(RuntimeError, match=r"view size \[12\] is not compatible with input tensor's size \[4, 3\]"):
        x.view(12)
    assert x.reshape(12).shape == (12,)


@pytest.mark.parametrize(
    "fn,error,match",
    [
        (lambda x: x.permute(0, 1), RuntimeError, r"number of dims don't match: the input has 3 dims"),
        (lambda x: x.permute(0, 1, 1), RuntimeError, "duplicate dims"),
        (lambda x: x.permute(0, 1, 3), IndexError, r"Dimension out of range \(expected to be in range of \[-3, 2\]"),
        (lambda x: x.transpose(0, 3), IndexError, "Dimension out of range"),
        (lambda x: x.t(), RuntimeError, "t\\(\\) expects a tensor with <= 2 dimensions, but self is 3D"),
        (lambda x: x.squeeze(5), IndexError, "Dimension out of range"),
        (lambda x: x.unsqueeze(4), IndexError, "Dimension out of range"),
        (lambda x: x.narrow(1, 2, 5), RuntimeError, r"start \(2\) \+ length \(5\) exceeds dimension size \(3\)"),
        (lambda x: x.select(0, 2), IndexError, r"index 2 out of range for tensor of size \[2, 3, 4\] at dimension 0"),
        (lambda x: x.flatten(2, 1), RuntimeError, "start_dim"),
        (lambda x: x.unflatten(1, (2, 2)), RuntimeError, r"sizes \[2, 2\] don't multiply up to the size of dim 1"),
        (lambda x: x.split([1, 2], 2), RuntimeError, r"sum exactly to 4 .* got split_sizes=\[1, 2\]"),
        (lambda x: x.chunk(0), RuntimeError, "greater than 0"),
        (lambda x: x.repeat(2, 2), RuntimeError, "can not be smaller than number of dimensions"),
        (lambda x: x.flip((0, -3)), RuntimeError, "dims has duplicates"),
        (lambda x: x.movedim((0, 1), 2), RuntimeError, "same number of dims"),
        (lambda x: x.roll((1, 2), 0), RuntimeError, "shifts and dimensions must align"),
        (lambda x: x.diagonal(0, 1, -2), RuntimeError, "diagonal dimensions cannot be identical"),
        (lambda x: x[0, 0].tril(), RuntimeError, r"at least 2 dimensions, got shape \[4\]"),
        (lambda x: x.expand(3, 3, 4), RuntimeError, r"expanded size \[3, 3, 4\] must match the existing size"),
        (lambda x: x.mT[0, 0].mT, RuntimeError, "mT is only supported on matrices"),
    ],
)
def test_errors_name_expected_and_given(fn, error, match):
    with pytest.raises(error, match=match):
        fn(kiln.zeros(2, 3, 4))
