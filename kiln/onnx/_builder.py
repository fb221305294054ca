"""The ONNX graph under construction: nodes, initializers, fresh names, and sizes known only at run time.

Rules (``_primitives``, ``_composites``) call ``ModelBuilder.op`` the way kiln code calls ops:
``b.op("Add", [x, y])`` appends a node and returns its output's name. Shapes are read through
``shape(value)``, which gives the symbolic shape when the model has a dynamic axis: each entry is
an int, a ``Sym`` (a named size bound by a graph input) or ``None`` (a size that changes with the
dynamic axes but is no symbol, such as ``batch * 12`` after a flatten).
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, SourceLocation, Value
from ..ir.types import Sym, SymProduct

#: ONNX's Slice reads an end beyond the dimension as "to the end".
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


class OnnxExportError(ValueError):
    """A program that cannot be written as ONNX: the message names the op and the user's line."""


def onnx_dtype(dtype) -> int:
    """The ONNX element type of a kiln dtype."""
    from onnx import helper  # noqa: PLC0415

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype.np))


def where(loc: SourceLocation | None) -> str:
    return f" (made at {loc})" if loc is not None else ""


class ModelBuilder:
    """Collects the nodes and initializers of one ONNX graph."""

    def __init__(self, graph: Graph, opset: int, shapes: dict | None = None, attrs: dict | None = None) -> None:
        from onnx import helper  # noqa: PLC0415 - optional dependency

        self.helper = helper
        self.graph = graph
        self.opset = opset
        self.nodes: list = []
        self.initializers: list = []
        self.names: dict[Value, str] = {}
        self._shapes = shapes or {}
        self._attrs = attrs or {}
        self._used: set[str] = set()
        self._ints: dict[tuple, str] = {}
        self._symbols: dict[Sym, tuple[str, int]] = {}  # symbol -> (graph input name, axis) that binds it
        self._dim_tensors: dict[Sym, str] = {}
        self.loc: SourceLocation | None = None  # of the node being written (error messages)

    # ------------------------------------------------------------------ names
    def fresh(self, hint: str) -> str:
        name, k = hint, 0
        while name in self._used:
            k += 1
            name = f"{hint}_{k}"
        self._used.add(name)
        return name

    def name(self, value: Value) -> str:
        return self.names[value]

    def reserve(self, names) -> None:
        """Names that ``fresh`` must not give (the graph's output names)."""
        self._used.update(names)

    def bind(self, value: Value, name: str) -> None:
        self.names[value] = name
        self._used.add(name)

    def bind_symbols(self, value: Value, name: str) -> None:
        """Graph input ``name`` (holding ``value``) gives each symbol in its shape a size."""
        for axis, d in enumerate(self.shape(value)):
            if isinstance(d, Sym) and d not in self._symbols:
                self._symbols[d] = (name, axis)

    # ------------------------------------------------------------------ what rules read
    def shape(self, value: Value) -> tuple:
        return self._shapes.get(value, value.type.shape)

    def attrs(self, node: Node) -> dict:
        return self._attrs.get(node, node.attrs)

    def is_static(self, value: Value) -> bool:
        return all(isinstance(d, int) for d in self.shape(value))

    # ------------------------------------------------------------------ writing
    def op(self, op_type: str, inputs, outputs: int = 1, hint: str | None = None, **attrs):
        """Append ``op_type(*inputs, **attrs)``; its output name (a list when ``outputs > 1``).
        An input ``""`` is an omitted optional input."""
        names = [self.fresh(hint or op_type.lower()) for _ in range(outputs)]
        kept = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(self.helper.make_node(op_type, list(inputs), names, name=self.fresh("n_" + op_type), **kept))
        return names[0] if outputs == 1 else names

    def const(self, array, hint: str = "const") -> str:
        """An initializer holding ``array``."""
        from onnx import numpy_helper  # noqa: PLC0415

        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.array(array, order="C"), name))  # keeps 0-d
        return name

    def ints(self, values) -> str:
        """A 1-D int64 initializer (shared between nodes that use the same values)."""
        values = tuple(values)
        if not all(isinstance(v, int | np.integer) for v in values):
            raise OnnxExportError(self.context(f"sizes {[str(v) for v in values]} where this op's ONNX form needs "
                                               "static ones (a dynamic size there is not supported yet)"))  # fmt: skip
        key = tuple(int(v) for v in values)
        if key not in self._ints:
            self._ints[key] = self.const(np.array(key, dtype=np.int64), "ints")
        return self._ints[key]

    def scalar(self, value, dtype) -> str:
        return self.const(np.array(value, dtype=dtype), "scalar")

    def dim(self, d) -> str:
        """A 1-element int64 tensor holding the size ``d`` at run time: an int, a symbol (read from the
        graph input that binds it) or a product of symbols (``2*seq``, ``batch*seq``: their sizes
        multiplied at run time)."""
        if isinstance(d, int):
            return self.ints([d])
        if not isinstance(d, Sym):
            raise OnnxExportError(self.context("a size that changes with the dynamic axes but is no named axis"))
        if d not in self._dim_tensors:
            self._dim_tensors[d] = self._product(d) if isinstance(d, SymProduct) else self._symbol_size(d)
        return self._dim_tensors[d]

    def _symbol_size(self, d: Sym) -> str:
        if d not in self._symbols:
            bound = ", ".join(f"{s} (input {name!r} axis {axis})" for s, (name, axis) in self._symbols.items())
            raise OnnxExportError(self.context(f"the size {d} is no dimension of any graph input (the inputs' "
                                               f"dynamic sizes: {bound or 'none'}), so ONNX cannot compute it"))  # fmt: skip
        source, axis = self._symbols[d]
        return self.op("Shape", [source], hint=f"size_{d.name}", start=axis, end=axis + 1)

    def _product(self, d: SymProduct) -> str:
        if d in self._symbols:  # an input's own dimension is this product: read it there
            return self._symbol_size(d)
        size = self.dim(d.factors[0])
        for factor in d.factors[1:]:
            size = self.op("Mul", [size, self.dim(factor)], hint=f"size_{d.name}")
        return size if d.scale == 1 else self.op("Mul", [size, self.ints([d.scale])], hint=f"size_{d.name}")

    def shape_tensor(self, dims) -> str:
        """A 1-D int64 tensor of the sizes ``dims`` (ints and symbols)."""
        if all(isinstance(d, int) for d in dims):
            return self.ints(dims)
        return self.op("Concat", [self.dim(d) for d in dims], hint="shape", axis=0)

    def context(self, what: str) -> str:
        return f"kiln.onnx: {what}{where(self.loc)}"
