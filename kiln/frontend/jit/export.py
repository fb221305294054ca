"""``kiln.export``: a traced graph with its parameters and signature, runnable without the Python code.

``export(fn_or_module, *example_args)`` traces one call (as ``fullgraph=True``: anything that
would stop a trace is an error). Tensors the function reads from outside its arguments become
the program's parameters, named as in the module's ``state_dict`` when a module is exported.
``ExportedProgram.save(path)`` writes one graph file (safetensors: the graph as JSON in the
header, constants and parameters as tensors; no pickle), and ``load_exported(path)`` reads it
back, checking the format version, the signature's structure and the graph (the verifier
re-infers every type), and never executing code from the file.

Calls must match the example's structure, shapes and dtypes (export specializes, as a trace
does). In-place changes the traced call made to its arguments or parameters (BatchNorm's
running statistics in training mode, the generator state of dropout) are applied on each call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ...ir import dtypes as dt
from ...ir.graph import Graph, Value
from ..autograd.grad_mode import no_grad
from ..tensor import Tensor, make_tensor
from .build import optimize, plan_results
from .compiler import CompileOptions
from .pytree import LEAF, flatten, unflatten
from .specialization import claim, owned_memory
from .trace import Trace

EXPORT_FORMAT_VERSION = 1


class ExportError(ValueError):
    """A function that cannot be exported, or a file that is not a valid exported program."""


@dataclass
class ExportedProgram:
    """A traced program: ``graph``, ``parameters`` (name -> Tensor) and its call signature."""

    graph: Graph
    parameters: dict[str, Tensor]
    in_tree: object
    in_specs: list  # per flattened argument: ("tensor", shape, dtype short name) | ("python", value)
    inputs: list  # per graph input: ("arg", index) | ("param", name)
    out_tree: object
    outputs: list  # per result leaf: ("value", i) | ("arg", index) | ("param", name) | ("python", value)
    #                | ("same", earlier leaf)
    writebacks: list  # (("arg", index) | ("param", name), output index)

    def __post_init__(self) -> None:
        from ...ir.interpreter import prepare  # noqa: PLC0415

        self._run = prepare(self.graph).run

    # ------------------------------------------------------------------ calling
    def __call__(self, *args, **kwargs):
        leaves, tree = flatten((args, kwargs))
        self._check_call(leaves, tree)
        arrays = [self._source(src, leaves)._data for src in self.inputs]
        outputs = self._run(arrays)
        claimed = owned_memory(arrays)  # results are materialized before the write-backs change inputs
        results = [claim(outputs[payload], claimed, self.graph.outputs[payload].type.device) if kind == "value"
                   else None for kind, payload in self.outputs]  # fmt: skip
        for target, index in self.writebacks:
            t = self._source(target, leaves)
            t._data[...] = outputs[index]
            t._version[0] += 1
        for position, (kind, payload) in enumerate(self.outputs):
            if kind == "python":
                results[position] = payload
            elif kind == "same":
                results[position] = results[payload]
            elif kind != "value":
                results[position] = self._source((kind, payload), leaves)
        return unflatten(self.out_tree, results)

    def _source(self, source, leaves: list) -> Tensor:
        kind, payload = source
        return leaves[payload] if kind == "arg" else self.parameters[payload]

    def _check_call(self, leaves: list, tree) -> None:
        if tree != self.in_tree:
            raise TypeError(f"exported program: the arguments' structure differs from the example's "
                            f"(expected {_describe_tree(self.in_tree)}, got {_describe_tree(tree)})")  # fmt: skip
        for i, (spec, leaf) in enumerate(zip(self.in_specs, leaves, strict=True)):
            if spec[0] == "tensor":
                if not isinstance(leaf, Tensor):
                    raise TypeError(f"exported program: argument {i} must be a tensor, got {type(leaf).__name__}")
                if tuple(leaf.shape) != tuple(spec[1]) or leaf.dtype.short != spec[2]:
                    raise ValueError(f"exported program: argument {i} must be {spec[2]}{list(spec[1])}, got "
                                     f"{leaf.dtype.short}{list(leaf.shape)} (export specializes on shapes and dtypes)")  # fmt: skip
            elif isinstance(leaf, Tensor) or leaf != spec[1]:
                raise ValueError(f"exported program: argument {i} must be {spec[1]!r} as in the example, got {leaf!r}")

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> None:
        """Write one self-contained, versioned file (no pickle)."""
        from ...ir.serialize import save_graph_file  # noqa: PLC0415

        meta = {
            "export_format_version": EXPORT_FORMAT_VERSION,
            "in_tree": _tree_to_json(self.in_tree),
            "in_specs": [_spec_to_json(s) for s in self.in_specs],
            "inputs": [list(s) for s in self.inputs],
            "out_tree": _tree_to_json(self.out_tree),
            "outputs": [_output_to_json(o) for o in self.outputs],
            "writebacks": [[list(t), i] for t, i in self.writebacks],
            "parameters": list(self.parameters),
        }
        tensors = {name: np.ascontiguousarray(t._host()) for name, t in self.parameters.items()}
        save_graph_file(path, self.graph, tensors=tensors, metadata=meta)

    def __repr__(self) -> str:
        return (f"ExportedProgram({len(self.graph.nodes)} nodes, {len(self.parameters)} parameters, "
                f"inputs {self.in_specs})")  # fmt: skip


def export(fn, *args, **kwargs) -> ExportedProgram:
    """Trace ``fn(*args, **kwargs)`` into an ``ExportedProgram`` (the call runs for real once)."""
    names = _parameter_names(fn)
    leaves, tree = flatten((args, kwargs))
    trace = Trace(fullgraph=True).start()
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
    sources, parameters = [], {}
    for k, ext in enumerate(traced.externals):
        if ext.kind == "arg":
            sources.append(("arg", ext.arg_index))
        else:
            name = names.get(id(ext.tensor), f"capture_{k}")
            parameters[name] = make_tensor(np.array(ext.tensor._host(), copy=True), ext.tensor._device)
            sources.append(("param", name))
    outputs: list[Value] = []
    plan = []
    for item in plan_results(traced.outputs, outputs, views=False):
        if item[0] == "external":
            item = sources[item[1]]
        elif item[0] == "python":
            _check_plain(item[1], "a result")
        plan.append(item)
    writebacks = []
    for index, value in traced.writebacks:
        writebacks.append((sources[index], len(outputs)))
        outputs.append(value)
    graph = optimize(traced.builder.build(outputs), CompileOptions(), [])
    specs = [("tensor", tuple(x.shape), x.dtype.short) if isinstance(x, Tensor) else ("python", _check_plain(x))
             for x in leaves]  # fmt: skip
    trace.release()
    return ExportedProgram(graph, parameters, tree, specs, sources, out_tree, plan, writebacks)


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
        inputs = [_source_from_json(s, names) for s in meta["inputs"]]
        writebacks = [(_source_from_json(t, names), _index(i, len(graph.outputs))) for t, i in meta["writebacks"]]
        in_tree = _tree_from_json(meta["in_tree"])
        in_specs = [_spec_from_json(s) for s in meta["in_specs"]]
        out_tree = _tree_from_json(meta["out_tree"])
        outputs = [_output_from_json(o, names, len(graph.outputs), i) for i, o in enumerate(meta["outputs"])]
    except ExportError:
        raise
    except RecursionError:
        raise ExportError(f"{path}: not a valid exported program (its signature is nested too deeply)") from None
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise ExportError(f"{path}: not a valid exported program ({type(error).__name__}: {error})") from None
    program = ExportedProgram(graph, parameters, in_tree, in_specs, inputs, out_tree, outputs, writebacks)
    problem = _signature_problem(program)
    if problem:
        raise ExportError(f"{path}: not a valid exported program: {problem}")
    return program


def _signature_problem(program: ExportedProgram) -> str:
    """What in the signature disagrees with the graph, or "": checked once at load, so that a damaged
    file is refused there instead of failing (or writing wrong shapes) on every call."""
    graph = program.graph
    for tree, count, what in ((program.in_tree, len(program.in_specs), "arguments"),
                              (program.out_tree, len(program.outputs), "results")):  # fmt: skip
        if _count_leaves(tree) != count:
            return f"the structure of the {what} has {_count_leaves(tree)} leaves, the signature lists {count}"
    if len(program.inputs) != len(graph.inputs):
        return f"the signature names {len(program.inputs)} inputs, the graph has {len(graph.inputs)}"
    bindings = [(f"graph input %{v.id}", source, v.type) for source, v in zip(program.inputs, graph.inputs)]
    bindings += [(f"the write-back of output {i}", target, graph.outputs[i].type) for target, i in program.writebacks]
    bindings += [(f"result {i}", out, None) for i, out in enumerate(program.outputs) if out[0] == "arg"]
    for where, source, expected in bindings:
        found = _source_type(program, source)
        if isinstance(found, str):
            return f"{where} reads {found}"
        name, dtype, shape = found
        if expected is not None and (dtype, shape) != (expected.dtype.short, tuple(expected.shape)):
            return f"{where} is {expected.dtype.short}{list(expected.shape)} in the graph, but {name} is {dtype}{list(shape)}"
    return ""


def _source_type(program: ExportedProgram, source: tuple) -> tuple[str, str, tuple] | str:
    """``(name, dtype short name, shape)`` of an argument or parameter, or what is wrong with the reference."""
    kind, payload = source
    if kind == "param":
        t = program.parameters[payload]
        return f"parameter {payload!r}", t.dtype.short, tuple(t.shape)
    if payload >= len(program.in_specs):
        return f"argument {payload}, but the signature has {len(program.in_specs)} arguments"
    spec = program.in_specs[payload]
    if spec[0] != "tensor":
        return f"argument {payload}, which is {spec[1]!r} in the signature, not a tensor"
    return f"argument {payload}", spec[2], tuple(spec[1])


def _count_leaves(tree) -> int:
    if tree is LEAF:
        return 1
    return sum(_count_leaves(sub) for sub in tree[-1])


def _index(i, n: int) -> int:
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n:
        raise ValueError(f"index {i!r} out of range")
    return i


def _source_from_json(obj, names: list) -> tuple:
    kind, payload = obj
    if kind == "arg":
        return ("arg", _index(payload, 1 << 30))
    if kind == "param" and payload in names:
        return ("param", payload)
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
        return ["tensor", list(spec[1]), spec[2]]
    return ["python", _plain_to_json(spec[1])]


def _spec_from_json(obj):
    if obj[0] == "tensor":
        shape = tuple(_index(d, 1 << 62) if d else 0 for d in obj[1])
        if obj[2] not in dt.BY_NAME:
            raise ValueError(
                f"unknown dtype {str(obj[2])[:20]!r} (kiln's are {', '.join(d.short for d in dt.ALL_DTYPES)})"
            )
        return ("tensor", shape, dt.BY_NAME[obj[2]].short)  # calls compare short names
    if obj[0] == "python":
        return ("python", _plain_from_json(obj[1]))
    raise ValueError(f"bad argument spec {obj!r}")


def _output_to_json(out):
    kind, payload = out
    return [kind, _plain_to_json(payload) if kind == "python" else payload]


def _output_from_json(obj, names: list, n_outputs: int, position: int):
    kind, payload = obj
    if kind == "value":
        return ("value", _index(payload, n_outputs))
    if kind == "same":
        return ("same", _index(payload, position))
    if kind == "python":
        return ("python", _plain_from_json(payload))
    return _source_from_json(obj, names)


def _describe_tree(tree) -> str:
    if tree is LEAF:
        return "x"
    if tree[0] is dict:
        return "{" + ", ".join(f"{k!r}: {_describe_tree(s)}" for k, s in zip(tree[1], tree[2], strict=True)) + "}"
    inner = ", ".join(_describe_tree(s) for s in tree[1])
    return f"[{inner}]" if tree[0] is list else f"({inner})"
