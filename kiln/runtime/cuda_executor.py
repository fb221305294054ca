"""Run a program lowered by the CUDA backend: its kernels launched on device arrays.

The CUDA twin of kiln/runtime/executor.py, with the same steps and the same promises: compiled
kernels (``numba.cuda.jit`` functions, launched on the current stream), extern nodes by their
eager kernels over the device's array namespace (matmul is cupy's, that is cuBLAS), declined
kernels interpreted; intermediates at their planned offsets in one device arena per thread (the
memory plan, applied to device memory); outputs from the device allocator (cupy's pool, kiln's
caching allocator on a GPU); outputs written back into inputs where the driver chose so.

On a GPU the arrays are cupy arrays and nothing waits for the device: numba launches on the
stream cupy is using, and ``numba.config.CUDA_ARRAY_INTERFACE_SYNC`` is off because the arrays a
kernel receives were made on that same stream. Under Numba's CUDA simulator the arrays are numpy
arrays and a launch runs to its end.

A kernel parameter is the flat view of an operand from its element [0, ..., 0] over the elements
its strides reach (kiln/codegen/cuda/kernels.py).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..ir.analysis import Liveness, constant_views
from ..ir.graph import CONSTANT, KERNEL, Graph, Node, Value
from ..ir.interpreter import kernel_runner, node_error
from ..ir.primitives import PRIMITIVES
from .executor import same_layout


def flat(xp: Any, array: Any) -> Any:
    """The one-dimensional view of ``array``'s memory from element [0, ..., 0] over every element
    its (non-negative) strides reach."""
    if array.flags.c_contiguous:
        return array.reshape(-1)
    if array.size == 0:
        return array.reshape(-1)
    itemsize = array.itemsize
    span = 1 + sum((n - 1) * (s // itemsize) for n, s in zip(array.shape, array.strides, strict=True))
    return xp.lib.stride_tricks.as_strided(array, (span,), (itemsize,))


class _Launch:
    """One compiled kernel node: its CUDA kernels, the operands each takes, their grids."""

    def __init__(self, node: Node, position: int, dead: tuple, slots: Mapping[Value, int], launches, config,
                 into: Mapping[Value, int]) -> None:  # fmt: skip
        self.node, self.position, self.dead = node, position, dead
        values = list(node.inputs) + list(node.outputs)
        self.operands = [slots[v] for v in values]
        self.allocate = [(slots[v], v.type.shape, v.type.dtype.np, into.get(v, -1)) for v in node.outputs]
        self.calls = [(function, launch.operands, _geometry(launch.grid, config)) for function, launch in launches]

    def run(self, env: list, program: CudaProgram) -> None:
        xp = program.xp
        for slot, shape, dtype, into in self.allocate:
            if env[slot] is None:  # not in the arena
                env[slot] = xp.empty(shape, dtype) if into < 0 else env[into]
        arrays = [flat(xp, env[slot]) for slot in self.operands]
        for function, operands, geometry in self.calls:
            if geometry is None:
                continue
            grid, block = geometry
            program.launch(function[grid, block] if program.simulated else function[grid, block, program.stream()],
                           [arrays[k] for k in operands])  # fmt: skip
        for slot in self.dead:
            env[slot] = None


def _geometry(grid: tuple, config) -> tuple | None:
    """(blocks, threads per block) of a launch; None when it has nothing to do."""
    kind, size = grid[0], grid[1]
    if size == 0:
        return None
    if kind == "rows":
        return size, config.block
    blocks = min(-(-size // config.threads), config.max_blocks)
    return ((blocks, grid[2]) if kind == "members" else blocks), config.threads


class _Extern:
    """A primitive's eager kernel over the device's namespace; results in C order."""

    def __init__(self, node: Node, position: int, dead: tuple, slots: Mapping[Value, int], planned: bool) -> None:
        self.node, self.position, self.dead = node, position, dead
        prim = PRIMITIVES[node.op]
        self.eager, self.eager_into, self.view = prim.eager, prim.eager_into, prim.is_view
        self.args = tuple(slots[v] for v in node.inputs)
        self.attrs = dict(node.attrs)
        self.out = slots[node.output]
        self.dtype = node.output.type.dtype.np
        self.planned = planned and prim.eager_into is not None

    def run(self, env: list, program: CudaProgram) -> None:
        xp = program.xp
        args = [env[slot] for slot in self.args]
        if self.planned:
            self.eager_into(xp, *args, out=env[self.out], **self.attrs)  # type: ignore[misc]  # set when planned
        else:
            result = self.eager(xp, *args, **self.attrs)
            if not hasattr(result, "flags"):
                result = xp.asarray(result, dtype=self.dtype)
            elif not self.view and (not result.flags.c_contiguous or any(result is a for a in args)):
                result = result.copy(order="C")
            elif env[self.out] is not None:  # planned without out=: copied into its arena place
                env[self.out][...] = result
                result = env[self.out]
            env[self.out] = result
        for slot in self.dead:
            env[slot] = None


class _Interpreted:
    """A kernel the code generator declined: its body on the interpreter."""

    def __init__(self, node: Node, position: int, dead: tuple, slots: Mapping[Value, int],
                 into: Mapping[Value, int]) -> None:  # fmt: skip
        self.node, self.position, self.dead = node, position, dead
        self.runner = kernel_runner(node)
        self.args = tuple(slots[v] for v in node.inputs)
        self.outs = tuple((slots[v], into.get(v, -1)) for v in node.outputs)

    def run(self, env: list, program: CudaProgram) -> None:
        xp = program.xp
        results = self.runner(xp, *[env[slot] for slot in self.args])
        for (slot, into), array in zip(self.outs, results, strict=True):
            target = env[into] if into >= 0 else env[slot]
            if target is not None:  # in the arena, or written back into an input
                target[...] = array
                env[slot] = target
            else:
                env[slot] = xp.ascontiguousarray(array)
        for slot in self.dead:
            env[slot] = None


class CudaProgram:
    """A lowered graph with its loaded CUDA kernels: ``program(list of arrays) -> list of arrays``.

    ``launches``: kernel node -> its ``(function, Launch)`` list (other kernel nodes run
    interpreted); ``config``: the launch geometry; ``simulated``: numpy arrays under the simulator.
    """

    fresh_outputs: frozenset[int] = frozenset()  # outputs are not tracked as fresh on the GPU yet

    def __init__(self, graph: Graph, launches: Mapping[Node, list], plan: Any, layouts: Mapping[Value, tuple],
                 write_backs: Mapping[int, int], config: Any, simulated: bool) -> None:  # fmt: skip
        self.graph, self.plan, self.simulated = graph, plan, simulated
        self.write_backs = dict(write_backs)
        if simulated:
            self.xp: Any = np
        else:
            import cupy  # noqa: PLC0415 - on a GPU only
            from numba import config as numba_config  # noqa: PLC0415

            numba_config.CUDA_ARRAY_INTERFACE_SYNC = False  # type: ignore[attr-defined]  # see the module docstring
            self.xp = cupy
        slots = {v: i for i, v in enumerate(graph.values())}
        self._slots = slots
        self._inputs = tuple(slots[v] for v in graph.inputs)
        self._checks = tuple((v.type.shape, v.type.dtype.np, layouts[v]) for v in graph.inputs)
        self._outputs = tuple(slots[v] for v in graph.outputs)
        self._copy = tuple(i for i, v in enumerate(graph.outputs) if v in constant_views(graph))
        self._constants = [(slots[n.output], graph.constants[n.attrs["name"]]) for n in graph.nodes if n.op == CONSTANT]
        into = {graph.outputs[o]: slots[graph.inputs[i]] for o, i in write_backs.items()}
        planned = plan.offsets if plan is not None else {}
        dead_after = [tuple(slots[v] for v in dead) for dead in Liveness(graph).dead_after(keep=planned)]
        steps: list[Any] = []
        for position, (node, dead) in enumerate(zip(graph.nodes, dead_after, strict=True)):
            if node.op == CONSTANT:
                continue
            if node in launches:
                steps.append(_Launch(node, position, dead, slots, launches[node], config, into))
            elif node.op == KERNEL:
                steps.append(_Interpreted(node, position, dead, slots, into))
            else:
                steps.append(_Extern(node, position, dead, slots, node.output in planned))
        self._steps = tuple(steps)
        self._local = threading.local()
        self.kernel_calls = tuple(step for step in steps if isinstance(step, _Launch))

    def stream(self) -> Any:
        """The numba view of the stream cupy is using (kernels queue behind cupy's work), made once
        per stream."""
        ptr = self.xp.cuda.get_current_stream().ptr
        found = _STREAMS.get(ptr)
        if found is None:
            from numba import cuda  # noqa: PLC0415

            found = _STREAMS[ptr] = cuda.external_stream(ptr)
        return found

    def launch(self, configured: Any, arrays: list) -> None:
        if self.simulated:
            with warnings.catch_warnings():  # numpy scalars warn where the device wraps silently
                warnings.simplefilter("ignore", RuntimeWarning)
                configured(*arrays)
        else:
            configured(*arrays)

    def _template(self) -> list:
        template = getattr(self._local, "template", None)
        if template is None:
            xp = self.xp
            template = [None] * len(self._slots)
            for slot, array in self._constants:
                template[slot] = xp.asarray(array)
            plan = self.plan
            if plan is not None and plan.offsets:
                arena = xp.empty(plan.arena_bytes, np.uint8)
                for value, offset in plan.offsets.items():
                    t = value.type
                    nbytes = t.dtype.itemsize * int(np.prod(t.shape, dtype=np.int64))
                    template[self._slots[value]] = arena[offset : offset + nbytes].view(t.dtype.np).reshape(t.shape)
            self._local.template = template
        return template

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        inputs = self._check(inputs)
        env = list(self._template())
        for slot, array in zip(self._inputs, inputs, strict=True):
            env[slot] = array
        index = 0
        with np.errstate(all="ignore"):
            try:
                for index, step in enumerate(self._steps):  # noqa: B007 - read by the error handler
                    step.run(env, self)
            except Exception as error:
                step = self._steps[index]
                raise node_error(step.node, step.position, error) from error
        outputs = [env[slot] for slot in self._outputs]
        for i in self._copy:
            outputs[i] = outputs[i].copy()
        return outputs

    __call__ = run
    run_checked_inputs = run  # the layout check also moves inputs into the kernels' layouts: always run it

    def _check(self, inputs: Sequence[Any]) -> list[Any]:
        if len(inputs) != len(self._checks):
            raise TypeError(f"the graph expects {len(self._checks)} inputs, got {len(inputs)}")
        out = list(inputs)
        for i, (array, (shape, dtype, strides)) in enumerate(zip(inputs, self._checks, strict=True)):
            if array.shape != shape or array.dtype != dtype:
                raise TypeError(f"input {i} of the graph: expected {dtype} of shape {shape}, "
                                f"got {array.dtype} of shape {array.shape}")  # fmt: skip
            if array.size > 1 and not same_layout(shape, array.strides, strides):
                out[i] = _into_layout(self.xp, array, strides)
        return out


_STREAMS: dict[int, Any] = {}  # cupy stream pointer -> numba's external stream over it


def _into_layout(xp: Any, array: Any, strides: tuple) -> Any:
    """A copy of ``array`` laid out with ``strides`` (dimensions ordered by stride)."""
    order = sorted(range(array.ndim), key=lambda d: -abs(strides[d]))
    copy = xp.ascontiguousarray(array.transpose(order)).transpose(np.argsort(order).tolist())
    if not same_layout(copy.shape, copy.strides, strides):
        raise RuntimeError(f"cannot lay out an input with strides {strides}")
    return copy
