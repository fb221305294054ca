"""ONNX export and import: ``kiln.onnx.export`` writes a model ``onnxruntime`` runs, ``kiln.onnx.load`` runs one.

Needs the ``onnx`` extra (``pip install kiln[onnx]``: onnx and onnxruntime); ``import kiln``
does not import it.

    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)).eval()
    kiln.onnx.export(model, (kiln.randn(8, 64),), "mlp.onnx",
                     input_names=["x"], output_names=["logits"], dynamic_axes={"x": {0: "batch"}})
    run = kiln.onnx.load("mlp.onnx")          # a callable running the model with kiln ops
    logits = run(kiln.randn(3, 64))

What is written:

- the traced forward call (as ``kiln.export`` traces it, under ``no_grad``), inputs named after the
  function's parameters (or ``input_names``), outputs ``output_0``... (or ``output_names``);
- parameters and other captured tensors as initializers, named as in the module's ``state_dict``;
- composite ops as their ONNX operator where it has their semantics: ``linear`` as ``Gemm`` (2-d
  input) or ``MatMul`` + ``Add``, ``conv1d/2d/3d`` as ``Conv``, ``max_pool``/``avg_pool`` as
  ``MaxPool``/``AveragePool``, ``layer_norm`` as ``LayerNormalization``, eval-mode ``batch_norm`` as
  ``BatchNormalization``, ``softmax``/``log_softmax`` as ``Softmax``/``LogSoftmax``, ``gelu`` as
  ``Gelu`` from opset 20 (its erf or tanh formula before), ``embedding`` as ``Gather``, each
  direction of each layer of ``nn.LSTM``/``nn.GRU`` as ``LSTM``/``GRU``; everything else primitive
  by primitive (``_primitives.RULES``; a recurrence outside such a region, ``rnn_scan``, as ONNX's
  ``LSTM``, ``GRU`` or ``RNN``: ``_recurrence``);
- ``dynamic_axes`` as PyTorch spells it (``{"x": {0: "batch"}}`` or ``{"x": [0]}``): the function
  is traced at two sizes of each axis and the programs compared, so the model runs at any size of
  them, or the error says which op depends on the size in another way. Axes of positional tensor
  arguments go through ``kiln.export(..., dynamic_shapes=...)`` (a mean's divisor, ``arange(T)``
  and a causal mask follow the size; a recurrence over a dynamic length is ONNX's operator);
  others (a tensor in a structure or a keyword argument) through ``_dynamic``'s own comparison;
- a program of ``kiln.export(..., dynamic_shapes=...)`` (``ExportedProgram.to_onnx``) with its sizes
  as ``dim_param``s: a symbol is named after it, and a size that is a product (``2*seq``,
  ``batch*seq`` after a flatten) is computed at run time from the inputs' shapes (``Shape``, ``Mul``,
  ``Concat``). A comparison the program guards (``assert T <= block_size``) cannot be checked by
  an ONNX model: the export warns of it.

Not written: ``check`` nodes (kiln's index-range checks: ONNX has no operator that raises; the
runtime's own bounds checks apply), and programs that draw random numbers (``random_bits``) or
change state in place (training-mode BatchNorm): export in eval mode.
"""

from __future__ import annotations

import inspect
import os

from ..ir.types import Sym
from ._builder import OnnxExportError
from ._primitives import DROPPED, RULES, UNMAPPABLE

__all__ = ["export", "load", "program_to_onnx", "OnnxExportError", "RULES", "UNMAPPABLE", "DROPPED"]


def export(model, args, f: str | os.PathLike, *, opset_version: int | None = None, input_names=None,
           output_names=None, dynamic_axes=None):  # fmt: skip
    """Trace ``model(*args)`` (a function or an ``nn.Module``) and write it to ``f`` as ONNX.

    ``args``: a tensor or a tuple of arguments (a trailing dict: keyword arguments, as
    ``torch.onnx.export``). Returns the ``onnx.ModelProto`` written; ``onnx.checker`` has passed.
    """
    from ..frontend.jit.export import export as trace_export  # noqa: PLC0415
    from ..frontend.jit.state import per_step_recurrences  # noqa: PLC0415

    args, kwargs = _split_args(args)
    names = _input_names(model, args, kwargs, input_names)
    axes = _dynamic_axes(dynamic_axes)
    symbolic = None
    dynamic_shapes = _dynamic_shapes(args, names, axes)
    if dynamic_shapes is not None:
        program = _export_symbolic(model, args, kwargs, dynamic_shapes)
        return _write(program, f, opset_version, names, output_names, axes, None)
    token = per_step_recurrences.set(True)  # RNN layers as per-step ops: ONNX has no rnn_scan
    try:
        if not any(name in names.values() for name in axes):
            program = trace_export(model, *args, **kwargs)
        else:  # an axis of a tensor inside a structure or a keyword argument
            program, symbolic = _export_dynamic(trace_export, model, args, kwargs, names, axes)
    finally:
        per_step_recurrences.reset(token)
    return _write(program, f, opset_version, names, output_names, axes, symbolic)


def program_to_onnx(program, path, *, opset_version=None, input_names=None, output_names=None, dynamic_axes=None):
    """``ExportedProgram.to_onnx``: write an exported program as ONNX, its dynamic sizes (``kiln.export``'s
    ``dynamic_shapes``) as symbolic dims. ``dynamic_axes`` may rename those dims (``{"x": {0: "N"}}``); a
    static dim cannot be made dynamic here (the program's sizes are fixed by then)."""
    axes = _dynamic_axes(dynamic_axes)
    positions = [i for i, spec in enumerate(program.in_specs) if spec[0] == "tensor"]
    given = list(input_names or [])
    names = {p: (given[k] if k < len(given) else f"input_{k}") for k, p in enumerate(positions)}
    shapes = {names[p]: program.in_specs[p][1] for p in positions}
    for name, entries in axes.items():
        static = [a for a in entries if name in shapes and not isinstance(_at(shapes[name], a), Sym)]
        if static:
            raise OnnxExportError(
                f"ExportedProgram.to_onnx: dynamic_axes makes axis {static[0]} of input {name!r} dynamic, but the "
                f"program was exported for its size (shape [{', '.join(map(str, shapes[name]))}]): export the function with "
                "kiln.export(fn, *args, dynamic_shapes=[...]) and write that program, or use "
                "kiln.onnx.export(fn, args, path, dynamic_axes=...), which traces it again at another size"
            )
    return _write(program, path, opset_version, names, output_names, axes, None)


def _at(shape: tuple, axis: int):
    return shape[axis] if -len(shape) <= axis < len(shape) else None


def load(path):
    """Read an ONNX model (a path, bytes or ``onnx.ModelProto``) as a callable running it with kiln ops."""
    from ._load import OnnxProgram  # noqa: PLC0415

    return OnnxProgram(path)


# ----------------------------------------------------------------------------- helpers
def _write(program, f, opset_version, names, output_names, axes, symbolic):
    import onnx  # noqa: PLC0415

    from ._export import DEFAULT_OPSET, build_model  # noqa: PLC0415

    dim_names = {(name, axis): dim for name, entries in axes.items() for axis, dim in entries.items()}
    unknown = set(axes) - set(names.values()) - set(output_names or [])
    if unknown:
        raise OnnxExportError(f"kiln.onnx: dynamic_axes names {sorted(unknown)}, which are neither input names "
                              f"{sorted(names.values())} nor output names {list(output_names or [])}")  # fmt: skip
    model = build_model(program, opset=opset_version or DEFAULT_OPSET, arg_names=names, output_names=output_names,
                        dim_names=dim_names, symbolic=symbolic)  # fmt: skip
    _warn_of_guards(program, names)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, os.fspath(f)) if not hasattr(f, "write") else f.write(model.SerializeToString())
    return model


def _warn_of_guards(program, names: dict[int, str]) -> None:
    """A dynamic program that holds only for some sizes (``assert T <= block_size``) says so: ONNX has no
    operator that refuses a call, so the written model does not check them."""
    guards = getattr(program, "size_guards", ())
    if not guards:
        return
    import warnings  # noqa: PLC0415

    held = "; ".join(f"{names.get(g.argument, f'input {g.argument}')} dim {g.dim}: {g} is {g.result} ({g.where})"
                     for g in guards)  # fmt: skip
    warnings.warn(f"kiln.onnx: the program was traced for sizes where {held}; ONNX has no operator that refuses a "
                  "call, so the model does not check it: other sizes may fail in the runtime or compute other "
                  "values", stacklevel=4)  # fmt: skip


def _split_args(args):
    from ..frontend.tensor import Tensor  # noqa: PLC0415

    if isinstance(args, Tensor) or not isinstance(args, tuple | list):
        return (args,), {}
    args = tuple(args)
    if args and isinstance(args[-1], dict):
        return args[:-1], dict(args[-1])
    return args, {}


def _input_names(model, args, kwargs, input_names) -> dict[int, str]:
    """Flattened argument position -> graph input name, for the tensor arguments."""
    from ..frontend.jit.pytree import flatten  # noqa: PLC0415
    from ..frontend.tensor import Tensor  # noqa: PLC0415

    leaves, _ = flatten((args, kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor)]
    given = list(input_names or [])
    if len(given) > len(positions):
        raise OnnxExportError(f"kiln.onnx: {len(given)} input_names for {len(positions)} tensor arguments")
    defaults = _parameter_names(model) if len(leaves) == len(args) and not kwargs else []
    names = {}
    for k, p in enumerate(positions):
        names[p] = given[k] if k < len(given) else (defaults[p] if p < len(defaults) else f"input_{k}")
    if len(set(names.values())) != len(names):
        raise OnnxExportError(f"kiln.onnx: input names must differ, got {list(names.values())}")
    return names


def _parameter_names(model) -> list[str]:
    fn = getattr(model, "forward", model)
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _dynamic_axes(dynamic_axes) -> dict[str, dict[int, str]]:
    axes: dict[str, dict[int, str]] = {}
    for name, entries in (dynamic_axes or {}).items():
        if isinstance(entries, dict):
            axes[name] = {int(a): str(d) for a, d in entries.items()}
        else:  # a list of axes: PyTorch names them itself
            axes[name] = {int(a): f"{name}_dynamic_axes_{int(a) + 1}" for a in entries}
    return axes


def _dynamic_shapes(args: tuple, names: dict[int, str], axes: dict) -> list | None:
    """``kiln.export``'s ``dynamic_shapes`` for the inputs' dynamic axes when each names a positional
    tensor argument (None when there is none, or one is in a structure or a keyword argument)."""
    from ..frontend.jit.pytree import flatten  # noqa: PLC0415
    from ..frontend.tensor import Tensor  # noqa: PLC0415

    leaf_of = {len(flatten(tuple(args[:k]))[0]): k for k, a in enumerate(args) if isinstance(a, Tensor)}
    named = {names[p]: k for p, k in leaf_of.items() if p in names}
    inputs = [name for name in axes if name in names.values()]
    if not inputs or any(name not in named for name in inputs):
        return None
    shapes: list = [None] * len(args)
    for name in inputs:
        arg = args[named[name]]
        for axis in axes[name]:
            if not -arg.ndim <= axis < arg.ndim:
                raise OnnxExportError(f"kiln.onnx: dynamic axis {axis} of input {name!r}, which has {arg.ndim} dims")
        shapes[named[name]] = {axis % arg.ndim: _symbol(dim).name for axis, dim in axes[name].items()}
    return shapes


def _export_symbolic(model, args, kwargs, dynamic_shapes):
    """``kiln.export`` with ``dynamic_shapes``: one program whose sizes are symbols. Its RNN layers run as
    ``rnn_scan`` (one op for any length; written as ONNX's LSTM, GRU or RNN), not per step."""
    from ..frontend.jit.export import ExportError  # noqa: PLC0415
    from ..frontend.jit.export_dynamic import export_dynamic  # noqa: PLC0415

    try:
        return export_dynamic(model, args, kwargs, dynamic_shapes)
    except ExportError as error:
        raise OnnxExportError(f"kiln.onnx: {error}") from None


def _export_dynamic(trace_export, model, args, kwargs, names, axes):
    """Trace at two sizes of each dynamic axis; the first program with its symbolic shapes."""
    from ..frontend.jit.pytree import flatten, unflatten  # noqa: PLC0415
    from ..frontend.tensor import Tensor  # noqa: PLC0415
    from ._dynamic import resized, symbolize  # noqa: PLC0415

    leaves, tree = flatten((args, kwargs))
    by_name = {name: p for p, name in names.items()}
    example: dict[str, int] = {}
    wanted: list[tuple[int, int, str]] = []
    for name, entries in axes.items():
        if name not in by_name:
            continue  # an output's axes: named when written
        leaf = leaves[by_name[name]]
        for axis, dim in entries.items():
            if not -leaf.ndim <= axis < leaf.ndim:
                raise OnnxExportError(f"kiln.onnx: dynamic axis {axis} of input {name!r}, which has {leaf.ndim} dims")
            axis %= leaf.ndim
            size = leaf.shape[axis]
            if example.setdefault(dim, size) != size:
                raise OnnxExportError(f"kiln.onnx: the dynamic axis {dim!r} has sizes {example[dim]} and {size} "
                                      "in the example")  # fmt: skip
            wanted.append((by_name[name], axis, dim))
    sizes: dict[str, tuple[int, int]] = {}
    for dim, size in example.items():
        first = max(size, 2)  # size 1 broadcasts; a trace at 1 could differ from every other size
        second = first + 1
        while (first, second) in sizes.values():
            second += 1
        sizes[dim] = (first, second)
    programs = []
    for which in (0, 1):
        new = list(leaves)
        for position, axis, dim in wanted:
            t = new[position]
            array = resized(t.detach().cpu().numpy(), axis, sizes[dim][which]) if isinstance(t, Tensor) else t
            new[position] = _like(t, array)
        a, k = unflatten(tree, new)
        programs.append(trace_export(model, *a, **k))
    symbolic = symbolize(_graph(programs[0]), _graph(programs[1]), {_symbol(d): pair for d, pair in sizes.items()})
    return programs[0], symbolic


def _graph(program):
    return program.traced if program.traced is not None else program.graph


def _symbol(name: str):
    import re  # noqa: PLC0415

    from ..ir.types import RESERVED_NAMES, Sym  # noqa: PLC0415

    safe = re.sub(r"\W", "_", name)
    return Sym(safe if safe[:1].isalpha() and safe not in RESERVED_NAMES else f"dim_{safe}")


def _like(t, array):
    import numpy as np  # noqa: PLC0415

    from .. import from_numpy  # noqa: PLC0415

    return from_numpy(np.ascontiguousarray(array)).to(t.device)
