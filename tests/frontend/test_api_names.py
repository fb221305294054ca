"""PyTorch names ported programs use (issue 15), against torch: sorting and top-k, closeness,
addcmul/addcdiv, repeat_interleave, meshgrid, Tensor.type/view_as, legacy tensor types, range
indexing, memory formats, finfo/iinfo, testing.assert_close, and the accelerator/backends/jit
stand-ins; gradients by finite differences in float64."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import kiln
from kiln.frontend.autograd import gradcheck

RNG = np.random.default_rng(0)


def _pair(torch, array):
    return kiln.from_numpy(array.copy()), torch.from_numpy(array.copy())


def test_topk_and_sort_match_torch(torch):
    array = RNG.standard_normal((4, 7))
    array[1, 2] = array[1, 5]  # a tie: the earlier index comes first, as torch on the CPU
    ours, theirs = _pair(torch, array)
    for k, dim, largest in [(3, -1, True), (2, 0, False), (7, 1, True)]:
        v, i = kiln.topk(ours, k, dim=dim, largest=largest)
        tv, ti = torch.topk(theirs, k, dim=dim, largest=largest)
        np.testing.assert_array_equal(v.numpy(), tv.numpy())
        np.testing.assert_array_equal(i.numpy(), ti.numpy())
    for descending in (False, True):
        v, i = ours.sort(dim=1, descending=descending, stable=True)
        tv, ti = theirs.sort(dim=1, descending=descending, stable=True)
        np.testing.assert_array_equal(v.numpy(), tv.numpy())
        np.testing.assert_array_equal(i.numpy(), ti.numpy())
    with pytest.raises(RuntimeError, match="k out of range"):
        kiln.topk(ours, 9)


def test_topk_values_are_differentiable():
    x = kiln.tensor(RNG.standard_normal((3, 5)), requires_grad=True)
    assert gradcheck(lambda t: kiln.topk(t, 2).values * 3.0, (x,), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_closeness_and_addc_ops(torch):
    a, ta = _pair(torch, RNG.standard_normal(6))
    b, tb = _pair(torch, RNG.standard_normal(6) + 3)
    np.testing.assert_array_equal(kiln.isclose(a, a + 1e-9).numpy(), torch.isclose(ta, ta + 1e-9).numpy())
    assert kiln.allclose(a, a + 1e-9) and not kiln.allclose(a, b)
    np.testing.assert_allclose(kiln.addcmul(a, a, b, value=0.5).numpy(), torch.addcmul(ta, ta, tb, value=0.5).numpy())
    np.testing.assert_allclose(a.addcdiv(a, b, value=-2).numpy(), ta.addcdiv(ta, tb, value=-2).numpy())
    c, tc = a.clone(), ta.clone()
    c.addcdiv_(a, b, value=2)
    tc.addcdiv_(ta, tb, value=2)
    np.testing.assert_allclose(c.numpy(), tc.numpy())


def test_repeat_interleave_and_meshgrid(torch):
    x, tx = _pair(torch, np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(kiln.repeat_interleave(x, 2).numpy(), torch.repeat_interleave(tx, 2).numpy())
    reps = [1, 3]
    np.testing.assert_array_equal(x.repeat_interleave(kiln.tensor(reps), dim=0).numpy(),
                                  tx.repeat_interleave(torch.tensor(reps), dim=0).numpy())  # fmt: skip
    np.testing.assert_array_equal(kiln.repeat_interleave(kiln.tensor([2, 0, 1])).numpy(),
                                  torch.repeat_interleave(torch.tensor([2, 0, 1])).numpy())  # fmt: skip
    for indexing in ("ij", "xy"):
        ours = kiln.meshgrid(kiln.arange(2), kiln.arange(3), kiln.arange(4), indexing=indexing)
        theirs = torch.meshgrid(torch.arange(2), torch.arange(3), torch.arange(4), indexing=indexing)
        for o, t in zip(ours, theirs, strict=True):
            np.testing.assert_array_equal(o.numpy(), t.numpy())


def test_repeat_interleave_gradient():
    x = kiln.tensor(RNG.standard_normal((2, 3)), requires_grad=True)
    assert gradcheck(lambda t: t.repeat_interleave(kiln.tensor([2, 1, 3]), dim=1), (x,), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_tensor_type_view_as_and_legacy_types(torch):
    x, tx = _pair(torch, RNG.standard_normal((2, 3)).astype(np.float32))
    assert x.type() == tx.type() == "torch.FloatTensor"
    assert x.type(kiln.int64).type() == tx.type(torch.int64).type() == "torch.LongTensor"
    assert x.type("torch.DoubleTensor").dtype is kiln.float64
    assert x.type(kiln.LongTensor).dtype is kiln.int64
    assert x.view_as(kiln.zeros(3, 2)).shape == tx.view_as(torch.zeros(3, 2)).shape
    long = kiln.LongTensor([1, 2])
    assert long.dtype is kiln.int64 and isinstance(long, kiln.LongTensor) and not isinstance(long, kiln.FloatTensor)
    assert kiln.FloatTensor(2, 3).shape == (2, 3)
    assert not (x.is_sparse or x.is_complex() or kiln.is_complex(x)) and kiln.is_floating_point(x)
    assert kiln.numel(x) == 6


def test_indexing_with_a_range(torch):
    x, tx = _pair(torch, np.arange(12.0).reshape(3, 4))
    np.testing.assert_array_equal(x[range(1, 3)].numpy(), tx[range(1, 3)].numpy())
    np.testing.assert_array_equal(x[:, range(0, 4, 2)].numpy(), tx[:, range(0, 4, 2)].numpy())
    x[range(2)] = 0.0
    tx[range(2)] = 0.0
    np.testing.assert_array_equal(x.numpy(), tx.numpy())


def test_memory_formats_are_accepted():
    x = kiln.randn(2, 3, 4, 5)
    assert x.contiguous(memory_format=kiln.channels_last).shape == x.shape
    assert x.is_contiguous(memory_format=kiln.contiguous_format)
    assert repr(kiln.channels_last) == "torch.channels_last"
    with pytest.raises(TypeError, match="no complex dtype"):
        kiln.view_as_real(x)


def test_finfo_and_iinfo(torch):
    for ours, theirs in [(kiln.float32, torch.float32), (kiln.float64, torch.float64), (kiln.float16, torch.float16)]:
        a, b = kiln.finfo(ours), torch.finfo(theirs)
        assert (a.bits, a.eps, a.max, a.min, a.tiny, a.resolution) == (
            b.bits,
            b.eps,
            b.max,
            b.min,
            b.tiny,
            b.resolution,
        )
    for ours, theirs in [(kiln.int64, torch.int64), (kiln.uint8, torch.uint8), (kiln.int8, torch.int8)]:
        a, b = kiln.iinfo(ours), torch.iinfo(theirs)
        assert (a.bits, a.max, a.min) == (b.bits, b.max, b.min)
    with pytest.raises(TypeError):
        kiln.finfo(kiln.int32)


def test_assert_close_tolerances_and_message():
    x = kiln.tensor([1.0, 2.0, 3.0])
    kiln.testing.assert_close(x, x + 1e-6)  # float32: rtol 1.3e-6, atol 1e-5
    with pytest.raises(AssertionError, match=r"Tensor-likes are not close!\n\nMismatched elements: 1 / 3"):
        kiln.testing.assert_close(x, kiln.tensor([1.0, 2.0, 3.1]))
    with pytest.raises(AssertionError, match="dtype"):
        kiln.testing.assert_close(x, x.double())
    kiln.testing.assert_close({"a": [x, 1.0]}, {"a": [x.clone(), 1.0]})


def test_backend_switches_import_as_submodules():
    import kiln.backends.cudnn as cudnn  # DCGAN's (and most CNN examples') import

    from kiln.backends import mps

    assert cudnn is kiln.backends.cudnn and mps is kiln.backends.mps
    for name in ("cudnn", "mkldnn", "cpu", "mps", "opt_einsum", "cuda"):
        assert importlib.import_module(f"kiln.backends.{name}") is getattr(kiln.backends, name)


def test_stand_ins_for_accelerators_backends_and_torchscript():
    assert kiln.accelerator.is_available() == kiln.cuda.is_available()
    assert (kiln.accelerator.current_accelerator() is None) == (not kiln.cuda.is_available())
    kiln.backends.cudnn.benchmark = True
    kiln.backends.cuda.matmul.allow_tf32 = True
    assert not kiln.backends.mps.is_available()
    assert not kiln.jit.is_scripting() and not kiln.jit.is_tracing()

    @kiln.jit.ignore
    def f(x):
        return x + 1

    assert kiln.jit.script(f) is f and kiln.jit.ignore(drop=True)(f) is f
    traced = kiln.jit.trace(lambda x: x * 2, (kiln.ones(2),))
    np.testing.assert_array_equal(traced(kiln.ones(2)).numpy(), [2.0, 2.0])
    assert kiln.cuda.amp.GradScaler is not None and issubclass(kiln.cuda.amp.autocast, kiln.amp.autocast)


def test_compiled_calls_of_the_new_names_equal_eager():
    x = kiln.randn(4, 5)

    def f(t):
        return kiln.addcmul(t, t, t, value=0.5).view_as(kiln.zeros(5, 4)), t.repeat_interleave(2, dim=0)

    compiled = kiln.compile(f)
    for _ in range(3):
        for a, b in zip(compiled(x), f(x), strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    topk = kiln.compile(lambda t: kiln.topk(t, 2).values * 2)  # reads the values: that call runs eagerly
    for _ in range(2):
        np.testing.assert_array_equal(topk(x).numpy(), kiln.topk(x, 2).values.numpy() * 2)


def test_jit_is_tracing_inside_a_trace_only():
    """``kiln.jit.is_tracing()`` is True while ``kiln.compile`` (or ``kiln.jit.trace``) traces, so code
    written for torch.jit can take its traced path; eagerly it is False."""
    seen = []

    @kiln.compile
    def f(x):
        seen.append(kiln.jit.is_tracing())
        return x * 2

    assert not kiln.jit.is_tracing()
    np.testing.assert_array_equal(f(kiln.ones(2)).numpy(), [2.0, 2.0])
    assert seen == [True]
    assert not kiln.jit.is_tracing()


def test_asarray_is_nonzero_narrow_copy_cosine_similarity_and_vmap_match_torch(torch):
    array = RNG.standard_normal((3, 4))
    ours, theirs = kiln.asarray(array), torch.asarray(array)
    array[0, 0] = 7.0  # both share the array's memory
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert kiln.asarray(array, copy=True).numpy()[0, 0] == torch.asarray(array, copy=True).numpy()[0, 0] == 7.0
    array[0, 0] = 1.0
    assert kiln.asarray(array, copy=True).numpy()[0, 0] == 1.0 and ours.numpy()[0, 0] == 1.0
    assert kiln.asarray([1, 2]).dtype is kiln.int64 and kiln.asarray([1.5], requires_grad=True).requires_grad
    with pytest.raises(ValueError):
        kiln.asarray([1, 2], copy=False)
    for value in (0.0, -2.5):
        assert kiln.is_nonzero(kiln.tensor([value])) == torch.is_nonzero(torch.tensor([value]))
    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        kiln.is_nonzero(kiln.ones(2))
    with pytest.raises(RuntimeError, match="no values is ambiguous"):
        kiln.is_nonzero(kiln.ones(0))
    copied = kiln.narrow_copy(ours, 1, 1, 2)
    np.testing.assert_array_equal(copied.numpy(), torch.narrow_copy(theirs, 1, 1, 2).numpy())
    assert not np.shares_memory(copied.numpy(), array)
    other = RNG.standard_normal((3, 4))
    np.testing.assert_allclose(kiln.cosine_similarity(ours, kiln.asarray(other), dim=1).numpy(),
                               torch.cosine_similarity(theirs, torch.asarray(other), dim=1).numpy(),
                               rtol=1e-12, atol=1e-12)  # fmt: skip
    np.testing.assert_allclose(kiln.vmap(lambda row: row.sum())(ours).numpy(),
                               torch.vmap(lambda row: row.sum())(theirs).numpy(), rtol=1e-12, atol=1e-12)  # fmt: skip


def test_float32_matmul_precision_is_kept(torch):
    try:
        for precision in ("high", "medium", "highest"):
            kiln.set_float32_matmul_precision(precision)
            assert kiln.get_float32_matmul_precision() == precision
        with pytest.raises(RuntimeError, match="Invalid precision"):
            kiln.set_float32_matmul_precision("low")
    finally:
        kiln.set_float32_matmul_precision("highest")
    assert torch.get_float32_matmul_precision() == kiln.get_float32_matmul_precision()
