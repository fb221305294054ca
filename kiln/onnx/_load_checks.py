"""What ``kiln.onnx.load`` checks of a model from a stranger: where its external data may come from,
and that running it raises clear errors (a ``MemoryError`` never escapes: it names the node instead)."""

from __future__ import annotations

import os

__all__ = ["located", "physical_memory", "refuse_external_data"]


def located(error: Exception, node) -> Exception:
    """``error`` told where it happened; a ``MemoryError`` becomes a ``ValueError`` (it must not escape)."""
    where = f"while running ONNX node {node.name or node.op_type} ({node.op_type})"
    if isinstance(error, MemoryError):
        return ValueError(f"the model asks for more memory than this machine can give ({error or 'MemoryError'}) "
                          f"{where}")  # fmt: skip
    try:
        return type(error)(f"{error}\n  {where}")
    except Exception:  # an error type whose constructor takes other arguments: keep it, with a note
        error.add_note(where)  # type: ignore[attr-defined]  # Python 3.11+, though requires-python says 3.10
        return error


def refuse_external_data(model) -> None:
    """A model given as bytes or a ModelProto has no folder: external data would be read relative to the
    working directory, so it is refused (a model given by its path reads it from the model's folder)."""
    import onnx  # noqa: PLC0415

    graphs = [model.graph, *(f for f in model.functions)]
    while graphs:
        graph = graphs.pop()
        tensors = list(getattr(graph, "initializer", ()))
        for node in graph.node:
            for a in node.attribute:
                tensors += ([a.t] if a.HasField("t") else []) + list(a.tensors)
                graphs += ([a.g] if a.HasField("g") else []) + list(a.graphs)
        for t in tensors:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                location = next((e.value for e in t.external_data if e.key == "location"), "?")
                raise ValueError(f"kiln.onnx.load: the model keeps the data of tensor {t.name[:80]!r} in the external "
                                 f"file {location[:200]!r}, but it was given as bytes or a ModelProto, without a folder "
                                 "to read that file from; give the model's path instead (its external data is read "
                                 "from the model's folder)")  # fmt: skip


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown here: numpy's own MemoryError is the limit
