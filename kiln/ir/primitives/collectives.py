"""Collectives as primitives: ``all_reduce`` inside a compiled program.

A compiled training step of a data-parallel model reduces its gradients over the processes of a
job. The node ``all_reduce[op=..., group=g](x)`` returns the reduction of ``x`` over the processes
of group ``g``; its eager kernel (run eagerly, by the interpreter and by the executor as an
extern) calls the communicator that ``kiln.distributed`` registered for ``g`` at run time (the IR
knows nothing of MPI or NCCL; group numbers are given in the same order on every process).

The node has an *effect*: the other processes wait for this one to take part, so passes never
drop it when its result looks unused, never merge two of them (CSE), and never fold one whose
input is a constant. Its place relative to the optimizer's update is a data dependence (the
update reads the reduced gradient), and every process runs the same program, so the collectives
meet in the same order everywhere. Group ``-1`` is the group of this process alone: the
reduction of one tensor is itself (the registry's samples use it).
"""

from __future__ import annotations

from collections.abc import Callable

from ..types import TensorType
from . import NOT_DIFFERENTIABLE, Kind, Primitive, Sample, register

#: group number -> ``reduce(xp, array, op) -> array`` (the reduced values in a new array); filled by
#: kiln.distributed when it makes a process group.
COMMUNICATORS: dict[int, Callable] = {}

REDUCE_OPS = ("sum", "avg", "product", "max", "min")
SELF_GROUP = -1


def _all_reduce_infer(x: TensorType, *, op: str, group: int) -> TensorType:
    if op not in REDUCE_OPS:
        raise ValueError(f"all_reduce: expected op in {REDUCE_OPS}, got {op!r}")
    if op == "avg" and not x.dtype.is_floating_point:
        raise TypeError(f"all_reduce: op 'avg' needs a floating-point tensor, got {x.dtype.name}")
    if not isinstance(group, int):
        raise TypeError(f"all_reduce: expected the group as an int, got {group!r}")
    return x


def _all_reduce_eager(xp, x, *, op: str, group: int):
    if group == SELF_GROUP:
        return xp.array(x, copy=True, order="C")
    reduce = COMMUNICATORS.get(group)
    if reduce is None:
        raise RuntimeError(
            f"all_reduce: process group {group} does not exist in this process (call "
            "kiln.distributed.init_process_group, and new_group in the same order, before running the program)"
        )
    return reduce(xp, x, op)


def _all_reduce_samples(rng):
    return [
        Sample((rng.standard_normal((3, 4)),), {"op": "sum", "group": SELF_GROUP}, gradcheck=False),
        Sample((rng.standard_normal((5,)),), {"op": "avg", "group": SELF_GROUP}, gradcheck=False),
        Sample((rng.standard_normal(()),), {"op": "max", "group": SELF_GROUP}, gradcheck=False),
    ]


all_reduce = register(Primitive(
    "all_reduce", Kind.COLLECTIVE, _all_reduce_infer, _all_reduce_eager, NOT_DIFFERENTIABLE,
    reference=lambda torch, x, op, group: x.clone(),  # a group of one process: the reduction is the tensor
    samples=_all_reduce_samples, effect=True,
    doc="The reduction (op: sum, avg, product, max, min) of x over the processes of process group `group`.",
))  # fmt: skip
