"""Whether compiled CUDA calls run compiled, and what a call costs: ``python -m benchmarks.cuda_explain``
on a GPU machine prints ``kiln.explain``'s summary (trace breaks, specializations) and the time per
call, compiled and eager, of GELU over 16M floats and of an MLP training step (batch 256, Adam)."""

from __future__ import annotations

import time

import numpy as np

import kiln
from kiln import nn


def _per_call_us(fn, calls: int = 20) -> float:
    fn()
    kiln.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    kiln.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def _report(name: str, compiled, eager, *args) -> None:
    print(kiln.explain(compiled, *args).summary())
    print(f"{name}: compiled {_per_call_us(lambda: compiled(*args)):.0f} us a call, "
          f"eager {_per_call_us(lambda: eager(*args)):.0f} us\n")  # fmt: skip


def main() -> None:
    if not kiln.cuda.is_available():
        raise SystemExit("benchmarks.cuda_explain needs a GPU: kiln.cuda.is_available() is False")
    rng = np.random.default_rng(0)
    x = kiln.tensor(rng.standard_normal(1 << 24).astype(np.float32), device="cuda")

    def gelu(t):
        return nn.functional.gelu(t)

    _report("gelu 16M f32", kiln.compile(gelu), gelu, x)

    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10)).to("cuda")
    optimizer = kiln.optim.Adam(model.parameters(), lr=1e-3)
    batch = kiln.randn(256, 784, device="cuda")
    labels = kiln.tensor(rng.integers(0, 10, 256), device="cuda")

    def step(x, y):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    _report("mlp step b256", kiln.compile(step), step, batch, labels)


if __name__ == "__main__":
    main()
