"""Walks the primitive registry: every rule present, and each rule checked against a reference.

For every primitive and every one of its samples: the eager kernel against PyTorch (float32 and
float64, contiguous and not), the shape rule against the eager result, the VJP against central
finite differences in float64, and for elementwise primitives the scalar formula against the
eager kernel.
"""

from __future__ import annotations

import operator
from types import SimpleNamespace

import numpy as np
import pytest

import kiln
from kiln.frontend.dispatch import apply, types_of
from kiln.ir.emitter import NumpyEmitter
from kiln.ir.graph import BODY_REDUCE_OPS, BODY_VIEW_OPS
from kiln.ir.primitives import ELEMENTWISE, NO_COMBINE, PRIMITIVES, Kind, missing_rules, required_rules
from tests.conftest import assert_close, tol

PRIMS = sorted(PRIMITIVES.values(), key=lambda p: p.name)
ids = [p.name for p in PRIMS]


def samples_of(prim):
    return prim.samples(np.random.default_rng(0))


def as_dtype(array, dtype):
    array = np.asarray(array)
    return array.astype(dtype) if array.dtype.kind == "f" else array


def kiln_args(sample, dtype=np.float64, layout="C"):
    out = []
    for a in sample.args:
        a = as_dtype(a, dtype)
        if layout == "F" and a.ndim >= 2:
            a = np.asfortranarray(a)
        out.append(kiln.from_numpy(a))
    return out


@pytest.mark.parametrize("prim", PRIMS, ids=ids)
def test_every_rule_its_kind_requires_is_present(prim):
    assert not missing_rules(prim), f"{prim.name} lacks {missing_rules(prim)}"


@pytest.mark.parametrize("prim", PRIMS, ids=ids)
def test_shape_rule_agrees_with_eager_kernel(prim):
    for sample in samples_of(prim):
        args = kiln_args(sample, np.float32)
        out = apply(prim, *args, **sample.attrs)
        inferred = prim.infer(*types_of(args), **sample.attrs)
        assert tuple(out.shape) == inferred.shape, f"{prim.name}{sample.attrs}"
        assert out.dtype is inferred.dtype, f"{prim.name}{sample.attrs}: {out.dtype} vs {inferred.dtype}"


@pytest.mark.parametrize("prim", [p for p in PRIMS if p.reference is not None], ids=lambda p: p.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["C", "F"])
def test_eager_kernel_matches_pytorch(prim, dtype, layout, torch):
    for sample in samples_of(prim):
        args = kiln_args(sample, dtype, layout)
        out = apply(prim, *args, **sample.attrs)
        expected = prim.reference(torch, *[torch.from_numpy(np.array(a._data)) for a in args], **sample.attrs)
        assert_close(out, expected, **tol(out.dtype))


@pytest.mark.parametrize("prim", [p for p in PRIMS if p.differentiable], ids=lambda p: p.name)
def test_vjp_matches_finite_differences(prim):
    checked = 0
    for sample in samples_of(prim):
        if not sample.gradcheck:
            continue
        args = kiln_args(sample, np.float64)
        args = [a.clone().requires_grad_() if a.is_floating_point() else a for a in args]
        kiln.autograd.gradcheck(lambda *xs, a=sample.attrs: apply(prim, *xs, **a), args, atol=1e-6, rtol=1e-4)
        checked += 1
    assert checked, f"{prim.name} has no sample for the gradient check"


@pytest.mark.parametrize("prim", [p for p in PRIMS if p.kind in ELEMENTWISE], ids=lambda p: p.name)
def test_scalar_formula_matches_eager_kernel(prim):
    em = NumpyEmitter()
    for sample in samples_of(prim):
        args = kiln_args(sample, np.float32)
        expected = apply(prim, *args, **sample.attrs)
        got = prim.scalar(em, *[np.broadcast_to(a._data, expected.shape) for a in args], **sample.attrs)
        assert_close(kiln.from_numpy(np.asarray(got)), expected, rtol=1e-6, atol=1e-7)


def test_registry_covers_the_kinds_the_design_names():
    kinds = {p.kind for p in PRIMS}
    assert {Kind.UNARY, Kind.BINARY, Kind.TERNARY, Kind.CAST, Kind.REDUCE, Kind.MOVEMENT} <= kinds


def test_kinds_require_their_lowering_rules():
    """Reductions need a combine op (or NO_COMBINE) and an identity; views an index map."""
    assert {"combine", "identity"} <= set(required_rules(PRIMITIVES["reduce_sum"]))
    assert "identity" not in required_rules(PRIMITIVES["argmax"]) and PRIMITIVES["argmax"].combine == NO_COMBINE
    assert "index_map" in required_rules(PRIMITIVES["permute"])
    assert "index_map" not in required_rules(PRIMITIVES["flip"])  # a copy, not a view


def test_body_op_sets_derive_from_the_registry():
    assert BODY_VIEW_OPS == {"reshape", "expand", "permute", "slice"}
    assert BODY_REDUCE_OPS == {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod"}


#: The index algebra of plain ints: an index map evaluated on one concrete output index.
INT_ALGEBRA = SimpleNamespace(zero=0, const=int, add=operator.add, scale=operator.mul, divmod=divmod)


@pytest.mark.parametrize("prim", [p for p in PRIMS if p.index_map is not None], ids=lambda p: p.name)
def test_view_index_maps_read_what_the_eager_view_holds(prim):
    """For every element of the eager view: the element of the input its index map names."""
    for sample in samples_of(prim):
        (x,) = sample.args
        view = np.asarray(prim.eager(np, x, **sample.attrs))
        for index in np.ndindex(view.shape):
            source = prim.index_map(INT_ALGEBRA, index, x.shape, view.shape, **sample.attrs)
            assert view[index] == x[source], f"{prim.name}{sample.attrs} at {index}: read {source}"


@pytest.mark.parametrize("prim", [p for p in PRIMS if p.kind is Kind.REDUCE and p.combine], ids=lambda p: p.name)
def test_reduction_combine_and_identity_match_the_eager_kernel(prim):
    """Folding the combine op (on the reference emitter) over the reduced axes from the identity."""
    em = NumpyEmitter()
    for sample in samples_of(prim):
        (x,) = sample.args
        axes = sample.attrs["axes"]
        expected = prim.eager(np, x, **sample.attrs)
        rows = np.moveaxis(x, axes, tuple(range(x.ndim - len(axes), x.ndim))) if axes else x
        outer = rows.shape[: x.ndim - len(axes)]
        rows = rows.reshape(*outer, int(np.prod(rows.shape[len(outer) :])))
        acc = np.full(rows.shape[:-1], prim.identity(kiln.float64), np.float64)
        for k in range(rows.shape[-1]):
            acc = getattr(em, prim.combine)(acc, rows[..., k])
        np.testing.assert_allclose(acc.reshape(np.shape(expected)), expected, rtol=1e-12)


@pytest.mark.parametrize("prim", [p for p in PRIMS if p.eager_into is not None], ids=lambda p: p.name)
def test_eager_into_writes_what_the_eager_kernel_returns(prim):
    """The kernel an executor calls to write into its arena (``out=``) gives the eager result, in place."""
    for sample in samples_of(prim):
        expected = np.asarray(prim.eager(np, *sample.args, **sample.attrs))
        out = np.full(expected.shape, np.nan, expected.dtype)
        prim.eager_into(np, *sample.args, out=out, **sample.attrs)
        np.testing.assert_array_equal(out, expected)


def test_only_planned_externs_write_into_the_arena():
    from kiln.passes.memory_plan import PLANNED_EXTERNS

    assert PLANNED_EXTERNS == {p.name for p in PRIMS if p.eager_into is not None} and "matmul" in PLANNED_EXTERNS


def test_exact_and_step_mark_elementwise_primitives_and_every_comparison_is_exact():
    """``Primitive.exact``/``step`` (the partition's rule for values a backward decision reads) are
    elementwise properties; a comparison (bool result) selects nothing rounded, so it is exact."""
    for prim in PRIMITIVES.values():
        if prim.exact or prim.step:
            assert prim.kind in ELEMENTWISE, prim.name
    comparisons = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not"}
    assert all(PRIMITIVES[name].exact for name in comparisons)
    assert not any(PRIMITIVES[name].exact for name in ("add", "mul", "exp", "div", "floor_divide"))
