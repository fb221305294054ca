"""Symbolic dimensions (``Sym``) in the IR: types, text form, files, shape rules, verifier, interpreter.

A graph with a symbolic batch dimension is checked against the same graph built with that
dimension concrete, run by the interpreter on the same inputs at several batch sizes.
"""

from __future__ import annotations

import numpy as np
import pytest

from kiln.ir.dtypes import bool_, float32, int64
from kiln.ir.graph import GraphBuilder
from kiln.ir.interpreter import interpret
from kiln.ir.parser import ParseError, parse_graph
from kiln.ir.primitives import PRIMITIVES
from kiln.ir.printer import print_graph
from kiln.ir.serialize import FormatError, graph_from_json, graph_to_json, load_graph_file, save_graph_file
from kiln.ir.shapes import broadcast_shapes, numel
from kiln.ir.types import Sym, SymbolicShapeError, SymProduct, TensorType, dim_size, sym_product, sym_sum
from kiln.ir.verifier import VerificationError, verify
from tests.conftest import assert_close

B, N = Sym("B"), Sym("N")


def T(*shape, dtype=float32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def infer(op: str, *types: TensorType, **attrs) -> TensorType:
    return PRIMITIVES[op].infer(*types, **attrs)


# ----------------------------------------------------------------------------- types


def test_sym_is_a_named_hashable_size_and_sizes_that_need_it_raise():
    assert Sym("B") == B and hash(Sym("B")) == hash(B) and B != N and B != 1
    t = T(B, 128)
    assert str(t) == "f32[B,128]" and not t.is_static and t.symbols == (B,)
    with pytest.raises(SymbolicShapeError, match="symbolic"):
        _ = t.numel
    with pytest.raises(SymbolicShapeError, match="symbolic"):
        _ = t.nbytes
    with pytest.raises(SymbolicShapeError, match="symbolic"):
        numel((B, 3))
    bound = t.bind({B: 4})
    assert bound == T(4, 128) and bound.numel == 512 and bound.nbytes == 2048
    assert T(2, 3).nbytes == 24 and T(2, 3).bind({}) == T(2, 3)
    with pytest.raises(KeyError, match="B"):
        t.bind({N: 3})
    for bad in ("f32", "None", "inf", "a.b", "1B", ""):
        with pytest.raises(ValueError, match="identifier"):
            Sym(bad)


# ----------------------------------------------------------------------------- text form and files


def _symbolic_graph():
    b = GraphBuilder()
    x = b.input(T(B, 4, 8))
    w = b.input(T(8))
    y = b.node("mul", [x, w])
    r = b.node("reshape", [y], {"shape": (B, 32)})
    e = b.node("expand", [b.node("reshape", [w], {"shape": (1, 8)})], {"shape": (B, 8)})
    s = b.node("slice", [r], {"starts": (0, 2), "stops": (B, 10), "steps": (1, 1)})
    return b.build([r, e, s])


def test_text_form_round_trips_symbols_in_types_and_attributes():
    g = _symbolic_graph()
    verify(g)
    text = print_graph(g)
    assert "%0: f32[B,4,8]" in text and "{shape=(B, 32)}" in text and "stops=(B, 10)" in text
    back = parse_graph(text)
    verify(back)
    assert print_graph(back) == text
    assert back.inputs[0].type.shape == (B, 4, 8) and back.nodes[1].attrs["shape"] == (B, 32)
    # spaces are free inside a shape, as everywhere between tokens
    assert parse_graph("graph(%0: f32[ B , 128 ]) {\n  return (%0)\n}").inputs[0].type == T(B, 128)


@pytest.mark.parametrize(
    ("text", "column", "expected"),
    [
        ("graph(%0: f32[f32]) {", 15, "a dimension"),
        ("graph(%0: f32[-2]) {", 15, "a dimension"),
        ("graph(%0: f32[a.b]) {", 15, "a symbol is"),
    ],
)
def test_parse_errors_for_bad_dimensions(text, column, expected):
    with pytest.raises(ParseError, match=expected) as info:
        parse_graph(text + "\n  return (%0)\n}")
    assert info.value.column == column


def test_a_symbol_in_an_attribute_must_be_named_by_a_type_first():
    text = "graph(%0: f32[B,8]) {\n  %1: f32[B,8] = reshape(%0) {shape=(C, 8)}\n  return (%1)\n}"
    with pytest.raises(ParseError, match="a symbol that a type before it names"):
        parse_graph(text)


def test_json_and_graph_files_round_trip_symbols(tmp_path):
    g = _symbolic_graph()
    obj = graph_to_json(g)
    assert obj["inputs"][0]["type"]["shape"] == ["B", 4, 8]
    assert obj["nodes"][1]["attrs"]["shape"] == {"tuple": [{"sym": "B"}, 32]}
    assert print_graph(graph_from_json(obj, {})) == print_graph(g)
    path = tmp_path / "g.kiln"
    save_graph_file(path, g)
    loaded, _, _ = load_graph_file(path)
    assert print_graph(loaded) == print_graph(g)
    # validation stays strict: a bad name, a negative size, a symbol tag holding a non-name
    for bad_shape in (["f32", 4, 8], [-1, 4, 8], [1.5, 4, 8]):
        obj["inputs"][0]["type"]["shape"] = bad_shape
        with pytest.raises(FormatError, match=r"inputs\[0\]\.type\.shape\[0\]"):
            graph_from_json(obj, {})
    obj = graph_to_json(g)
    obj["nodes"][1]["attrs"]["shape"] = {"tuple": [{"sym": 3}, 32]}
    with pytest.raises(FormatError, match="identifier"):
        graph_from_json(obj, {})


# ----------------------------------------------------------------------------- shape rules


def test_broadcasting_a_symbol():
    assert broadcast_shapes((B, 1), (1, 4)) == (B, 4)
    assert broadcast_shapes((B, 4), (4,), (B, 1)) == (B, 4)
    assert broadcast_shapes((1,), (B,)) == (B,)
    for other in ((4, 4), (N, 4)):
        with pytest.raises(ValueError, match="a symbolic size broadcasts only with 1 or itself"):
            broadcast_shapes((B, 4), other)
    assert infer("add", T(B, 4), T(4)) == T(B, 4)
    assert infer("where", T(B, 1, dtype=bool_), T(B, 4), T(4)) == T(B, 4)
    assert infer("cast", T(B, 4), dtype=int64) == T(B, 4, dtype=int64)
    with pytest.raises(ValueError, match="is B in one and 3 in another"):
        infer("add", T(B, 4), T(3, 4))


def test_reductions_over_and_not_over_the_symbolic_axis():
    x = T(B, 3, 4)
    assert infer("reduce_sum", x, axes=(2,), keepdim=True) == T(B, 3, 1)
    assert infer("reduce_max", x, axes=(1, 2), keepdim=False) == T(B)
    assert infer("reduce_sum", x, axes=(0,), keepdim=False) == T(3, 4)
    assert infer("reduce_min", x, axes=(0, 1), keepdim=True) == T(1, 1, 4)
    assert infer("argmax", x, axis=2, keepdim=False) == T(B, 3, dtype=int64)
    assert infer("argmax", x, axis=None, keepdim=False) == T(dtype=int64)
    assert infer("cumsum", x, axis=0, reverse=False) == x


def test_matmul_with_symbolic_batch_and_rows():
    assert infer("matmul", T(B, 16), T(16, 32)) == T(B, 32)
    assert infer("matmul", T(B, N, 16), T(16, 8)) == T(B, N, 8)
    assert infer("matmul", T(B, 2, 3), T(1, 3, 4)) == T(B, 2, 4)
    assert infer("matmul", T(2, B), T(B, 3)) == T(2, 3)  # K symbolic, the same symbol on both sides
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        infer("matmul", T(2, B), T(N, 3))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        infer("matmul", T(4, 16), T(B, 3))


def test_movement_rules_carry_the_symbol_through():
    assert infer("reshape", T(B, 4, 8), shape=(B, 32)) == T(B, 32)
    assert infer("reshape", T(B, 32), shape=(4, B, 8)) == T(4, B, 8)  # any place: sizes match for every B
    with pytest.raises(RuntimeError, match="keeps each symbolic dimension whole"):
        infer("reshape", T(B, 4, 8), shape=(B, 16))
    with pytest.raises(RuntimeError, match="keeps each symbolic dimension whole"):
        infer("reshape", T(B, 4), shape=(N, 4))
    with pytest.raises(RuntimeError, match="keeps each symbolic dimension whole"):
        infer("reshape", T(B, 4), shape=(4 * 8,))  # a symbol cannot be merged into a concrete size
    assert infer("expand", T(1, 8), shape=(B, 8)) == T(B, 8)
    assert infer("expand", T(B, 1), shape=(3, B, 8)) == T(3, B, 8)
    with pytest.raises(RuntimeError, match="must match"):
        infer("expand", T(B, 1), shape=(4, 8))
    assert infer("permute", T(B, 3, 4), perm=(2, 0, 1)) == T(4, B, 3)
    assert infer("slice", T(B, 10), starts=(0, 2), stops=(B, 10), steps=(1, 2)) == T(B, 4)
    assert infer("slice", T(B, 10), starts=(1, 0), stops=(B, 10), steps=(1, 1)) == T(sym_sum([B], -1), 10)
    assert infer("slice", T(B, 10), starts=(0, 0), stops=(B, N), steps=(1, 1)) == T(B, N)  # x[:, :N]
    assert infer("slice", T(B, 10), starts=(0, 1), stops=(B, N), steps=(1, 1)) == T(B, sym_sum([N], -1))
    t1 = sym_sum([B], 1)  # a cat's gradient narrows its last part: from B to B+1
    assert infer("slice", T(t1, 3), starts=(B, 0), stops=(t1, 3), steps=(1, 1)) == T(1, 3)
    # the first two steps fit every size a dynamic program serves (>= 2); a third would not (B = 2)
    assert infer("slice", T(B, 10), starts=(0, 0), stops=(2, 10), steps=(1, 1)) == T(2, 10)
    assert infer("slice", T(B, 10), starts=(1, 0), stops=(2, 10), steps=(1, 1)) == T(1, 10)
    with pytest.raises(SymbolicShapeError, match="a symbolic stop"):
        infer("slice", T(B, 10), starts=(0, 0), stops=(3, 10), steps=(1, 1))
    with pytest.raises(SymbolicShapeError, match="a symbolic stop"):  # (B-1) may be 1
        infer("slice", T(sym_sum([B], -1), 10), starts=(0, 0), stops=(2, 10), steps=(1, 1))
    # a bound in another dim's symbols holds only while they compare as traced: refused, floor-divided too
    with pytest.raises(SymbolicShapeError, match="a symbolic stop"):
        infer("slice", T(N, 10), starts=(0, 0), stops=(sym_sum([B], 1), 10), steps=(1, 1))
    with pytest.raises(SymbolicShapeError, match="a symbolic stop"):
        infer("slice", T(N, 10), starts=(0, 0), stops=(sym_sum([B], 1, 2), 10), steps=(1, 1))
    assert infer("slice", T(sym_sum([B], 1, 2), 4), starts=(0, 0), stops=(sym_sum([B], 1, 2), 4),
                 steps=(1, 1)) == T(sym_sum([B], 1, 2), 4)  # fmt: skip
    with pytest.raises(SymbolicShapeError, match="a symbolic stop"):
        infer("slice", T(B, 10), starts=(0, 0), stops=(B, 10), steps=(2, 1))
    assert infer("pad", T(B, 3), low=(0, 1), high=(0, 1), interior=(0, 0), value=0.0) == T(B, 5)
    assert infer("pad", T(B, 3), low=(1, 0), high=(2, 0), interior=(0, 0), value=0.0) == T(sym_sum([B], 3), 3)
    assert str(infer("pad", T(B), low=(0,), high=(0,), interior=(1,), value=0.0).shape[0]) == "(2*B-1)"
    assert infer("concatenate", T(B, 3), T(B, 5), axis=1) == T(B, 8)
    assert infer("concatenate", T(B, 3), T(N, 3), T(2, 3), axis=0) == T(sym_sum([B, N], 2), 3)
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        infer("concatenate", T(B, 3), T(N, 3), axis=1)


def test_gather_and_checks_with_a_symbolic_batch():
    assert infer("gather", T(B, 10), T(B, 1, dtype=int64), axis=1) == T(B, 1)
    with pytest.raises(RuntimeError, match="must not exceed"):
        infer("gather", T(B, 10), T(N, 1, dtype=int64), axis=1)
    ok = T(B, 1, dtype=bool_)
    assert infer("check", ok, T(B, 1, dtype=int64), error="IndexError", message="m") == T(dtype=bool_)
    with pytest.raises(ValueError, match="shown values"):
        infer("check", ok, T(N, 1, dtype=int64), error="IndexError", message="m")


def test_rules_that_do_not_take_symbols_say_so():
    assert infer("unfold", T(2, 3, B, 8), kernel_size=(2, 2), stride=(2, 1), dilation=(1, 1)) == T(
        2, 3, 2, 2, sym_sum([B], 0, 2), 7
    )  # (B - 2)//2 + 1 windows
    with pytest.raises(SymbolicShapeError, match="kernel_size that follows a dynamic size"):  # adaptive pooling's
        infer("unfold", T(2, 3, B, 8), kernel_size=(B, 2), stride=(B, 1), dilation=(1, 1))
    assert infer("unfold", T(B, 3, 8, 8), kernel_size=(3, 3), stride=(1, 1), dilation=(1, 1)) == T(B, 3, 3, 3, 6, 6)


def test_random_bits_and_the_advance_past_them_take_symbolic_sizes():
    state = T(2, dtype=int64)
    assert infer("random_bits", state, shape=(B, 3)) == T(B, 3, dtype=int64)
    assert infer("random_advance", state, shape=(B, 3)) == state
    for op in ("random_bits", "random_advance"):
        with pytest.raises(ValueError, match=f"{op}: expected a shape of non-negative ints or symbolic sizes"):
            infer(op, state, shape=(B, -1))
        with pytest.raises(ValueError, match="non-negative ints or symbolic sizes, got"):
            infer(op, state, shape=(2.0,))
    # one graph draws at every size what a draw of that concrete size draws, and advances the offset
    # by ceil(3 * B / 4) blocks: 3*B is rarely a multiple of 4
    b = GraphBuilder()
    s = b.input(state)
    b.input(T(B, 3))  # an input that binds B
    graph = b.build([b.node("random_bits", [s], {"shape": (B, 3)}), b.node("random_advance", [s], {"shape": (B, 3)})])
    for n, blocks in ((2, 2), (5, 4), (7, 6), (8, 6)):
        seed_offset = np.array([7, 11], np.int64)
        bits, after = interpret(graph, [seed_offset, np.zeros((n, 3), np.float32)])
        np.testing.assert_array_equal(bits, PRIMITIVES["random_bits"].eager(np, seed_offset, shape=(n, 3)))
        np.testing.assert_array_equal(after, [7, 11 + blocks])


# ----------------------------------------------------------------------------- verifier


def test_the_verifier_re_infers_symbolic_types():
    b = GraphBuilder()
    x = b.input(T(B, 4))
    y = b.node("exp", [x], type=T(N, 4))  # the rule says f32[B,4]
    with pytest.raises(VerificationError, match=r"output type f32\[N,4\] does not match the type rule's f32\[B,4\]"):
        verify(b.build([y]))


def test_the_verifier_wants_every_symbol_bound_by_an_input():
    b = GraphBuilder()
    x = b.input(T(1, 4))
    y = b.node("expand", [x], {"shape": (B, 4)})
    graph = b.build([y])
    with pytest.raises(VerificationError, match="symbolic dimension B is not the size of any dimension"):
        verify(graph)
    with pytest.raises(ValueError, match="symbolic dimension B is not the size of any dimension"):
        interpret(graph, [np.ones((1, 4), np.float32)])


# ----------------------------------------------------------------------------- interpreter


def _mlp(batch):
    """matmul + bias + relu + matmul + bias + log_softmax, then a sum over the batch, with views
    that name the batch size (reshape, expand, slice) along the way."""
    b = GraphBuilder()
    x, w1, b1, w2, b2 = (b.input(T(*s)) for s in ((batch, 16), (16, 32), (32,), (32, 10), (10,)))
    zero = b.constant(np.zeros((), np.float32), T())
    h = b.node("add", [b.node("matmul", [x, w1]), b1])
    h = b.node("where", [b.node("gt", [h, zero]), h, zero])  # relu
    z = b.node("add", [b.node("matmul", [h, w2]), b.node("expand", [b2], {"shape": (batch, 10)})])
    z = b.node("reshape", [b.node("reshape", [z], {"shape": (batch, 2, 5)})], {"shape": (batch, 10)})
    z = b.node("slice", [z], {"starts": (0, 0), "stops": (batch, 10), "steps": (1, 1)})
    m = b.node("reduce_max", [z], {"axes": (1,), "keepdim": True})
    shifted = b.node("sub", [z, m])
    lse = b.node("log", [b.node("reduce_sum", [b.node("exp", [shifted])], {"axes": (1,), "keepdim": True})])
    out = b.node("sub", [shifted, lse])
    total = b.node("reduce_sum", [out], {"axes": (0,), "keepdim": False})
    return b.build([out, total])


def test_a_symbolic_mlp_runs_at_every_batch_size_like_the_concrete_one():
    rng = np.random.default_rng(0)
    symbolic = _mlp(B)
    verify(symbolic)
    assert symbolic.outputs[0].type == T(B, 10) and symbolic.outputs[1].type == T(10)
    weights = [rng.normal(size=s).astype(np.float32) for s in ((16, 32), (32,), (32, 10), (10,))]
    for batch in (1, 7, 32, 7):
        x = rng.normal(size=(batch, 16)).astype(np.float32)
        concrete = _mlp(batch)
        verify(concrete)
        expected = interpret(concrete, [x, *weights])
        actual = interpret(symbolic, [x, *weights])
        for a, e in zip(actual, expected, strict=True):
            assert a.shape == e.shape
            assert_close(a, e, rtol=0, atol=0)  # the same kernels on the same inputs: the same bits
        probabilities = np.exp(actual[0]).sum(axis=1)
        assert_close(probabilities, np.ones(batch, np.float32), rtol=1e-5, atol=1e-5)


def test_a_symbol_binds_one_size_across_inputs():
    b = GraphBuilder()
    x, y = b.input(T(B, 3)), b.input(T(B, 3))
    graph = b.build([b.node("add", [x, y])])
    ones = np.ones((4, 3), np.float32)
    np.testing.assert_array_equal(interpret(graph, [ones, ones])[0], 2 * ones)
    with pytest.raises(TypeError, match=r"input 1 of the graph: dimension 0 is the symbolic size B, which input 0 "
                                        r"\(dimension 0\) bound to 4, but it is 5 here"):  # fmt: skip
        interpret(graph, [ones, np.ones((5, 3), np.float32)])
    with pytest.raises(TypeError, match=r"expected float32 of shape \(B, 3\)"):
        interpret(graph, [ones, np.ones((4, 2), np.float32)])
    with pytest.raises(TypeError, match=r"expected float32 of shape \(B, 3\)"):
        interpret(graph, [ones, np.ones((4, 3), np.float64)])


# ----------------------------------------------------------------------------- products of symbols


def _flatten_graph():
    """A (B, N, 4) input flattened to (B*N, 4) rows and to (3*B*N*4 / 3 ...) and back: products of
    symbols in types and in reshape attributes."""
    b = GraphBuilder()
    x = b.input(T(B, N, 4))
    rows = b.node("reshape", [x], {"shape": (sym_product(1, [B, N]), 4)})
    doubled = b.node("reshape", [b.node("mul", [rows, rows])], {"shape": (sym_product(2, [B, N]), 2)})
    back = b.node("reshape", [doubled], {"shape": (B, N, 4)})
    return b.build([rows, doubled, back])


def test_a_product_of_symbols_has_one_spelling_and_binds_from_its_factors():
    p = sym_product(2, [N, B])
    assert p == sym_product(1, [2, B, N]) == sym_product(2, [sym_product(1, [B, N])]) and str(p) == "2*B*N"
    assert isinstance(p, SymProduct) and isinstance(p, Sym) and p.factors == (B, N) and p.scale == 2
    assert sym_product(1, [B]) == B and sym_product(3, []) == 3
    assert dim_size(p, {B: 5, N: 7}) == 70 and TensorType((p, 4), float32).bind({B: 2, N: 3}).shape == (12, 4)
    with pytest.raises(KeyError, match="symbolic dimension N has no size"):
        dim_size(p, {B: 5})


def test_products_round_trip_through_the_text_form_and_files(tmp_path):
    g = _flatten_graph()
    text = print_graph(g)
    assert "f32[B*N,4] = reshape(%0) {shape=(B*N, 4)}" in text and "f32[2*B*N,2]" in text
    assert print_graph(parse_graph(text)) == text
    obj = graph_to_json(g)
    assert obj["nodes"][0]["attrs"]["shape"] == {"tuple": [{"sym": "B*N"}, 4]}
    assert print_graph(graph_from_json(obj, {})) == text
    save_graph_file(tmp_path / "g.kiln", g)
    assert print_graph(load_graph_file(tmp_path / "g.kiln")[0]) == text


def test_reshape_counts_a_products_factors_and_the_verifier_binds_it_through_them():
    verify(_flatten_graph())
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    rows, doubled, back = interpret(_flatten_graph(), [x])
    assert_close(rows, x.reshape(6, 4), rtol=0, atol=0)
    assert_close(doubled, (x * x).reshape(12, 2), rtol=0, atol=0)
    assert_close(back, x * x, rtol=0, atol=0)
    assert PRIMITIVES["reshape"].infer(T(B, N, 4), shape=(sym_product(4, [B]), N)).shape == (sym_product(4, [B]), N)
    for wrong in ((sym_product(2, [B]), N), (sym_product(4, [B]), 1)):  # 2*B*N elements; no N
        with pytest.raises(RuntimeError, match="the same symbols on both sides"):
            PRIMITIVES["reshape"].infer(T(B, N, 4), shape=wrong)
    b = GraphBuilder()  # a product whose factor no input binds
    b.input(T(B, 4))
    z = b.node("expand", [b.constant(np.ones((1, 4), np.float32), T(1, 4))], {"shape": (sym_product(2, [B, N]), 4)})
    with pytest.raises(VerificationError, match="symbolic dimension N is not the size of any dimension"):
        verify(b.build([z]))
