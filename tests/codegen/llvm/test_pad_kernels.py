"""``pad`` compiled as a function of its own (kiln/codegen/llvm/pad.py) against its eager kernel, and in
a compiled convolution's step against eager."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.codegen.llvm import Unsupported
from kiln.codegen.llvm import pad as pad_code
from kiln.codegen.llvm.kernels import KernelModule
from kiln.ir import dtypes as dt
from kiln.ir.graph import GraphBuilder, Node
from kiln.ir.primitives import PRIMITIVES
from kiln.ir.types import TensorType
from tests.codegen.llvm.test_kernels import compile_kernel, run

rng = np.random.default_rng(3)


def _pad_node(shape, low, high, value=0.0, dtype=dt.float32, interior=None) -> Node:
    b = GraphBuilder()
    x = b.input(TensorType(tuple(shape), dtype))
    attrs = {"low": low, "high": high, "interior": interior or (0,) * len(shape), "value": value}
    return b.build([b.node("pad", [x], attrs)]).nodes[0]


def _eager(node: Node, x: np.ndarray) -> np.ndarray:
    return PRIMITIVES["pad"].eager(np, x, **node.attrs)


CASES = [
    ((32, 8, 14, 14), (0, 0, 1, 1), (0, 0, 1, 1), 0.0),  # a CNN's convolution input
    ((3, 5, 6, 7), (0, 0, 2, 3), (0, 0, 1, 0), -0.0),  # uneven margins, negative zero
    ((4, 70), (2, 0), (1, 5), -1.5),  # rows past one vector, padding in the leading dim
    ((5,), (3,), (0,), 2.0),  # one row
    ((2, 3, 4), (1, 2, 0), (0, 1, 2), float("inf")),
    ((2, 0, 3), (0, 1, 1), (0, 1, 1), 1.0),  # an empty input: every row is the value
]


@pytest.mark.parametrize(("shape", "low", "high", "value"), CASES)
@pytest.mark.parametrize("dtype", [dt.float32, dt.float64])
def test_pad_matches_its_eager_kernel(shape, low, high, value, dtype):
    node = _pad_node(shape, low, high, value, dtype)
    x = rng.standard_normal(shape).astype(dtype.np)
    transposed = np.ascontiguousarray(x.T).T  # the same values through reversed strides
    for array in (x, transposed, x[..., ::-1] if x.ndim and x.shape[-1] > 1 else x):
        (out,) = run(node, [array])
        np.testing.assert_array_equal(out, _eager(node, array))
        assert np.signbit(out).tolist() == np.signbit(_eager(node, array)).tolist()


def test_units_run_separately_give_the_same_result():
    node = _pad_node((40, 3, 30, 30), (0, 1, 2, 2), (0, 1, 2, 2))
    x = rng.standard_normal((40, 3, 30, 30)).astype(np.float32)
    info, _, _ = compile_kernel(node, [x])
    assert info.extent > 2
    (out,) = run(node, [x], ranges=[(0, 1), (1, 2), (2, info.extent)])
    np.testing.assert_array_equal(out, _eager(node, x))


@pytest.mark.parametrize(
    ("node", "why"),
    [
        (_pad_node((3, 4), (1, 1), (1, 1), interior=(1, 0)), "interior"),
        (_pad_node((3, 4), (1, 1), (1, 1), dtype=dt.int32), "int32"),
        (_pad_node((), (), ()), "0-d"),
    ],
)
def test_pads_it_does_not_compile_run_on_their_eager_kernel_unreported(node, why):
    assert why in pad_code.compilable(node)
    assert pad_code.eager_by_choice(node) is not None  # pads were always eager: no fallback to say
    with pytest.raises(Unsupported, match=why):
        KernelModule().add(node, [(1,) * len(node.inputs[0].type.shape)])


def test_a_compiled_convolution_step_pads_on_the_compiled_kernel_and_matches_eager(monkeypatch):
    monkeypatch.setenv("KILN_JIT_STRICT", "1")
    conv = kiln.nn.Conv2d(3, 4, 3, padding=1)

    def step(x):
        conv.zero_grad()
        y = conv(x)
        (y * y).sum().backward()
        return y.detach(), conv.weight.grad.clone()

    compiled = kiln.compile(step, fullgraph=True, wait=True)
    for call in range(3):
        x = kiln.tensor(rng.standard_normal((5, 3, 9, 9)).astype(np.float32))
        expected = [t.numpy().copy() for t in step(x)]
        with kiln.profiler.profile() as prof:
            actual = [t.numpy() for t in compiled(x)]
        for a, e in zip(actual, expected, strict=True):
            np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4)
        names = {e.key for e in prof.key_averages()}
        if call:
            assert "compiled pad" in names and "extern pad" not in names, sorted(names)
