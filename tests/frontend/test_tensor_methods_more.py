"""Tensor methods and properties of PyTorch's that ported programs call (``ops/tensor_methods.py``),
against PyTorch and hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

import kiln


def _answers(lib):
    t, x = lib.ones(2, 3), lib.arange(12.0).reshape(3, 4)
    mask = lib.tensor([True, False, True])
    return [
        t.nbytes, t.itemsize, lib.ones(3, dtype=lib.int64).nbytes, t.is_pinned(), t.dim_order(), x.t().dim_order(),
        lib.ones(2, 3, 4).permute(2, 0, 1).dim_order(), t.is_cpu, t.is_meta, t.is_quantized, t.is_nested,
        t.is_inference(), t.is_conj(), t.is_neg(), tuple(t.mH.shape), tuple(t.H.shape), tuple(t.adjoint().shape),
        tuple(lib.ones(5, 2, 3).mH.shape), t.real.tolist(), x.clone().tril_().tolist(), x.clone().triu_(1).tolist(),
        x.clone().log2_().tolist(), x.clone().log10_().tolist(), x.clone().negative_().tolist(),
        mask.clone().logical_and_(lib.tensor([True, True, False])).tolist(),
        mask.clone().logical_or_(lib.tensor([False, True, False])).tolist(),
        mask.clone().logical_xor_(lib.tensor([True, True, True])).tolist(),
        x.clone().index_fill_(1, lib.tensor([0, 2]), -1.0).tolist(),
        x.clone().index_copy_(0, lib.tensor([2, 0]), lib.zeros(2, 4)).tolist(),
        lib.zeros(3).masked_scatter_(mask, lib.tensor([5.0, 6.0])).tolist(),
        lib.tensor([1.7, -1.7]).fix().tolist(), lib.tensor([1.7, -1.7]).fix_().tolist(),
        [c.tolist() for c in x.unsafe_chunk(2)], [c.tolist() for c in x.unsafe_split(2, dim=1)],
        tuple(x.new(2, 3).shape), str(x.new([1, 2]).dtype).split(".")[-1], tuple(x.new().shape),
        tuple(x.new(lib.Size([2])).shape), x.new(t) is t, x.new(t).data_ptr() == t.data_ptr(), x.to_dense() is x, x.output_nr,
    ]  # fmt: skip


def test_matches_torch(torch):
    ours, theirs = _answers(kiln), _answers(torch)
    for i, (got, want) in enumerate(zip(ours, theirs, strict=True)):
        if isinstance(want, list) and want and not isinstance(want[0], list | bool):  # values: to rounding
            np.testing.assert_allclose(np.array(got, float), np.array(want, float), rtol=1e-6, atol=1e-7)
        elif isinstance(want, list) and want and isinstance(want[0], list) and isinstance(want[0][0], float):
            np.testing.assert_allclose(np.array(got, float), np.array(want, float), rtol=1e-6, atol=1e-7)
        else:
            assert got == want, f"answer {i}: {got} vs {want}"


def test_hand_computed():
    t = kiln.ones(2, 3, dtype=kiln.float64)
    assert (t.nbytes, t.itemsize, t.dim_order(), t.t().dim_order()) == (48, 8, (0, 1), (1, 0))
    assert not t.is_pinned() and not t.is_meta and t.is_cpu
    assert kiln.ones(3, 3).tril_().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert t.new(4).shape == (4,) and t.new(4).dtype is kiln.float64 and t.new([1]).dtype is kiln.float64
    with pytest.raises(TypeError):
        t.new(2, "3")


@pytest.mark.skipif(kiln.cuda.is_available(), reason="with a GPU, pin_memory() is accepted")
def test_pin_memory_without_a_gpu_raises_as_torch():
    with pytest.raises(RuntimeError, match="accelerator"):
        kiln.ones(2).pin_memory()
