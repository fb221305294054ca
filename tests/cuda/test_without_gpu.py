"""kiln.cuda where CUDA is not usable: checked everywhere by making the probe say "no CUDA"
(so these run on a GPU machine too), and the caching allocator's accounting over a fake pool."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import kiln
from kiln.ir.types import device
from kiln.runtime import cuda_allocator, devices


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(devices, "_probe", lambda: (None, "cupy is not installed (test)"))


def test_availability_and_seeding_without_cuda(no_cuda):
    assert kiln.cuda.is_available() is False
    assert kiln.cuda.device_count() == 0
    # PyTorch's behaviour: seeding CUDA without CUDA is silently ignored
    assert kiln.cuda.manual_seed(3) is None
    assert kiln.cuda.manual_seed_all(3) is None
    before = kiln.randn(4).numpy()
    kiln.manual_seed(0)
    a = kiln.randn(4).numpy()
    kiln.cuda.manual_seed(123)  # leaves the CPU generator alone
    kiln.manual_seed(0)
    np.testing.assert_array_equal(kiln.randn(4).numpy(), a)
    assert before.shape == (4,)


@pytest.mark.parametrize(
    "call, what",
    [
        (lambda: kiln.cuda.synchronize(), "kiln.cuda.synchronize()"),
        (lambda: kiln.cuda.Stream(), "kiln.cuda.Stream()"),
        (lambda: kiln.cuda.current_stream(), "kiln.cuda.current_stream()"),
        (lambda: kiln.cuda.Event(enable_timing=True), "kiln.cuda.Event()"),
        (lambda: kiln.cuda.get_device_name(), "kiln.cuda.get_device_name()"),
        (lambda: kiln.cuda.current_device(), "kiln.cuda.current_device()"),
        (lambda: kiln.cuda.memory_allocated(), "kiln.cuda.memory_allocated()"),
        (lambda: kiln.cuda.max_memory_allocated(), "kiln.cuda.max_memory_allocated()"),
        (lambda: kiln.cuda.memory_reserved(), "kiln.cuda.memory_reserved()"),
        (lambda: kiln.cuda.empty_cache(), "kiln.cuda.empty_cache()"),
        (lambda: kiln.cuda.reset_peak_memory_stats(), "kiln.cuda.reset_peak_memory_stats()"),
        (lambda: kiln.cuda.memory_summary(), "kiln.cuda.memory_summary()"),
        (lambda: kiln.ones(2, device="cuda"), "device cuda:0"),
        (lambda: kiln.ones(2).cuda(), "device cuda:0"),
        (lambda: kiln.ones(2).to("cuda:1"), "device cuda:1"),
    ],
)
def test_what_needs_a_device_says_so(no_cuda, call, what):
    with pytest.raises(RuntimeError) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"{what} needs CUDA, but CUDA is not available: cupy is not installed (test)")
    assert "pip install 'kiln[cuda]' cupy-cuda13x" in message and "cupy-cuda12x" in message
    assert isinstance(info.value, kiln.cuda.CudaUnavailable)


def test_mixed_devices_raise_pytorchs_error():
    # a tensor that claims cuda:0 over host memory stands in for a GPU tensor: the device check
    # comes before any kernel runs
    from kiln.frontend.tensor import make_tensor

    fake = make_tensor(np.ones(3, np.float32), device("cuda:0"))
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, but found at least "
                                           r"two devices, cpu and cuda:0! \(in add"):  # fmt: skip
        kiln.ones(3) + fake


class _Pool:
    """cupy's pool as the allocator sees it: malloc, and the byte counts it reports."""

    def __init__(self) -> None:
        self.live, self.freed = 0, 0

    def malloc(self, nbytes):
        self.live += 1
        return _Memory(self)

    def total_bytes(self):
        return 4096

    def free_bytes(self):
        return 1024

    def free_all_blocks(self):
        self.freed += 1


class _Memory:
    def __init__(self, pool) -> None:
        self.pool = pool

    def __del__(self):
        self.pool.live -= 1


def test_caching_allocator_accounts_rounded_live_bytes_and_the_peak():
    pool = _Pool()
    allocator = cuda_allocator.CachingAllocator(pool, lambda block, size: block)
    a = allocator.malloc(1)  # rounded to 512
    b = allocator.malloc(513)  # 1024
    assert allocator.stats()["allocated_bytes"] == 1536 and allocator.stats()["live_blocks"] == 2
    del a
    gc.collect()
    assert allocator.allocated == 1024 and allocator.peak == 1536 and pool.live == 1  # back to the pool
    allocator.reset_peak()
    assert allocator.peak == 1024
    c = allocator.malloc(4096)
    assert allocator.peak == 1024 + 4096
    del b, c
    gc.collect()
    assert allocator.allocated == 0 and pool.live == 0 and allocator.stats()["allocations"] == 3
    allocator.empty_cache()
    assert pool.freed == 1
    summary = allocator.summary()
    assert "Peak allocated memory" in summary and "5.0 KiB" in summary and "4.0 KiB" in summary


@pytest.mark.parametrize("nbytes, rounded", [(0, 512), (1, 512), (512, 512), (513, 1024), (10**6, 1000448)])
def test_sizes_round_up_to_512_bytes(nbytes, rounded):
    assert cuda_allocator.round_size(nbytes) == rounded


def test_floored_division_composed_for_cupy_equals_numpys_on_special_values():
    # cupy's own floor_divide and remainder differ from numpy's on inf, nan and zero; the composition
    # its eager kernels use is checked here against numpy on numpy arrays, bit for bit (sign of zero too)
    from kiln.ir.primitives.elementwise import _float_divmod

    special = [0.0, -0.0, 1.0, -1.0, 2.5, -7.0, 0.1, -0.1, 1e-30, 1e30, -1e30, 5e-324, 1.7e308, np.inf, -np.inf, np.nan]
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        grid = np.meshgrid(np.array(special).astype(dtype), np.array(special).astype(dtype))
        spread = [(rng.standard_normal(2000) * 10.0 ** rng.integers(-5, 6, 2000)).astype(dtype) for _ in range(2)]
        for a, b in (grid, spread):
            with np.errstate(all="ignore"):
                got = _float_divmod(np, a, b)
                expected = np.floor_divide(a, b), np.remainder(a, b)
            for g, e in zip(got, expected, strict=True):
                assert g.dtype == dtype
                np.testing.assert_array_equal(g, e)
                np.testing.assert_array_equal(np.signbit(g), np.signbit(e))
