"""Composite ops written as the ONNX operator of the same name: ``COMPOSITES[name] = (accepts, emit)``.

A region (``kiln.jit.Region``) is one call of a composite op in the trace. ``accepts(b, args)``
says whether the ONNX operator has the call's exact semantics (``max_pool2d`` with
``return_indices`` has none; ``LayerNormalization`` needs opset 17); ``emit(b, args, name)``
writes it, ``name(key)`` being the ONNX name of a tensor argument. A region not accepted is
written primitive by primitive, as it was traced.
"""

from __future__ import annotations

import math

import numpy as np


def _tuple(value, d: int) -> tuple[int, ...] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * d
    if isinstance(value, tuple | list) and len(value) == d and all(isinstance(v, int) for v in value):
        return tuple(value)
    if isinstance(value, tuple | list) and len(value) == 1 and isinstance(value[0], int):
        return (value[0],) * d
    return None


def _ndim(args, key: str = "input") -> int:
    return args[key].type.ndim


# ----------------------------------------------------------------------------- linear
def _linear_accepts(b, args) -> bool:
    return args["weight"] is not None and _ndim(args, "weight") == 2 and _ndim(args) >= 1


def _linear_emit(b, args, name):
    x, w = name("input"), name("weight")
    bias = name("bias") if args["bias"] is not None else ""
    if _ndim(args) == 2:
        return [b.op("Gemm", [x, w, bias] if bias else [x, w], hint="linear", transB=1)]
    out = b.op("MatMul", [x, b.op("Transpose", [w], perm=[1, 0])])
    return [b.op("Add", [out, bias], hint="linear") if bias else out]


# ----------------------------------------------------------------------------- convolution
def _conv_pads(args, d: int):
    kernel = tuple(args["weight"].type.shape[2:])
    stride, dilation = _tuple(args["stride"], d), _tuple(args["dilation"], d)
    padding = args["padding"]
    if stride is None or dilation is None or not all(isinstance(k, int) for k in kernel):
        return None
    if padding == "valid":
        return [0] * d * 2, stride, dilation
    if padding == "same":  # PyTorch's split: the extra element goes after
        total = [dl * (k - 1) for k, dl in zip(kernel, dilation, strict=True)]
        return [t // 2 for t in total] + [t - t // 2 for t in total], stride, dilation
    pads = _tuple(padding, d)
    return (None if pads is None else list(pads) * 2), stride, dilation


def _conv(d: int):
    def accepts(b, args) -> bool:
        ok = _ndim(args) == d + 2 and isinstance(args["groups"], int) and args["weight"] is not None
        return ok and _conv_pads(args, d) is not None and _conv_pads(args, d)[0] is not None

    def emit(b, args, name):
        pads, stride, dilation = _conv_pads(args, d)
        inputs = [name("input"), name("weight")] + ([name("bias")] if args["bias"] is not None else [])
        kernel = list(args["weight"].type.shape[2:])
        return [b.op("Conv", inputs, hint=f"conv{d}d", kernel_shape=kernel, pads=pads, strides=list(stride),
                     dilations=list(dilation), group=args["groups"])]  # fmt: skip

    return accepts, emit


# ----------------------------------------------------------------------------- pooling
def _pool_geometry(args, d: int, with_dilation: bool):
    kernel = _tuple(args["kernel_size"], d)
    stride = kernel if args["stride"] is None or args["stride"] == () else _tuple(args["stride"], d)
    padding = _tuple(args["padding"], d)
    dilation = _tuple(args["dilation"], d) if with_dilation else (1,) * d
    if None in (kernel, stride, padding, dilation):
        return None
    return kernel, stride, padding, dilation


def _max_pool(d: int):
    def accepts(b, args) -> bool:
        return (_ndim(args) == d + 2 and not args["return_indices"] and not args["ceil_mode"]
                and _pool_geometry(args, d, True) is not None)  # fmt: skip

    def emit(b, args, name):
        kernel, stride, padding, dilation = _pool_geometry(args, d, True)
        return [b.op("MaxPool", [name("input")], hint=f"max_pool{d}d", kernel_shape=list(kernel),
                     strides=list(stride), pads=list(padding) * 2, dilations=list(dilation))]  # fmt: skip

    return accepts, emit


def _avg_pool(d: int):
    def accepts(b, args) -> bool:
        return (_ndim(args) == d + 2 and not args["ceil_mode"] and args["divisor_override"] is None
                and _pool_geometry(args, d, False) is not None)  # fmt: skip

    def emit(b, args, name):
        kernel, stride, padding, _ = _pool_geometry(args, d, False)
        return [b.op("AveragePool", [name("input")], hint=f"avg_pool{d}d", kernel_shape=list(kernel),
                     strides=list(stride), pads=list(padding) * 2,
                     count_include_pad=int(bool(args["count_include_pad"])))]  # fmt: skip

    return accepts, emit


# ----------------------------------------------------------------------------- normalization, activations
def _layer_norm_shape(args):
    shape = args["normalized_shape"]
    return (shape,) if isinstance(shape, int) else tuple(shape)


def _layer_norm_accepts(b, args) -> bool:
    return b.opset >= 17 and isinstance(args["eps"], float | int) and args["input"].type.dtype.is_floating_point


def _layer_norm_emit(b, args, name):
    shape = _layer_norm_shape(args)
    dtype = np.dtype(args["input"].type.dtype.np)
    scale = name("weight") if args["weight"] is not None else b.const(np.ones(shape, dtype), "layer_norm_scale")
    inputs = [name("input"), scale] + ([name("bias")] if args["bias"] is not None else [])
    return [b.op("LayerNormalization", inputs, hint="layer_norm", axis=-len(shape), epsilon=float(args["eps"]))]


def _batch_norm_accepts(b, args) -> bool:
    # in training it updates the running statistics: a write-back, refused by the exporter anyway
    return (not args["training"] and args["running_mean"] is not None and args["running_var"] is not None
            and _ndim(args) >= 2 and isinstance(args["eps"], float | int))  # fmt: skip


def _batch_norm_emit(b, args, name):
    channels = args["running_mean"].type.shape[0]
    dtype = np.dtype(args["input"].type.dtype.np)
    scale = name("weight") if args["weight"] is not None else b.const(np.ones(channels, dtype), "batch_norm_scale")
    shift = name("bias") if args["bias"] is not None else b.const(np.zeros(channels, dtype), "batch_norm_bias")
    inputs = [name("input"), scale, shift, name("running_mean"), name("running_var")]
    return [b.op("BatchNormalization", inputs, hint="batch_norm", epsilon=float(args["eps"]))]


def _softmax(op_type: str):
    def accepts(b, args) -> bool:
        return isinstance(args["dim"], int) and _ndim(args) > 0 and 0 not in args["input"].type.shape

    def emit(b, args, name):
        x = name("input")
        if args["dtype"] is not None:
            from ._primitives import onnx_dtype  # noqa: PLC0415

            x = b.op("Cast", [x], to=onnx_dtype(args["dtype"]))
        return [b.op(op_type, [x], hint=op_type.lower(), axis=args["dim"])]

    return accepts, emit


def _gelu_accepts(b, args) -> bool:
    return args["approximate"] in ("none", "tanh")


def _gelu_emit(b, args, name):
    x = name("input")
    if b.opset >= 20:
        return [b.op("Gelu", [x], hint="gelu", approximate=args["approximate"])]
    dtype = np.dtype(args["input"].type.dtype.np)
    half = b.op("Mul", [x, b.scalar(0.5, dtype)])
    if args["approximate"] == "none":
        inner = b.op("Erf", [b.op("Mul", [x, b.scalar(1.0 / math.sqrt(2.0), dtype)])])
    else:
        cube = b.op("Mul", [b.op("Mul", [b.op("Mul", [x, x]), x]), b.scalar(0.044715, dtype)])
        inner = b.op("Tanh", [b.op("Mul", [b.op("Add", [x, cube]), b.scalar(math.sqrt(2.0 / math.pi), dtype)])])
    return [b.op("Mul", [half, b.op("Add", [inner, b.scalar(1.0, dtype)])], hint="gelu")]


# ----------------------------------------------------------------------------- embedding, recurrences
def _embedding_accepts(b, args) -> bool:
    # the padding row only changes gradients; max_norm and the rest are refused by embedding itself
    return args["max_norm"] is None and args["weight"].type.ndim == 2


def _embedding_emit(b, args, name):
    return [b.op("Gather", [name("weight"), name("input")], hint="embedding", axis=0)]


# One direction of one layer of kiln's LSTM or GRU (``_RNNBase._direction``) is ONNX's operator of the
# same name, with the gate blocks of the weights reordered: PyTorch's LSTM stacks (input, forget, cell,
# output), ONNX's (input, output, forget, cell); PyTorch's GRU (reset, update, new), ONNX's (update,
# reset, hidden), and PyTorch's GRU applies the reset gate after the recurrent product: linear_before_reset.
# kiln's own classes only: a subclass may define another cell.
_RECURRENCES = {"kiln.nn.modules.rnn.LSTM": ("LSTM", 4, (0, 3, 1, 2)), "kiln.nn.modules.rnn.GRU": ("GRU", 3, (1, 0, 2))}


def _rnn_accepts(b, args) -> bool:
    from ..frontend.jit.regions import class_name  # noqa: PLC0415

    x, weights = args["x"], args["weights"]
    found = _RECURRENCES.get(class_name(args["self"]))
    if found is None or not isinstance(weights, tuple) or len(weights) != 4 or weights[0] is None or weights[1] is None:
        return False
    w_hh = weights[1].type.shape
    steps = x.type.shape[0] if x.type.ndim == 3 else 0  # a symbol (a dynamic length) is >= 1 in every call
    return (len(w_hh) == 2 and w_hh[0] == found[1] * w_hh[1] and steps != 0
            and (weights[2] is None) == (weights[3] is None))  # fmt: skip


def _reordered(b, name: str, hidden: int, order) -> str:
    """The gate blocks of a weight or bias (stacked along dim 0) in ONNX's order."""
    blocks = [b.op("Slice", [name, b.ints([k * hidden]), b.ints([(k + 1) * hidden]), b.ints([0])]) for k in order]
    return b.op("Concat", blocks, axis=0)


def _rnn_emit(b, args, name):
    from ..frontend.jit.regions import class_name  # noqa: PLC0415

    kind, _, order = _RECURRENCES[class_name(args["self"])]
    w_ih, w_hh, b_ih, b_hh = args["weights"]
    hidden = w_hh.type.shape[1]
    first = b.ints([0])
    w = b.op("Unsqueeze", [_reordered(b, b.name(w_ih), hidden, order), first])
    r = b.op("Unsqueeze", [_reordered(b, b.name(w_hh), hidden, order), first])
    bias = ""
    if b_ih is not None:
        both = [_reordered(b, b.name(v), hidden, order) for v in (b_ih, b_hh)]
        bias = b.op("Unsqueeze", [b.op("Concat", both, axis=0), first])
    states = [b.op("Unsqueeze", [b.name(s), first]) for s in args["state"]]
    direction = "reverse" if args["reverse"] else "forward"
    extra = {"linear_before_reset": 1} if kind == "GRU" else {}
    outs = b.op(kind, [name("x"), w, r, bias, "", *states], outputs=1 + len(states), hint=kind.lower(),
                hidden_size=hidden, direction=direction, **extra)  # fmt: skip
    return [b.op("Squeeze", [outs[0], b.ints([1])])] + [b.op("Squeeze", [s, first]) for s in outs[1:]]


COMPOSITES = {
    "embedding": (_embedding_accepts, _embedding_emit),
    "rnn_direction": (_rnn_accepts, _rnn_emit),
    "linear": (_linear_accepts, _linear_emit),
    **{f"conv{d}d": _conv(d) for d in (1, 2, 3)},
    **{f"max_pool{d}d": _max_pool(d) for d in (1, 2, 3)},
    **{f"avg_pool{d}d": _avg_pool(d) for d in (1, 2, 3)},
    "layer_norm": (_layer_norm_accepts, _layer_norm_emit),
    "batch_norm": (_batch_norm_accepts, _batch_norm_emit),
    "softmax": _softmax("Softmax"),
    "log_softmax": _softmax("LogSoftmax"),
    "gelu": (_gelu_accepts, _gelu_emit),
}
