"""The verifier: well-formed graphs pass; each kind of defect is caught at the node that has it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kiln.ir.dtypes import float16, float32, float64, int64
from kiln.ir.graph import Graph, GraphBuilder, Node, SourceLocation, Value
from kiln.ir.types import TensorType, device
from kiln.ir.verifier import VerificationError, verify

F2 = TensorType((2,), float32)
LOC = SourceLocation("model.py", 12, "forward")


def chain() -> tuple[GraphBuilder, Value, Value]:
    b = GraphBuilder()
    x = b.input(F2)
    y = b.node("exp", [x], loc=LOC)
    return b, x, y


def test_well_formed_graphs_pass():
    b, x, y = chain()
    c = b.constant(np.zeros(2, np.float32), F2)
    z = b.node("add", [y, c])
    s = b.node("reduce_sum", [z], {"axes": (0,), "keepdim": True})
    p = b.node("pad", [s], {"low": (1,), "high": (0,), "interior": (0,), "value": math.nan})
    h = b.node("cast", [p], {"dtype": float16})
    cuda = b.input(TensorType((3, 2), float32, device("cuda:0")))
    e = b.node("exp", [cuda])
    verify(b.build([h, z, x, e]))
    verify(GraphBuilder().build([]))


def test_duplicate_definition_of_the_same_value():
    b, x, y = chain()
    b.nodes.append(b.nodes[-1])
    with pytest.raises(VerificationError, match=r"node 1 \(%1 = exp, at model.py:12 in forward\): %1 is defined twice"):
        verify(b.build([y]))


def test_duplicate_ids():
    b, x, y = chain()
    b.nodes.append(Node("neg", (y,), {}, (Value(1, F2),)))
    with pytest.raises(VerificationError, match=r"node 1 \(%1 = neg\): %1 is defined twice \(another value"):
        verify(b.build([y]))
    with pytest.raises(VerificationError, match=r"graph input 1: %0 is defined twice"):
        verify(Graph((x, Value(0, F2)), (), ()))


def test_use_before_definition():
    b, x, y = chain()
    z = b.node("neg", [y])
    graph = b.build([z])
    swapped = Graph(graph.inputs, graph.nodes[::-1], graph.outputs)
    with pytest.raises(
        VerificationError, match=r"node 0 \(%2 = neg\): input 0 uses %1 before its definition by node 1"
    ):
        verify(swapped)


def test_use_of_a_foreign_or_undefined_value():
    b, x, y = chain()
    b.node("add", [y, Value(9, F2)])
    with pytest.raises(VerificationError, match="input 1 uses %9 but it is not defined"):
        verify(b.build([]))
    b, x, y = chain()
    b.node("add", [y, Value(0, F2)])  # same id as the input, another object
    with pytest.raises(VerificationError, match="input 1 uses %0 but that is another value with the same id"):
        verify(b.build([]))


def test_graph_outputs_must_be_defined():
    b, x, y = chain()
    with pytest.raises(VerificationError, match=r"graph output 1 \(%5\) is not a value defined"):
        verify(b.build([y, Value(5, F2)]))


def test_wrong_output_type_names_expected_and_given():
    b = GraphBuilder()
    x = b.input(F2)
    y = b.node("exp", [x], type=TensorType((2,), float16), loc=LOC)
    with pytest.raises(
        VerificationError,
        match=r"node 0 \(%1 = exp, at model.py:12 in forward\): output type f16\[2\] does not match the type rule's f32\[2\]",
    ):
        verify(b.build([y]))


def test_wrong_device_is_a_type_mismatch():
    b = GraphBuilder()
    x = b.input(TensorType((2,), float32, device("cuda:0")))
    b.node("neg", [x], type=F2)
    with pytest.raises(VerificationError, match=r"output type f32\[2\] does not match the type rule's f32\[2\]@cuda:0"):
        verify(b.build([]))


def test_type_rule_rejecting_the_inputs():
    b, x, y = chain()
    b.node("reduce_sum", [y], {"axes": (3,), "keepdim": False}, type=TensorType((), float32))
    with pytest.raises(
        VerificationError, match=r"node 1 \(%2 = reduce_sum\): the type rule rejects the node: IndexError"
    ):
        verify(b.build([]))
    b, x, y = chain()
    b.node("exp", [y], {"extra": 1}, type=F2)
    with pytest.raises(VerificationError, match="the type rule rejects the node: TypeError"):
        verify(b.build([]))


def test_unknown_op():
    b, x, y = chain()
    b.node("frobnicate", [y], type=F2)
    with pytest.raises(VerificationError, match=r"node 1 \(%2 = frobnicate\): unknown op 'frobnicate'"):
        verify(b.build([]))


def test_missing_or_mismatched_constant():
    b = GraphBuilder()
    c = b.constant(np.zeros(2, np.float32), F2, loc=LOC)
    graph = b.build([c])
    verify(graph)
    with pytest.raises(
        VerificationError, match=r"node 0 \(%0 = constant, at model.py:12 in forward\): constant 'c0' is missing"
    ):
        verify(Graph(graph.inputs, graph.nodes, graph.outputs, {}))
    with pytest.raises(VerificationError, match=r"shape \(3,\) and dtype float32, but the value's type is f32\[2\]"):
        verify(Graph(graph.inputs, graph.nodes, graph.outputs, {"c0": np.zeros(3, np.float32)}))
    with pytest.raises(VerificationError, match="dtype int64, but the value's type is f32"):
        verify(Graph(graph.inputs, graph.nodes, graph.outputs, {"c0": np.zeros(2, np.int64)}))
    with pytest.raises(VerificationError, match="expected a numpy array"):
        verify(Graph(graph.inputs, graph.nodes, graph.outputs, {"c0": [0.0, 0.0]}))
    bad = Graph((), (Node("constant", (), {"name": "c0", "x": 1}, (c,)),), (c,), graph.constants)
    with pytest.raises(VerificationError, match="a constant has no inputs and attrs"):
        verify(bad)


@pytest.mark.parametrize(
    ("value", "kind"),
    [([1, 2], "list"), (np.float64(1.0), "numpy.float64"), ((1, {2}), "set"), (int64.np, "numpy.dtypes.Int64DType")],
)
def test_attribute_kinds(value, kind):
    b, x, y = chain()
    b.node("cast", [y], {"dtype": value}, type=F2)
    with pytest.raises(VerificationError, match=f"attribute dtype=.* holds a {kind}; expected ints"):
        verify(b.build([]))


def test_malformed_values_and_nodes():
    with pytest.raises(VerificationError, match="graph input 0: %0 has shape \\[2\\], expected a tuple of ints"):
        verify(Graph((Value(0, TensorType([2], float32)),), (), ()))
    with pytest.raises(VerificationError, match="negative dimension"):
        verify(Graph((Value(0, TensorType((-1,), float32)),), (), ()))
    with pytest.raises(VerificationError, match="expected a Node, got str"):
        verify(Graph((), ("exp",), ()))
    b, x, y = chain()
    b.nodes.append(Node("exp", (y,), {}, ()))
    with pytest.raises(VerificationError, match="expected exactly one output, got 0"):
        verify(b.build([]))
    with pytest.raises(VerificationError, match="expected a Graph"):
        verify("graph")


def test_verification_error_is_a_value_error():
    assert issubclass(VerificationError, ValueError)


# -- kernel nodes ---------------------------------------------------------------------------
def _kernel(bodies, kind, inputs_types=None, name="k0", input_values=None):
    b = GraphBuilder()
    types = inputs_types or [v.type for body in bodies for v in body.inputs]
    ins = input_values(b) if input_values else [b.input(t) for t in types]
    outs = b.kernel(ins, bodies, kind, name=name)
    return b.build(list(outs))


def _body(shape=(4, 8), ops=("exp",), reduce=None, row_out=False, const_shape=(), dtype=float32):
    b = GraphBuilder()
    x = b.input(TensorType(shape, dtype))
    y = x
    for op in ops:
        y = b.node(op, [y])
    outs = [y]
    if reduce is not None:
        r = b.node("reduce_sum", [y], {"axes": reduce, "keepdim": True})
        outs = [b.node("div", [y, r])] + ([r] if row_out else [])
    if const_shape is not None:
        c = b.constant(np.zeros(const_shape, dtype.np), TensorType(const_shape, dtype))
        outs[0] = b.node("add", [outs[0], c])
    return b.build(outs)


def test_kernel_nodes_verify():
    from tests.ir.test_printer_parser import kernel_graph

    verify(kernel_graph())
    verify(_kernel([_body()], "elementwise"))
    verify(_kernel([_body(reduce=(1,), row_out=True)], "reduction"))
    verify(_kernel([_body((3,)), _body((2, 5))], "horizontal"))


def test_kernel_errors():
    def rejects(graph, match):
        with pytest.raises(VerificationError, match=match):
            verify(graph)

    rejects(_kernel([_body(reduce=(1,))], "elementwise"), "'reduce_sum' is not allowed in a kernel body of kind elem")
    rejects(_kernel([_body()], "reduction"), "a reduction body holds at least one reduce node")
    rejects(_kernel([_body(reduce=(0,))], "reduction"), "reduces trailing axes, got axes \\(0,\\)")
    rejects(_kernel([_body(const_shape=(8,))], "elementwise"), "constant %2 in a body must be 0-d")
    rejects(_kernel([_body()], "fused"), "kernel kind 'fused' is not one of")
    rejects(_kernel([_body(), _body()], "elementwise"), "a elementwise kernel has exactly one body, got 2")
    rejects(_kernel([_body(), _body(ops=("neg",))], "horizontal"), "member 1 .* not structurally identical")
    rejects(_kernel([_body()], "elementwise", name="a/b"), "non-empty string without '/'")
    rejects(_kernel([_body()], "elementwise", inputs_types=[TensorType((4, 8), float64)]),
            "input 0 has type f32\\[4,8\\] in the body but f64\\[4,8\\] on the node")  # fmt: skip
    copy_ = GraphBuilder()
    x = copy_.input(TensorType((4,), float32))
    rejects(_kernel([copy_.build([copy_.node("copy", [x])])], "elementwise"), "'copy' is not allowed")
    # Outputs of different shapes in an elementwise body.
    two = GraphBuilder()
    x = two.input(TensorType((4, 8), float32))
    two_graph = two.build([x, two.node("exp", [two.node("slice", [x], {"starts": (0, 0), "stops": (4, 1),
                                                                      "steps": (1, 1)})])])  # fmt: skip
    rejects(_kernel([two_graph], "elementwise"), "every output of an elementwise body has the domain's shape")
    # A reduction output that is neither full nor a row value.
    col = GraphBuilder()
    x = col.input(TensorType((4, 8), float32))
    r = col.node("reduce_sum", [x], {"axes": (1,), "keepdim": True})
    c = col.node("reduce_sum", [col.node("div", [x, r])], {"axes": (1,), "keepdim": False})
    verify(_kernel([col.build([c, r])], "reduction"))
    s = col.node("slice", [x], {"starts": (0, 0), "stops": (1, 8), "steps": (1, 1)})
    rejects(_kernel([col.build([s])], "reduction"), "is a full value \\[4, 8\\] or a row value \\[4\\]")
    # Two kernels with one name; a kernel inside a body.
    b = GraphBuilder()
    x = b.input(TensorType((4, 8), float32))
    (y,) = b.kernel([x], [_body(const_shape=None)], "elementwise", name="k")
    (z,) = b.kernel([y], [_body(const_shape=None)], "elementwise", name="k")
    rejects(b.build([z]), "kernel name 'k' is already used by node 0")
    rejects(_kernel([b.build([y])], "elementwise"), "op 'kernel' is not allowed")
