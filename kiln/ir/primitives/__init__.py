"""The primitive registry: every primitive op of kiln, defined once.

A ``Primitive`` carries every rule about one op, side by side:

- ``infer(*types, **attrs) -> TensorType``: the shape/dtype rule. The tracer and the
  verifier run it; eager execution runs it when a kernel fails, to turn a numpy error into one
  that names what was expected and what was given.
- ``eager(xp, *arrays, **attrs) -> array``: the kernel, written once against an array
  namespace ``xp`` (numpy on the CPU, cupy on CUDA). It is also the interpreter's kernel.
- ``vjp(ops, ctx, g) -> tuple``: the vector-Jacobian product, one entry per input (``None``
  where no gradient flows), written with kiln tensor ops passed in as ``ops`` so the same rule
  runs eagerly, builds higher-order graphs, and is recorded when traced. ``ctx`` gives
  ``inputs`` and ``output`` (saved when ``save_inputs``/``save_output`` say so), ``attrs``,
  ``input_types`` and ``needs_input_grad``. ``NOT_DIFFERENTIABLE`` marks ops with no gradient.
- ``scalar(em, *values, **attrs)``: for elementwise kinds, the formula for one element against
  an emitter protocol (``em.add``, ``em.exp``, ``em.select``...) that each code generator
  implements; fusion evaluates a chain of these in one loop nest.
- ``combine`` and ``identity``, for reductions: the name of the emitter method that folds one
  element into the running value (``"add"``, ``"max"``) and ``identity(dtype)``, the value over no
  elements; code generators lower every reduction from these two. ``NO_COMBINE`` marks a
  reduction no code generator fuses (argmax: its running value is an index).
- ``index_map(ix, index, in_shape, out_shape, **attrs)``, for views: the index into the input that
  an index into the output reads, written against an index-algebra namespace ``ix`` (``zero``,
  ``const(c)``, ``add``, ``scale(e, k)``, ``divmod(e, d)``) that the caller supplies -- symbolic
  affine forms in a kernel generator, plain ints in the tests.
- ``reference(torch, *tensors, **attrs)``: the same op in PyTorch, the parity oracle.
- ``samples(rng) -> list[Sample]``: example arguments, so that generic tests walk the
  registry: eager against the reference, ``infer`` against eager, ``vjp`` against finite
  differences.

A primitive with ``effect`` (``check``, which raises unless a condition holds; ``all_reduce``, which
other processes wait for) must run even when nothing reads its output: passes never drop it (``has_effect``).

Composite ops (softmax, gelu, linear...) are Python over primitives in ``kiln.frontend.ops``
and have no rules of their own. ``tests/ir/test_registry.py`` fails when a primitive lacks a
rule that its kind requires.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..types import TensorType


class Kind(enum.Enum):
    UNARY = "unary"  # elementwise, one input
    BINARY = "binary"  # elementwise, two inputs of one shape after broadcasting
    TERNARY = "ternary"  # elementwise, three inputs (where)
    CAST = "cast"  # elementwise dtype conversion
    REDUCE = "reduce"  # reduction over axes
    SCAN = "scan"  # cumulative op along an axis
    MATMUL = "matmul"
    MOVEMENT = "movement"  # reshape, permute, slice, pad, cat...: moves elements, computes none
    INDEX = "index"  # gather / scatter with index tensors
    CREATION = "creation"  # iota, full
    RANDOM = "random"  # counter-based random bits
    WINDOW = "window"  # sliding windows (unfold/fold): the basis of conv and pooling
    CHECK = "check"  # raises unless a condition holds on values (index ranges, division by zero)
    COLLECTIVE = "collective"  # communicates with the other processes of a job (all_reduce)
    DECOMPOSITION = "decomposition"  # a matrix decomposition through numpy.linalg: never fused, run as an extern
    RECURRENCE = "recurrence"  # an RNN layer's loop over time steps (rnn_scan): never fused, run as an extern
    ORDER = "order"  # the positions that sort values (argsort): never fused, run as an extern


ELEMENTWISE = frozenset({Kind.UNARY, Kind.BINARY, Kind.TERNARY, Kind.CAST})


class Cost(enum.Enum):
    """What one element of an elementwise primitive costs on a CPU's vector unit, the one cost model
    that fusion's recomputation and the code generators' kept values read (each says which classes
    are worth a store and a load for it)."""

    CHEAP = "cheap"  # one or a few short instructions (add, compare, select, floor, cast)
    DIVISION = "division"  # one long-latency instruction and its fix-ups (div, sqrt, rsqrt, floor_divide)
    ROUTINE = "routine"  # a math-library routine of tens of instructions (exp, log, tanh, sin, pow, erf)


def _not_differentiable(ops: Any, ctx: Any, g: Any) -> tuple:
    raise AssertionError("a non-differentiable primitive was asked for its VJP")


#: Marker for primitives without gradient (comparisons, argmax, random bits...).
NOT_DIFFERENTIABLE: Callable[..., tuple] = _not_differentiable

#: Marker for reductions without a scalar combine op: code generators leave them to the interpreter.
NO_COMBINE = ""


@dataclass(frozen=True)
class Sample:
    """Example arguments for one primitive call: numpy arrays and attributes."""

    args: tuple
    attrs: dict = field(default_factory=dict)
    gradcheck: bool = True  # False where finite differences are ill-posed (kinks, ties)


@dataclass(frozen=True, eq=False)
class Primitive:
    name: str
    kind: Kind
    infer: Callable[..., TensorType]
    eager: Callable[..., Any]
    vjp: Callable[..., tuple] | None = None
    save_inputs: bool = False
    save_output: bool = False
    scalar: Callable[..., Any] | None = None
    reference: Callable[..., Any] | None = None
    samples: Callable[[Any], Sequence[Sample]] | None = None
    is_view: bool = False  # the eager result shares memory with input 0 (PyTorch's view ops)
    # the eager kernel writing its result into a given array, ``eager_into(xp, *arrays, out=, **attrs)``:
    # an executor may then place the result in its arena (matmul through BLAS straight into place)
    eager_into: Callable[..., Any] | None = None
    combine: str | None = None  # reductions: the emitter method folding an element into the running value
    identity: Callable[[Any], object] | None = None  # reductions: dtype -> the value over no elements
    index_map: Callable[..., tuple] | None = None  # views: output index -> the input index it reads
    effect: bool = False  # the node runs even when nothing reads its output (a check that raises)
    cost: Cost | None = None  # elementwise: what an element costs against a store and a load (see Cost)
    # elementwise: any two kernels compute it alike from the same input bits -- it selects, compares or
    # converts, and has no rounding LLVM could contract with a neighbour's (``passes/partition``)
    exact: bool = False
    # elementwise: its result jumps where a float input crosses a point (floor, sign): a decision, as
    # a comparison's is (``passes/partition``)
    step: bool = False
    doc: str = ""

    @property
    def differentiable(self) -> bool:
        return self.vjp is not None and self.vjp is not NOT_DIFFERENTIABLE

    def __repr__(self) -> str:
        return f"<primitive {self.name}>"


PRIMITIVES: dict[str, Primitive] = {}


def register(prim: Primitive) -> Primitive:
    assert prim.name not in PRIMITIVES, f"primitive {prim.name} is defined twice"
    PRIMITIVES[prim.name] = prim
    return prim


def required_rules(prim: Primitive) -> list[str]:
    """The rules a primitive of this kind must have; the registry test checks them."""
    rules = ["infer", "eager", "vjp", "samples"]
    if prim.kind in ELEMENTWISE:
        rules += ["scalar", "cost"]
    if prim.kind is Kind.REDUCE:
        rules.append("combine")  # NO_COMBINE where no code generator fuses it
        if prim.combine != NO_COMBINE:
            rules.append("identity")
    if prim.is_view:
        rules.append("index_map")
    if prim.kind is not Kind.RANDOM:  # random bits are checked against Philox's test vectors
        rules.append("reference")
    return rules


def ops_of_cost(cost: Cost) -> frozenset[str]:
    """The elementwise primitives of one cost class (``Primitive.cost``), by name."""
    return frozenset(name for name, prim in PRIMITIVES.items() if prim.cost is cost)


def has_effect(op: str) -> bool:
    """Whether nodes of ``op`` must run even when nothing reads their output (kernels and
    constants have no effect)."""
    prim = PRIMITIVES.get(op)
    return prim is not None and prim.effect


def missing_rules(prim: Primitive) -> list[str]:
    return [rule for rule in required_rules(prim) if getattr(prim, rule) is None]


# Importing the definitions fills PRIMITIVES; the order fixes nothing but the printout.
from . import (  # noqa: E402,F401
    bitwise,
    checks,
    collectives,
    convolution,
    decompositions,
    elementwise,
    indexing,
    linalg,
    movement,
    ordering,
    random,
    recurrence,
    reductions,
    tiles,
    windows,
)

P = PRIMITIVES

#: The view ops a kernel body may hold (index remapping, never a copy): those with an index map.
VIEW_OPS = frozenset(p.name for p in PRIMITIVES.values() if p.index_map is not None)
#: The reductions a reduction kernel's body may hold: those with a combine op.
FUSIBLE_REDUCE_OPS = frozenset(p.name for p in PRIMITIVES.values() if p.kind is Kind.REDUCE and p.combine)
