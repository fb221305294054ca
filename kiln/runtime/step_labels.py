"""What ``kiln.profiler`` shows of a compiled program's step (``executor.CompiledProgram``): its name,
category, bytes moved and allocated, input shapes and the user's line."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from ..ir.graph import CONSTANT, KERNEL, Value
from .loop_call import LoopCall


def _nbytes(value: Value) -> int:
    """The bytes of a value (0 for a symbolic size: the profiler's figures are per program, not per call)."""
    shape = value.type.shape
    if not all(isinstance(d, int) for d in shape):
        return 0
    return value.type.dtype.itemsize * int(np.prod(cast(tuple[int, ...], shape), dtype=np.int64))


def step_label(step: Any) -> tuple[str, str, int, int, tuple, tuple]:
    """What the profiler shows of a step: name, category, bytes read + written, bytes allocated
    per run (outputs outside the arena), input shapes, and the user's line that made it."""
    label = _step_name(step)
    return (*label, (str(step.node.loc),) if step.node.loc is not None else ())


def _step_name(step: Any) -> tuple[str, str, int, int, tuple]:
    from .executor import ExternCall, KernelCall  # noqa: PLC0415 - the executor imports this module

    node = step.node
    shapes = tuple(tuple(v.type.shape) for v in node.inputs)
    moved = sum(map(_nbytes, node.inputs)) + sum(map(_nbytes, node.outputs))
    if isinstance(step, ExternCall):
        allocated = 0 if step.into >= 0 or not step.normalize else _nbytes(node.output)
        return f"extern {node.op}", "extern", moved, allocated, shapes
    if isinstance(step, LoopCall):
        return step.describe(), "loop", moved, sum(map(_nbytes, node.outputs)), shapes
    ops = list(dict.fromkeys(n.op for body in node.bodies for n in body.nodes if n.op != CONSTANT))
    fused = "+".join(ops[:4]) + ("+..." if len(ops) > 4 else "")
    if isinstance(step, KernelCall):
        allocated = sum(_nbytes_of(shape, dtype) for _, _, shape, dtype in step.allocate)
        name = f"kernel {node.attrs['kind']} ({fused})" if node.op == KERNEL else f"compiled {node.op}"
        return name, "kernel", step.work_bytes or moved, allocated, shapes
    allocated = sum(_nbytes(v) for (_, in_arena, into), v in zip(step.outs, node.outputs) if not in_arena and into < 0)
    return f"interpreted kernel ({fused})", "kernel", moved, allocated, shapes


def _nbytes_of(shape: tuple, dtype) -> int:
    return np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))
