"""``kiln.export`` with ``dynamic_shapes``: one exported program for every size of the named dimensions.

``export(fn, x, dynamic_shapes=[{0: "batch", 1: "seq"}])`` names dimensions of the positional tensor
arguments (as ``torch.export``'s ``Dim``s, by name; one name is one size, in every argument that
has it). The call is traced at two sizes of each name (``dynamic.py``'s ``symbolize`` compares the
two graphs and writes the sizes as symbols), and the program runs at any size >= 1 there, its
kernels generated once (``symbolic_program.py``).

A comparison Python makes of a named size while it is traced (``assert T <= block_size``) becomes a
guard of the program (``watched_sizes.SizeGuard``): a call whose size compares otherwise is refused
with the comparison and the user's line, instead of running a program traced for other sizes. Any
other use of a named size in a Python branch is an ``ExportError``.
"""

from __future__ import annotations

import numpy as np

from ...compiler.driver import optimize
from ...compiler.options import CompileOptions
from ...ir.graph import Value
from ...ir.types import Sym
from ..tensor import Tensor, make_tensor
from .dynamic import NotDynamic, symbolize_values
from .export import ExportedProgram, ExportError, traced_export
from .pytree import flatten
from .regions import Region
from .watched_sizes import guards_of, with_shadows

__all__ = ["export_dynamic"]


def export_dynamic(fn, args: tuple, kwargs: dict, dynamic_shapes) -> ExportedProgram:
    """``export`` with the dynamic sizes ``dynamic_shapes`` names: traced at two sizes, the programs compared."""
    axes = dynamic_axes(args, dynamic_shapes)
    pairs = _size_pairs(args, axes)
    programs, traces = [], []
    for which in (0, 1):
        resized = [_resized(a, {d: pairs[n][which] for d, n in axes[k].items()}) if k in axes else a
                   for k, a in enumerate(args)]  # fmt: skip
        shadows = with_shadows((p[which], p[1 - which]) for p in pairs.values())
        program, trace = traced_export(fn, tuple(resized), kwargs, shadows)
        if trace.size_compared is not None:
            raise ExportError(f"export: with dynamic_shapes, Python uses a dynamic size in a way the exported program "
                              f"cannot check at each call: {trace.size_compared}")  # fmt: skip
        programs.append(program)
        traces.append(trace)
    first, second = programs
    assert first.traced is not None and second.traced is not None, "export keeps the traced graph"
    try:
        symbolic, values = symbolize_values(first.traced, second.traced, {Sym(n): p for n, p in pairs.items()})
    except NotDynamic as why:
        raise ExportError(f"export: with dynamic_shapes the call is traced at two sizes, which must make one program "
                          f"up to those sizes; they do not: {why}") from None  # fmt: skip
    guards = _guards(args, axes, pairs, traces[1].size_guards)
    graph = optimize(symbolic, CompileOptions(), [])
    specs = list(first.in_specs)
    for k, dims in axes.items():
        kind, shape, dtype = specs[_leaf(args, k)]
        specs[_leaf(args, k)] = (kind, tuple(Sym(dims[d]) if d in dims else n for d, n in enumerate(shape)), dtype)
    regions = _symbolic_regions(first.regions, second.regions, values)
    return ExportedProgram(graph, first.parameters, first.in_tree, specs, first.signature, first.out_tree, regions,
                           symbolic, tuple(guards))  # fmt: skip


def _symbolic_regions(first: tuple, second: tuple, values: dict) -> tuple[Region, ...]:
    """The first trace's composite regions over the symbolic graph (for exporters: kiln.onnx writes an LSTM
    layer as ONNX's LSTM). A region whose other arguments differ between the traces (a size passed as
    an int) names no one op at every size and is left out: its nodes are written one by one."""
    if [r.name for r in first] != [r.name for r in second]:
        return ()
    kept = []
    for a, b in zip(first, second, strict=True):
        arguments = {key: _symbolic_argument(arg, b.arguments.get(key), values) for key, arg in a.arguments.items()}
        if any(arg is _DIFFERS for arg in arguments.values()) or any(v not in values for v in a.outputs):
            continue
        kept.append(Region(a.name, arguments, tuple(values[v] for v in a.outputs), a.loc))
    return tuple(kept)


_DIFFERS = object()


def _symbolic_argument(a, b, values: dict):
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        items = tuple(_symbolic_argument(x, y, values) for x, y in zip(a, b, strict=True))
        return _DIFFERS if any(x is _DIFFERS for x in items) else items
    if isinstance(a, Value):
        return values.get(a, _DIFFERS) if isinstance(b, Value) else _DIFFERS
    if a is None or b is None:
        return a if a is b else _DIFFERS
    try:
        return a if type(a) is type(b) and bool(a == b) else _DIFFERS
    except Exception:  # noqa: BLE001 - an object with no plain equality: the same object in both traces
        return a if a is b else _DIFFERS


def dynamic_axes(args: tuple, dynamic_shapes) -> dict[int, dict[int, str]]:
    """Positional argument -> {dimension: the name of its dynamic size}, checked."""
    if not isinstance(dynamic_shapes, list | tuple) or len(dynamic_shapes) != len(args):
        raise ExportError(f"export: dynamic_shapes must be a list with one entry per positional argument "
                          f"({len(args)}), each None or {{dim: 'name'}}; got {dynamic_shapes!r:.80}")  # fmt: skip
    axes: dict[int, dict[int, str]] = {}
    for k, entry in enumerate(dynamic_shapes):
        if entry is None:
            continue
        arg = args[k]
        if not isinstance(arg, Tensor) or not isinstance(entry, dict) or not entry:
            raise ExportError(f"export: dynamic_shapes[{k}] must be None or {{dim: 'name', ...}} for a tensor "
                              f"argument; got {entry!r:.80} for a {type(arg).__name__}")  # fmt: skip
        dims = {}
        for dim, name in entry.items():
            if not isinstance(dim, int) or isinstance(dim, bool) or not -arg.ndim <= dim < arg.ndim:
                raise ExportError(f"export: dynamic_shapes[{k}] names dimension {dim!r} of a tensor of shape "
                                  f"{list(arg.shape)}")  # fmt: skip
            try:
                dims[dim % arg.ndim] = Sym(name).name
            except ValueError as error:
                raise ExportError(f"export: dynamic_shapes[{k}][{dim}]: {error}") from None
        axes[k] = dims
    return axes


def _size_pairs(args: tuple, axes: dict[int, dict[int, str]]) -> dict[str, tuple[int, int]]:
    """The two sizes each name is traced at: the example's (at least 2: a size 1 broadcasts) and
    twice it and one, no two names at the same pair (``symbolize`` tells the symbols apart by their pair)."""
    example: dict[str, int] = {}
    for k, dims in axes.items():
        for dim, name in dims.items():
            size = args[k].shape[dim]
            if example.setdefault(name, size) != size:
                raise ExportError(f"export: the dynamic size {name} is {example[name]} and {size} in the example")
    pairs: dict[str, tuple[int, int]] = {}
    for name, size in example.items():
        first = max(size, 2)
        # far from the first, so that a size a stride divides (a stride-2 conv's (H-1)//2) differs too
        second = 2 * first + 1
        while second in {b for _, b in pairs.values()}:  # (a guard names its size by the second)
            second += 1
        pairs[name] = (first, second)
    return pairs


def _guards(args: tuple, axes: dict, pairs: dict, compared: list) -> list:
    """The program's size guards from the second trace's comparisons of sizes (``Trace.size_guards``)."""
    positions = [(_leaf(args, k), d) for k, dims in axes.items() for d in dims]
    size_pairs = [pairs[axes[k][d]] for k, dims in axes.items() for d in dims]
    guards, why = guards_of(compared, ("compare", None, size_pairs, positions))
    if why is not None:
        raise ExportError(f"export: with dynamic_shapes, {why}")
    return guards


def _leaf(args: tuple, position: int) -> int:
    """The flattened leaf index of the tensor that is positional argument ``position``."""
    return len(flatten(tuple(args[:position]))[0])


def _resized(t: Tensor, sizes: dict[int, int]) -> Tensor:
    """``t`` with ``sizes[d]`` elements along each dimension ``d``, repeating its own (indices it holds
    stay valid; a causal mask stays one where its pattern repeats)."""
    array = t.detach().numpy()
    for dim, size in sizes.items():
        array = np.take(array, np.arange(size) % max(array.shape[dim], 1), axis=dim)
    return make_tensor(np.ascontiguousarray(array), t._device)
