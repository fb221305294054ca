"""Run a graph with the primitives' eager kernels: the reference executor and the JIT's fallback.

``interpret(graph, inputs)`` checks the inputs against the graph's input types, runs the nodes
in order and returns the outputs. The work that depends only on the graph (kernels looked up,
values numbered into slots of a list, the point after which each value is dead) is done once per
graph by ``Program`` and cached, so a graph called many times pays only for its kernels and a
list index per argument.

Each value is dropped right after its last use, so a large intermediate does not outlive the node
that reads it last. Outputs may be the caller's own input arrays (a graph that returns an input)
but never the graph's constant arrays, which are copied on the way out so that a caller writing
into an output cannot change the graph. Floating-point exceptions are values (inf, nan), not
warnings, as in eager execution.

A graph with symbolic dimensions (``kiln.ir.types.Sym``) runs for inputs of any size there: each
symbol binds to the size of the first input dimension it names, every other dimension naming it
must have that size, and attributes naming it (a reshape's shape) read the bound size.

Kernel nodes (made by fusion) run by interpreting their bodies, each prepared once as a
``Program`` of its own; a horizontal kernel runs each member on its slice of the node's inputs.
A kernel's outputs are always fresh arrays (as compiled kernels write them), never views of its
inputs. Loop nodes run their body's program ``trips`` times (``kiln.ir.loops.run_loop``), its
outputs fresh arrays too.

>>> from kiln.ir.graph import GraphBuilder
>>> from kiln.ir.types import TensorType
>>> from kiln.ir.dtypes import float32
>>> b = GraphBuilder()
>>> x = b.input(TensorType((3,), float32))
>>> y = b.node("mul", [x, x])
>>> interpret(b.build([y]), [np.array([1.0, 2.0, 3.0], np.float32)])
[array([1., 4., 9.], dtype=float32)]
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from .analysis import Liveness
from .graph import CONSTANT, KERNEL, LOOP, Graph, Node, Value, body_inputs_outputs
from .loops import loop_of, run_loop
from .primitives import PRIMITIVES
from .types import Sym, dim_size


class Program:
    """A graph prepared for repeated runs. Holds no reference to the graph itself, so that the
    cache of programs (keyed weakly by graph) lets graphs go."""

    __slots__ = ("_input_slots", "_input_types", "_steps", "_nodes", "_output_slots", "_copy_outputs",
                 "_template", "_constant_slots", "_on_device", "_symbols", "_bound_steps")  # fmt: skip

    def __init__(self, graph: Graph, *, fresh_outputs: bool = False) -> None:
        # fresh_outputs: outputs that may share memory with an input are copied too (kernel bodies).
        slots: dict[Value, int] = {v: i for i, v in enumerate(graph.values())}
        self._input_slots = tuple(slots[v] for v in graph.inputs)
        self._input_types = tuple((v.type.shape, v.type.dtype.np, v.type) for v in graph.inputs)
        # (input, axis, symbol) for every symbolic input dimension; None for a graph of static shapes
        self._symbols = tuple((i, axis, d) for i, v in enumerate(graph.inputs) for axis, d in enumerate(v.type.shape)
                              if isinstance(d, Sym)) or None  # fmt: skip
        self._bound_steps: dict[tuple[int, ...], tuple] | None = None  # steps with symbols in attrs, by sizes
        self._output_slots = tuple(slots[v] for v in graph.outputs)
        self._template: list[Any] = [None] * len(slots)
        self._constant_slots: list[tuple[int, np.ndarray]] = []
        self._on_device: dict[int, tuple[Any, list[Any]]] = {}  # id(xp) -> (xp, template with its constants)
        for node in graph.nodes:
            if node.op == CONSTANT:
                slot = slots[node.output]
                self._template[slot] = graph.constants[node.attrs["name"]]
                self._constant_slots.append((slot, self._template[slot]))
        # Steps are the non-constant nodes; each remembers its index in the graph for error messages.
        self._nodes = tuple((i, node) for i, node in enumerate(graph.nodes) if node.op != CONSTANT)
        live = Liveness(graph)
        dead = live.dead_after()
        slot_of = slots.__getitem__
        self._steps = tuple(_step(position, node, slots, tuple(map(slot_of, dead[i])))
                            for position, (i, node) in enumerate(self._nodes))  # fmt: skip
        aliases = live.aliases(inputs=fresh_outputs)
        self._copy_outputs = tuple(i for i, v in enumerate(graph.outputs) if v in aliases)
        if any(_has_symbol(step[2]) for step in self._steps):
            self._bound_steps = {}

    def run(self, inputs: Sequence[Any], xp: Any = np) -> list[Any]:
        """The graph's outputs for ``inputs`` (arrays of ``xp``), as a list."""
        self._check(inputs)
        return self._execute(inputs, xp)

    def _execute(self, inputs: Sequence[Any], xp: Any) -> list[Any]:
        steps = self._steps if self._bound_steps is None else self._steps_for(inputs)
        env = self._template.copy() if xp is np else self._device_template(xp).copy()
        for slot, array in zip(self._input_slots, inputs):
            env[slot] = array
        ndarray, read = xp.ndarray, env.__getitem__
        step: tuple = ()
        with np.errstate(all="ignore"):  # inf and nan are values in kiln, not warnings
            try:
                for step in steps:
                    eager, args, attrs, out, frees, dtype, _ = step
                    result = eager(xp, *map(read, args), **attrs)
                    if out.__class__ is tuple:  # a kernel node: a list of fresh arrays
                        for slot, array in zip(out, result):
                            env[slot] = array
                    elif result.__class__ is not ndarray:  # numpy gives scalars for 0-d results
                        env[out] = xp.asarray(result, dtype=dtype)
                    else:
                        env[out] = result
                    for slot in frees:
                        env[slot] = None
            except Exception as error:
                index, node = self._nodes[step[6]]
                raise node_error(node, index, error) from error
        outputs = [env[slot] for slot in self._output_slots]
        for i in self._copy_outputs:
            outputs[i] = outputs[i].copy()
        return outputs

    __call__ = run

    def _check(self, inputs: Sequence[Any]) -> None:
        if len(inputs) != len(self._input_types):
            raise TypeError(f"the graph expects {len(self._input_types)} inputs, got {len(inputs)}")
        if self._symbols is not None:
            self._check_symbolic(inputs)
            return
        for i, (array, (shape, dtype, expected)) in enumerate(zip(inputs, self._input_types)):
            given_dtype = getattr(array, "dtype", None)
            if getattr(array, "shape", None) != shape or (given_dtype is not dtype and given_dtype != dtype):
                given = (f"{given_dtype} of shape {tuple(array.shape)}" if given_dtype is not None
                         else f"a {type(array).__name__}")  # fmt: skip
                raise TypeError(
                    f"input {i} of the graph: expected {expected.dtype.name} of shape {shape} ({expected}), got {given}"
                )

    def _check_symbolic(self, inputs: Sequence[Any]) -> None:
        """The input check of a graph with symbolic dimensions: each symbol takes one size."""
        bound: dict[Sym, tuple[int, int, int]] = {}  # symbol -> (size, input, axis) that bound it
        for i, (array, (shape, dtype, expected)) in enumerate(zip(inputs, self._input_types)):
            given_dtype = getattr(array, "dtype", None)
            given_shape = getattr(array, "shape", None)
            if given_dtype is None or given_shape is None:
                raise TypeError(f"input {i} of the graph: expected {expected}, got a {type(array).__name__}")
            sizes_fit = len(given_shape) == len(shape) and all(
                isinstance(d, Sym) or d == n for d, n in zip(shape, given_shape)
            )
            if not sizes_fit or (given_dtype is not dtype and given_dtype != dtype):
                raise TypeError(
                    f"input {i} of the graph: expected {expected.dtype.name} of shape {_shape_text(shape)} "
                    f"({expected}), got {given_dtype} of shape {tuple(given_shape)}"
                )
            for axis, (d, n) in enumerate(zip(shape, given_shape)):
                if not isinstance(d, Sym):
                    continue
                first = bound.setdefault(d, (int(n), i, axis))
                if first[0] != n:
                    raise TypeError(
                        f"input {i} of the graph: dimension {axis} is the symbolic size {d}, which input {first[1]} "
                        f"(dimension {first[2]}) bound to {first[0]}, but it is {n} here ({expected} given shape "
                        f"{tuple(given_shape)})"
                    )

    def _steps_for(self, inputs: Sequence[Any]) -> tuple:
        """The steps with every symbol in their attributes replaced by its size in ``inputs``."""
        assert self._bound_steps is not None
        sizes = {d: int(inputs[i].shape[axis]) for i, axis, d in self._symbols or ()}
        key = tuple(sizes.values())
        steps = self._bound_steps.get(key)
        if steps is None:
            steps = tuple(step[:2] + ({k: _bind(v, sizes) for k, v in step[2].items()},) + step[3:]
                          for step in self._steps)  # fmt: skip
            self._bound_steps[key] = steps
        return steps

    def _device_template(self, xp: Any) -> list[Any]:
        # Constants live in numpy arrays; another namespace gets them copied to its device once
        # (keyed by identity: a namespace need not be hashable).
        entry = self._on_device.get(id(xp))
        if entry is None or entry[0] is not xp:
            template = self._template.copy()
            for slot, array in self._constant_slots:
                template[slot] = xp.asarray(array)
            entry = self._on_device[id(xp)] = (xp, template)
        return entry[1]


_PROGRAMS: weakref.WeakKeyDictionary[Graph, Program] = weakref.WeakKeyDictionary()


def prepare(graph: Graph) -> Program:
    """The ``Program`` of ``graph``, built on first use and cached while the graph lives."""
    program = _PROGRAMS.get(graph)
    if program is None:
        program = _PROGRAMS[graph] = Program(graph)
    return program


def interpret(graph: Graph, inputs: Sequence[Any], xp: Any = np) -> list[Any]:
    """Run ``graph`` on ``inputs`` (arrays of the namespace ``xp``) and return its outputs."""
    return prepare(graph).run(inputs, xp)


# ----------------------------------------------------------------------------- preparation
def _has_symbol(value: Any) -> bool:
    if isinstance(value, dict):
        return any(map(_has_symbol, value.values()))
    if isinstance(value, tuple):
        return any(map(_has_symbol, value))
    return isinstance(value, Sym)


def _bind(value: Any, sizes: dict[Sym, int]) -> Any:
    """An attribute value with each symbol replaced by its size."""
    if isinstance(value, Sym):
        try:
            return dim_size(value, sizes)
        except KeyError:  # the verifier rejects such a graph; say so when running one anyway
            raise ValueError(
                f"symbolic dimension {value} is not the size of any dimension of the graph's inputs"
            ) from None
    if isinstance(value, tuple):
        return tuple(_bind(v, sizes) for v in value)
    return value


def _shape_text(shape: tuple) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _step(position: int, node: Node, slots: dict[Value, int], frees: tuple[int, ...]) -> tuple:
    args = tuple(slots[v] for v in node.inputs)
    if node.op in (KERNEL, LOOP):
        outs = tuple(slots[v] for v in node.outputs)
        runner = kernel_runner(node) if node.op == KERNEL else loop_runner(node)
        return (runner, args, {}, outs, frees, None, position)
    assert len(node.outputs) == 1, f"{node.op} has {len(node.outputs)} outputs; the interpreter expects one"
    out = node.outputs[0]
    eager = PRIMITIVES[node.op].eager
    return (eager, args, dict(node.attrs), slots[out], frees, out.type.dtype.np, position)


def kernel_runner(node: Node):
    """The step function of a kernel node, ``runner(xp, *arrays) -> list of outputs``: its body's
    program, or each member's on its inputs (bodies prepared once)."""
    members = [(Program(body, fresh_outputs=True), len(inputs)) for body, inputs, _ in body_inputs_outputs(node)]
    if len(members) == 1:
        execute = members[0][0]._execute
        return lambda xp, *arrays: execute(arrays, xp)

    def run_members(xp: Any, *arrays: Any) -> list[Any]:
        results: list[Any] = []
        start = 0
        for program, count in members:
            results += program._execute(arrays[start : start + count], xp)
            start += count
        return results

    return run_members


def loop_runner(node: Node):
    """The step function of a loop node, ``runner(xp, *arrays) -> list of outputs``: its body's
    program (prepared once, outputs always fresh arrays) run ``trips`` times (``kiln.ir.loops``)."""
    loop = loop_of(node)
    execute = Program(loop.body, fresh_outputs=True)._execute

    def run(xp: Any, *arrays: Any) -> list[Any]:
        return run_loop(loop, lambda inputs: execute(inputs, xp), arrays)

    return run


# ----------------------------------------------------------------------------- errors
def node_error(node: Node, index: int, error: Exception) -> Exception:
    """``error`` with the node that raised it and the user's line that made the node (raise it
    ``from error``); the same type where its constructor takes one message, else RuntimeError.
    Every executor of graphs raises this way."""
    inputs = ", ".join(f"%{v.id}" for v in node.inputs)
    outputs = ", ".join(f"%{v.id}" for v in node.outputs)
    where = f" at {node.loc}" if node.loc is not None else " (no source location)"
    message = f"{error}\n  while running node {index}: {outputs} = {node.op}({inputs}){where}"
    try:
        wrapped = type(error)(message)
    except Exception:  # noqa: BLE001 - an exception type whose constructor takes other arguments
        return RuntimeError(f"{type(error).__name__}: {message}")
    if str(wrapped) != message:  # e.g. KeyError quotes its argument; keep the text readable
        return RuntimeError(f"{type(error).__name__}: {message}")
    return wrapped
