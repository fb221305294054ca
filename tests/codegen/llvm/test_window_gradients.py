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
from kiln.codegen.llvm.elementwise import WINDOW_LANES, _short_row_lanes, _window_lanes
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


def _vector_code(body: Graph, layouts) -> tuple[int, int]:
    """The kernel's packed vector loads and stores, and its gathers and scatters, in its x86-64 assembly."""
    module = KernelModule()
    module.add(kernel("elementwise", body), layouts)
    lines = [line.split(None, 1) for line in engine.assembly(module.ir()).splitlines() if "\t" in line]
    moves = [ops for op, *ops in lines if op.startswith(("vmovups", "vmovaps", "vmovdqu")) and ops]
    packed = sum(1 for (ops,) in moves if "(%" in ops and any(r in ops for r in ("%xmm", "%ymm", "%zmm")))
    return packed, sum(1 for op, *_ in lines if "gather" in op or "scatter" in op)


needs_avx = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or "avx" not in engine.host_signature(),
    reason="reads x86-64 AVX assembly",
)


@needs_avx
def test_pool_backward_uses_packed_vector_instructions():
    """On main it ran scalar: 12 instructions an element."""
    packed, gathers = _vector_code(_pool_backward_body(4, 8, 14, 2), _layouts(_pool_backward_arrays(4, 8, 14, 2)))
    assert packed and not gathers


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


def _pool_forward_body(n: int, c: int, h: int, separate: bool = False) -> Graph:
    """Max pooling's forward as a CNN's step fuses it: each window's four elements sliced from the
    (n, c, 2h, 2h) input, their maximum and which offset holds it (the last one that does). With
    ``separate``, the four slices are inputs of their own (strided views the kernel gets as pointers)."""
    b = GraphBuilder()
    window = (n, c, h, 1, h, 1)
    if separate:
        parts = [b.node("reshape", [b.input(T(window))], {"shape": (n, c, h, h)}) for _ in range(4)]
    else:
        x = b.node("reshape", [b.input(T((n, c, 2 * h, 2 * h)))], {"shape": (n, c, h, 2, h, 2)})
        parts = []
        for a in (0, 1):
            for d in (0, 1):
                piece = b.node("slice", [x], {"starts": (0, 0, 0, a, 0, d), "stops": (n, c, h, a + 1, h, d + 1),
                                              "steps": (1,) * 6})  # fmt: skip
                parts.append(b.node("reshape", [piece], {"shape": (n, c, h, h)}))
    top = b.node("maximum", [b.node("maximum", [parts[0], parts[1]]), b.node("maximum", [parts[2], parts[3]])])
    which = b.constant(np.zeros((), np.int32), T((), dt.int32))
    for k, part in enumerate(parts[1:], start=1):
        which = b.node("where", [b.node("eq", [part, top]), b.constant(np.array(k, np.int32), T((), dt.int32)), which])
    return b.build([top, which])


@pytest.mark.parametrize("h", [15, 14, 8, 7, 4])
def test_pool_forward_matches_the_interpreter(h):
    """Rows of 15 to 8 windows (a forced vector loop of 4 lanes, scalar remainders of 3 to 0) and
    rows of 7 and 4 (scalar: ``_short_row_lanes`` declines them)."""
    x = rng.standard_normal((3, 5, 2 * h, 2 * h)).astype(np.float32)
    body = _pool_forward_body(3, 5, h)
    top, which = check(body, [x], rtol=0, atol=0)
    windows = x.reshape(3, 5, h, 2, h, 2).transpose(0, 1, 2, 4, 3, 5).reshape(3, 5, h, h, 4)
    np.testing.assert_array_equal(top, windows.max(axis=-1))
    assert set(np.unique(which)) == {0, 1, 2, 3}
    plan = elementwise_plan(body, [ix.contiguous_strides(x.shape)])
    assert _short_row_lanes(plan, plan.sizes) == (WINDOW_LANES if h >= 8 else None)


def test_strided_loads_of_separate_operands_keep_the_row_scalar():
    """Each slice its own pointer: stride-2 loads of one offset each, which LLVM widens into gathers."""
    body = _pool_forward_body(2, 3, 14, separate=True)
    x = rng.standard_normal((2, 3, 28, 28)).astype(np.float32).reshape(2, 3, 14, 2, 14, 2)
    arrays = [x[:, :, :, a : a + 1, :, d : d + 1] for a in (0, 1) for d in (0, 1)]
    plan = elementwise_plan(body, _layouts(arrays))
    assert plan.sizes[-1] == 14 and _short_row_lanes(plan, plan.sizes) is None
    check(body, arrays, rtol=0, atol=0)


@needs_avx
def test_pool_forward_uses_packed_vector_instructions():
    """On main LLVM folded the short row's tail into masked gathers (or left it scalar)."""
    packed, gathers = _vector_code(_pool_forward_body(4, 8, 14), [(6272, 784, 28, 1)])
    assert packed and not gathers


def test_a_short_row_of_unit_stride_loads_is_left_to_llvm():
    """Rows of 8 of a padded input (DCGAN's gradient): LLVM unrolls and packs them itself, faster
    than a forced loop of 4 lanes."""
    b = GraphBuilder()
    x, padded = b.input(T((4, 3, 8, 8))), b.input(T((4, 3, 8, 8)))
    body = b.build([b.node("add", [x, padded])])
    layouts = [(192, 64, 8, 1), (300, 100, 10, 1)]
    plan = elementwise_plan(body, layouts)
    assert plan.sizes[-1] == 8 and _short_row_lanes(plan, plan.sizes) is None
    wide = rng.standard_normal((4, 3, 10, 10)).astype(np.float32)
    check(body, [rng.standard_normal((4, 3, 8, 8)).astype(np.float32), wide[:, :, 1:9, 1:9]])


def test_compiled_max_pool_backward_over_a_dynamic_batch_matches_eager(monkeypatch):
    """``dynamic=True``: the batch may be a symbol of the kernels (never split by the refinement:
    plans.py); each batch size against eager."""
    monkeypatch.setenv("KILN_JIT_STRICT", "1")
    F = kiln.nn.functional
    scale = kiln.tensor(rng.standard_normal((1, 6, 1, 1)).astype(np.float32), requires_grad=True)

    def step(x, w):
        scale.grad = None
        y = F.max_pool2d(F.relu(x * scale), 2)
        (y * w).sum().backward()
        return scale.grad.clone(), y.detach()

    compiled = kiln.compile(step, dynamic=True, wait=True)
    for batch in (4, 3, 5):
        x = kiln.tensor(rng.standard_normal((batch, 6, 14, 14)).astype(np.float32))
        w = kiln.tensor(rng.standard_normal((batch, 6, 7, 7)).astype(np.float32))
        expected = [t.numpy().copy() for t in step(x, w)]
        for a, e in zip([t.numpy() for t in compiled(x, w)], expected, strict=True):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)
