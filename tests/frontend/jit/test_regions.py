"""Composite regions (``kiln.jit.composite``): what a trace records of each composite op's call."""

from __future__ import annotations

import numpy as np

import kiln
import kiln.nn.functional as F


@kiln.jit.composite("scaled_tanh")
def scaled_tanh(x, scale=2.0, *, shift=None):
    out = kiln.tanh(x) * scale
    return out if shift is None else out + shift


def test_a_region_names_arguments_and_results():
    x, shift = kiln.randn(3), kiln.randn(3)
    program = kiln.export(lambda a, b: scaled_tanh(a, 0.5, shift=b) * 3, x, shift)
    (region,) = program.regions
    assert region.name == "scaled_tanh"
    assert region.arguments["x"] is program.graph.inputs[0] and region.arguments["shift"] is program.graph.inputs[1]
    assert region.arguments["scale"] == 0.5
    (out,) = region.outputs
    mul = next(n for n in program.traced.nodes if n.op == "mul" and out in n.inputs)  # the * 3 reads the result
    assert mul.output.type.shape == (3,)
    assert "test_regions.py" in region.loc.filename
    # compiled tanh may differ from eager's by an ulp (seen at 4.5e-8 for some inputs)
    want = (scaled_tanh(x, 0.5, shift=shift) * 3).numpy()
    np.testing.assert_allclose(program(x, shift).numpy(), want, rtol=1e-6, atol=1e-7)


def test_nested_regions_are_recorded_inner_first():
    layer = kiln.nn.Linear(4, 2)
    program = kiln.export(lambda x: F.softmax(layer(x), dim=-1), kiln.randn(5, 4))
    assert [r.name for r in program.regions] == ["linear", "softmax"]
    assert program.regions[0].outputs[0] is program.regions[1].arguments["input"]


def test_outside_a_trace_the_function_runs_as_it_is():
    x = kiln.randn(4)
    np.testing.assert_allclose(scaled_tanh(x).numpy(), (kiln.tanh(x) * 2.0).numpy())
    assert scaled_tanh.__name__ == "scaled_tanh" and scaled_tanh.__wrapped__ is not None


def test_compiled_calls_are_unchanged():
    compiled = kiln.compile(lambda x: scaled_tanh(x, 3.0))
    for _ in range(3):
        x = kiln.randn(6)
        np.testing.assert_allclose(compiled(x).numpy(), (kiln.tanh(x) * 3.0).numpy(), rtol=1e-6)
