"""Exported programs with dynamic sizes in any dimension (issue 33, item 6): ``kiln.export(...,
dynamic_shapes=[{0: "batch", 1: "seq"}])``, saved and loaded, run compiled at other sizes and equal
the eager model; a size the program cannot take is refused with the comparison that rules it out.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.frontend.jit.symbolic_program import SymbolicProgram
from kiln.ir.serialize import load_graph_file
from kiln.ir.types import Sym
from tests.conftest import assert_close
from tests.frontend.jit.test_dynamic_inner_sizes import TinyGPT

rng = np.random.default_rng(5)


class GuardedGPT(TinyGPT):
    """TinyGPT as nanoGPT writes it: a length past the position table is refused by an assert."""

    def forward(self, idx):
        assert idx.shape[1] <= 32, "sequence longer than the block size"
        return super().forward(idx)


def _exported_and_loaded(model, example, dynamic_shapes, path):
    with kiln.no_grad():
        program = kiln.export(model, example, dynamic_shapes=dynamic_shapes)
    program.save(path)
    return program, kiln.load_exported(path)


@pytest.mark.parametrize("dims", [{1: "seq"}, {0: "batch", 1: "seq"}])
def test_an_exported_gpt_runs_compiled_at_other_lengths_and_equals_eager(tmp_path, dims):
    kiln.manual_seed(0)
    model = TinyGPT().eval()
    program, loaded = _exported_and_loaded(model, kiln.tensor(rng.integers(0, 13, (2, 8))), [dims], tmp_path / "g.kiln")
    assert loaded.graph.inputs[0].type.shape == tuple(Sym(dims[d]) if d in dims else 2 for d in range(2))
    sizes = [(2, 5), (2, 8), (2, 17), (2, 1), (2, 32), (2, 5)] + ([(4, 9), (1, 3)] if 0 in dims else [])
    for b, t in sizes:
        idx = kiln.tensor(rng.integers(0, 13, (b, t)))
        with kiln.no_grad():
            expected = model(idx).numpy()
        assert_close(loaded(idx).numpy(), expected, rtol=1e-5, atol=1e-5)
        assert_close(program(idx).numpy(), expected, rtol=1e-5, atol=1e-5)
    assert isinstance(loaded._program, SymbolicProgram)
    assert loaded._program.lowerings == len(set(sizes))  # code generated once, loaded per size
    assert loaded._program.report.kernels >= 10


def test_an_exported_lstm_runs_at_other_sequence_lengths_and_equals_eager(tmp_path):
    kiln.manual_seed(0)
    model = nn.LSTM(4, 6, num_layers=2, batch_first=True).eval()

    def f(x):
        out, (h, c) = model(x)
        return out, h, c

    _, loaded = _exported_and_loaded(f, kiln.randn(3, 7, 4), [{1: "seq"}], tmp_path / "lstm.kiln")
    for t in (7, 2, 12, 5):
        x = kiln.randn(3, t, 4)
        with kiln.no_grad():
            expected = f(x)
        for actual, e in zip(loaded(x), expected, strict=True):
            assert_close(actual.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)
    assert isinstance(loaded._program, SymbolicProgram) and loaded._program.lowerings == 4


def test_a_size_the_program_was_not_traced_for_is_refused_with_its_guard(tmp_path):
    kiln.manual_seed(0)
    model = GuardedGPT().eval()
    path = tmp_path / "guarded.kiln"
    program, loaded = _exported_and_loaded(model, kiln.tensor(rng.integers(0, 13, (2, 8))), [{1: "seq"}], path)
    for p in (program, loaded):
        assert [str(g) for g in p.size_guards] == ["size <= 32"]
        idx = kiln.tensor(rng.integers(0, 13, (2, 32)))
        with kiln.no_grad():
            assert_close(p(idx).numpy(), model(idx).numpy(), rtol=1e-5, atol=1e-5)
        with pytest.raises(
            ValueError, match=r"argument 0 dim 1: size <= 32 is not True at size 33 \(.*test_export_dynamic"
        ):
            p(kiln.tensor(rng.integers(0, 13, (2, 33))))
    assert load_graph_file(path)[2]["export_format_version"] == 2  # older kilns refuse it, not drop its guard


def test_dynamic_shapes_that_cannot_be_exported_say_why():
    def f(x, y):
        return x * 2.0 + y

    with pytest.raises(kiln.jit.ExportError, match="names dimension 2 of a tensor of shape"):
        kiln.export(f, kiln.ones(4, 3), kiln.ones(4, 3), dynamic_shapes=[{2: "n"}, None])
    with pytest.raises(kiln.jit.ExportError, match="the dynamic size n is 4 and 3"):
        kiln.export(f, kiln.ones(4, 3), kiln.ones(4, 3), dynamic_shapes=[{0: "n", 1: "n"}, None])

    def branches(x):  # a branch on the length that no single comparison with an int describes
        return x * 2.0 if x.shape[1] % 2 else x

    with pytest.raises(kiln.jit.ExportError, match="cannot check at each call"):
        kiln.export(branches, kiln.ones(2, 5), dynamic_shapes=[{1: "seq"}])

    def folded(x):  # 1 at both traced lengths (5 and 11): exported as a constant, it would be 1 at 6 too
        return x * (x.shape[1] % 2)

    with pytest.raises(kiln.jit.ExportError, match="a number computed from a dynamic size that is the same at both"):
        kiln.export(folded, kiln.ones(2, 5), dynamic_shapes=[{1: "seq"}])


@pytest.mark.parametrize(
    ("guard", "why"),
    [
        ([0, 0, "__le__", 32, True, "x.py:1"], "not a dynamic size"),  # dim 0 is the static batch
        ([0, 1, "__class__", 32, True, "x.py:1"], "not a comparison"),
        ([0, 1, "__le__", 3.5, True, "x.py:1"], "not a comparison"),
        ([7, 1, "__le__", 32, True, "x.py:1"], "out of range"),
        ([0, 1, "__le__"], "not a valid exported program"),
    ],
)
def test_a_damaged_size_guard_in_a_file_is_refused_at_load(tmp_path, guard, why):
    from kiln.ir.serialize import save_graph_file  # noqa: PLC0415

    kiln.manual_seed(0)
    path = tmp_path / "guarded.kiln"
    _exported_and_loaded(GuardedGPT().eval(), kiln.tensor(rng.integers(0, 13, (2, 8))), [{1: "seq"}], path)
    graph, tensors, meta = load_graph_file(path)
    save_graph_file(path, graph, tensors=tensors, metadata={**meta, "size_guards": [guard]})
    with pytest.raises(kiln.jit.ExportError, match=why):
        kiln.load_exported(path)
