"""The IR's text form: golden printouts, exact print -> parse -> print round trips, and parse errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.ir.dtypes import ALL_DTYPES, bool_, float16, float32, float64, int64
from kiln.ir.graph import CONSTANT, Graph, GraphBuilder, SourceLocation
from kiln.ir.parser import ParseError, parse_graph
from kiln.ir.printer import format_string, print_graph
from kiln.ir.types import TensorType, device
from kiln.ir.verifier import verify

CUDA = device("cuda:0")


def same_attr(a, b) -> bool:
    """Exact equality of attribute values: nan equals nan, -0.0 differs from 0.0, 1 differs from 1.0 and True."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, tuple):
        return len(a) == len(b) and all(map(same_attr, a, b))
    return a is b if a is None or hasattr(a, "short") else a == b


def assert_same_graph(a: Graph, b: Graph) -> None:
    """Same structure, ids, types, attributes (in order) and locations; uses resolve to the same definitions."""
    assert [(v.id, v.type) for v in a.inputs] == [(v.id, v.type) for v in b.inputs]
    assert len(a.nodes) == len(b.nodes)
    for x, y in zip(a.nodes, b.nodes):
        assert (x.op, x.loc) == (y.op, y.loc)
        assert [(v.id, v.type) for v in x.outputs] == [(v.id, v.type) for v in y.outputs]
        assert [v.id for v in x.inputs] == [v.id for v in y.inputs]
        assert list(x.attrs) == list(y.attrs), "attribute order"
        assert all(same_attr(x.attrs[k], y.attrs[k]) for k in x.attrs), (x.attrs, y.attrs)
    assert [v.id for v in a.outputs] == [v.id for v in b.outputs]
    # Uses are the very Value objects defined earlier in the parsed graph.
    defined = {v.id: v for v in b.values()}
    assert all(defined[v.id] is v for node in b.nodes for v in node.inputs)
    assert all(defined[v.id] is v for v in b.outputs)


def round_trip(graph: Graph) -> Graph:
    text = print_graph(graph)
    parsed = parse_graph(text, graph.constants)
    assert print_graph(parsed) == text
    assert_same_graph(graph, parsed)
    return parsed


# -- golden printouts -----------------------------------------------------------------------


def brief_example() -> Graph:
    b = GraphBuilder()
    x = b.input(TensorType((2, 3), float32))
    b.input(TensorType((2,), int64))
    y = b.node("add", [x, x])
    s = b.node("reduce_sum", [y], {"axes": (0, 1), "keepdim": False})
    b.constant(np.arange(3, dtype=np.float32), TensorType((3,), float32))
    return b.build([s, y])


def test_golden_basic():
    assert str(brief_example()) == (
        "graph(%0: f32[2,3], %1: i64[2]) {\n"
        "  %2: f32[2,3] = add(%0, %0)\n"
        "  %3: f32[] = reduce_sum(%2) {axes=(0, 1), keepdim=False}\n"
        '  %4: f32[3] = constant() {name="c0"}\n'
        "  return (%3, %2)\n"
        "}\n"
    )
    verify(round_trip(brief_example()))


def every_attr_kind() -> Graph:
    b = GraphBuilder()
    x = b.input(TensorType((4,), float64, CUDA))
    attrs = {
        "i": -7, "big": 2**70, "f": 1.5, "tiny": 5e-324, "huge": 1e300, "inf": math.inf, "ninf": -math.inf,
        "nan": math.nan, "nzero": -0.0, "whole": 3.0, "t": True, "fa": False, "none": None, "dt": float16,
        "b": bool_, "s": 'say "hi"\\\n\tok\x00\x7f\u2028é😀', "empty": (), "one": (1,), "nested": ((1, (2.5,)), ("a", None)),
    }  # fmt: skip
    y = b.node("custom_op", [x, x], attrs, type=TensorType((4,), float16, CUDA))
    return b.build([y])


def test_golden_every_attribute_kind_and_device():
    assert print_graph(every_attr_kind()) == (
        "graph(%0: f64[4]@cuda:0) {\n"
        "  %1: f16[4]@cuda:0 = custom_op(%0, %0) {i=-7, big=1180591620717411303424, f=1.5, tiny=5e-324, "
        "huge=1e+300, inf=inf, ninf=-inf, nan=nan, nzero=-0.0, whole=3.0, t=True, fa=False, none=None, dt=f16, "
        'b=bool, s="say \\"hi\\"\\\\\\n\\tok\\x00\\x7f\\u2028é😀", empty=(), one=(1,), nested=((1, (2.5,)), ("a", None))}\n'
        "  return (%1)\n"
        "}\n"
    )
    parsed = round_trip(every_attr_kind())
    assert isinstance(parsed.nodes[0].attrs["whole"], float) and isinstance(parsed.nodes[0].attrs["i"], int)
    assert parsed.nodes[0].attrs["dt"] is float16 and parsed.inputs[0].type.device is CUDA


def located() -> Graph:
    b = GraphBuilder()
    x = b.input(TensorType((3,), float32))
    y = b.node("exp", [x], loc=SourceLocation("model.py", 12, "forward"))
    z = b.node("neg", [y], loc=SourceLocation('my "dir"/a b.py', 3, "<lambda>"))
    w = b.node("tanh", [z], loc=SourceLocation("C:\\x.py", 0))
    v = b.node("sin", [w], loc=SourceLocation("x.py", 5, "not a name"))
    c = b.constant(np.ones((), np.float32), TensorType((), float32), loc=SourceLocation("c.py", 1, "f"))
    return b.build([v, c])


def test_golden_locations():
    graph = located()
    assert print_graph(graph) == (
        "graph(%0: f32[3]) {\n"
        '  %1: f32[3] = exp(%0)  # "model.py":12 in forward\n'
        '  %2: f32[3] = neg(%1)  # "my \\"dir\\"/a b.py":3 in <lambda>\n'
        '  %3: f32[3] = tanh(%2)  # "C:\\\\x.py":0\n'
        '  %4: f32[3] = sin(%3)  # "x.py":5 in "not a name"\n'
        '  %5: f32[] = constant() {name="c0"}  # "c.py":1 in f\n'
        "  return (%4, %5)\n"
        "}\n"
    )
    assert print_graph(graph, locations=False).splitlines()[1] == "  %1: f32[3] = exp(%0)"
    verify(round_trip(graph))
    assert parse_graph(print_graph(graph, locations=False)).nodes[0].loc is None


def test_empty_graph_and_builder_docstring_shape():
    assert print_graph(GraphBuilder().build([])) == "graph() {\n  return ()\n}\n"
    assert_same_graph(GraphBuilder().build([]), parse_graph("graph() {\n  return ()\n}\n"))


def test_parser_is_lenient_about_spacing_and_blank_lines():
    text = '\n graph( %0 :f32[2] ){\n\n\t%1:f32[2]=exp( %0 ){a=( 1 , 2 , )}#"f":1 in g\n return(%1)\n}\n\n'
    g = parse_graph(text)
    assert g.nodes[0].attrs == {"a": (1, 2)} and g.nodes[0].loc == SourceLocation("f", 1, "g")


def test_constants_are_attached():
    graph = brief_example()
    parsed = parse_graph(str(graph), {"c0": graph.constants["c0"]})
    assert parsed.constants["c0"] is graph.constants["c0"]
    assert parse_graph(str(graph)).constants == {}


@pytest.mark.parametrize("text", ["", "a\x01b", "\ud800", "😀\U0010ffff", "\\" * 5 + '"'])
def test_strings_round_trip(text):
    b = GraphBuilder()
    x = b.input(TensorType((), float32))
    y = b.node("exp", [x], loc=SourceLocation(text, 1, text))
    round_trip(b.build([y]))
    assert format_string(text).isprintable()


# -- random graphs --------------------------------------------------------------------------

UNARY = ("exp", "neg", "tanh", "abs", "sqrt")
attr_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6)
    | st.sampled_from(ALL_DTYPES),
    lambda inner: st.lists(inner, max_size=3).map(tuple),
    max_leaves=8,
)  # fmt: skip
locations = st.none() | st.builds(SourceLocation, st.text(max_size=8), st.integers(0, 10**6), st.text(max_size=8))


@st.composite
def random_graphs(draw) -> Graph:
    """A chain of elementwise, reduction, reshape, cast and pad nodes that the verifier accepts."""
    b = GraphBuilder()
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    dev = draw(st.sampled_from([device("cpu"), CUDA]))
    x = b.input(TensorType(shape, draw(st.sampled_from([float32, float64])), dev))
    values = [x]
    for _ in range(draw(st.integers(0, 8))):
        cur, loc = values[-1], draw(locations)
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "reshape", "cast", "pad", "constant"]))
        if kind == "unary":
            values.append(b.node(draw(st.sampled_from(UNARY)), [cur], loc=loc))
        elif kind == "binary":
            other = draw(st.sampled_from(values))
            if other.type == cur.type:
                values.append(b.node(draw(st.sampled_from(["add", "mul", "maximum"])), [cur, other], loc=loc))
        elif kind == "reduce" and cur.type.ndim:
            axes = tuple(sorted(draw(st.sets(st.integers(0, cur.type.ndim - 1), min_size=1))))
            op = draw(st.sampled_from(["reduce_sum", "reduce_max"]))
            values.append(b.node(op, [cur], {"axes": axes, "keepdim": draw(st.booleans())}, loc=loc))
        elif kind == "reshape":
            values.append(b.node("reshape", [cur], {"shape": (cur.type.numel,)}, loc=loc))
        elif kind == "cast":
            values.append(b.node("cast", [cur], {"dtype": draw(st.sampled_from([float16, float32, float64]))}))
        elif kind == "pad":
            n = cur.type.ndim
            pads = [tuple(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))) for _ in range(3)]
            value = draw(st.floats(allow_nan=True, allow_infinity=True))
            attrs = {"low": pads[0], "high": pads[1], "interior": pads[2], "value": value}
            values.append(b.node("pad", [cur], attrs, loc=loc))
        elif kind == "constant":
            b.constant(np.zeros(shape, cur.type.dtype.np), TensorType(shape, cur.type.dtype), loc=loc)
    outputs = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
    return b.build(outputs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_random_graphs_round_trip(graph):
    verify(graph)
    verify(round_trip(graph))


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True), attr_values, max_size=4), locations)
def test_random_attributes_round_trip(attrs, loc):
    b = GraphBuilder()
    x = b.input(TensorType((2,), float32))
    y = b.node("some_op", [x], attrs, type=TensorType((2,), float32), loc=loc)
    round_trip(b.build([y]))


# -- errors ---------------------------------------------------------------------------------

GOOD = "graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0)\n  return (%1)\n}\n"


@pytest.mark.parametrize(
    ("text", "line", "column", "match"),
    [
        ("", 1, 1, "expected 'graph"),
        ("graf(%0: f32[2]) {", 1, 1, "expected 'graph'"),
        ("graph(%0 f32[2]) {", 1, 10, "expected ':'"),
        ("graph(%0: q32[2]) {", 1, 11, "expected a dtype"),
        ("graph(%0: f32[2,-1]) {", 1, 17, "non-negative"),
        ("graph(%0: f32[2]@tpu) {", 1, 18, "expected a device"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = exp(%7)\n  return (%1)\n}", 2, 20, "undefined %7"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = exp(%1)\n  return (%1)\n}", 2, 20, "undefined %1"),
        ("graph(%0: f32[2]) {\n  %0: f32[2] = exp(%0)\n  return (%0)\n}", 2, 3, "defined twice"),
        ("graph(%0: f32[2], %0: f32[2]) {", 1, 19, "defined twice"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0) {a=(1)}\n  return (%1)\n}", 2, 29, r"\(x,\)"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0) {a=1, a=2}\n  return (%1)\n}", 2, 30, "each attribute once"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0) {a=os}\n  return (%1)\n}", 2, 27, "attribute value"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0) {a=__import__(1)}\n  return (%1)\n}", 2, 27, "attribute value"),
        ('graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0) {a="x}\n  return (%1)\n}', 2, 30, "close the string"),
        ('graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0) {a="\\q"}\n  return (%1)\n}', 2, 28, "escape"),
        ('graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0) {a="\\x4"}\n  return (%1)\n}', 2, 28, "hex digits"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0)  # model.py:3\n  return (%1)\n}", 2, 27, "quoted file name"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0) ; x\n  return (%1)\n}", 2, 24, "unexpected character ';'"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0) extra\n  return (%1)\n}", 2, 24, "end of the line"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0)\n", 3, 1, "before the end of the text"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0)\n  return (%1)\n", 4, 1, "expected '}'"),
        (GOOD + "graph() {", 5, 1, "end of the text"),
        ("graph() {\n  return ()\n  %0: f32[] = exp()\n}", 3, 3, "expected '}' after the return line, got '%0'"),
        ("graph(%0: f32[2]) {\n  return (%0, %3)\n}", 2, 15, "undefined %3"),
    ],
)
def test_parse_errors_name_line_column_and_expectation(text, line, column, match):
    with pytest.raises(ParseError, match=match) as info:
        parse_graph(text)
    assert (info.value.line, info.value.column) == (line, column), str(info.value)
    assert str(info.value).startswith(f"line {line}, column {column}: ")


def test_parse_error_shows_the_line_and_a_caret():
    with pytest.raises(ParseError) as info:
        parse_graph("graph(%0: f32[2]) {\n  %1: f32[2] = exp(%9)\n  return (%1)\n}")
    assert str(info.value).splitlines()[1:] == ["      %1: f32[2] = exp(%9)", "                       ^"]


def test_missing_constant_is_a_parse_error_when_constants_are_given():
    with pytest.raises(ParseError, match="constant 'c0' is not among the constants given"):
        parse_graph(str(brief_example()), {})
    assert parse_graph(str(brief_example())).nodes[2].op == CONSTANT


def test_parse_error_is_a_value_error():
    assert issubclass(ParseError, ValueError)
    with pytest.raises(ValueError, match="line 1, column 7"):
        parse_graph("graph(1) {")


def test_printer_rejects_attributes_it_cannot_read_back():
    b = GraphBuilder()
    x = b.input(TensorType((2,), float32))
    b.node("exp", [x], {"bad": [1, 2]}, type=TensorType((2,), float32))
    with pytest.raises(TypeError, match="cannot print attribute value \\[1, 2\\]"):
        print_graph(b.build([]))


# -- kernel nodes ---------------------------------------------------------------------------
KERNEL_LOC = SourceLocation("m.py", 3, "f")


def kernel_graph() -> Graph:
    """A graph with a reduction kernel (two outputs, a body constant) and a horizontal kernel of two members."""
    f32 = float32
    body = GraphBuilder()
    x = body.input(TensorType((4, 8), f32))
    w = body.input(TensorType((8,), f32))
    m = body.node("reduce_max", [x], {"axes": (1,), "keepdim": True}, loc=KERNEL_LOC)
    e = body.node("exp", [body.node("sub", [x, m])])
    two = body.constant(np.array(2.0, np.float32), TensorType((), f32))
    y = body.node("mul", [body.node("mul", [e, w]), two])
    reduction = body.build([y, m])

    def member(shape):
        b = GraphBuilder()
        p = b.input(TensorType(shape, f32))
        half = b.constant(np.array(0.5, np.float32), TensorType((), f32))
        return b.build([b.node("mul", [p, half])])

    b = GraphBuilder()
    xs = b.input(TensorType((4, 8), f32))
    ws = b.input(TensorType((8,), f32))
    outs = b.kernel([xs, ws], [reduction], "reduction")
    neg = b.node("neg", [outs[0]])
    scaled = b.kernel([ws, neg], [member((8,)), member((4, 8))], "horizontal")
    return b.build([neg, outs[1], *scaled])


def test_kernel_golden_text_and_round_trip():
    from kiln.ir.graph import qualified_constants

    graph = kernel_graph()
    text = print_graph(graph)
    assert text == (
        "graph(%0: f32[4,8], %1: f32[8]) {\n"
        '  %2: f32[4,8], %3: f32[4,1] = kernel(%0, %1) {name="k0", kind="reduction"} {\n'
        "    body(%0: f32[4,8], %1: f32[8]) {\n"
        '      %2: f32[4,1] = reduce_max(%0) {axes=(1,), keepdim=True}  # "m.py":3 in f\n'
        "      %3: f32[4,8] = sub(%0, %2)\n"
        "      %4: f32[4,8] = exp(%3)\n"
        '      %5: f32[] = constant() {name="c0"}\n'
        "      %6: f32[4,8] = mul(%4, %1)\n"
        "      %7: f32[4,8] = mul(%6, %5)\n"
        "      return (%7, %2)\n"
        "    }\n"
        '  }  # "m.py":3 in f\n'
        "  %4: f32[4,8] = neg(%2)\n"
        '  %5: f32[8], %6: f32[4,8] = kernel(%1, %4) {name="k1", kind="horizontal"} {\n'
        "    body(%0: f32[8]) {\n"
        '      %1: f32[] = constant() {name="c0"}\n'
        "      %2: f32[8] = mul(%0, %1)\n"
        "      return (%2)\n"
        "    }\n"
        "    body(%0: f32[4,8]) {\n"
        '      %1: f32[] = constant() {name="c0"}\n'
        "      %2: f32[4,8] = mul(%0, %1)\n"
        "      return (%2)\n"
        "    }\n"
        "  }\n"
        "  return (%4, %3, %5, %6)\n"
        "}\n"
    )
    table = qualified_constants(graph)
    assert sorted(table) == ["k0/0/c0", "k1/0/c0", "k1/1/c0"]
    parsed = parse_graph(text, table)
    assert print_graph(parsed) == text
    verify(parsed)
    assert parsed.constants == {}
    (kernel,) = [n for n in parsed.nodes if n.attrs.get("name") == "k0"]
    assert kernel.loc == KERNEL_LOC and kernel.bodies[0].constants["c0"] == 2.0
    assert [b.inputs[0].type.shape for b in parsed.nodes[2].bodies] == [(8,), (4, 8)]
    # Each body is its own scope: the body's %0 is not the graph's %0.
    assert kernel.bodies[0].inputs[0] is not parsed.inputs[0]
    # Without constants the text still parses (bodies get empty tables).
    assert print_graph(parse_graph(text)) == text


@pytest.mark.parametrize(
    "text, match",
    [
        ("graph(%0: f32[2]) {\n  %1: f32[2] = kernel(%0) {kind=\"elementwise\", name=\"k\"}\n  return (%1)\n}",
         "'{' to open the kernel's bodies"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = kernel(%0) {\n    body(%0: f32[2]) {\n      %1: f32[2] = exp(%5)\n"
         "      return (%1)\n    }\n  }\n  return (%1)\n}", "undefined %5"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = kernel(%0) {\n    graph(%0: f32[2]) {\n", "'body'"),
        ("graph(%0: f32[2]) {\n  %1: f32[2] = kernel(%0) {\n    body(%0: f32[2]) {\n      return (%0)\n    }\n",
         "'body\\(...\\) \\{' or '}'"),
    ],
)  # fmt: skip
def test_kernel_parse_errors(text, match):
    with pytest.raises(ParseError, match=match):
        parse_graph(text)


def test_kernel_body_cannot_use_outer_values():
    text = (
        "graph(%0: f32[2], %1: f32[2]) {\n  %2: f32[2] = kernel(%0) {\n    body(%5: f32[2]) {\n"
        "      %6: f32[2] = add(%5, %1)\n      return (%6)\n    }\n  }\n  return (%2)\n}"
    )
    with pytest.raises(ParseError, match="undefined %1"):
        parse_graph(text)


def test_kernel_body_constant_must_be_given():
    text = print_graph(kernel_graph())
    with pytest.raises(ParseError, match="'c0' is not among the constants given"):
        parse_graph(text, {})


def test_tuples_of_ints_print_as_their_mixed_and_numpy_kin_do():
    """``format_attr`` prints a tuple of plain ints by ``repr`` (a 100k-node trace prints for its cache
    key); bools in a tuple, numpy ints and other mixes take the general path, and read back the same."""
    b = GraphBuilder()
    x = b.input(TensorType((4,), float64))
    attrs = {"ints": (3, -1, 2**70), "mixed": (True, 1), "numpy": (np.int64(2), 3), "scalar": np.int64(5), "n": 0}
    b.node("custom_op", [x], attrs, type=TensorType((4,), float64))
    graph = b.build([x])
    line = print_graph(graph).splitlines()[1]
    assert line.endswith("{ints=(3, -1, 1180591620717411303424), mixed=(True, 1), numpy=(2, 3), scalar=5, n=0}")
    parsed = parse_graph(print_graph(graph), graph.constants)
    assert print_graph(parsed) == print_graph(graph)
    attrs_back = parsed.nodes[0].attrs
    assert attrs_back["mixed"][0] is True and type(attrs_back["numpy"][0]) is int


def test_attribute_sets_types_and_locations_that_repeat_print_as_each_node_alone():
    """``print_graph`` formats each distinct type, attribute set and location once per graph (the
    cache key of an unrolled loop prints 60k nodes); every line must still read as ``format_node``
    prints its node alone, with attributes equal as values yet not alike (1, 1.0, True, a dtype)
    kept apart, and with the locations of nodes that repeat."""
    from kiln.ir.printer import format_node  # noqa: PLC0415

    b = GraphBuilder()
    x = b.input(TensorType((2, 3), float32))
    here, there = SourceLocation("a.py", 3, "f"), SourceLocation("b.py", 3, "f")
    values = [x]
    for value in (1, 1.0, True, 1, np.int64(1), 1.0, True):
        for loc in (here, there, here):
            values.append(b.node("pad", [values[-1]], {"low": (0, 0), "high": (0, value), "interior": (0, 0),
                                                        "value": value}, loc=loc))  # fmt: skip
    values.append(b.node("cast", [values[-1]], {"dtype": float64}, loc=here))
    values.append(b.node("cast", [values[-1]], {"dtype": float32}, loc=None))
    graph = b.build([values[-1]])
    for locations in (True, False):
        lines = print_graph(graph, locations=locations).splitlines()[1:-2]
        assert lines == ["  " + format_node(node, locations=locations) for node in graph.nodes]
    assert len({line.split(" = ", 1)[1] for line in print_graph(graph, locations=False).splitlines()[1:-2]}) > 5
