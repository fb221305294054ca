"""``kiln.export``: a traced graph with its parameters and signature, runnable without the Python code.

``export(fn_or_module, *example_args)`` traces one call (as ``fullgraph=True``: anything that
would stop a trace is an error). Tensors the function reads from outside its arguments become
the program's parameters, named as in the module's ``state_dict`` when a module is exported.
``ExportedProgram.save(path)`` writes one graph file (safetensors: the graph as JSON in the
header, constants and parameters as tensors; no pickle), and ``load_exported(path)`` reads it
back, checking the format version, the signature's structure and the graph (the verifier
re-infers every type), and never executing code from the file.

Calls must match the example's structure, shapes and dtypes (export specializes, as a trace
does), except along the dynamic dimensions ``dynamic_shapes`` names: ``export(fn, x,
dynamic_shapes=[{0: "batch", 1: "seq"}])`` traces the call at two sizes of each
(``export_dynamic.py``) and the program then runs at any size >= 1 there, compiled once, refusing
with a clear error the sizes its guards do not take (``assert T <= block_size`` as traced). In-place
changes the traced call made to its arguments or parameters (BatchNorm's running statistics in
training mode, the generator state of dropout) are applied on each call.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...compiler.driver import compile_graph, optimize
from ...compiler.options import CompileOptions
from ...ir import dtypes as dt
from ...ir.graph import CONSTANT, Graph
from ...ir.primitives import PRIMITIVES
from ...ir.types import Sym
from ...ir.types import is_static as _is_static
from ..autograd.grad_mode import no_grad
from ..dispatch import apply as dispatch_apply
from ..tensor import Tensor, make_tensor
from . import state
from .pytree import LEAF, flatten, unflatten
from .region_check import check_regions
from .regions import regions_from_json, regions_to_json
from .signature import (
    Argument,
    ExternalResult,
    InputKind,
    Parameter,
    PythonValue,
    Repeat,
    Result,
    Signature,
    WriteBack,
    apply,
    bind,
    number_outputs,
)
from .symbolic_program import Unlowered, lower_symbolic
from .trace import Trace
from .watched_sizes import GUARD_COMPARISONS, SizeGuard

#: The newest format this kiln reads and writes: 2 adds the size guards of a dynamic program (a file
#: without guards is written as version 1, which older kilns read).
EXPORT_FORMAT_VERSION = 2


class ExportError(ValueError):
    """A function that cannot be exported, or a file that is not a valid exported program."""


@dataclass
class ExportedProgram:
    """A traced program: ``graph``, ``parameters`` (name -> Tensor) and its call signature.

    The ``signature``'s inputs are ``Argument`` and ``Parameter`` kinds; its results ``Result``,
    ``ExternalResult``, ``Repeat`` and ``PythonValue`` (views come back as values of their own); it
    writes back the arguments and parameters the traced call changed in place."""

    graph: Graph
    parameters: dict[str, Tensor]
    in_tree: object
    in_specs: list  # per flattened argument: ("tensor", shape, dtype short name) | ("python", value)
    signature: Signature
    out_tree: object
    # For exporters, not stored in files: the composite ops' regions (regions.py) and the graph as traced,
    # before the passes (which may merge or replace the values the regions name).
    regions: tuple = ()
    traced: Graph | None = None
    size_guards: tuple = ()  # watched_sizes.SizeGuard: the dynamic sizes' comparisons each call must keep

    def __post_init__(self) -> None:
        from ...ir.interpreter import prepare  # noqa: PLC0415

        self._interpreted = prepare(self.graph).run  # the reference, and ``kiln run --interpret``
        self._program: Callable[[list], list] | None = None  # compiled at the first call
        self._compiling = threading.Lock()

    def _run(self, arrays: list) -> list:
        """The graph on its arrays, compiled on the first call through the same driver, backend and
        disk cache as ``kiln.compile`` (a loaded program ran on the interpreter: a CNN 8.0 ms a call
        against 1.4 ms compiled); a compile that fails falls back to the interpreter, said."""
        program = self._program
        if program is None:
            with self._compiling:
                if self._program is None:
                    self._program = self._compile()
                program = self._program
        return program(arrays)

    def _compile(self) -> Callable[[list], list]:
        if is_static_graph(self.graph):
            return compile_graph(self.graph, CompileOptions()).program
        try:  # a dynamic batch: the kernels generated once, loaded per size
            return lower_symbolic(self.graph, CompileOptions(), [None] * len(self.graph.inputs), ())[1]
        except Unlowered:
            return self._interpreted

    # ------------------------------------------------------------------ calling
    def __call__(self, *args, **kwargs):
        leaves, tree = flatten((args, kwargs))
        self._check_call(leaves, tree)
        if state.current.get() is not None:  # traced (kiln.compile of a loaded program): as kiln's ops
            return unflatten(self.out_tree, self._replay(leaves))
        arrays = bind(self.signature, leaves, self.parameters)
        results = apply(self.signature, self._run(arrays), arrays, leaves, self.parameters)
        return unflatten(self.out_tree, results)

    def _replay(self, leaves: list) -> list:
        """The call's flattened results, computed node by node through kiln's dispatcher: a trace
        running the program records each node and reads the arguments and parameters as inputs
        on every call (``bind`` would hand their memory to the interpreter behind the trace's back)."""
        graph, signature = self.graph, self.signature
        # an exported program's inputs are Arguments and Parameters alone (so are its results' kinds below)
        inputs = [leaves[s.position] if isinstance(s, Argument) else self.parameters[s.name] for s in signature.inputs]  # type: ignore[union-attr]
        env = dict(zip(graph.inputs, inputs, strict=True))
        with no_grad():
            for node in graph.nodes:
                env[node.output] = _run_node(graph, node, [env[v] for v in node.inputs])
            outputs = [env[v] for v in graph.outputs]
            for w in signature.writebacks:
                inputs[w.input].copy_(outputs[w.output])
        roots = {id(t._base if t._base is not None else t) for t in inputs}
        results: list = []
        for r in signature.results:
            if isinstance(r, Result):
                t = outputs[r.output]
                # the interpreter's outputs that share an input's memory are copied by ``apply``
                shared = id(t._base if t._base is not None else t) in roots
                results.append(t.clone() if shared else t)
            elif isinstance(r, ExternalResult):
                results.append(inputs[r.input])
            elif isinstance(r, Repeat):
                results.append(results[r.position])
            else:
                results.append(r.value)  # type: ignore[union-attr]  # a PythonValue
        return results

    def _check_call(self, leaves: list, tree) -> None:
        if tree != self.in_tree:
            raise TypeError(f"exported program: the arguments' structure differs from the example's "
                            f"(expected {_describe_tree(self.in_tree)}, got {_describe_tree(tree)})")  # fmt: skip
        sizes: dict = {}  # a dynamic dimension's size in this call
        for i, (spec, leaf) in enumerate(zip(self.in_specs, leaves, strict=True)):
            if spec[0] == "tensor":
                if not isinstance(leaf, Tensor):
                    raise TypeError(f"exported program: argument {i} must be a tensor, got {type(leaf).__name__}")
                shape = tuple(_dynamic_size(d, n, sizes, i) for d, n in zip(spec[1], leaf.shape))
                if len(leaf.shape) != len(spec[1]) or shape != tuple(leaf.shape) or leaf.dtype.short != spec[2]:
                    raise ValueError(f"exported program: argument {i} must be {spec[2]}[{', '.join(map(str, spec[1]))}], got "
                                     f"{leaf.dtype.short}{list(leaf.shape)} (export specializes on shapes and dtypes)")  # fmt: skip
            elif isinstance(leaf, Tensor) or leaf != spec[1]:
                raise ValueError(f"exported program: argument {i} must be {spec[1]!r} as in the example, got {leaf!r}")
        for guard in self.size_guards:
            miss = guard.miss(leaves)
            if miss is not None:
                raise ValueError(f"exported program: {miss}: the program was traced for sizes that keep it")

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> None:
        """Write one self-contained, versioned file (no pickle)."""
        from ...ir.serialize import save_graph_file  # noqa: PLC0415

        meta = {
            "export_format_version": 2 if self.size_guards else 1,
            "size_guards": [_guard_to_json(g) for g in self.size_guards],
            "in_tree": _tree_to_json(self.in_tree),
            "in_specs": [_spec_to_json(s) for s in self.in_specs],
            **signature_to_json(self.signature),
            "out_tree": _tree_to_json(self.out_tree),
            "parameters": list(self.parameters),
            "regions": regions_to_json(self.regions, self.graph, self.traced),  # for exporters (kiln.onnx)
        }
        tensors = {name: t._host() for name, t in self.parameters.items()}  # C order made there; 0-d kept 0-d
        save_graph_file(path, self.graph, tensors=tensors, metadata=meta)

    def to_onnx(self, path: str | os.PathLike, *, opset_version: int | None = None, input_names=None,
                output_names=None, dynamic_axes=None) -> None:  # fmt: skip
        """Write this program as an ONNX model (needs the ``onnx`` extra); see ``kiln.onnx.export``."""
        from ...onnx import program_to_onnx  # noqa: PLC0415 - optional dependency, imported when used

        program_to_onnx(self, path, opset_version=opset_version, input_names=input_names,
                        output_names=output_names, dynamic_axes=dynamic_axes)  # fmt: skip

    def __repr__(self) -> str:
        return (f"ExportedProgram({len(self.graph.nodes)} nodes, {len(self.parameters)} parameters, "
                f"inputs {self.in_specs})")  # fmt: skip


def is_static_graph(graph: Graph) -> bool:
    return all(_is_static(v.type.shape) for v in graph.inputs)


def _dynamic_size(dim, size: int, sizes: dict, position: int):
    """``size`` where the spec's ``dim`` is a symbol that takes it (one size per symbol, >= 1 in a call),
    else ``dim`` (the comparison with the call's shape then says what was expected)."""
    if not isinstance(dim, Sym):
        return dim
    bound = sizes.setdefault(dim, size)
    if bound != size:
        raise ValueError(f"exported program: the dynamic dimension {dim} is {bound} in one argument and {size} in "
                         f"argument {position}; it must be one size")  # fmt: skip
    return size if size >= 1 else dim


def export(fn, *args, dynamic_shapes=None, **kwargs) -> ExportedProgram:
    """Trace ``fn(*args, **kwargs)`` into an ``ExportedProgram`` (the call runs for real once; with
    ``dynamic_shapes``, twice). ``dynamic_shapes``: per positional argument, None or ``{dim: "name",
    ...}`` to make those dimensions dynamic sizes called ``name`` (as ``torch.export``'s, with names
    for ``Dim``s); the program then runs at any size >= 1 there (``export_dynamic.py``)."""
    if dynamic_shapes is not None:
        from .export_dynamic import export_dynamic  # noqa: PLC0415 - it builds on this module

        return export_dynamic(fn, args, kwargs, dynamic_shapes)
    return traced_export(fn, args, kwargs)[0]


def traced_export(
    fn, args: tuple, kwargs: dict, watched: frozenset[int] | dict[int, int | None] = frozenset()
) -> tuple[ExportedProgram, Trace]:
    """The program of one traced call, and its trace (released), whose Python reads of the sizes in
    ``watched`` were watched (``watched_sizes.py``: what it compared is in ``size_guards``)."""
    names = _parameter_names(fn)
    leaves, tree = flatten((args, kwargs))
    trace = Trace(fullgraph=True).start()
    trace.watched_sizes = watched
    try:
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, Tensor) and not trace.is_bound(leaf):
                trace.add_external(leaf, "arg", i)
        with no_grad():  # an exported program is a forward computation
            result = fn(*args, **kwargs)
        out_leaves, out_tree = flatten(result)
        traced = trace.finish(out_leaves)
    except BaseException:
        trace.abandon()
        raise
    if traced.grads:
        trace.release()
        raise ExportError("export: the function sets .grad values; export a forward computation")
    inputs: list = []
    parameters = {}
    for k, ext in enumerate(traced.externals):
        if ext.kind == "arg":
            inputs.append(Argument(ext.arg_index))  # type: ignore[arg-type]  # set for every "arg"
        else:
            name = names.get(id(ext.tensor), f"capture_{k}")
            parameters[name] = make_tensor(np.array(ext.tensor._host(), copy=True), ext.tensor._device)
            inputs.append(Parameter(name))
    for item in traced.outputs:
        if isinstance(item, PythonValue):
            _check_plain(item.value, "a result")
    signature, outputs = number_outputs(inputs, traced.outputs, traced.writebacks, views=False)
    built = traced.builder.build(outputs)
    graph = optimize(built, CompileOptions(), [])
    specs = [("tensor", tuple(x.shape), x.dtype.short) if isinstance(x, Tensor) else ("python", _check_plain(x))
             for x in leaves]  # fmt: skip
    trace.release()
    return ExportedProgram(graph, parameters, tree, specs, signature, out_tree, tuple(trace.regions), built), trace


def _run_node(graph: Graph, node, inputs: list) -> Tensor:
    """One node of an exported graph as a kiln op (recorded by a running trace)."""
    if node.op == CONSTANT:
        return make_tensor(np.array(graph.constants[node.attrs["name"]], copy=True))
    prim = PRIMITIVES[node.op]
    if not inputs:  # made from its attributes alone: a constant to the trace
        return make_tensor(np.asarray(prim.eager(np, **node.attrs), dtype=node.output.type.dtype.np))
    return dispatch_apply(prim, *inputs, **node.attrs)


def _parameter_names(fn) -> dict[int, str]:
    module = getattr(fn, "_orig_mod", fn)
    if not hasattr(module, "named_parameters"):
        return {}
    names = {id(p): name for name, p in module.named_parameters()}
    names.update({id(b): name for name, b in module.named_buffers()})
    return names


# ---------------------------------------------------------------------- loading
def load_exported(path: str | os.PathLike) -> ExportedProgram:
    """Read a file written by ``ExportedProgram.save``; no code from the file runs."""
    from ...ir.serialize import load_graph_file  # noqa: PLC0415

    graph, tensors, meta = load_graph_file(path)
    try:
        version = meta["export_format_version"]
        if type(version) is not int or version < 1:
            raise ExportError(f"{path}: its export_format_version must be an integer >= 1, got {version!r:.40} "
                              f"({type(version).__name__})")  # fmt: skip
        if version > EXPORT_FORMAT_VERSION:
            raise ExportError(f"{path}: exported with format version {version}, newer than this kiln reads "
                              f"({EXPORT_FORMAT_VERSION}); upgrade kiln")  # fmt: skip
        names = meta["parameters"]
        if (
            not isinstance(names, list)
            or not all(isinstance(n, str) for n in names)
            or sorted(names) != sorted(tensors)
        ):
            raise ExportError(f"{path}: the parameter list does not match the stored tensors")
        parameters = {name: make_tensor(tensors[name]) for name in names}  # fresh arrays, the program's own
        in_tree = _tree_from_json(meta["in_tree"])
        in_specs = [_spec_from_json(s) for s in meta["in_specs"]]
        out_tree = _tree_from_json(meta["out_tree"])
        signature = signature_from_json(meta, graph, in_specs, parameters)
        regions = regions_from_json(meta.get("regions", []), graph)  # files of older kilns have none
        regions = check_regions(regions, graph)  # an exporter writes a region as one op: it must be the graph's
        guards = tuple(_guard_from_json(g, in_specs) for g in meta.get("size_guards", []))  # version 2
    except ExportError:
        raise
    except RecursionError:
        raise ExportError(f"{path}: not a valid exported program (its signature is nested too deeply)") from None
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise ExportError(f"{path}: not a valid exported program ({type(error).__name__}: {error})") from None
    program = ExportedProgram(graph, parameters, in_tree, in_specs, signature, out_tree, regions, None, guards)
    problem = _signature_problem(program)
    if problem:
        raise ExportError(f"{path}: not a valid exported program: {problem}")
    return program


def _signature_problem(program: ExportedProgram) -> str:
    """What in the signature disagrees with the graph, or "": checked once at load, so that a damaged
    file is refused there instead of failing (or writing wrong shapes) on every call."""
    graph, signature = program.graph, program.signature
    for tree, count, what in ((program.in_tree, len(program.in_specs), "arguments"),
                              (program.out_tree, len(signature.results), "results")):  # fmt: skip
        if _count_leaves(tree) != count:
            return f"the structure of the {what} has {_count_leaves(tree)} leaves, the signature lists {count}"
    if len(signature.inputs) != len(graph.inputs):
        return f"the signature names {len(signature.inputs)} inputs, the graph has {len(graph.inputs)}"
    bindings = [(f"graph input %{v.id}", source, v.type) for source, v in zip(signature.inputs, graph.inputs)]
    bindings += [(f"the write-back of output {w.output}", signature.inputs[w.input], graph.outputs[w.output].type)
                 for w in signature.writebacks]  # fmt: skip
    for where, source, expected in bindings:
        found = _source_type(program.in_specs, program.parameters, source)
        if isinstance(found, str):
            return f"{where} reads {found}"
        name, dtype, shape = found
        if (dtype, shape) != (expected.dtype.short, tuple(expected.shape)):
            return f"{where} is {expected.dtype.short}{list(expected.shape)} in the graph, but {name} is {dtype}{list(shape)}"
    return ""


def _source_type(in_specs: list, parameters: dict, source) -> tuple[str, str, tuple] | str:
    """``(name, dtype short name, shape)`` of an argument or parameter, or what is wrong with the reference."""
    if isinstance(source, Parameter):
        t = parameters[source.name]
        return f"parameter {source.name!r}", t.dtype.short, tuple(t.shape)
    position = source.position
    if position >= len(in_specs):
        return f"argument {position}, but the signature has {len(in_specs)} arguments"
    spec = in_specs[position]
    if spec[0] != "tensor":
        return f"argument {position}, which is {spec[1]!r} in the signature, not a tensor"
    return f"argument {position}", spec[2], tuple(spec[1])


def _guard_to_json(guard: SizeGuard) -> list:
    return [guard.argument, guard.dim, guard.comparison, guard.other, guard.result, guard.where]


def _guard_from_json(item, in_specs: list) -> SizeGuard:
    """A size guard from its JSON form, checked: a dynamic dimension of a tensor argument, a comparison
    of ints."""
    argument, dim, comparison, other, result, where = item
    _index(argument, len(in_specs))
    spec = in_specs[argument]
    if spec[0] != "tensor" or not isinstance(spec[1][_index(dim, len(spec[1]))], Sym):
        raise ValueError(f"a size guard on argument {argument} dim {dim}, which is not a dynamic size")
    if (
        comparison not in GUARD_COMPARISONS
        or type(other) is not int
        or type(result) is not bool
        or type(where) is not str
    ):
        raise ValueError(f"a size guard {item!r:.80} is not a comparison of a size with an int")
    return SizeGuard(argument, dim, comparison, other, result, where)


def _count_leaves(tree) -> int:
    if tree is LEAF:
        return 1
    return sum(_count_leaves(sub) for sub in tree[-1])


def _index(i, n: int) -> int:
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n:
        raise ValueError(f"index {i!r} out of range")
    return i


# ---------------------------------------------------------------------- the signature in JSON
# Format version 1: inputs are ["arg", position] or ["param", name]; results ["value", output],
# ["same", earlier result], ["python", value] or an input's own form (the input itself returned);
# write-backs [input's form, output].
def signature_to_json(signature: Signature) -> dict:
    """The ``inputs``, ``outputs`` and ``writebacks`` entries of an exported file's metadata."""
    forms = [["arg", s.position] if isinstance(s, Argument) else ["param", s.name] for s in signature.inputs]  # type: ignore[union-attr]
    outputs = []
    for r in signature.results:
        if isinstance(r, ExternalResult):
            outputs.append(forms[r.input])
        elif isinstance(r, Result):
            outputs.append(["value", r.output])
        elif isinstance(r, Repeat):
            outputs.append(["same", r.position])
        elif isinstance(r, PythonValue):
            outputs.append(["python", _plain_to_json(r.value)])
        else:
            raise ExportError(f"export: a result of kind {r.kind!r} cannot be stored")
    return {
        "inputs": forms,
        "outputs": outputs,
        "writebacks": [[forms[w.input], w.output] for w in signature.writebacks],
    }


def signature_from_json(meta: dict, graph: Graph, in_specs: list, parameters: dict) -> Signature:
    """The signature stored in ``meta`` (see ``signature_to_json``), its references checked:
    ``ValueError``, ``TypeError``, ``KeyError`` or ``IndexError`` say what is wrong."""
    names = list(parameters)
    inputs: list[InputKind] = [_input_from_json(obj, names) for obj in meta["inputs"]]
    index = {source: k for k, source in enumerate(inputs)}

    def input_of(obj, where: str) -> int:
        source = _input_from_json(obj, names)
        if source not in index:
            found = _source_type(in_specs, parameters, source)
            raise ValueError(f"{where} reads {found if isinstance(found, str) else found[0] + ', no graph input'}")
        return index[source]

    n_outputs = len(graph.outputs)
    results: list = []
    for position, obj in enumerate(meta["outputs"]):
        kind, payload = obj
        if kind == "value":
            results.append(Result(_index(payload, n_outputs)))
        elif kind == "same":
            results.append(Repeat(_index(payload, position)))
        elif kind == "python":
            results.append(PythonValue(_plain_from_json(payload)))
        else:
            results.append(ExternalResult(input_of(obj, f"result {position}")))
    writebacks = [WriteBack(input_of(target, f"the write-back of output {output}"), _index(output, n_outputs))
                  for target, output in meta["writebacks"]]  # fmt: skip
    return Signature(inputs, results, writebacks, devices=tuple(v.type.device for v in graph.outputs))


def _input_from_json(obj, names: list) -> Argument | Parameter:
    kind, payload = obj
    if kind == "arg":
        return Argument(_index(payload, 1 << 30))
    if kind == "param" and payload in names:
        return Parameter(payload)
    raise ValueError(f"bad input source {obj!r}")


# ---------------------------------------------------------------------- JSON for trees and values
_PLAIN = (int, float, bool, str, type(None))


def _check_plain(value, what: str = "an argument"):
    if not isinstance(value, _PLAIN):
        raise ExportError(f"export: {what} of type {type(value).__name__} cannot be stored; use tensors, "
                          "numbers, strings, None, and tuples/lists/dicts of them")  # fmt: skip
    return value


def _plain_to_json(value):
    if isinstance(value, float) and not np.isfinite(value):
        return {"float": repr(value)}
    return value


def _plain_from_json(obj):
    if isinstance(obj, dict):
        text = obj["float"]
        if text not in ("nan", "inf", "-inf"):
            raise ValueError(f"bad float {text!r}")
        return float(text)
    if not isinstance(obj, _PLAIN):
        raise TypeError(f"bad value {obj!r}")
    return obj


def _tree_to_json(tree):
    if tree is LEAF:
        return None
    kind = tree[0]
    if kind is dict:
        for k in tree[1]:
            if not isinstance(k, str | int) or isinstance(k, bool):
                raise ExportError(f"export: dict keys must be strings or ints to be stored, got {k!r}")
        return {"dict": [[k, _tree_to_json(sub)] for k, sub in zip(tree[1], tree[2], strict=True)]}
    if kind is tuple or kind is list:
        return {kind.__name__: [_tree_to_json(sub) for sub in tree[1]]}
    raise ExportError(f"export: a {kind.__name__} in the arguments or results cannot be stored; use a tuple")


def _tree_from_json(obj):
    if obj is None:
        return LEAF
    if not isinstance(obj, dict) or len(obj) != 1:
        raise ValueError(f"bad structure {obj!r}")
    ((kind, items),) = obj.items()
    if kind == "dict":
        keys = tuple(k for k, _ in items)
        return (dict, keys, tuple(_tree_from_json(sub) for _, sub in items))
    if kind in ("tuple", "list"):
        return ({"tuple": tuple, "list": list}[kind], tuple(_tree_from_json(sub) for sub in items))
    raise ValueError(f"bad structure kind {kind!r}")


def _spec_to_json(spec):
    if spec[0] == "tensor":
        return ["tensor", [d.name if isinstance(d, Sym) else d for d in spec[1]], spec[2]]
    return ["python", _plain_to_json(spec[1])]


def _spec_from_json(obj):
    if obj[0] == "tensor":
        shape = tuple(Sym(d) if isinstance(d, str) else _index(d, 1 << 62) if d else 0 for d in obj[1])
        if obj[2] not in dt.BY_NAME:
            raise ValueError(
                f"unknown dtype {str(obj[2])[:20]!r} (kiln's are {', '.join(d.short for d in dt.ALL_DTYPES)})"
            )
        return ("tensor", shape, dt.BY_NAME[obj[2]].short)  # calls compare short names
    if obj[0] == "python":
        return ("python", _plain_from_json(obj[1]))
    raise ValueError(f"bad argument spec {obj!r}")


def _describe_tree(tree) -> str:
    if tree is LEAF:
        return "x"
    if tree[0] is dict:
        return "{" + ", ".join(f"{k!r}: {_describe_tree(s)}" for k, s in zip(tree[1], tree[2], strict=True)) + "}"
    inner = ", ".join(_describe_tree(s) for s in tree[1])
    return f"[{inner}]" if tree[0] is list else f"({inner})"
