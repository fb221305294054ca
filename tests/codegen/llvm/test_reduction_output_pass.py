"""The output pass of a reduction kernel (``kiln.codegen.llvm.reduction``): what it keeps from the
passes before it (softmax's exponentials, layer norm's centered values), what it computes again, and
its divisions by a row value -- by the reciprocal where that is within 1.5 ulp, never for a quotient
an earlier pass reduced."""

from __future__ import annotations

import numpy as np

from kiln.codegen import index as ix
from kiln.codegen.llvm import reduction
from kiln.codegen.llvm.kernels import KernelModule
from kiln.ir import dtypes as dt
from kiln.ir.graph import GraphBuilder
from kiln.ir.interpreter import interpret
from tests.codegen.llvm.test_kernels import T, check, kernel, run
from tests.conftest import assert_close

rng = np.random.default_rng(7)


def _softmax_body(n: int, plus_input: bool = False):
    """softmax over rows of ``n``: max, then the sum of exp(x - max), then exp(x - max) / sum (+ x)."""
    b = GraphBuilder()
    x = b.input(T((16, n)))
    shifted = b.node("sub", [x, b.node("reduce_max", [x], {"axes": (1,), "keepdim": True})])
    e = b.node("exp", [shifted])
    out = b.node("div", [e, b.node("reduce_sum", [e], {"axes": (1,), "keepdim": True})])
    return b.build([b.node("add", [out, x]) if plus_input else out])


def _exp_calls(body) -> int:
    module = KernelModule()
    module.add(kernel("reduction", body), [(body.inputs[0].type.shape[1], 1)])
    return module.ir().count('call float @"kiln.math.exp.f32"')


def test_softmax_keeps_its_exponentials_in_the_output_and_computes_them_once():
    assert _exp_calls(_softmax_body(64)) == 1  # in the sum's pass, stored; the output pass divides
    x = rng.standard_normal((16, 64)).astype(np.float32) * 4
    check(_softmax_body(64), [x], kind="reduction", rtol=1e-6, atol=1e-7)


def test_an_output_that_reads_an_input_again_is_not_kept_early():
    # out = softmax(x) + x: the output pass reads x, which shares memory with the output when the
    # output is written in place, so nothing is stored before that pass: the exponentials are
    # computed in the sum's pass and again in the output pass (emitted twice: with the sum's
    # reciprocal and with the division, see test_a_division_by_a_row_value_...).
    assert _exp_calls(_softmax_body(64, plus_input=True)) == 3
    x = rng.standard_normal((16, 64)).astype(np.float32)
    check(_softmax_body(64, plus_input=True), [x], kind="reduction", rtol=1e-6, atol=1e-6)


def test_softmax_written_over_its_input_is_right():
    x = rng.standard_normal((16, 64)).astype(np.float32) * 3
    expected = interpret(_softmax_body(64), [x.copy()])[0]
    (out,) = run(kernel("reduction", _softmax_body(64)), [x], outputs=[x])  # the output is the input's memory
    assert out is x
    assert_close(x, expected, rtol=1e-6, atol=1e-7)


def _centered_body(n: int, plus_input: bool = False):
    """LayerNorm's rows with its drift (kiln.nn's ``_normalize``), times a weight of the row's
    shape: mean, drift, variance, then ``((x - mean) - drift) / sqrt(var) * w`` (+ y, an input of
    the output's shape that only the output pass reads)."""
    b = GraphBuilder()
    x, w = b.input(T((16, n))), b.input(T((n,)))
    y = b.input(T((16, n))) if plus_input else None

    def mean(v):
        total = b.node("reduce_sum", [v], {"axes": (1,), "keepdim": True})
        return b.node("div", [total, b.constant(np.array(n, np.float32), T(()))])

    deviation = b.node("sub", [x, mean(x)])
    centered = b.node("sub", [deviation, mean(deviation)])
    var = mean(b.node("mul", [centered, centered]))
    out = b.node("mul", [b.node("div", [centered, b.node("sqrt", [var])]), w])
    return b.build([out if y is None else b.node("add", [out, y])])


def _subtractions(body) -> int:
    module = KernelModule()
    module.add(kernel("reduction", body), [ix.contiguous_strides(v.type.shape) for v in body.inputs])
    return module.ir().count("= fsub ")


def test_layer_norm_keeps_its_centered_values_in_the_output(monkeypatch):
    # Two subtractions an element are worth a store and a load: the variance's pass stores
    # ((x - mean) - drift) into the output, and the output pass scales it (LayerNorm 4096x1024 on
    # 2 threads: 0.85x the time). The weight, of the row's shape, cannot share the output's memory.
    kept = _subtractions(_centered_body(64))
    monkeypatch.setattr(reduction, "KEEP_OPS", 10**9)
    assert kept < _subtractions(_centered_body(64))
    monkeypatch.undo()
    x, w = rng.standard_normal((16, 64)).astype(np.float32) + 100, rng.standard_normal(64).astype(np.float32)
    check(_centered_body(64), [x, w], kind="reduction", rtol=1e-5, atol=1e-5)
    expected = interpret(_centered_body(64), [x.copy(), w])[0]
    (out,) = run(kernel("reduction", _centered_body(64)), [x, w], outputs=[x])  # written over its input
    assert out is x
    assert_close(x, expected, rtol=1e-5, atol=1e-5)


def test_a_centered_output_that_reads_an_input_of_its_shape_is_not_kept_early(monkeypatch):
    # out = layer_norm(x) * w + y: the output pass reads y, which may share the output's memory
    # (here it does), so nothing is stored into the output before that pass.
    body = _centered_body(64, plus_input=True)
    kept = _subtractions(body)
    monkeypatch.setattr(reduction, "KEEP_OPS", 10**9)
    assert kept == _subtractions(body)
    monkeypatch.undo()
    x, w, y = (rng.standard_normal(s).astype(np.float32) for s in ((16, 64), (64,), (16, 64)))
    expected = interpret(body, [x, w, y.copy()])[0]
    (out,) = run(kernel("reduction", body), [x, w, y], outputs=[y])
    assert out is y
    assert_close(y, expected, rtol=1e-5, atol=1e-5)


def test_quotients_a_reduction_reads_are_stored_as_it_read_them():
    # out = (x / d, max(x / d)) with d one value a row: the max pass divides; had the output pass
    # multiplied by 1 / d, a stored quotient could differ from the one the max chose in its last bit,
    # and amax's backward, which looks for the max among the stored values, found none (0 / 0).
    b = GraphBuilder()
    x = b.input(T((50, 3), dt.float64))
    d = b.node("reduce_sum", [b.input(T((50, 3), dt.float64))], {"axes": (1,), "keepdim": True})
    q = b.node("div", [x, d])
    body = b.build([q, b.node("reduce_max", [q], {"axes": (1,), "keepdim": True})])
    xs = rng.standard_normal((50, 3))
    ys = np.full((50, 3), 1.0)  # d = 3: x / 3 and x * (1 / 3) differ in the last bit for many x
    quotients, maxima = run(kernel("reduction", body), [xs, ys])
    np.testing.assert_array_equal(quotients, xs / 3.0)  # each a true division, bit for bit
    np.testing.assert_array_equal(maxima[:, 0], quotients.max(axis=1))


def test_a_division_by_a_row_value_multiplies_by_its_reciprocal_where_that_is_within_1_5_ulp():
    # out = x / sum(y): rows whose divisor and its reciprocal are normal numbers multiply by the
    # reciprocal (two roundings); a row with a zero, subnormal, huge, infinite or nan divisor
    # divides, exactly as the interpreter does.
    b = GraphBuilder()
    x, y = b.input(T((9, 40))), b.input(T((9, 40)))
    body = b.build([b.node("div", [x, b.node("reduce_sum", [y], {"axes": (1,), "keepdim": True})])])
    xs = rng.standard_normal((9, 40)).astype(np.float32) * 10
    xs[:, :4] = [0.0, -0.0, np.inf, np.nan]
    ys = np.zeros((9, 40), np.float32)
    ys[0] = rng.integers(1, 16, 40) / 8  # a normal sum, exact in any order (the kernel's order is not numpy's)
    ys[1, 0] = -3.0  # a negative one
    ys[2, 0] = 2e-38  # normal, its reciprocal too
    # rows 3 and on divide: 0, a subnormal, the largest floats, inf, -inf, nan
    ys[4, 0] = 1e-40
    xs[4] *= 1e-36  # quotients near 1e5: finite, where times the reciprocal (inf) they would not be
    ys[5, 0] = 3e38
    ys[6, 0] = np.inf
    ys[7, 0] = -np.inf
    ys[8, 0] = np.nan
    (actual,) = run(kernel("reduction", body), [xs, ys])
    (expected,) = interpret(body, [xs, ys])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(actual[3:], expected[3:])  # nan matches nan; 0.0 and -0.0 compare equal
        np.testing.assert_array_equal(np.signbit(actual[3:]), np.signbit(expected[3:]))
        fast = expected[:3]
        ulp = np.spacing(np.abs(fast).astype(np.float32))
        finite = np.isfinite(fast)
        assert np.all(np.abs(actual[:3] - fast)[finite] <= 1.5 * ulp[finite])
        np.testing.assert_array_equal(actual[:3][~finite], fast[~finite])
