"""The ``check`` primitive through every consumer of graphs: its kernel, the text form, JSON, the
verifier, dead-code elimination and CSE (its effect), and the LLVM executor (errors with the node,
the op and the user's line; no in-place write of an external before a check)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kiln.compiler.driver import compile_graph
from kiln.compiler.options import CompileOptions
from kiln.ir.dtypes import bool_, float32, int64
from kiln.ir.graph import Graph, GraphBuilder, SourceLocation
from kiln.ir.interpreter import interpret
from kiln.ir.parser import parse_graph
from kiln.ir.primitives import PRIMITIVES, has_effect
from kiln.ir.primitives.checks import ERRORS
from kiln.ir.serialize import graph_from_json, graph_to_json
from kiln.ir.types import TensorType
from kiln.ir.verifier import VerificationError, verify
from kiln.passes import eliminate_common_subexpressions, eliminate_dead_code
from tests.ir.test_printer_parser import assert_same_graph

CHECK = PRIMITIVES["check"]
LLVM = CompileOptions(backend="llvm")
LOC = SourceLocation("model.py", 42, "forward")
MESSAGE = 'index {value} is "out" of [0, 3)\nsecond line'


def _index_graph():
    """x[i] for 3 rows, with the bounds check the frontend records."""
    b = GraphBuilder()
    x = b.input(TensorType((3, 2), float32))
    i = b.input(TensorType((4,), int64))
    low = b.node("ge", [i, b.constant(np.array(0), TensorType((), int64))])
    high = b.node("lt", [i, b.constant(np.array(3), TensorType((), int64))])
    ok = b.node("logical_and", [low, high])
    b.node("check", [ok, i], {"error": "IndexError", "message": MESSAGE}, loc=LOC)
    return b.build([b.node("take", [x, i], loc=LOC)])


def test_kernel_raises_the_named_error_with_the_first_failing_value():
    ok = np.array([[True, False], [True, False]])
    shown = np.array([[1, -7], [2, 9]])
    for name, error in ERRORS.items():
        with pytest.raises(error, match="^bad -7 here$"):
            CHECK.eager(np, ok, shown, error=name, message="bad {value} here")
    assert CHECK.eager(np, np.ones((2, 2), bool), shown, error="IndexError", message="m").item() is True
    assert CHECK.eager(np, np.zeros((0,), bool), error="ValueError", message="m").item() is True
    with pytest.raises(ZeroDivisionError, match=r"^no \{value\} without shown$"):
        CHECK.eager(np, np.zeros((), bool), error="ZeroDivisionError", message="no {value} without shown")


def test_shape_rule_rejects_what_a_graph_must_not_hold():
    ok, shown = TensorType((4,), bool_), TensorType((4,), int64)
    assert CHECK.infer(ok, shown, error="IndexError", message="m") == TensorType((), bool_)
    with pytest.raises(ValueError, match="unknown error 'SystemExit'"):
        CHECK.infer(ok, error="SystemExit", message="m")
    with pytest.raises(TypeError, match="bool tensor of conditions, got int64"):
        CHECK.infer(shown, error="IndexError", message="m")
    with pytest.raises(ValueError, match=r"shown values of shape \[4\], got \[3\]"):
        CHECK.infer(ok, TensorType((3,), int64), error="IndexError", message="m")
    assert has_effect("check") and not has_effect("add") and not has_effect("kernel")


def test_text_and_json_round_trip_and_verify():
    graph = _index_graph()
    verify(graph)
    text = str(graph)
    assert "check(%" in text and '"IndexError"' in text
    back = parse_graph(text, graph.constants)
    assert_same_graph(graph, back)
    from_json = graph_from_json(json.loads(json.dumps(graph_to_json(graph), allow_nan=False)), graph.constants)
    assert_same_graph(graph, from_json)
    broken = text.replace('"IndexError"', '"SystemExit"')
    with pytest.raises((VerificationError, ValueError), match="SystemExit"):
        verify(parse_graph(broken, graph.constants))


def test_interpreter_raises_with_the_node_and_the_line():
    graph = _index_graph()
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert interpret(graph, [x, np.array([0, 2, 1, 1])])[0].tolist() == x[[0, 2, 1, 1]].tolist()
    with pytest.raises(
        IndexError, match=r'(?s)^index 3 is "out".*node 5: %7 = check\(%6, %1\) at model\.py:42 in forward'
    ):
        interpret(graph, [x, np.array([0, 3, -1, 1])])


def test_dead_code_elimination_keeps_a_check_whose_output_nothing_reads():
    graph = _index_graph()
    without_result = Graph(graph.inputs, graph.nodes, (), graph.constants)
    kept = eliminate_dead_code(without_result)
    assert [n.op for n in kept.nodes] == ["constant", "ge", "constant", "lt", "logical_and", "check"]
    with pytest.raises(IndexError):
        interpret(kept, [np.zeros((3, 2), np.float32), np.array([0, 1, 2, 3])])


def test_cse_merges_checks_of_one_condition_keeping_the_first_and_no_others():
    b = GraphBuilder()
    i = b.input(TensorType((4,), int64))
    zero = b.constant(np.array(0), TensorType((), int64))
    ok = b.node("ge", [i, zero])
    other = b.node("gt", [i, zero])
    b.node("check", [ok, i], {"error": "IndexError", "message": "first {value}"})
    b.node("check", [ok], {"error": "RuntimeError", "message": "second"})  # can never raise: merged
    b.node("check", [other], {"error": "RuntimeError", "message": "third"})  # another condition: kept
    graph = eliminate_dead_code(eliminate_common_subexpressions(b.build([b.node("neg", [i])])))
    checks = [n for n in graph.nodes if n.op == "check"]
    assert [n.attrs["message"] for n in checks] == ["first {value}", "third"]
    with pytest.raises(IndexError, match="first -1"):
        interpret(graph, [np.array([1, -1, 0, 2])])
    with pytest.raises(RuntimeError, match="third"):
        interpret(graph, [np.array([1, 1, 0, 2])])


def test_llvm_executor_raises_the_check_and_extern_errors_with_the_node_and_the_line():
    program = compile_graph(_index_graph(), LLVM).program
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert program.run([x, np.array([0, 2, 1, 1])])[0].tolist() == x[[0, 2, 1, 1]].tolist()
    with pytest.raises(IndexError, match=r'(?s)^index 3 is "out".*= check\(.*at model\.py:42 in forward') as info:
        program.run([x, np.array([0, 3, -1, 1])])
    assert isinstance(info.value.__cause__, IndexError)
    b = GraphBuilder()  # an extern whose own kernel raises (no check in front of it)
    xv, iv = b.input(TensorType((3, 2), float32)), b.input(TensorType((1,), int64))
    unchecked = compile_graph(b.build([b.node("take", [xv, iv], loc=LOC)]), LLVM).program
    with pytest.raises(IndexError, match=r"(?s)out of bounds.*node 0: %2 = take\(%0, %1\) at model\.py:42 in forward"):
        unchecked.run([x, np.array([5])])


def _update_graph(check_first: bool) -> Graph:
    """p + 1 written back to p (an optimizer-like update), and a check of i before or after it."""
    b = GraphBuilder()
    p = b.input(TensorType((8,), float32))
    i = b.input(TensorType((8,), int64))

    def check():
        ok = b.node("ge", [i, b.constant(np.array(0), TensorType((), int64))])
        b.node("check", [ok, i], {"error": "IndexError", "message": "index {value}"})

    if check_first:
        check()
    updated = b.node("add", [p, b.constant(np.array(1.0, np.float32), TensorType((), float32))])
    if not check_first:
        check()
    return b.build([updated])


@pytest.mark.parametrize("check_first", [True, False])
def test_no_in_place_write_of_an_input_before_a_check(check_first):
    program = compile_graph(_update_graph(check_first), LLVM, write_backs=[(0, 0)]).program
    assert program.write_backs == ({0: 0} if check_first else {})
    p = np.zeros(8, np.float32)
    out = program.run([p, np.arange(8)])[0]
    assert out.tolist() == [1.0] * 8 and (out is p) == check_first
    before = p.copy()
    with pytest.raises(IndexError, match="index -1"):
        program.run([p, np.array([0, 1, 2, -1, 4, 5, 6, 7])])
    assert p.tolist() == before.tolist(), "a call that raised wrote its input"
