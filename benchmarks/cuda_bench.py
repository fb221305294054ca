"""The GPU workloads of ``python -m benchmarks.run --device cuda`` (issue 13).

- ``cuda_overhead``: eager per-op overhead on tiny tensors, kiln (cupy) vs PyTorch CUDA;
- ``cuda_kernels``: compiled GELU and softmax over 16M floats against a device-to-device copy of
  the same bytes (the bandwidth a kernel that reads and writes each element once can reach;
  target: at least 80% of it, kiln/copy <= 1.25), with PyTorch eager and torch.compile beside;
- ``cuda_train``: the MLP and GPT training steps compiled vs PyTorch eager and torch.compile
  (target: faster than PyTorch eager);
- ``cuda_allocator``: the first training iteration (cold caching allocator: cudaMalloc) against
  the steady state (every block reused), as in the paper's section 6.2;
- ``cuda_async``: the host's time to queue 1000 small ops against the device's time to run them
  (the host runs ahead: the first is the smaller).

Every timed statement ends with ``kiln.cuda.synchronize()`` (or torch's), so device time counts.
Without a GPU every workload reports itself skipped, saying why.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

import kiln

from . import models
from .common import KILN, Result, Target, close, one_shot, optional_import, side_by_side, skipped, torch_compile_or_why

NO_GPU = ("skipped: no CUDA device (kiln.cuda.is_available() is False); run on an NVIDIA GPU after "
          "`pip install 'kiln[cuda13]'` (or kiln[cuda12])")  # fmt: skip
COPY = "d2d copy"

TARGETS = [
    Target("cuda_kernels", "gelu 16M f32", COPY, max_ratio=1.25),
    Target("cuda_kernels", "softmax 4096x4096 f32", COPY, max_ratio=1.25),
    Target("cuda_train", "mlp step b256", "torch", max_ratio=1.0),
    Target("cuda_train", "gpt step", "torch", max_ratio=1.0),
]


def _no_gpu(workload: str) -> list[Result] | None:
    return None if kiln.cuda.is_available() else [skipped(workload, "(whole workload)", KILN, NO_GPU)]


def _torch_cuda():
    """torch when it has CUDA, else the reason its references are skipped."""
    torch = optional_import("torch")
    if torch is None:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "this torch has no CUDA"
    return torch, ""


def _synced(call: Callable[[], object], sync: Callable[[], None]) -> Callable[[], object]:
    def run():
        out = call()
        sync()
        return out

    return run


def _kiln_synced(call):
    return _synced(call, kiln.cuda.synchronize)


# ----------------------------------------------------------------------------- eager overhead
def run_overhead(quick: bool = False) -> list[Result]:
    if (skip := _no_gpu("cuda_overhead")) is not None:
        return skip
    torch, why = _torch_cuda()
    a, b = kiln.ones(4, device="cuda"), kiln.ones(4, device="cuda")
    builders: dict = {KILN: lambda: _kiln_synced(lambda: [a + b for _ in range(100)])}
    if torch is None:
        builders["torch"] = why
    else:
        ta, tb = torch.ones(4, device="cuda"), torch.ones(4, device="cuda")
        builders["torch"] = lambda: _synced(lambda: [ta + tb for _ in range(100)], torch.cuda.synchronize)
    return side_by_side("cuda_overhead", "100 x add f32[4]", builders, quick=quick,
                        notes=lambda impl, t: f"{t.median_ns / 100 / 1e3:.1f} us per op")  # fmt: skip


# ----------------------------------------------------------------------------- bandwidth
def _bandwidth_case(case: str, fn_name: str, shape: tuple, quick: bool) -> list[Result]:
    torch, why = _torch_cuda()
    import cupy as cp  # noqa: PLC0415 - present wherever kiln.cuda.is_available()

    if quick:
        shape = tuple(max(1, n // 16) for n in shape)
    host = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x = kiln.tensor(host, device="cuda")
    nbytes = 2 * host.nbytes  # read once, written once

    def kiln_fn(t):
        return kiln.nn.functional.gelu(t) if fn_name == "gelu" else t.softmax(-1)

    def verify(call) -> str:
        expected = kiln_fn(kiln.tensor(host)).numpy()
        return close(call().cpu().numpy(), expected, rtol=1e-5, atol=1e-6)

    src, dst = cp.asarray(host), cp.empty_like(cp.asarray(host))
    compiled = kiln.compile(kiln_fn)
    builders: dict = {
        KILN: lambda: _kiln_synced(lambda: compiled(x)),
        COPY: lambda: _synced(lambda: cp.copyto(dst, src), cp.cuda.runtime.deviceSynchronize),
    }
    if torch is None:
        builders["torch"] = builders["torch.compile"] = why
    else:
        tx = torch.from_numpy(host).cuda()
        tf = (lambda t: torch.nn.functional.gelu(t)) if fn_name == "gelu" else (lambda t: torch.softmax(t, -1))
        builders["torch"] = lambda: _synced(lambda: tf(tx), torch.cuda.synchronize)
        tc = torch_compile_or_why(torch)

        def torch_compiled():
            compiled_tf = torch.compile(tf)
            return _synced(lambda: compiled_tf(tx), torch.cuda.synchronize)

        builders["torch.compile"] = tc or torch_compiled
    return side_by_side("cuda_kernels", case, builders, quick=quick, verify=verify, params={"shape": list(shape)},
                        notes=lambda impl, t: f"{nbytes / t.median_ns:.0f} GB/s")  # fmt: skip


def run_kernels(quick: bool = False) -> list[Result]:
    if (skip := _no_gpu("cuda_kernels")) is not None:
        return skip
    return (_bandwidth_case("gelu 16M f32", "gelu", (1 << 24,), quick)
            + _bandwidth_case("softmax 4096x4096 f32", "softmax", (4096, 4096), quick))  # fmt: skip


# ----------------------------------------------------------------------------- training steps
def _mlp_step(lib, device, batch: int, compiled: bool):
    lib.manual_seed(0)
    model = models.mlp(lib).to(device)
    optimizer = lib.optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    x = lib.from_numpy(rng.standard_normal((batch, models.MLP_SIZES[0])).astype(np.float32)).to(device)
    y = lib.from_numpy(rng.integers(0, 10, batch)).to(device)
    step = models.train_step(lib, model, optimizer, x, y)
    if lib is kiln:
        return kiln.compile(step) if compiled else step
    return lib.compile(step) if compiled else step


def _gpt_step(lib, device, compiled: bool, quick: bool):
    lib.manual_seed(0)
    context = 64 if quick else 256
    model = models.gpt(lib, vocab=512, d=256, heads=4, layers=4, context=context).to(device)
    rng = np.random.default_rng(0)
    idx, targets = (lib.from_numpy(rng.integers(0, 512, (16, context))).to(device) for _ in range(2))
    step = models.forward_backward(lib, model, idx, targets)
    if lib is kiln:
        return kiln.compile(step) if compiled else step
    return lib.compile(step) if compiled else step


def _train_builders(make, torch, why) -> dict:
    builders: dict = {KILN: lambda: _kiln_synced(make(kiln, "cuda", True)),
                      "kiln eager": lambda: _kiln_synced(make(kiln, "cuda", False))}  # fmt: skip
    if torch is None:
        builders["torch"] = builders["torch.compile"] = why
    else:
        builders["torch"] = lambda: _synced(make(torch, "cuda", False), torch.cuda.synchronize)
        tc = torch_compile_or_why(torch)
        builders["torch.compile"] = tc or (lambda: _synced(make(torch, "cuda", True), torch.cuda.synchronize))
    return builders


def run_train(quick: bool = False) -> list[Result]:
    if (skip := _no_gpu("cuda_train")) is not None:
        return skip
    torch, why = _torch_cuda()
    batch = 64 if quick else 256
    mlp = _train_builders(lambda lib, dev, c: _mlp_step(lib, dev, batch, c), torch, why)
    gpt = _train_builders(lambda lib, dev, c: _gpt_step(lib, dev, c, quick), torch, why)
    return (side_by_side("cuda_train", "mlp step b256", mlp, quick=quick)
            + side_by_side("cuda_train", "gpt step", gpt, quick=quick))  # fmt: skip


# ----------------------------------------------------------------------------- allocator and asynchrony
def run_allocator(quick: bool = False) -> list[Result]:
    """The first eager MLP step after ``empty_cache`` (every block from cudaMalloc) vs later steps."""
    if (skip := _no_gpu("cuda_allocator")) is not None:
        return skip
    step = _kiln_synced(_mlp_step(kiln, "cuda", 64 if quick else 256, False))
    kiln.cuda.empty_cache()
    start = time.perf_counter_ns()
    step()
    first = time.perf_counter_ns() - start
    samples = []
    for _ in range(5 if quick else 20):
        start = time.perf_counter_ns()
        step()
        samples.append(time.perf_counter_ns() - start)
    reserved = kiln.cuda.memory_reserved()
    return [Result("cuda_allocator", "mlp eager step", "first iteration", one_shot([first])),
            Result("cuda_allocator", "mlp eager step", "steady state", one_shot(samples),
                   note=f"{reserved / 2**20:.1f} MiB reserved")]  # fmt: skip


def run_async(quick: bool = False) -> list[Result]:
    """Host time to queue 1000 elementwise ops on a 1M-element tensor vs the device's time for them."""
    if (skip := _no_gpu("cuda_async")) is not None:
        return skip
    x = kiln.ones(1 << (16 if quick else 20), device="cuda")
    kiln.cuda.synchronize()
    host, device = [], []
    for _ in range(3 if quick else 10):
        start = time.perf_counter_ns()
        y = x
        for _ in range(1000):
            y = y * 1.0001
        queued = time.perf_counter_ns()
        kiln.cuda.synchronize()
        done = time.perf_counter_ns()
        host.append(queued - start)
        device.append(done - start)
    return [Result("cuda_async", "1000 x mul f32[1M]", "host queues", one_shot(host)),
            Result("cuda_async", "1000 x mul f32[1M]", "device runs", one_shot(device))]  # fmt: skip
