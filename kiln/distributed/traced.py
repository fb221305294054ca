"""``all_reduce`` inside ``kiln.compile``: a graph node that the compiled program runs through the
group's communicator (``kiln/ir/primitives/collectives.py`` says why it is kept and ordered)."""

from __future__ import annotations

import time

from kiln.ir.primitives import PRIMITIVES
from kiln.ir.primitives.collectives import COMMUNICATORS, REDUCE_OPS

from ._check import Call, check_collective
from ._mpi import wait_request


def register_communicator(pg) -> None:
    """Let compiled programs (and the interpreter) reduce over ``pg`` by its group number."""

    def reduce(xp, array, op: str):
        out = xp.array(array, copy=True, order="C")
        check_collective(pg, Call("all_reduce", out.dtype, tuple(out.shape), op))
        deadline = time.monotonic() + pg.timeout.total_seconds()
        wait_request(pg.communicator.allreduce(out, "sum" if op == "avg" else op), deadline, "all_reduce", pg.peers)
        if op == "avg":
            out /= pg.size()
        return out

    COMMUNICATORS[pg.group_id] = reduce


def unregister_all() -> None:
    COMMUNICATORS.clear()


def traced_all_reduce(tensor, op, pg) -> bool:
    """Record ``all_reduce`` of ``tensor`` over ``pg`` into the current trace (it also runs now, as
    every traced op does) and write the result into ``tensor``; False where the op has no node."""
    from kiln.frontend.autograd import no_grad  # noqa: PLC0415
    from kiln.frontend.dispatch import apply  # noqa: PLC0415
    from kiln.frontend.ops.inplace import commit_inplace  # noqa: PLC0415

    if op.value not in REDUCE_OPS:
        return False
    with no_grad():
        result = apply(PRIMITIVES["all_reduce"], tensor, op=op.value, group=pg.group_id)
        commit_inplace(tensor, result, op="all_reduce")
    return True
