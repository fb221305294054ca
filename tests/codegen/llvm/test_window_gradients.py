"""Max pooling's backward as a compiled elementwise kernel: over a refined domain (kiln/codegen/plans.py)
with the window's offsets unrolled inside a forced vector loop of the row's windows
(kiln/codegen/llvm/elementwise.py: ``_window_lanes``), against the interpreter and against eager."""

from __future__ import annotations

import platform

import numpy as np
import pytest

import kiln
from kiln.codegen import index as ix
from kiln.codegen.llvm import engine
from kiln.codegen.llvm.elementwise import WINDOW_LANES, _window_lanes
from kiln.codegen.llvm.kernels import KernelModule
from kiln.codegen.plans import elementwise_plan
from kiln.ir import dtypes as dt
from kiln.ir.graph import Graph, GraphBuilder
from kiln.ir.types import TensorType
from tests.codegen.llvm.test_kernels import check, kernel

rng = np.random.default_rng(7)


def T(shape, dtype=dt.float32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def _pool_backward_body(n: int, c: int, h: int, k: int) -> Graph:
    """A CNN step's fused max pooling backward, ReLU's mask and BatchNorm's products: each window's
    gradient ``g`` at the offset ``idx`` names, read as the (n, c, h*k, h*k) input, masked, times the
    input ``x`` and a per-channel scale ``s``."""
    b = GraphBuilder()
    g, idx = b.input(T((n, c, h, h))), b.input(T((n, c, h, h), dt.int32))
    win, mask = b.input(T((1, 1, 1, k, 1, k), dt.int32)), b.input(T((n, c, h * k, h * k), dt.bool_))
    x, s = b.input(T((n, c, h * k, h * k))), b.input(T((1, c, 1, 1)))
    window = (n, c, h, 1, h, 1)
    zero = b.constant(np.zeros((), np.float32), T(()))
    hit = b.node("eq", [win, b.node("reshape", [idx], {"shape": window})])
    spread = b.node("where", [hit, b.node("reshape", [g], {"shape": window}), zero])
    grad = b.node("where", [mask, zero, b.node("reshape", [spread], {"shape": (n, c, h * k, h * k)})])
    return b.build([grad, b.node("mul", [grad, x]), b.node("mul", [grad, s])])


def _pool_backward_arrays(n: int, c: int, h: int, k: int) -> list[np.ndarray]:
    side = h * k
    return [
        rng.standard_normal((n, c, h, h)).astype(np.float32),
        rng.integers(0, k * k, (n, c, h, h)).astype(np.int32),
        np.arange(k * k, dtype=np.int32).reshape(1, 1, 1, k, 1, k),
        rng.random((n, c, side, side)) < 0.3,
        rng.standard_normal((n, c, side, side)).astype(np.float32),
        rng.standard_normal((1, c, 1, 1)).astype(np.float32),
    ]


def _layouts(arrays) -> list[tuple[int, ...]]:
    return [tuple(s // a.itemsize for s in a.strides) for a in arrays]


@pytest.mark.parametrize(("h", "k"), [(14, 2), (7, 2), (5, 2), (4, 2), (3, 2), (5, 3), (4, 4), (9, 1)])
def test_pool_backward_matches_the_interpreter(h, k):
    """Rows of 14 down to 3 windows (forced vector loops of 4 lanes with scalar remainders of 0 to 3,
    and a row too short to force), windows of 2 to 4 offsets, and none (k = 1: no split)."""
    arrays = _pool_backward_arrays(3, 5, h, k)
    body = _pool_backward_body(3, 5, h, k)
    (grad, *_) = check(body, arrays, rtol=0, atol=0)  # selects and products: exact
    assert (grad != 0).any()
    info = KernelModule().add(kernel("elementwise", body), _layouts(arrays))
    check(body, arrays, rtol=0, atol=0, ranges=[(0, 1), (1, info.extent)])  # units run separately


def test_the_row_of_windows_is_a_forced_vector_loop():
    body = _pool_backward_body(4, 8, 14, 2)
    plan = elementwise_plan(body, _layouts(_pool_backward_arrays(4, 8, 14, 2)))
    assert _window_lanes(plan, plan.sizes) == WINDOW_LANES
    long_rows = _pool_backward_body(2, 2, 32, 2)  # 32 windows a row: LLVM vectorizes it unforced
    plan = elementwise_plan(long_rows, _layouts(_pool_backward_arrays(2, 2, 32, 2)))
    assert _window_lanes(plan, plan.sizes) is None


def test_a_row_whose_window_offsets_read_one_element_is_not_forced():
    """Both offsets of a window reading the window's first element: a stride-2 load the same for each
    offset, which LLVM widens only into gathers (slower than the scalar loop)."""
    b = GraphBuilder()
    x = b.input(T((2, 3, 14, 2, 14, 2)))
    first = b.node("slice", [x], {"starts": (0,) * 6, "stops": (2, 3, 14, 1, 14, 1), "steps": (1,) * 6})
    body = b.build([b.node("sub", [x, first])])
    plan = elementwise_plan(body, [ix.contiguous_strides(x.type.shape)])
    assert plan.sizes[-2:] == [14, 2] and _window_lanes(plan, plan.sizes) is None
    check(body, [rng.standard_normal((2, 3, 14, 2, 14, 2)).astype(np.float32)], rtol=0, atol=0)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="looks for x86-64 vector registers")
def test_pool_backward_uses_packed_vector_instructions():
    if "avx" not in engine.host_signature():
        pytest.skip("the host has no AVX")
    module = KernelModule()
    module.add(kernel("elementwise", _pool_backward_body(4, 8, 14, 2)), _layouts(_pool_backward_arrays(4, 8, 14, 2)))
    assembly = engine.assembly(module.ir())
    packed = [line for line in assembly.splitlines() if "ps\t" in line and ("%ymm" in line or "%zmm" in line)]
    assert packed, "the pool's backward runs scalar"


@pytest.mark.parametrize("side", [28, 14, 12])
def test_compiled_max_pool_backward_matches_eager_over_calls(side, monkeypatch):
    """Max pooling after ReLU, its gradient through a per-channel scale, compiled against eager on
    fresh inputs each call (every kernel compiled: a kernel LLVM declines raises)."""
    monkeypatch.setenv("KILN_JIT_STRICT", "1")
    F = kiln.nn.functional

    def step(x, scale, w):
        scale.grad = None
        y = F.max_pool2d(F.relu(x * scale), 2)
        (y * w).sum().backward()
        return scale.grad.clone(), y.detach()

    compiled = kiln.compile(step, fullgraph=True, wait=True)
    scale = kiln.tensor(rng.standard_normal((1, 6, 1, 1)).astype(np.float32), requires_grad=True)
    for _ in range(3):
        x = kiln.tensor(rng.standard_normal((4, 6, side, side)).astype(np.float32))
        w = kiln.tensor(rng.standard_normal((4, 6, side // 2, side // 2)).astype(np.float32))
        expected = [t.numpy().copy() for t in step(x, scale, w)]
        actual = [t.numpy() for t in compiled(x, scale, w)]
        for a, e in zip(actual, expected, strict=True):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)
