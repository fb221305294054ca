"""The keywords PyTorch's factories take about memory, which ported programs pass: ``layout``,
``pin_memory``, ``memory_format``; ``empty_strided``; ``Tensor.layout`` and ``kiln.strided``."""

from __future__ import annotations

import numpy as np
import pytest

import kiln


def _factories(lib):
    t = lib.ones(2, 3)
    return {
        "zeros": lambda **k: lib.zeros(2, 3, **k), "ones": lambda **k: lib.ones(2, 3, **k),
        "empty": lambda **k: lib.empty(2, 3, **k).zero_(), "full": lambda **k: lib.full((2, 3), 1.5, **k),
        "arange": lambda **k: lib.arange(5, **k), "eye": lambda **k: lib.eye(3, **k),
        "linspace": lambda **k: lib.linspace(0, 1, 5, **k), "logspace": lambda **k: lib.logspace(0, 1, 5, **k),
        "zeros_like": lambda **k: lib.zeros_like(t, **k), "ones_like": lambda **k: lib.ones_like(t, **k),
        "full_like": lambda **k: lib.full_like(t, 2.0, **k), "empty_like": lambda **k: lib.empty_like(t, **k).zero_(),
        "scalar_tensor": lambda **k: lib.scalar_tensor(1.5, **k), "new_zeros": lambda **k: t.new_zeros((2,), **k),
        "new_ones": lambda **k: t.new_ones((2,), **k), "new_full": lambda **k: t.new_full((2,), 3.0, **k),
        "new_empty": lambda **k: t.new_empty((2,), **k).zero_(), "tril_indices": lambda **k: lib.tril_indices(3, 3, **k),
        "empty_strided": lambda **k: lib.empty_strided((2, 3), (1, 2), **k).zero_(),
        # random: compared by shape and dtype
        "rand": lambda **k: lib.rand(2, 3, **k), "randn": lambda **k: lib.randn(2, 3, **k),
        "randint": lambda **k: lib.randint(0, 5, (2, 3), **k), "rand_like": lambda **k: lib.rand_like(t, **k),
        "randn_like": lambda **k: lib.randn_like(t, **k), "randint_like": lambda **k: lib.randint_like(t, 5, **k),
        "randperm": lambda **k: lib.randperm(4, **k),
    }  # fmt: skip


def _keywords(lib):
    return {"layout=strided": {"layout": lib.strided}, "layout=None": {"layout": None},
            "pin_memory=False": {"pin_memory": False}}  # fmt: skip


def _summary(t, random: bool):
    values = None if random else np.asarray(t.tolist(), dtype=float)
    return tuple(t.shape), str(t.dtype).split(".")[-1], str(t.layout).split(".")[-1], t.stride(), values


def test_factory_keywords_match_torch(torch):
    theirs, ours = _factories(torch), _factories(kiln)
    for name in theirs:
        random = name.startswith("rand")
        for key, kwargs in _keywords(torch).items():
            want = _summary(theirs[name](**kwargs), random)
            got = _summary(ours[name](**_keywords(kiln)[key]), random)
            assert got[:4] == want[:4], f"{name}({key}): {got[:4]} vs {want[:4]}"
            if not random:
                np.testing.assert_allclose(got[4], want[4], rtol=1e-6, atol=1e-7, err_msg=f"{name}({key})")


def test_factory_keywords_hand_checked():
    for name, make in _factories(kiln).items():
        for kwargs in _keywords(kiln).values():
            assert make(**kwargs).layout is kiln.strided, name
    assert kiln.zeros(2, layout=kiln.strided, pin_memory=False).tolist() == [0.0, 0.0]
    assert kiln.tensor([1.0], pin_memory=False).tolist() == [1.0]
    assert kiln.scalar_tensor(2.0, requires_grad=True).requires_grad
    with pytest.raises(RuntimeError, match="to_sparse"):
        kiln.zeros(2, layout=kiln.sparse_coo)
    with pytest.raises(TypeError):
        kiln.ones(2, layout="banded")


@pytest.mark.skipif(kiln.cuda.is_available(), reason="with a GPU, pin_memory=True is accepted")
def test_pin_memory_without_a_gpu_raises_as_torch():
    for make in (lambda: kiln.zeros(2, pin_memory=True), lambda: kiln.tensor([1.0], pin_memory=True),
                 lambda: kiln.empty_like(kiln.ones(2), pin_memory=True)):  # fmt: skip
        with pytest.raises(RuntimeError, match="pin_memory=True requires a CUDA"):
            make()


def test_memory_formats(torch):
    for lib in (torch, kiln):
        assert lib.empty(2, 3, memory_format=lib.contiguous_format).shape == (2, 3)
        assert lib.empty(2, 3, 4, 5, memory_format=lib.channels_last).shape == (2, 3, 4, 5)
        with pytest.raises(RuntimeError, match="required rank 4"):
            lib.empty(2, 3, memory_format=lib.channels_last)
        with pytest.raises(RuntimeError, match="unsupported memory format Preserve"):
            lib.empty(2, 3, memory_format=lib.preserve_format)
        x = lib.arange(24.0).reshape(1, 2, 3, 4)
        for same in (x.clone(memory_format=lib.channels_last), x.contiguous(memory_format=lib.channels_last),
                     lib.zeros_like(x, memory_format=lib.channels_last) + x,
                     lib.rand_like(x, memory_format=lib.contiguous_format) * 0 + x):  # fmt: skip
            assert same.shape == x.shape and same.tolist() == x.tolist()  # a hint: the same values and shape


def test_layouts(torch):
    assert kiln.ones(2).layout == kiln.strided and kiln.ones(2).to_sparse().layout == kiln.sparse_coo
    assert isinstance(kiln.strided, kiln.layout) and isinstance(kiln.sparse_coo, kiln.layout)
    assert repr(kiln.strided) == "kiln.strided" and kiln.sparse_coo == "sparse_coo"
    assert str(torch.ones(2).layout) == "torch.strided" and str(kiln.ones(2).layout) == "kiln.strided"


def test_empty_strided_matches_torch(torch):
    for size, stride in [((2, 3), (1, 2)), ((2, 3), (3, 1)), ((2, 0), (1, 1)), ((4,), (0,)), ((2, 3, 4), (1, 2, 6))]:
        ours, theirs = kiln.empty_strided(size, stride), torch.empty_strided(size, stride)
        assert tuple(ours.shape) == tuple(theirs.shape) and ours.stride() == theirs.stride()
        assert ours.is_contiguous() == theirs.is_contiguous()
    t = kiln.empty_strided((2, 3), (1, 2))
    t.fill_(2.0)
    assert t.tolist() == [[2.0] * 3] * 2 and (t + 1).tolist() == [[3.0] * 3] * 2


def _with_out(lib):
    def out(n, dtype="float32"):
        return lib.empty(n, dtype=getattr(lib, dtype))

    return {
        "zeros int64": (lambda o: lib.zeros(3, out=o), lambda: out(3, "int64")),
        "ones": (lambda o: lib.ones(2, 2, out=o), lambda: lib.empty(2, 2)),
        "empty": (lambda o: lib.empty(3, out=o).zero_(), lambda: out(3)),
        "full int64": (lambda o: lib.full((2,), 1.5, out=o), lambda: out(2, "int64")),
        "arange float": (lambda o: lib.arange(5, out=o), lambda: out(5)),
        "arange resized": (lambda o: lib.arange(5, out=o), lambda: out(0)),
        "linspace float64": (lambda o: lib.linspace(0, 1, 3, out=o), lambda: out(3, "float64")),
        "logspace": (lambda o: lib.logspace(0, 1, 3, out=o), lambda: out(3)),
        "eye": (lambda o: lib.eye(2, out=o), lambda: lib.empty(2, 2)),
        "rand float64": (lambda o: lib.rand(3, out=o) * 0, lambda: out(3, "float64")),
        "randn": (lambda o: lib.randn(3, out=o) * 0, lambda: out(3)),
        "randint float": (lambda o: lib.randint(0, 1, (3,), out=o), lambda: out(3)),
        "randperm": (lambda o: lib.randperm(3, out=o).sort().values, lambda: out(3, "int64")),
    }


def test_out_matches_torch(torch):
    theirs, ours = _with_out(torch), _with_out(kiln)
    for name, (make, out) in theirs.items():
        o = out()
        want = make(o)
        o_kiln = ours[name][1]()
        got = ours[name][0](o_kiln)
        assert _summary(got, False)[:2] == _summary(want, False)[:2], name
        np.testing.assert_allclose(
            _summary(got, False)[4], _summary(want, False)[4], rtol=1e-6, atol=1e-7, err_msg=name
        )
        assert tuple(o_kiln.shape) == tuple(o.shape) and str(o_kiln.dtype)[5:] == str(o.dtype)[6:], name  # filled


def test_out_hand_checked():
    o = kiln.empty(3, dtype=kiln.int64)
    assert kiln.zeros(3, out=o) is o and o.tolist() == [0, 0, 0]
    o = kiln.empty(2)
    with pytest.warns(UserWarning, match="resized"):
        assert kiln.arange(4, out=o) is o
    assert o.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match="does not match dtype of out"):
        kiln.zeros(3, dtype=kiln.float64, out=kiln.empty(3))
    with pytest.raises(RuntimeError, match="automatic differentiation"):
        kiln.zeros(3, out=kiln.empty(3, requires_grad=True))
