"""``kiln.onnx.load``: an ONNX model run node by node with kiln's eager ops.

Every operator ``kiln.onnx.export`` writes is here (``OPS``), and a few that other exporters
write often (Relu, Flatten, Squeeze, Constant, ConstantOfShape). Sizes computed inside the graph
(``Shape``, the shape input of ``Reshape``) are read as Python ints, so a loaded model runs
eagerly: to compile it, wrap the call in a function of your own with static sizes.
"""

from __future__ import annotations

import math
import os

import numpy as np

import kiln
import kiln.nn.functional as F

from ._builder import OnnxExportError
from ._load_checks import located, physical_memory, refuse_external_data
from ._load_recurrent import gru, lstm


class OnnxProgram:
    """A loaded ONNX model: ``program(*inputs)`` (tensors or arrays, in the graph's input order, or by
    name as keywords) returns the output tensor, or a tuple of them when the model has several."""

    def __init__(self, source) -> None:
        import onnx  # noqa: PLC0415
        from onnx import numpy_helper  # noqa: PLC0415

        if isinstance(source, onnx.ModelProto):
            model = source
        elif isinstance(source, bytes):
            model = onnx.load_from_string(source)
        else:
            model = onnx.load(os.fspath(source))  # external data: read relative to the model's own folder
        if isinstance(source, onnx.ModelProto | bytes):
            refuse_external_data(model)
        onnx.checker.check_model(model)
        domains = {o.domain: o.version for o in model.opset_import}
        self.opset = domains.get("", domains.get("ai.onnx", 0))
        self.graph = model.graph
        self.initializers = {t.name: kiln.from_numpy(numpy_helper.to_array(t).copy()) for t in self.graph.initializer}
        self.input_names = [i.name for i in self.graph.input if i.name not in self.initializers]
        self._input_types = {i.name: _declared(i) for i in self.graph.input if i.name not in self.initializers}
        self.output_names = [o.name for o in self.graph.output]
        missing = sorted(
            {n.op_type for n in self.graph.node if n.domain not in ("", "ai.onnx") or n.op_type not in OPS}
        )
        if missing:
            raise NotImplementedError(f"kiln.onnx.load: operators not supported: {', '.join(missing)}")

    def __call__(self, *args, **kwargs):
        if len(args) > len(self.input_names):
            raise TypeError(f"the model takes {len(self.input_names)} inputs ({self.input_names}), got {len(args)}")
        env = dict(self.initializers)
        bound = dict(zip(self.input_names, args, strict=False))
        bound.update(kwargs)
        for name in self.input_names:
            if name not in bound:
                raise TypeError(f"missing input {name!r} (the model's inputs: {self.input_names})")
            value = bound[name]
            value = value if isinstance(value, kiln.Tensor) else kiln.from_numpy(np.array(value, order="C"))
            _check_input(name, value, *self._input_types[name])
            env[name] = value
        with kiln.no_grad():
            for node in self.graph.node:
                inputs = [env[name] if name else None for name in node.input]
                try:
                    results = OPS[node.op_type](_attrs(node), *inputs)
                except Exception as error:
                    raise located(error, node) from error
                results = results if isinstance(results, tuple) else (results,)
                env.update(zip(node.output, results, strict=False))
        outputs = tuple(env[name] for name in self.output_names)
        return outputs[0] if len(outputs) == 1 else outputs

    def __repr__(self) -> str:
        return f"OnnxProgram(inputs {self.input_names}, outputs {self.output_names}, {len(self.graph.node)} nodes)"


def _declared(value_info) -> tuple:
    """(dtype, shape with None for a named or unknown size) of a graph input."""
    tensor = value_info.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
    return _dtype(tensor.elem_type), (dims if tensor.HasField("shape") else None)


def _check_input(name: str, value, dtype, shape) -> None:
    # onnxruntime refuses these too; a silent float64 run of a float32 model would be a different model
    if value.dtype != dtype:
        raise TypeError(f"input {name!r}: expected {dtype}, got {value.dtype}")
    if shape is not None and (value.ndim != len(shape) or any(d is not None and d != n for d, n in
                                                              zip(shape, value.shape, strict=True))):  # fmt: skip
        expected = "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
        raise ValueError(f"input {name!r}: expected shape {expected}, got {list(value.shape)}")


def _attrs(node) -> dict:
    from onnx import helper  # noqa: PLC0415

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _ints(t) -> list[int]:
    return [int(v) for v in t.numpy().reshape(-1)]


def _dtype(onnx_type: int):
    from onnx import helper  # noqa: PLC0415

    from ..ir.dtypes import from_numpy_dtype  # noqa: PLC0415

    return from_numpy_dtype(helper.tensor_dtype_to_np_dtype(onnx_type))


def _wrap(index, size: int):
    return kiln.where(index < 0, index + size, index)


# ----------------------------------------------------------------------------- movement
def _slice(a, x, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = _ints(axes) if axes is not None else list(range(len(starts)))
    steps = _ints(steps) if steps is not None else [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis %= x.ndim
        size = x.shape[axis]
        start, end = (start + size if start < 0 else start), (end + size if end < 0 else end)
        if step > 0:
            start, end = min(max(start, 0), size), min(max(end, 0), size)
            index = [slice(None)] * axis + [slice(start, end, step)]
            x = x[tuple(index)]
        else:
            start, end = min(max(start, 0), size - 1), min(max(end, -1), size - 1)
            picked = kiln.tensor(list(range(start, end, step)), dtype=kiln.int64)
            x = kiln.index_select(x, axis, picked)
    return x


def _reshape(a, x, shape):
    target = _ints(shape)
    if not a.get("allowzero", 0):
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return x.reshape(*target)


def _expand(a, x, shape):
    return x.expand(*np.broadcast_shapes(tuple(x.shape), tuple(_ints(shape))))


def _unsqueeze(a, x, axes=None):
    axes = sorted(d % (x.ndim + len(axes_list)) for axes_list in [_axes(a, axes)] for d in axes_list)
    for d in axes:
        x = x.unsqueeze(d)
    return x


def _axes(a, axes) -> list[int]:
    return _ints(axes) if axes is not None else list(a.get("axes", []))


def _squeeze(a, x, axes=None):
    dims = _axes(a, axes) or [d for d in range(x.ndim) if x.shape[d] == 1]
    for d in sorted((d % x.ndim for d in dims), reverse=True):
        x = x.squeeze(d)
    return x


def _pad(a, x, pads, value=None, axes=None):
    if a.get("mode", b"constant") not in ("constant", b"constant"):
        raise NotImplementedError(f"Pad mode {a['mode']!r}")
    pads = _ints(pads)
    n = len(pads) // 2
    dims = _ints(axes) if axes is not None else list(range(n))
    low, high = dict(zip(dims, pads[:n], strict=True)), dict(zip(dims, pads[n:], strict=True))
    fill = 0.0 if value is None else value.item()
    spec = []
    crop = []
    for d in range(x.ndim):
        lo, hi = low.get(d, 0), high.get(d, 0)
        crop.append(slice(max(-lo, 0), x.shape[d] - max(-hi, 0)))
        spec = [max(lo, 0), max(hi, 0)] + spec  # F.pad: the last dim first
    x = x[tuple(crop)]
    return F.pad(x, tuple(spec), value=fill) if any(spec) else x


def _gather(a, x, index):
    axis = a.get("axis", 0) % x.ndim
    index = _wrap(index, x.shape[axis]).to(kiln.int64)
    picked = kiln.index_select(x, axis, index.reshape(-1))
    return picked.reshape(*x.shape[:axis], *index.shape, *x.shape[axis + 1 :])


def _gather_elements(a, x, index):
    if x.ndim == 0:
        return _gather_elements(a, x.reshape(1), index.reshape(1)).reshape(())
    axis = a.get("axis", 0) % x.ndim
    return kiln.gather(x, axis, _wrap(index, x.shape[axis]).to(kiln.int64))


def _scatter_elements(a, x, index, updates):
    if x.ndim == 0:
        return _scatter_elements(a, x.reshape(1), index.reshape(1), updates.reshape(1)).reshape(())
    axis = a.get("axis", 0) % x.ndim
    index = _wrap(index, x.shape[axis]).to(kiln.int64)
    reduction = a.get("reduction", b"none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction == "add":
        return x.scatter_add(axis, index, updates)
    if reduction == "none":
        return x.scatter(axis, index, updates)
    raise NotImplementedError(f"ScatterElements reduction {reduction!r}")


def _nd_indices(x, index):
    k = index.shape[-1]
    return tuple(_wrap(index[..., j], x.shape[j]) for j in range(k))


def _gather_nd(a, x, index):
    if a.get("batch_dims", 0):
        raise NotImplementedError("GatherND with batch_dims")
    return x[_nd_indices(x, index.to(kiln.int64))]


def _scatter_nd(a, x, index, updates):
    reduction = a.get("reduction", b"none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in ("none", "add"):
        raise NotImplementedError(f"ScatterND reduction {reduction!r}")
    return x.index_put(_nd_indices(x, index.to(kiln.int64)), updates, accumulate=reduction == "add")


# ----------------------------------------------------------------------------- math
def _fmod(x, y):
    # Python's % of non-negative operands is C's fmod, exactly; fmod takes the dividend's sign
    r = kiln.remainder(kiln.abs(x), kiln.abs(y))
    return kiln.where(x < 0, -r, r)


def _div(x, y):
    if x.dtype.is_floating_point:
        return kiln.div(x, y)
    return kiln.div(x, y, rounding_mode="trunc")  # ONNX's integer Div truncates, as C does


def _mod(a, x, y):
    return _fmod(x, y) if a.get("fmod", 0) else kiln.remainder(x, y)


def _clip(a, x, low=None, high=None):
    low = low.item() if low is not None else None
    high = high.item() if high is not None else None
    return kiln.clamp(x, low, high)


def _gemm(a, x, y, c=None):
    x = x.transpose(0, 1) if a.get("transA", 0) else x
    y = y.transpose(0, 1) if a.get("transB", 0) else y
    out = kiln.matmul(x, y)
    if a.get("alpha", 1.0) != 1.0:
        out = out * a["alpha"]
    if c is not None:
        out = out + (c * a["beta"] if a.get("beta", 1.0) != 1.0 else c)
    return out


def _reduce(fn):
    def rule(a, x, axes=None):
        dims = _axes(a, axes)
        if not dims:
            if a.get("noop_with_empty_axes", 0):
                return x
            dims = list(range(x.ndim))
        keep = bool(a.get("keepdims", 1))
        return fn(x, tuple(d % x.ndim for d in dims), keep) if x.ndim else x

    return rule


def _prod(x, dims, keep):
    for d in sorted(dims, reverse=True):
        x = x.prod(dim=d, keepdim=keep)
    return x


def _arg(fn):
    def rule(a, x):
        if a.get("select_last_index", 0):
            raise NotImplementedError("ArgMax/ArgMin with select_last_index")
        return fn(x, dim=a.get("axis", 0), keepdim=bool(a.get("keepdims", 1)))

    return rule


def _cumsum(a, x, axis):
    if a.get("exclusive", 0):
        raise NotImplementedError("CumSum with exclusive=1")
    axis = int(axis.item()) % max(x.ndim, 1)
    if a.get("reverse", 0):
        return kiln.flip(kiln.cumsum(kiln.flip(x, (axis,)), axis), (axis,))
    return kiln.cumsum(x, axis)


# ----------------------------------------------------------------------------- layers
def _symmetric(a, d: int) -> tuple[int, ...]:
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotImplementedError(f"auto_pad={a['auto_pad']!r}")
    pads = list(a.get("pads", [0] * 2 * d))
    if pads[:d] != pads[d:]:
        raise NotImplementedError(f"asymmetric pads {pads}")
    return tuple(pads[:d])


def _conv(a, x, w, bias=None):
    d = w.ndim - 2
    fn = (F.conv1d, F.conv2d, F.conv3d)[d - 1]
    return fn(x, w, bias, stride=tuple(a.get("strides", [1] * d)), padding=_symmetric(a, d),
              dilation=tuple(a.get("dilations", [1] * d)), groups=a.get("group", 1))  # fmt: skip


def _max_pool(a, x):
    d = x.ndim - 2
    fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[d - 1]
    kernel = tuple(a["kernel_shape"])
    return fn(x, kernel, stride=tuple(a.get("strides", [1] * d)), padding=_symmetric(a, d),
              dilation=tuple(a.get("dilations", [1] * d)), ceil_mode=bool(a.get("ceil_mode", 0)))  # fmt: skip


def _avg_pool(a, x):
    d = x.ndim - 2
    fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[d - 1]
    return fn(x, tuple(a["kernel_shape"]), stride=tuple(a.get("strides", [1] * d)), padding=_symmetric(a, d),
              ceil_mode=bool(a.get("ceil_mode", 0)), count_include_pad=bool(a.get("count_include_pad", 0)))  # fmt: skip


def _layer_norm(a, x, scale, bias=None):
    axis = a.get("axis", -1) % x.ndim
    return F.layer_norm(x, tuple(x.shape[axis:]), scale, bias, eps=a.get("epsilon", 1e-5))


def _batch_norm(a, x, scale, bias, mean, var):
    if a.get("training_mode", 0):
        raise NotImplementedError("BatchNormalization with training_mode=1")
    return F.batch_norm(x, mean, var, scale, bias, training=False, eps=a.get("epsilon", 1e-5))


def _gelu(a, x):
    approximate = a.get("approximate", b"none")
    return F.gelu(x, approximate=approximate.decode() if isinstance(approximate, bytes) else approximate)


def _constant(a):
    from onnx import numpy_helper  # noqa: PLC0415

    if "value" not in a:
        raise NotImplementedError(f"Constant with {sorted(a)}")
    return kiln.from_numpy(numpy_helper.to_array(a["value"]).copy())


def _constant_of_shape(a, shape):
    from onnx import numpy_helper  # noqa: PLC0415

    value = numpy_helper.to_array(a["value"]) if "value" in a else np.zeros(1, np.float32)
    dims = _ints(shape)
    nbytes = math.prod(dims) * value.dtype.itemsize
    if all(d >= 0 for d in dims) and nbytes > physical_memory():
        raise ValueError(f"ConstantOfShape asks for a tensor of shape {dims} ({nbytes} bytes), more than this "
                         f"machine's memory ({physical_memory()} bytes)")  # fmt: skip
    return kiln.from_numpy(np.full(dims, value.reshape(-1)[0], dtype=value.dtype))


def _shape(a, x):
    dims = list(x.shape)[a.get("start", 0) : a.get("end", None)]
    return kiln.tensor(dims, dtype=kiln.int64)


def _flatten(a, x):
    axis = a.get("axis", 1) % (x.ndim + 1) if x.ndim else 0
    return x.reshape(int(np.prod(x.shape[:axis])), -1)


def _unary(fn):
    return lambda a, x: fn(x)


def _binary(fn):
    return lambda a, x, y: fn(x, y)


OPS = {
    **{k: _unary(f) for k, f in {
        "Neg": kiln.neg, "Abs": kiln.abs, "Exp": kiln.exp, "Log": kiln.log, "Sqrt": kiln.sqrt, "Sin": kiln.sin,
        "Cos": kiln.cos, "Tanh": kiln.tanh, "Sigmoid": kiln.sigmoid, "Erf": kiln.erf, "Not": kiln.logical_not,
        "Floor": kiln.floor, "Ceil": kiln.ceil, "Round": kiln.round, "Sign": kiln.sign, "Reciprocal": kiln.reciprocal,
        "IsNaN": kiln.isnan, "IsInf": kiln.isinf, "Relu": kiln.relu, "Identity": lambda x: x,
    }.items()},
    **{k: _binary(f) for k, f in {
        "Add": kiln.add, "Sub": kiln.sub, "Mul": kiln.mul, "Div": _div, "Pow": kiln.pow, "Max": kiln.maximum,
        "Min": kiln.minimum, "Equal": kiln.eq, "Less": kiln.lt, "LessOrEqual": kiln.le, "Greater": kiln.gt,
        "GreaterOrEqual": kiln.ge, "And": kiln.logical_and, "Or": kiln.logical_or, "Xor": kiln.logical_xor,
        "MatMul": kiln.matmul,
    }.items()},
    "Where": lambda a, c, x, y: kiln.where(c, x, y),
    "Cast": lambda a, x: x.to(_dtype(a["to"])),
    "Mod": _mod, "Clip": _clip, "Gemm": _gemm,
    "Transpose": lambda a, x: x.permute(*(a.get("perm") or range(x.ndim - 1, -1, -1))),
    "Reshape": _reshape, "Expand": _expand, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Flatten": _flatten,
    "Concat": lambda a, *xs: kiln.cat(list(xs), dim=a["axis"]), "Slice": _slice, "Pad": _pad,
    "Gather": _gather, "GatherElements": _gather_elements, "ScatterElements": _scatter_elements,
    "GatherND": _gather_nd, "ScatterND": _scatter_nd,
    "ReduceSum": _reduce(lambda x, d, k: x.sum(dim=d, keepdim=k)),
    "ReduceMax": _reduce(lambda x, d, k: kiln.amax(x, dim=d, keepdim=k)),
    "ReduceMin": _reduce(lambda x, d, k: kiln.amin(x, dim=d, keepdim=k)),
    "ReduceProd": _reduce(_prod),
    "ArgMax": _arg(kiln.argmax), "ArgMin": _arg(kiln.argmin), "CumSum": _cumsum,
    "Shape": _shape, "Constant": _constant, "ConstantOfShape": _constant_of_shape,
    "Conv": _conv, "MaxPool": _max_pool, "AveragePool": _avg_pool, "LayerNormalization": _layer_norm,
    "Softmax": lambda a, x: kiln.softmax(x, a.get("axis", -1)),
    "LogSoftmax": lambda a, x: kiln.log_softmax(x, a.get("axis", -1)),
    "Gelu": _gelu, "BatchNormalization": _batch_norm, "LSTM": lstm, "GRU": gru,
}  # fmt: skip

__all__ = ["OnnxProgram", "OPS", "OnnxExportError"]
