"""The interpreter against direct calls of the eager kernels, its input checks, its freeing of
dead values, aliasing of outputs, and the errors it raises."""

from __future__ import annotations

import dataclasses
import gc
import types
import warnings
import weakref

import numpy as np
import pytest

from kiln.ir.dtypes import bool_, float32, float64, from_numpy_dtype, int64
from kiln.ir.graph import GraphBuilder, SourceLocation
from kiln.ir.interpreter import interpret, prepare
from kiln.ir.primitives import PRIMITIVES
from kiln.ir.types import TensorType

PRIMS = sorted(PRIMITIVES.values(), key=lambda p: p.name)


def type_of(array: np.ndarray) -> TensorType:
    return TensorType(array.shape, from_numpy_dtype(array.dtype))


def assert_identical(actual, expected) -> None:
    """Same class, dtype, shape and bits (nan matches any nan; 0.0 and -0.0 differ)."""
    assert isinstance(actual, np.ndarray), type(actual)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected, strict=True)
    if actual.dtype.kind == "f":
        numbers = ~np.isnan(expected)  # the sign of a nan carries no meaning
        np.testing.assert_array_equal(np.signbit(actual[numbers]), np.signbit(expected[numbers]))


def f32(*values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# ----------------------------------------------------------------------------- every primitive
@pytest.mark.parametrize("prim", PRIMS, ids=[p.name for p in PRIMS])
def test_every_primitive_matches_its_eager_kernel(prim):
    # One-node graphs over the registry's own samples: every kind (elementwise, reduction,
    # movement, matmul, index, random_bits with its state input, windows) runs through the
    # interpreter exactly as a direct kernel call.
    for sample in prim.samples(np.random.default_rng(0)):
        args = [np.asarray(a) for a in sample.args]
        b = GraphBuilder()
        inputs = [b.input(type_of(a)) for a in args]
        out = b.node(prim.name, inputs, sample.attrs)
        graph = b.build([out])
        with np.errstate(all="ignore"):
            expected = np.asarray(prim.eager(np, *args, **sample.attrs))
        (actual,) = interpret(graph, args)
        assert_identical(actual, expected)
        assert actual.dtype == out.type.dtype.np and actual.shape == out.type.shape


def test_a_chain_of_every_kind_matches_direct_kernel_calls():
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(2, 3)), rng.normal(size=(3, 4))
    index = np.array([[0, 2, 1, 1]])
    state = np.array([7, 3], dtype=np.int64)
    b = GraphBuilder()
    vx, vw = b.input(TensorType((2, 3), float64)), b.input(TensorType((3, 4), float64))
    vi, vs = b.input(TensorType((1, 4), int64)), b.input(TensorType((2,), int64))
    m = b.node("matmul", [vx, vw])  # (2, 4)
    e = b.node("exp", [m])
    t = b.node("permute", [e], {"perm": (1, 0)})  # (4, 2)
    s = b.node("reduce_sum", [t], {"axes": (1,), "keepdim": False})  # (4,)
    g = b.node("gather", [b.node("reshape", [s], {"shape": (1, 4)}), vi], {"axis": 1})
    bits = b.node("random_bits", [vs], {"shape": (1, 4)})
    mixed = b.node("add", [g, b.node("cast", [bits], {"dtype": float64})])
    graph = b.build([mixed, bits, s])

    P = {name: PRIMITIVES[name].eager for name in PRIMITIVES}
    ee = P["exp"](np, P["matmul"](np, x, w))
    es = P["reduce_sum"](np, P["permute"](np, ee, perm=(1, 0)), axes=(1,), keepdim=False)
    eg = P["gather"](np, P["reshape"](np, es, shape=(1, 4)), index, axis=1)
    ebits = P["random_bits"](np, state, shape=(1, 4))
    emixed = P["add"](np, eg, P["cast"](np, ebits, dtype=float64))
    for actual, expected in zip(interpret(graph, [x, w, index, state]), [emixed, ebits, es], strict=True):
        assert_identical(actual, expected)
    # random_bits is a pure function of the state input: another state, other bits.
    other = interpret(graph, [x, w, index, np.array([7, 4], dtype=np.int64)])[1]
    assert not np.array_equal(other, ebits)


def test_hand_computed_values_and_0d_results_are_arrays():
    b = GraphBuilder()
    x = b.input(TensorType((), float32))
    y = b.node("add", [x, x])  # numpy returns a scalar for 0-d operands
    z = b.node("reduce_sum", [b.node("expand", [y], {"shape": (3,)})], {"axes": (0,), "keepdim": False})
    out = interpret(b.build([y, z]), [np.array(1.5, np.float32)])
    assert_identical(out[0], np.array(3.0, np.float32))
    assert_identical(out[1], np.array(9.0, np.float32))


def test_constants_come_from_the_constant_table():
    b = GraphBuilder()
    x = b.input(TensorType((3,), float32))
    c = b.constant(f32(1.0, -2.0, 0.5), TensorType((3,), float32))
    graph = b.build([b.node("mul", [x, c])])
    assert_identical(interpret(graph, [f32(2.0, 2.0, -0.0)])[0], f32(2.0, -4.0, -0.0))


# ----------------------------------------------------------------------------- inputs
def _square_graph():
    b = GraphBuilder()
    x = b.input(TensorType((2, 3), float32))
    return b.build([b.node("mul", [x, x])])


def test_wrong_number_of_inputs_is_an_error():
    graph = _square_graph()
    with pytest.raises(TypeError, match="expects 1 inputs, got 2"):
        interpret(graph, [np.zeros((2, 3), np.float32)] * 2)
    with pytest.raises(TypeError, match="expects 1 inputs, got 0"):
        interpret(graph, [])


@pytest.mark.parametrize(
    "given, match",
    [
        (np.zeros((3, 2), np.float32), r"input 0 .*expected float32 of shape \(2, 3\).*got float32 of shape \(3, 2\)"),
        (np.zeros((2, 3), np.float64), r"input 0 .*expected float32 of shape \(2, 3\) \(f32\[2,3\]\), got float64"),
        ([[1.0, 2.0, 3.0]] * 2, r"input 0 .*expected float32 .*got a list"),
    ],
)
def test_input_types_are_checked(given, match):
    with pytest.raises(TypeError, match=match):
        interpret(_square_graph(), [given])


# ----------------------------------------------------------------------------- outputs and aliasing
def test_outputs_that_are_inputs_or_repeated_come_out_right():
    b = GraphBuilder()
    x, y = b.input(TensorType((2,), float32)), b.input(TensorType((2,), float32))
    s = b.node("add", [x, y])
    graph = b.build([x, s, s, y, x])
    a, c = f32(1.0, 2.0), f32(10.0, 20.0)
    out = interpret(graph, [a, c])
    assert out[0] is a and out[4] is a and out[3] is c  # inputs come back as given, not copied
    assert_identical(out[1], f32(11.0, 22.0))
    assert out[2] is out[1]
    assert_identical(a, f32(1.0, 2.0))  # inputs are never written


def test_an_input_used_after_it_is_an_output_is_kept():
    b = GraphBuilder()
    x = b.input(TensorType((2,), float32))
    n = b.node("neg", [x])
    graph = b.build([n, x, b.node("exp", [n])])
    a = f32(0.0, 1.0)
    out = interpret(graph, [a])
    assert out[1] is a
    assert_identical(out[2], np.exp(-a))


def test_constant_outputs_and_their_views_are_copies():
    b = GraphBuilder()
    c = b.constant(f32(1.0, 2.0, 3.0, 4.0), TensorType((4,), float32))
    r = b.node("reshape", [c], {"shape": (2, 2)})
    graph = b.build([c, r])
    out = interpret(graph, [])
    out[0][...] = 0.0
    out[1][...] = 0.0
    assert_identical(graph.constants["c0"], f32(1.0, 2.0, 3.0, 4.0))
    assert_identical(interpret(graph, [])[1], f32(1.0, 2.0, 3.0, 4.0).reshape(2, 2))


# ----------------------------------------------------------------------------- freeing
def test_dead_values_are_dropped_after_their_last_use(monkeypatch):
    # exp makes a big intermediate read only by reduce_sum; when the neg after it runs, the
    # interpreter must hold no reference to it any more.
    made: list[weakref.ref] = []
    alive_at_neg: list[bool] = []
    exp, neg = PRIMITIVES["exp"], PRIMITIVES["neg"]

    def spy_exp(xp, x):
        out = exp.eager(xp, x)
        made.append(weakref.ref(out))
        return out

    def spy_neg(xp, x):
        gc.collect()
        alive_at_neg.append(made[-1]() is not None)
        return neg.eager(xp, x)

    monkeypatch.setitem(PRIMITIVES, "exp", dataclasses.replace(exp, eager=spy_exp))
    monkeypatch.setitem(PRIMITIVES, "neg", dataclasses.replace(neg, eager=spy_neg))

    def graph(big_is_output: bool):
        b = GraphBuilder()
        x = b.input(TensorType((1000, 100), float64))
        big = b.node("exp", [x])
        total = b.node("reduce_sum", [big], {"axes": (0, 1), "keepdim": False})
        return b.build([b.node("neg", [total]), big] if big_is_output else [b.node("neg", [total])])

    data = np.zeros((1000, 100))
    (out,) = interpret(graph(False), [data])
    assert alive_at_neg == [False]
    assert_identical(out, np.array(-100000.0))

    # The same big value as an output is kept, and comes out.
    out = interpret(graph(True), [data])
    assert alive_at_neg == [False, True]
    assert out[1] is made[-1]()


def test_programs_are_cached_per_graph_and_do_not_keep_it_alive():
    graph = _square_graph()
    assert prepare(graph) is prepare(graph)
    interpret(graph, [np.ones((2, 3), np.float32)])
    ref = weakref.ref(graph)
    del graph
    gc.collect()
    assert ref() is None


# ----------------------------------------------------------------------------- errors
def test_a_failing_node_is_named_with_its_source_location():
    b = GraphBuilder()
    x, y = b.input(TensorType((3,), int64)), b.input(TensorType((3,), int64))
    s = b.node("add", [x, y], loc=SourceLocation("model.py", 11, "forward"))
    nonzero = b.node("ne", [y, b.constant(np.array(0), TensorType((), int64))])
    b.node("check", [nonzero], {"error": "ZeroDivisionError", "message": "by zero"}, loc=SourceLocation("model.py", 12, "forward"))  # fmt: skip
    out = b.node("floor_divide", [s, y], loc=SourceLocation("model.py", 12, "forward"))
    graph = b.build([out])
    ok = interpret(graph, [np.array([4, 5, 6]), np.array([1, 2, 3])])[0]
    assert_identical(ok, np.array([5, 3, 3]))
    with pytest.raises(ZeroDivisionError, match=r"(?s)by zero.*node 3: %5 = check\(%4\) at model\.py:12 in forward") as info:  # fmt: skip
        interpret(graph, [np.array([4, 5, 6]), np.array([1, 0, 3])])
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_node_index_counts_constants_and_missing_location_is_said():
    b = GraphBuilder()
    x = b.input(TensorType((2,), float32))
    i = b.constant(np.array([5]), TensorType((1,), int64))
    b.node("take", [x, i])
    graph = b.build([b.nodes[-1].output])
    with pytest.raises(IndexError, match=r"(?s)out of bounds.*node 1: %2 = take\(%0, %1\) \(no source location\)"):
        interpret(graph, [f32(1.0, 2.0)])


def test_an_exception_type_with_its_own_constructor_becomes_a_runtime_error(monkeypatch):
    class Odd(Exception):
        def __init__(self, a, b):
            super().__init__(f"odd {a} {b}")

    def fail(xp, x):
        raise Odd(1, 2)

    monkeypatch.setitem(PRIMITIVES, "exp", dataclasses.replace(PRIMITIVES["exp"], eager=fail))
    b = GraphBuilder()
    x = b.input(TensorType((2,), float32))
    graph = b.build([b.node("exp", [x], loc=SourceLocation("f.py", 3))])
    with pytest.raises(RuntimeError, match=r"(?s)Odd: odd 1 2.*node 0: %1 = exp\(%0\) at f\.py:3") as info:
        interpret(graph, [f32(0.0, 1.0)])
    assert isinstance(info.value.__cause__, Odd)


def test_floating_point_exceptions_are_values_not_warnings():
    b = GraphBuilder()
    x = b.input(TensorType((4,), float32))
    q = b.node("div", [x, b.node("sub", [x, x])])
    lg = b.node("log", [b.node("sub", [x, x])])
    graph = b.build([q, lg, b.node("exp", [b.node("mul", [x, b.constant(f32(1e30), TensorType((1,), float32))])])])
    data = f32(1.0, -1.0, 0.0, np.inf)
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        out = interpret(graph, [data])
    with np.errstate(all="ignore"):
        assert_identical(out[0], data / (data - data))
        assert_identical(out[1], np.log(data - data))
        assert_identical(out[2], np.exp(data * np.float32(1e30)))


# ----------------------------------------------------------------------------- other namespaces
def test_another_array_namespace_gets_its_own_constants():
    # A stand-in for cupy: numpy's functions behind another module object. Constants are moved
    # to its "device" once (xp.asarray), and kernels receive it as xp.
    converted = []

    def asarray(a, dtype=None):
        converted.append(a)
        return np.asarray(a, dtype=dtype)

    xp = types.SimpleNamespace(**{name: getattr(np, name) for name in dir(np) if not name.startswith("_")})
    xp.asarray = asarray
    b = GraphBuilder()
    x = b.input(TensorType((2,), bool_))
    c = b.constant(np.array([True, False]), TensorType((2,), bool_))
    graph = b.build([b.node("logical_and", [x, c])])
    for _ in range(2):
        (out,) = interpret(graph, [np.array([True, True])], xp=xp)
        assert_identical(out, np.array([True, False]))
    assert len(converted) == 1


# -- kernel nodes ---------------------------------------------------------------------------
def test_kernel_nodes_run_their_bodies():
    from tests.ir.test_printer_parser import kernel_graph

    graph = kernel_graph()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    neg, row, scaled_w, scaled_neg = interpret(graph, [x, w])
    m = x.max(axis=1, keepdims=True)
    np.testing.assert_array_equal(row, m)
    np.testing.assert_array_equal(neg, -(np.exp(x - m) * w * np.float32(2)))
    np.testing.assert_array_equal(scaled_w, w * np.float32(0.5))
    np.testing.assert_array_equal(scaled_neg, neg * np.float32(0.5))
    assert all(a.dtype == np.float32 for a in (neg, row, scaled_w, scaled_neg))


def test_kernel_outputs_are_fresh_arrays():
    # A body returning its input (or a view of it) still gives the caller a new array.
    body = GraphBuilder()
    x = body.input(TensorType((2, 3), float32))
    t = body.node("permute", [x], {"perm": (1, 0)})
    inner = body.build([x, body.node("exp", [t])])
    b = GraphBuilder()
    X = b.input(TensorType((2, 3), float32))
    same, e = b.kernel([X], [inner], "elementwise")
    graph = b.build([same, e])
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    out, ex = interpret(graph, [a])
    np.testing.assert_array_equal(out, a)
    assert not np.shares_memory(out, a)
    np.testing.assert_array_equal(ex, np.exp(a.T))


def test_kernel_error_names_the_kernel_and_the_body_node():
    body = GraphBuilder()
    x = body.input(TensorType((2,), int64))
    inner = body.build([body.node("floor_divide", [x, x], loc=SourceLocation("m.py", 9, "f"))])
    b = GraphBuilder()
    (y,) = b.kernel([b.input(TensorType((2,), int64))], [inner], "elementwise")
    program = prepare(b.build([y]))
    program._steps = tuple((_raise, *step[1:]) for step in program._steps)
    with pytest.raises(ValueError, match="while running node 0: %1 = kernel\\(%0\\) at m.py:9 in f"):
        program.run([np.array([1, 2])])


def _raise(xp, *arrays):
    raise ValueError("boom")
