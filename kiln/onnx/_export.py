"""An ``ExportedProgram`` as an ONNX ``ModelProto``: graph inputs, initializers, nodes, outputs.

Composite regions the trace recorded are written as their ONNX operator when it has the op's
semantics (``_composites``); everything else primitive by primitive (``_primitives``). Nodes
that only fed a region written whole are left out (a dead-code walk from the outputs in which a
region's results depend on its arguments alone).
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import CONSTANT, KERNEL, Graph, Value
from ..ir.types import Sym
from ._builder import ModelBuilder, OnnxExportError, where
from ._composites import COMPOSITES
from ._primitives import RULES, UNMAPPABLE, onnx_dtype

DEFAULT_OPSET = 17
MIN_OPSET = 16  # ScatterElements/ScatterND with reduction="add"; Shape with start/end


def build_model(program, *, opset: int, arg_names: dict[int, str], output_names: list[str] | None,
                dim_names: dict[tuple[str, int], str], symbolic=None):  # fmt: skip
    """The ONNX model of ``program``. ``arg_names``: argument position -> input name; ``dim_names``:
    (input or output name, axis) -> the name its dynamic size takes; ``symbolic``: the shapes,
    attributes and splat constants of ``_dynamic.symbolize`` (None: every size static)."""
    from onnx import helper, numpy_helper  # noqa: PLC0415

    from ..frontend.jit.signature import Argument, ExternalResult, Parameter, Repeat, Result  # noqa: PLC0415

    if not MIN_OPSET <= opset <= _max_opset():
        raise OnnxExportError(f"kiln.onnx: opset_version must be in [{MIN_OPSET}, {_max_opset()}], got {opset}")
    # the graph as traced: the values composite regions name are all there (the passes may merge some)
    graph = program.traced if program.traced is not None else program.graph
    signature = program.signature
    shapes, attrs, splats = symbolic if symbolic is not None else ({}, {}, {})
    b = ModelBuilder(graph, opset, shapes, attrs)
    inputs, initializers = [], []
    for source, value in zip(signature.inputs, graph.inputs, strict=True):
        if isinstance(source, Parameter):
            b.bind(value, source.name)
            array = np.array(program.parameters[source.name]._host(), order="C")
            initializers.append((source.name, array))
        else:
            assert isinstance(source, Argument)
            name = arg_names[source.position]
            b.bind(value, name)
            b.bind_symbols(value, name)
            inputs.append(_value_info(helper, name, value, b.shape(value), dim_names))
    names = list(output_names or [])
    names += [f"output_{k}" for k in range(len(names), len(signature.results))]
    b.reserve(names)  # no node output takes an output's name before it is renamed to it
    for name, array in initializers:
        b.initializers.append(numpy_helper.from_array(array, name))
    _emit_nodes(b, graph, program.regions, splats)  # first: an unmappable op is the clearer error
    if signature.writebacks:
        raise OnnxExportError("kiln.onnx: the exported call changes its arguments or parameters in place (BatchNorm "
                              "in training mode, for one); ONNX models have no state: export in eval mode")  # fmt: skip
    outputs: list = []
    renames: dict = {}
    others = [r for r in signature.results if not isinstance(r, Repeat | Result | ExternalResult)]
    if others:
        raise OnnxExportError(f"kiln.onnx: ONNX outputs are tensors; the function also returns {others[0]!r}")
    for k, result in enumerate(signature.results):
        out_name = names[k]
        if isinstance(result, Result):
            value = graph.outputs[result.output]
        elif isinstance(result, ExternalResult):
            value = graph.inputs[result.input]
        else:  # Repeat: the same tensor again
            value = _result_value(graph, signature, signature.results[result.position])
        internal = b.name(value)
        if internal in renames.values() or internal in renames or not _made_by_node(b, internal):
            b.nodes.append(helper.make_node("Identity", [internal], [out_name], name=b.fresh("n_output")))
        else:
            renames[internal] = out_name
        outputs.append(_value_info(helper, out_name, value, b.shape(value), dim_names))
    _rename(b.nodes, renames)
    onnx_graph = helper.make_graph(b.nodes, "kiln_program", inputs, outputs, b.initializers)
    opsets = [helper.make_opsetid("", opset)]
    from .. import __version__  # noqa: PLC0415

    model = helper.make_model(onnx_graph, opset_imports=opsets, producer_name="kiln", producer_version=__version__)
    model.ir_version = helper.find_min_ir_version_for(opsets)
    return model


def _max_opset() -> int:
    import onnx  # noqa: PLC0415

    return onnx.defs.onnx_opset_version()


def _result_value(graph: Graph, signature, result) -> Value:
    if hasattr(result, "output"):
        return graph.outputs[result.output]
    return graph.inputs[result.input]


def _made_by_node(b: ModelBuilder, name: str) -> bool:
    return any(name in node.output for node in b.nodes)


def _rename(nodes: list, renames: dict[str, str]) -> None:
    if not renames:
        return
    for node in nodes:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name in renames:
                    field[i] = renames[name]


def _value_info(helper, name: str, value: Value, shape, dim_names: dict):
    dims: list[int | str | None] = []
    for axis, d in enumerate(shape):
        given = dim_names.get((name, axis))
        if isinstance(d, int) and given is None:
            dims.append(d)
        elif isinstance(d, Sym):
            dims.append(given or str(d))  # a product reads as one: "2*seq", "batch*seq"
        else:
            dims.append(given)  # None: a size ONNX leaves unnamed
    return helper.make_tensor_value_info(name, onnx_dtype(value.type.dtype), dims)


# ----------------------------------------------------------------------------- nodes and regions
def _present(graph: Graph) -> dict[Value, int]:
    """Each value's defining position: -1 for inputs, the node's index otherwise."""
    position = {v: -1 for v in graph.inputs}
    for i, node in enumerate(graph.nodes):
        for v in node.outputs:
            position[v] = i
    return position


def _accepted_regions(b: ModelBuilder, graph: Graph, regions) -> dict[Value, object]:
    """For each value a region writes whole, that region (the outermost: recorded last)."""
    position = _present(graph)
    chosen: dict[Value, object] = {}
    for region in regions:
        rule = COMPOSITES.get(region.name)
        tensors = _tensor_arguments(region)
        if rule is None or any(v is None or v not in position for v in tensors):
            continue
        if any(v not in position for v in region.outputs):
            continue  # a pass replaced a result
        at = max(position[v] for v in region.outputs)
        if any(position[v] >= at for v in tensors) or not rule[0](b, region.arguments):
            continue
        for v in region.outputs:
            chosen[v] = region
    return chosen


def _tensor_arguments(region) -> list:
    from ..ir.graph import Value as IRValue  # noqa: PLC0415

    found = []
    for arg in region.arguments.values():
        items = arg if isinstance(arg, tuple) else (arg,)
        found += [a for a in items if isinstance(a, IRValue)]
    return found


def _needed(graph: Graph, chosen: dict) -> tuple[set, set]:
    """The values the outputs need, and the regions used, walking back through regions whole."""
    producers = graph.producers()
    needed: set = set()
    used: set = set()
    stack = list(graph.outputs)
    # checks (DROPPED) are effects nothing reads: not reached, so not written
    while stack:
        v = stack.pop()
        if v in needed:
            continue
        needed.add(v)
        region = chosen.get(v)
        if region is not None:
            used.add(region)
            stack += _tensor_arguments(region)
            stack += region.outputs
        elif v in producers:
            stack += producers[v].inputs
    return needed, used


def _emit_nodes(b: ModelBuilder, graph: Graph, regions, splats: dict) -> None:
    chosen = _accepted_regions(b, graph, regions)
    needed, used = _needed(graph, chosen)
    position = _present(graph)
    # A region is written as soon as its arguments exist: a node before its last result may read one
    # of its results (CSE shares an LSTM's last step between its outputs and its final state).
    due: dict[int, list] = {}
    for region in (r for r in regions if r in used):  # in the order recorded: the same file every time
        due.setdefault(max((position[v] for v in _tensor_arguments(region)), default=-1), []).append(region)
    _emit_regions(b, due.get(-1, ()))
    for i, node in enumerate(graph.nodes):
        b.loc = node.loc
        if any(v in needed and v not in chosen for v in node.outputs):
            _emit_node(b, graph, node, splats)
        _emit_regions(b, due.get(i, ()))


def _emit_regions(b: ModelBuilder, regions) -> None:
    for region in regions:
        b.loc = region.loc
        names = COMPOSITES[region.name][1](b, region.arguments, lambda key, r=region: b.name(r.arguments[key]))
        for v, name in zip(region.outputs, names, strict=True):
            b.bind(v, name)


def _emit_node(b: ModelBuilder, graph: Graph, node, splats: dict) -> None:
    if node.op == CONSTANT:
        array = np.asarray(graph.constants[node.attrs["name"]])
        if node.output in splats:
            value = b.scalar(splats[node.output], array.dtype)
            b.bind(node.output, b.op("Expand", [value, b.shape_tensor(b.shape(node.output))], hint="splat"))
        else:
            b.bind(node.output, b.const(array, "constant"))
        return
    if node.op == KERNEL:
        raise OnnxExportError(b.context("a fused kernel node; export the traced graph before fusion"))
    if node.op in UNMAPPABLE:
        raise OnnxExportError(b.context(f"the primitive {node.op!r} has no ONNX equivalent: {UNMAPPABLE[node.op]}"))
    rule = RULES.get(node.op)
    if rule is None:
        raise OnnxExportError(b.context(f"no ONNX rule for the primitive {node.op!r}"))
    b.bind(node.output, rule(b, node, *(b.name(v) for v in node.inputs)))


__all__ = ["DEFAULT_OPSET", "build_model", "OnnxExportError", "where"]
