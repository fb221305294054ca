"""The eager view ops' lean path (ops/_views.py): the same views, nodes and errors as dispatch.apply's."""

import numpy as np
import pytest

import kiln
from kiln.frontend import dispatch
from kiln.frontend.ops import _views, indexing, shape

RNG = np.random.default_rng(1)

VIEWS = {
    "view": lambda x: x.view(3, 2, 4),
    "reshape": lambda x: x.reshape(-1, 8),
    "transpose": lambda x: x.transpose(0, 2),
    "permute": lambda x: x.permute(2, 0, 1),
    "T": lambda x: x[0].T,
    "unsqueeze": lambda x: x.unsqueeze(1),
    "squeeze": lambda x: x[:, :1].squeeze(1),
    "expand": lambda x: x[:, :1].expand(3, 5, 4),
    "narrow": lambda x: x.narrow(1, 1, 1),
    "slices": lambda x: x[1:, ::2, -1],
    "int": lambda x: x[2],
    "none": lambda x: x[None, ..., 1:3],
}


@pytest.fixture
def no_dispatch(monkeypatch):
    """Fail any view op that goes through dispatch.apply (where the lean path should serve it)."""

    def refuse(prim, *args, **kwargs):
        raise AssertionError(f"{prim.name} went through dispatch.apply")

    for module in (shape, indexing):
        monkeypatch.setattr(module, "apply", refuse)


@pytest.mark.parametrize("op", list(VIEWS.values()), ids=list(VIEWS))
def test_plain_views_skip_dispatch_and_share_memory_and_version(no_dispatch, op):
    x = kiln.tensor(RNG.normal(size=(3, 2, 4)))
    y = op(x)
    assert y._base is x and y._version is x._version and np.shares_memory(y.numpy(), x.numpy())


@pytest.mark.parametrize("op", list(VIEWS.values()), ids=list(VIEWS))
def test_values_and_gradients_equal_pytorch(torch, op):
    x_np = RNG.normal(size=(3, 2, 4))
    grads, values = [], []
    for lib in (kiln, torch):
        x = lib.tensor(x_np, requires_grad=True)
        y = op(x * 1.0)
        values.append(y.detach().numpy())
        (y * lib.tensor(np.arange(y.numel(), dtype=np.float64).reshape(tuple(y.shape)))).sum().backward()
        grads.append(x.grad.numpy())
    np.testing.assert_array_equal(values[0], values[1])
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12, atol=1e-12)


def test_gradients_by_finite_differences_and_second_order():
    x = kiln.tensor(RNG.normal(size=(3, 2, 4)), requires_grad=True)
    for op in VIEWS.values():
        assert kiln.autograd.gradcheck(lambda t, op=op: (op(t * t) ** 2).sum(), (x,))
        assert kiln.autograd.gradgradcheck(lambda t, op=op: (op(t * t) ** 2).sum(), (x,))


def test_in_place_through_a_lean_view_and_its_base():
    w = kiln.tensor(RNG.normal(size=(2, 3)), requires_grad=True)
    y = w * 1.0
    v = y.T
    v[0].mul_(4.0)  # column 0 of y
    y.add_(1.0)
    (v * v).sum().backward()
    expected = 2 * (w.detach().numpy() * np.array([[4.0, 1, 1]]) + 1) * np.array([[4.0, 1, 1]])
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-12)


def test_bad_shapes_keep_their_errors():
    x = kiln.zeros(2, 3)
    with pytest.raises(RuntimeError, match=r"shape \[4, 2\] is invalid for input of size 6"):
        x.reshape(4, 2)
    with pytest.raises(RuntimeError, match="must match the existing size"):
        x.expand(2, 4)
    with pytest.raises(RuntimeError, match="view size .* is not compatible"):
        x.T.view(6)
    with pytest.raises(IndexError, match="out of bounds"):
        x[:, 3]


def test_traces_and_profiles_record_the_primitives():
    x = kiln.tensor(RNG.normal(size=(4, 6)))
    with kiln.profiler.profile() as prof:
        x.T.reshape(3, 8)[1:, ::2]
    names = {a.key for a in prof.key_averages()}
    assert {"permute", "reshape", "slice"} <= names, names
    assert not dispatch.profiling_ops

    def fn(t):
        return t.T.reshape(3, 8)[1:, ::2].unsqueeze(0).expand(2, 2, 4) * 2

    compiled = kiln.compile(fn)
    for _ in range(3):
        x = kiln.tensor(RNG.normal(size=(4, 6)))
        np.testing.assert_array_equal(compiled(x).numpy(), fn(x).numpy())


@pytest.mark.parametrize(
    ("given", "shape"),
    [
        ((), (4, 5)),
        ((3, 1), (2, 3, 4)),
        ((1,), (0,)),
        ((3, 1), (3, 0)),
        ((1, 1, 4, 4), (2, 3, 4, 4)),
        ((0, 2), (3, 0, 2)),
    ],
)
def test_broadcast_view_is_broadcast_to(given, shape):
    array = RNG.normal(size=given)
    for a in (array, np.asfortranarray(array)[..., :]):  # contiguous, and maybe not
        got, expected = _views.broadcast_view(a, shape), np.broadcast_to(a, shape)
        assert got.shape == expected.shape and got.strides == expected.strides and not got.flags.writeable
        np.testing.assert_array_equal(got, expected)
        assert got.size == 0 or np.shares_memory(got, a)
    with pytest.raises(ValueError):
        _views.broadcast_view(RNG.normal(size=(3, 2)), (3, 4))


def _bound(rng, n):
    return None if rng.random() < 0.3 else int(rng.integers(-n - 2, n + 3))


def _random_key(rng, ndim):
    items = []
    for n in (4, 5, 3)[: rng.integers(1, ndim + 1)]:
        if rng.random() < 0.3:
            items.append(int(rng.integers(-n, n)))
        else:
            step = None if rng.random() < 0.5 else int(rng.integers(1, 4))
            items.append(slice(_bound(rng, n), _bound(rng, n), step))
    return tuple(items) if len(items) > 1 or rng.random() < 0.5 else items[0]


def test_int_and_slice_keys_parse_as_the_general_parser(monkeypatch):
    x_np = RNG.normal(size=(4, 5, 3))
    x = kiln.tensor(x_np)
    rng = np.random.default_rng(5)
    keys = [_random_key(rng, 3) for _ in range(300)]
    fast = [indexing._parse(x, k) for k in keys]
    assert all(indexing._parse_slices(x.shape, k) is not None for k in keys)
    monkeypatch.setattr(indexing, "_parse_slices", lambda shape, key: None)
    for key, got in zip(keys, fast, strict=True):
        assert got == indexing._parse(x, key), key
        np.testing.assert_array_equal(x[key].numpy(), x_np[key])
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 1 with size 5"):
        x[:, 5]
