"""Spellings real PyTorch programs use: ``Tensor(*sizes)``, ``size=`` keywords, module names by path."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from tests.conftest import assert_close

CREATORS = ["empty", "zeros", "ones", "rand", "randn"]


@pytest.mark.parametrize("name", CREATORS)
def test_size_keyword(name):
    make = getattr(kiln, name)
    for size in [(2, 3), [4], 5, ()]:
        assert make(size=size).shape == make(*(size if isinstance(size, tuple | list) else (size,))).shape
    assert make(size=(2, 3), dtype=kiln.float64).dtype == kiln.float64
    with pytest.raises(TypeError, match="both"):
        make(2, size=(3,))


@pytest.mark.parametrize("name", CREATORS)
def test_size_keyword_matches_torch(torch, name):
    assert tuple(getattr(kiln, name)(size=(3, 1, 2)).shape) == tuple(getattr(torch, name)(size=(3, 1, 2)).shape)


def test_legacy_tensor_constructor():
    t = kiln.Tensor(2, 3)
    assert t.shape == (2, 3) and t.dtype == kiln.get_default_dtype()
    assert kiln.Tensor().shape == (0,)
    assert kiln.Tensor(kiln.Size([4, 1])).shape == (4, 1)
    assert_close(kiln.Tensor([1, 2]), np.array([1.0, 2.0], np.float32), rtol=0, atol=0)
    assert_close(kiln.Tensor(np.arange(3)), np.arange(3, dtype=np.float32), rtol=0, atol=0)
    a = kiln.ones(2)
    assert kiln.Tensor(a) is a
    with pytest.raises(TypeError, match="sizes"):
        kiln.Tensor(2.5)
    ints = kiln.ones(2, dtype=kiln.int64)
    assert kiln.Tensor(ints) is ints  # as PyTorch's: the tensor itself, whatever its dtype
    assert isinstance(kiln.nn.Parameter(kiln.ones(2)), kiln.Tensor)  # subclasses still construct themselves


def test_legacy_tensor_constructor_matches_torch(torch):
    for args in [(2, 3), (), ([1.5, 2],), ((2, 3),)]:
        k, t = kiln.Tensor(*args), torch.Tensor(*args)
        assert tuple(k.shape) == tuple(t.shape) and str(k.dtype).split(".")[-1] == str(t.dtype).split(".")[-1]
    assert_close(kiln.Tensor([1.5, 2]), torch.Tensor([1.5, 2]), rtol=0, atol=0)


def test_non_dynamically_quantizable_linear_is_the_attention_projection(torch):
    from kiln.nn.modules.linear import NonDynamicallyQuantizableLinear

    m = kiln.nn.MultiheadAttention(8, 2)
    assert type(m.out_proj) is NonDynamicallyQuantizableLinear and isinstance(m.out_proj, kiln.nn.Linear)
    assert type(torch.nn.MultiheadAttention(8, 2).out_proj).__name__ == NonDynamicallyQuantizableLinear.__name__
