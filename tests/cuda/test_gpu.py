"""CUDA on a real GPU (marked ``cuda``: skipped where kiln.cuda.is_available() is False).

Eager CUDA tensors against the CPU on the same inputs: every primitive's eager kernel over cupy
(the registry walked as tests/ir/test_registry.py walks it), autograd, nn + optim, moving between
devices, save/load with ``map_location``, DLPack; and the ``kiln.cuda`` API: streams, events,
seeding (the device's Philox numbers are the CPU's), the caching allocator's statistics.
Run them with ``python -m pytest -m cuda`` on a machine with an NVIDIA GPU and cupy.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.frontend.dispatch import apply
from tests.conftest import assert_close, tol
from tests.ir.test_registry import PRIMS, kiln_args, samples_of

pytestmark = pytest.mark.cuda


def _cuda(t):
    return t.to("cuda")


@pytest.mark.parametrize("prim", PRIMS, ids=lambda p: p.name)
def test_every_primitive_on_cuda_gives_the_cpus_result(prim):
    for sample in samples_of(prim):
        args = kiln_args(sample, np.float32)
        expected = apply(prim, *args, **sample.attrs)
        got = apply(prim, *[_cuda(a) for a in args], **sample.attrs)
        assert got.device == kiln.device("cuda:0"), prim.name
        assert got.dtype is expected.dtype and tuple(got.shape) == tuple(expected.shape), prim.name
        assert_close(got.cpu(), expected, **tol(expected.dtype))


def test_moving_between_devices_keeps_values_and_dtypes():
    for dtype in (kiln.float32, kiln.float64, kiln.int64, kiln.int8, kiln.bool):
        x = kiln.arange(12).reshape(3, 4).to(dtype)
        y = x.cuda()
        assert y.is_cuda and y.dtype is dtype and y.device == kiln.device("cuda:0")
        assert y.cpu().tolist() == x.tolist() and y.to("cpu").device == kiln.device("cpu")
        assert x.to("cuda:0").t().contiguous().cpu().tolist() == x.t().tolist()


def test_mixed_devices_raise_pytorchs_error():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least two"):
        kiln.ones(3) + kiln.ones(3, device="cuda")


def test_a_zero_dim_cpu_tensor_goes_with_cuda_tensors_as_in_pytorch():
    # PyTorch treats a 0-d CPU tensor as a scalar beside tensors of another device (an optimizer's
    # step size); anything larger stays an error, and so do non-elementwise ops
    x = kiln.arange(4.0, device="cuda", requires_grad=True)
    s = kiln.tensor(3.0, dtype=kiln.float64, requires_grad=True)
    y = (s * x) - kiln.tensor(1.0)
    assert y.is_cuda and y.dtype is kiln.float32 and y.cpu().tolist() == [-1.0, 2.0, 5.0, 8.0]
    y.sum().backward()
    assert s.grad.device == kiln.device("cpu") and s.grad.item() == 6.0
    assert x.grad.cpu().tolist() == [3.0] * 4
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        kiln.ones(2, device="cuda") + kiln.ones(1)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        kiln.ones(2, 2, device="cuda") @ kiln.ones(2, 2)


def test_autograd_on_cuda_matches_the_cpu():
    x = np.random.default_rng(0).standard_normal((4, 5))
    grads = []
    for device in ("cpu", "cuda"):
        t = kiln.tensor(x, device=device, requires_grad=True)
        (t.tanh() * t.exp()).sum().backward()
        grads.append(t.grad.cpu())
    assert_close(grads[1], grads[0], rtol=1e-12, atol=1e-12)


def test_nn_and_optim_on_cuda_match_the_cpu():
    losses = []
    for device in ("cpu", "cuda"):
        kiln.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
        opt = kiln.optim.Adam(model.parameters(), lr=0.01)
        rng = np.random.default_rng(1)
        run = []
        for _ in range(3):
            x = kiln.tensor(rng.standard_normal((5, 8)).astype(np.float32), device=device)
            y = kiln.tensor(rng.integers(0, 3, 5), device=device)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)


def test_save_and_load_with_map_location(tmp_path):
    x = kiln.randn(3, 4, device="cuda")
    path = tmp_path / "x.kiln"
    kiln.save({"x": x}, path)
    on_cpu = kiln.load(path, map_location="cpu")["x"]
    assert on_cpu.device == kiln.device("cpu") and on_cpu.tolist() == x.cpu().tolist()
    back = kiln.load(path, map_location="cuda")["x"]
    assert back.is_cuda and back.cpu().tolist() == x.cpu().tolist()


def test_dlpack_round_trip_with_cupy():
    cp = pytest.importorskip("cupy")
    x = kiln.arange(6.0, device="cuda")
    view = cp.from_dlpack(x)
    view[0] = 42
    assert x.cpu().tolist()[0] == 42.0
    assert kiln.from_dlpack(view).data_ptr() == x.data_ptr()


def test_cuda_generator_gives_the_cpus_numbers():
    kiln.manual_seed(7)
    kiln.cuda.manual_seed(7)
    assert_close(kiln.randn(1000, device="cuda").cpu(), kiln.randn(1000), rtol=1e-6, atol=1e-6)


def test_device_queries():
    assert kiln.cuda.is_available() and kiln.cuda.device_count() >= 1
    assert isinstance(kiln.cuda.get_device_name(), str) and kiln.cuda.get_device_name(0)
    assert kiln.cuda.get_device_capability()[0] >= 3
    assert kiln.cuda.current_device() == 0


def test_streams_and_events():
    s = kiln.cuda.Stream()
    x = kiln.ones(1 << 20, device="cuda")
    start, end = kiln.cuda.Event(enable_timing=True), kiln.cuda.Event(enable_timing=True)
    with kiln.cuda.stream(s):
        assert kiln.cuda.current_stream() == s
        start.record()
        y = (x * 3).sum()
        end.record()
    assert kiln.cuda.current_stream() != s
    end.synchronize()
    s.synchronize()
    assert s.query() and end.query()
    assert start.elapsed_time(end) > 0
    assert y.item() == 3 * (1 << 20)
    with pytest.raises(RuntimeError, match="enable_timing"):
        kiln.cuda.Event().elapsed_time(end)
    kiln.cuda.synchronize()


def test_memory_statistics_follow_tensors():
    kiln.cuda.synchronize()
    kiln.cuda.empty_cache()
    kiln.cuda.reset_peak_memory_stats()
    base = kiln.cuda.memory_allocated()
    x = kiln.empty(1000, device="cuda")  # 4000 bytes -> 4096
    assert kiln.cuda.memory_allocated() - base == 4096
    assert kiln.cuda.max_memory_allocated() >= base + 4096
    assert kiln.cuda.memory_reserved() >= kiln.cuda.memory_allocated()
    del x
    assert kiln.cuda.memory_allocated() == base
    kiln.cuda.reset_peak_memory_stats()
    assert kiln.cuda.max_memory_allocated() == base
    y = kiln.empty(1000, device="cuda")  # the freed block, reused at once
    del y
    kiln.cuda.empty_cache()
    assert "Peak allocated memory" in kiln.cuda.memory_summary()
