"""One ONNX rule per kiln primitive: ``RULES[op](b, node, *inputs) -> output name``.

Each rule writes the ONNX operators that compute exactly what the primitive's eager kernel
computes, kiln's edge cases included (``sign`` of nan is 0, float -> int casts truncate and
saturate, Python's floor division and remainder, integer division by zero gives 0, ``expm1`` and
``log1p`` stay accurate near 0). ``UNMAPPABLE`` lists the primitives no ONNX operator expresses,
each with the reason; ``tests/onnx`` walks the registry and fails on a primitive in neither.
"""

from __future__ import annotations

import numpy as np

from ..ir import dtypes as dt
from ..ir.types import Sym
from . import _indexing as ix
from ._builder import INT64_MAX, INT64_MIN, OnnxExportError, onnx_dtype
from ._recurrence import rnn_scan

#: Primitives ONNX cannot express, with the reason (the exporter's error says it).
UNMAPPABLE = {
    "random_bits": "kiln's random numbers are Philox-4x32-10 counter-based bits; ONNX's random operators "
    "follow no specified generator, so the exported model could not reproduce them (export in eval mode, "
    "where dropout draws nothing)",
    "random_advance": "it moves kiln's Philox generator past a draw, and ONNX cannot reproduce the draw (export "
    "in eval mode, where dropout draws nothing)",
    "argsort": "kiln's sort orders nan as the largest value and keeps ties in order, and ONNX's TopK does "
    "not say where nan goes; export the part of the model around the sort",
    "rnn_scan_backward": "the backward pass of a recurrence has no ONNX operator: export the forward call",
    "all_reduce": "a collective communicates with the other processes of a job; an ONNX model is one process "
    "(export the model outside its DistributedDataParallel wrapper)",
    **{
        name: "the standard ONNX operator set has no matrix decompositions (inverse, solve, Cholesky, eigh, SVD, "
        "QR, slogdet); export the part of the model around them"
        for name in (
            "linalg_inv",
            "linalg_solve",
            "linalg_cholesky",
            "linalg_eigh",
            "linalg_svd",
            "linalg_qr",
            "linalg_slogdet",
        )  # fmt: skip
    },
    **{
        name: "ONNX's bitwise operators on integers arrive with opset 18 and kiln writes opset 17 by default "
        "(bool masks' & | ^ ~ are the logical primitives, which export); no rule is written yet"
        for name in ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not")
    },
    **{
        name: "ONNX's BitShift takes unsigned integers only and leaves a count at or past the width to the "
        "runtime, where kiln (as PyTorch) shifts signed values and defines every count"
        for name in ("shift_left", "shift_right")
    },
}
#: Primitives written as nothing: ``check`` raises on bad values (an index out of range) in kiln; ONNX has
#: no operator that raises, and the runtime's own bounds checks (Gather) take its place.
DROPPED = {"check"}

#: Primitives written only when the program reads part of their result, with what ONNX gives of it.
PARTIAL = {"rnn_scan": "ONNX's LSTM, GRU and RNN give each step's h and the final states, not the gates "
                        "and cell states rnn_scan also packs (what its backward reads)"}  # fmt: skip


def _in(node, k: int = 0):
    return node.inputs[k]


# ----------------------------------------------------------------------------- elementwise
_SIMPLE_UNARY = {"neg": "Neg", "abs": "Abs", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "sin": "Sin", "cos": "Cos",
                 "tanh": "Tanh", "sigmoid": "Sigmoid", "erf": "Erf"}  # fmt: skip
_FLOAT_ONLY_UNARY = {"floor": "Floor", "ceil": "Ceil", "round": "Round"}  # identity on integers, as in numpy
_SIMPLE_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater",
                  "ge": "GreaterOrEqual"}  # fmt: skip
_LOGICAL = {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}  # on bools: other dtypes test != 0


def _np(value) -> np.dtype:
    return np.dtype(value.type.dtype.np)


def _sign(b, node, x):
    s = b.op("Sign", [x])
    if not node.output.type.dtype.is_floating_point:
        return s
    return b.op("Where", [b.op("IsNaN", [x]), b.scalar(0, _np(node.output)), s])  # kiln: sign(nan) = 0


def _rsqrt(b, node, x):
    return b.op("Reciprocal", [b.op("Sqrt", [x])])


def _expm1(b, node, x):
    # exp(x) - 1 loses every digit near 0; 2t / (1 - t) with t = tanh(x / 2) is exact there but not for
    # large x (t rounds to 1): each where it is accurate.
    t = np.dtype(_np(node.output))
    half = b.op("Mul", [x, b.scalar(0.5, t)])
    th = b.op("Tanh", [half])
    small = b.op("Div", [b.op("Mul", [th, b.scalar(2.0, t)]), b.op("Sub", [b.scalar(1.0, t), th])])
    large = b.op("Sub", [b.op("Exp", [x]), b.scalar(1.0, t)])
    near = b.op("Less", [b.op("Abs", [x]), b.scalar(0.5, t)])
    return b.op("Where", [near, small, large])


def _log1p(b, node, x):
    # log(u) * x / (u - 1) with u = 1 + x corrects the rounding of 1 + x (exact where u == 1: x itself).
    t = _np(node.output)
    u = b.op("Add", [x, b.scalar(1.0, t)])
    du = b.op("Sub", [u, b.scalar(1.0, t)])
    exact = b.op("Equal", [du, b.scalar(0.0, t)])
    safe = b.op("Where", [exact, b.scalar(1.0, t), du])
    corrected = b.op("Div", [b.op("Mul", [b.op("Log", [u]), x]), safe])
    corrected = b.op("Where", [b.op("IsInf", [du]), b.op("Log", [u]), corrected])  # inf * inf / inf
    return b.op("Where", [exact, x, corrected])


def _unary(op_type):
    return lambda b, node, x: b.op(op_type, [x])


def _float_unary(op_type):
    return lambda b, node, x: b.op(op_type if node.output.type.dtype.is_floating_point else "Identity", [x])


def _binary(op_type):
    return lambda b, node, x, y: b.op(op_type, [x, y])


def _truth(b, value, name):
    return name if value.type.dtype is dt.bool_ else b.op("Cast", [name], to=onnx_dtype(dt.bool_))


def _logical(op_type):
    return lambda b, node, x, y: b.op(op_type, [_truth(b, node.inputs[0], x), _truth(b, node.inputs[1], y)])


def _logical_not(b, node, x):
    return b.op("Not", [_truth(b, node.inputs[0], x)])


def _nan_propagating(op_type):
    """ONNX's Max/Min leave nan unspecified; kiln's propagate it (a + b is nan where either is)."""

    def rule(b, node, x, y):
        out = b.op(op_type, [x, y])
        if not node.output.type.dtype.is_floating_point:
            return out
        either = b.op("Or", [b.op("IsNaN", [x]), b.op("IsNaN", [y])])
        return b.op("Where", [either, b.op("Add", [x, y]), out])

    return rule


def _ne(b, node, x, y):
    return b.op("Not", [b.op("Equal", [x, y])])


def _safe_divisor(b, node, y):
    """Integer divisor with zeros replaced by 1, and where it was zero (kiln's result there is 0)."""
    t = _np(_in(node, 1))
    zero = b.op("Equal", [y, b.scalar(0, t)])
    return b.op("Where", [zero, b.scalar(1, t), y]), zero


def _floor_divide(b, node, x, y):
    t = _np(node.output)
    if node.output.type.dtype.is_floating_point:
        # numpy: (x - fmod(x, y)) / y rounded, then corrected when fmod's sign differs from y's
        mod = b.op("Mod", [x, y], fmod=1)
        div = b.op("Div", [b.op("Sub", [x, mod]), y])
        differs = b.op("And", [b.op("Not", [b.op("Equal", [mod, b.scalar(0, t)])]),
                               b.op("Xor", [b.op("Less", [mod, b.scalar(0, t)]), b.op("Less", [y, b.scalar(0, t)])])])  # fmt: skip
        q = b.op("Where", [differs, b.op("Sub", [div, b.scalar(1, t)]), div])
        rounded = b.op("Round", [q])
        # division by zero: x / y itself (inf, or nan for 0 / 0), as numpy
        return b.op("Where", [b.op("Equal", [y, b.scalar(0, t)]), b.op("Div", [x, y]), rounded])
    safe, zero = _safe_divisor(b, node, y)
    mod = b.op("Mod", [x, safe], fmod=0)  # integer Mod takes the divisor's sign: Python's %
    q = b.op("Div", [b.op("Sub", [x, mod]), safe])  # exact: x - mod is a multiple of y
    return b.op("Where", [zero, b.scalar(0, t), q])


def _remainder(b, node, x, y):
    t = _np(node.output)
    if node.output.type.dtype.is_floating_point:
        r = b.op("Mod", [x, y], fmod=1)  # C's fmod: the dividend's sign
        fix = b.op("And", [b.op("Not", [b.op("Equal", [r, b.scalar(0, t)])]),
                           b.op("Xor", [b.op("Less", [r, b.scalar(0, t)]), b.op("Less", [y, b.scalar(0, t)])])])  # fmt: skip
        return b.op("Where", [fix, b.op("Add", [r, y]), r])
    safe, zero = _safe_divisor(b, node, y)
    return b.op("Where", [zero, b.scalar(0, t), b.op("Mod", [x, safe], fmod=0)])


def _where(b, node, c, x, y):
    return b.op("Where", [c, x, y])


def _cast(b, node, x):
    target = node.attrs["dtype"]
    source = _in(node).type.dtype
    if target is dt.bool_ or not source.is_floating_point or target.is_floating_point:
        return b.op("Cast", [x], to=onnx_dtype(target))
    # kiln: nan -> 0, truncate toward zero, saturate beyond int64, then wrap into narrower types
    wide = b.op("Cast", [x], to=onnx_dtype(dt.float64))
    zeroed = b.op("Where", [b.op("IsNaN", [wide]), b.scalar(0.0, np.float64), wide])
    clipped = b.op("Clip", [zeroed, b.scalar(-9.2e18, np.float64), b.scalar(9.2e18, np.float64)])
    as_int = b.op("Cast", [clipped], to=onnx_dtype(dt.int64))
    return as_int if target is dt.int64 else b.op("Cast", [as_int], to=onnx_dtype(target))


# ----------------------------------------------------------------------------- movement
def _reshape(b, node, x):
    target = b.attrs(node)["shape"]
    if all(isinstance(d, int) for d in target):
        return b.op("Reshape", [x, b.ints(target)], allowzero=1 if 0 in target else None)
    unnamed = [d for d in target if d is None]
    if len(unnamed) > 1 or 0 in target:
        raise OnnxExportError(b.context(f"a reshape to {list(target)} has more than one size that depends on the "
                                        "dynamic axes in a way ONNX's Reshape cannot infer"))  # fmt: skip
    parts = [b.ints([-1]) if d is None else b.dim(d) for d in target]
    return b.op("Reshape", [x, parts[0] if len(parts) == 1 else b.op("Concat", parts, axis=0)])


def _expand(b, node, x):
    target = tuple(b.attrs(node)["shape"])
    source = tuple(b.shape(node.inputs[0]))
    aligned = (None,) * (len(target) - len(source)) + source
    dims = []
    for have, want in zip(aligned, target, strict=True):
        if isinstance(want, int):
            dims.append(want)
        elif have is not None and have != 1 and (have == want or not isinstance(have, int)):
            dims.append(1)  # Expand's 1 keeps the input's own (dynamic) size
        else:
            dims.append(want)
    return b.op("Expand", [x, b.shape_tensor(dims)])


def _permute(b, node, x):
    if not node.attrs["perm"]:
        return b.op("Identity", [x])
    return b.op("Transpose", [x], perm=list(node.attrs["perm"]))


def _slice(b, node, x):
    """``Slice``; a bound that is a dynamic size (``mask[:T, :T]`` of a block-sized buffer) is read at run time."""
    a = b.attrs(node)
    shape = b.shape(node.inputs[0])
    axes, starts, ends, steps = [], [], [], []
    for axis, (start, stop, step, size) in enumerate(zip(a["starts"], a["stops"], a["steps"], shape, strict=True)):
        if start is None or stop is None:  # a size that follows the axes but is none of them (kiln.onnx._dynamic)
            raise OnnxExportError(b.context("a slice whose bounds depend on the dynamic axes other than as one "
                                            "of their sizes"))  # fmt: skip
        if start == 0 and step == 1 and stop == size:
            continue
        axes.append(axis)
        starts.append(start)
        ends.append(INT64_MAX if isinstance(stop, Sym) and stop == size else stop)  # to the end: no size to read
        steps.append(step)
    if not axes:
        return b.op("Identity", [x])
    return b.op("Slice", [x, b.shape_tensor(starts), b.shape_tensor(ends), b.ints(axes), b.ints(steps)])


def _interior(b, x, shape, axis: int, gap: int, value):
    """Insert ``gap`` elements of ``value`` between neighbours along ``axis``."""
    n = shape[axis]
    if not isinstance(n, int) or not all(isinstance(d, int) for d in shape):
        raise OnnxExportError(b.context("interior padding along a dynamic axis"))
    lifted = b.op("Unsqueeze", [x, b.ints([axis + 1])])
    pads = [0] * (len(shape) + 1) * 2
    pads[len(shape) + 1 + axis + 1] = gap
    spread = b.op("Pad", [lifted, b.ints(pads), value])
    merged = list(shape)
    merged[axis] = n * (gap + 1)
    flat = b.op("Reshape", [spread, b.ints(merged)], allowzero=1 if 0 in merged else None)
    keep = max(n * (gap + 1) - gap, 0)
    out_shape = list(shape)
    out_shape[axis] = keep
    return b.op("Slice", [flat, b.ints([0]), b.ints([keep]), b.ints([axis])]), out_shape


def _pad(b, node, x):
    a = node.attrs
    value = b.scalar(a["value"], _np(node.output))
    shape = list(b.shape(node.inputs[0]))
    for axis, gap in enumerate(a["interior"]):
        if gap:
            x, shape = _interior(b, x, shape, axis, gap, value)
    if not any(a["low"]) and not any(a["high"]):
        return b.op("Identity", [x])
    return b.op("Pad", [x, b.ints(list(a["low"]) + list(a["high"])), value])


def _concatenate(b, node, *xs):
    return b.op("Concat", list(xs), axis=node.attrs["axis"])


def _flip(b, node, x):
    axes = list(node.attrs["axes"])
    if not axes:
        return b.op("Identity", [x])
    n = len(axes)
    return b.op("Slice", [x, b.ints([-1] * n), b.ints([INT64_MIN] * n), b.ints(axes), b.ints([-1] * n)])


# ----------------------------------------------------------------------------- reductions and scans
def _reduce(op_type: str, axes_input_since: int):
    def rule(b, node, x):
        axes, keepdim = node.attrs["axes"], int(node.attrs["keepdim"])
        if not axes:
            return b.op("Identity", [x])
        out = _reduce_op(b, op_type, x, axes, keepdim, axes_input_since)
        if op_type in ("ReduceMax", "ReduceMin") and node.output.type.dtype.is_floating_point:
            # kiln's amax/amin propagate nan; ONNX leaves it unspecified: nan where the slice holds one
            t = _np(node.output)
            nans = b.op("Cast", [b.op("IsNaN", [x])], to=onnx_dtype(node.output.type.dtype))
            has_nan = b.op("Greater", [_reduce_op(b, "ReduceMax", nans, axes, keepdim, 18), b.scalar(0, t)])
            out = b.op("Where", [has_nan, b.scalar(np.nan, t), out])
        return out

    return rule


def _reduce_op(b, op_type: str, x, axes, keepdim: int, axes_input_since: int):
    if b.opset >= axes_input_since:
        return b.op(op_type, [x, b.ints(axes)], keepdims=keepdim)
    return b.op(op_type, [x], axes=list(axes), keepdims=keepdim)


def _arg(op_type: str):
    def rule(b, node, x):
        axis, keepdim = node.attrs["axis"], int(node.attrs["keepdim"])
        if axis is not None and node.inputs[0].type.ndim > 0:
            return b.op(op_type, [x], axis=axis, keepdims=keepdim)
        flat = b.op("Reshape", [x, b.ints([-1])])
        found = b.op(op_type, [flat], axis=0, keepdims=0)
        return b.op("Reshape", [found, b.shape_tensor(b.shape(node.output))])

    return rule


def _cumsum(b, node, x):
    a = node.attrs
    reverse = int(a["reverse"])
    if node.inputs[0].type.ndim == 0:
        flat = b.op("CumSum", [b.op("Reshape", [x, b.ints([1])]), b.scalar(0, np.int64)], reverse=reverse)
        return b.op("Reshape", [flat, b.ints([])])
    return b.op("CumSum", [x, b.scalar(a["axis"], np.int64)], reverse=reverse)


def _matmul(b, node, x, y):
    return b.op("MatMul", [x, y])


def _copy(b, node, x):
    return b.op("Identity", [x])


def _check(b, node, *inputs):
    return b.const(np.ones((), dtype=bool), "check_passed")  # see DROPPED


RULES = {
    **{name: _unary(op) for name, op in _SIMPLE_UNARY.items()},
    **{name: _float_unary(op) for name, op in _FLOAT_ONLY_UNARY.items()},
    **{name: _binary(op) for name, op in _SIMPLE_BINARY.items()},
    **{name: _logical(op) for name, op in _LOGICAL.items()},
    "logical_not": _logical_not, "maximum": _nan_propagating("Max"), "minimum": _nan_propagating("Min"),
    "sign": _sign, "rsqrt": _rsqrt, "expm1": _expm1, "log1p": _log1p, "ne": _ne,
    "floor_divide": _floor_divide, "remainder": _remainder, "where": _where, "cast": _cast,
    "gather": ix.gather, "scatter_add": ix.scatter("add"), "scatter": ix.scatter(None), "take": ix.take,
    "index_put": ix.index_put, "matmul": _matmul,
    "reshape": _reshape, "expand": _expand, "copy": _copy, "permute": _permute, "slice": _slice, "pad": _pad,
    "concatenate": _concatenate, "flip": _flip,
    "reduce_sum": _reduce("ReduceSum", 13), "reduce_max": _reduce("ReduceMax", 18),
    "reduce_min": _reduce("ReduceMin", 18), "reduce_prod": _reduce("ReduceProd", 18),
    "argmax": _arg("ArgMax"), "argmin": _arg("ArgMin"), "cumsum": _cumsum,
    "unfold": ix.unfold, "fold": ix.fold, "tile_transform": ix.tile_transform,
    "untile_transform": ix.untile_transform, "conv": ix.conv, "conv_weight": ix.conv_weight, "check": _check,
    "rnn_scan": rnn_scan,
}  # fmt: skip
