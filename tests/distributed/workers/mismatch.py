"""Every operation called with arguments that differ across ranks: each must raise
CollectiveMismatchError on every rank (on the receiver for a message), naming the operation, the
rank and what each rank passed -- and leave the group usable. The last rank is the odd one out.
With ``off`` as argument, the group is made with KILN_DISTRIBUTED_DEBUG=OFF and the old silent
behaviour is checked instead (the switch works)."""

from __future__ import annotations

import os
import sys

import numpy as np
from common import start

import kiln
import kiln.distributed as dist
from kiln.distributed import ReduceOp

rank, world, check = start()
odd = rank == world - 1  # this rank passes something else


def raises(what: str, call, *shown: str, op: str = "") -> None:
    """``call()`` must raise CollectiveMismatchError naming the operation (``op``, else the first word
    of ``what``), this rank, and each rank's call (``shown[0]`` for the others, ``shown[1]`` for the
    last rank)."""
    try:
        call()
    except RuntimeError as error:  # CollectiveMismatchError is one, as PyTorch's errors are
        check.true(type(error).__name__ == "CollectiveMismatchError", repr(error))
        text = str(error)
        print(f"rank {rank} {what}: {text.splitlines()[0]}", flush=True)
        check.true(
            text.startswith(op or what.split()[0]) and f"this is rank {rank}" in text, f"{what}: names op and rank"
        )
        for r in range(world):
            line = next((ln for ln in text.splitlines() if ln.startswith(f"  rank {r}: ")), "")
            want = shown[1] if r == world - 1 else shown[0]
            check.true(want in line, f"{what}: rank {r}'s call shown as {want!r}, got {line!r}")
        return
    check.true(False, f"{what}: no error")


def t(shape, dtype=kiln.float32):
    return kiln.zeros(*shape, dtype=dtype)


if sys.argv[1:] == ["off"]:
    os.environ["KILN_DISTRIBUTED_DEBUG"] = "OFF"
    unchecked = dist.new_group(list(range(world)))
    x = kiln.ones(8 if odd else 4)
    dist.all_reduce(x, group=unchecked)  # 4 against 8 elements: no error; the tail is left as it
    if odd:  # was (2 ranks) or garbage (3 ranks): the silent fault the check is there for
        check.close(x[:4], [world] * 4, what="unchecked: the head is reduced")
    check.true(not unchecked.check_calls, "the switch is read when the group is made")
    check.report()
    sys.exit(0)

raises("all_reduce count", lambda: dist.all_reduce(t((8,) if odd else (4,))), "float32[4]", "float32[8]")
big = (300_000,) if odd else (1_000,)
raises("all_reduce 1000 vs 300000", lambda: dist.all_reduce(t(big)), "float32[1000]", "float32[300000]")
raises("all_reduce dtype", lambda: dist.all_reduce(t((3,), kiln.float64 if odd else kiln.float32)),
       "float32[3]", "float64[3]")  # fmt: skip
raises("all_reduce op", lambda: dist.all_reduce(t((3,)), op=ReduceOp.MAX if odd else ReduceOp.SUM), "op sum", "op max")
raises("all_reduce shape", lambda: dist.all_reduce(t((3, 2) if odd else (2, 3))), "float32[2, 3]", "float32[3, 2]")
raises("broadcast count", lambda: dist.broadcast(t((5,) if odd else (4,)), src=0), "float32[4]", "float32[5]")
raises("broadcast src", lambda: dist.broadcast(t((4,)), src=1 if odd else 0), "root 0", "root 1")
raises("reduce dst", lambda: dist.reduce(t((4,)), dst=1 if odd else 0), "root 0", "root 1")
raises("all_gather count", lambda: dist.all_gather([t((3 if odd else 2,)) for _ in range(world)], t((3 if odd else 2,))),
       "float32[2]", "float32[3]")  # fmt: skip
raises("all_gather_into_tensor dtype",
       lambda: (dt := kiln.int64 if odd else kiln.float32, dist.all_gather_into_tensor(t((2 * world,), dt), t((2,), dt))),
       "float32[2]", "int64[2]")  # fmt: skip
raises("reduce_scatter_tensor count", lambda: dist.reduce_scatter_tensor(t((3 if odd else 2,)), t((world * (3 if odd else 2),))),
       "float32[2]", "float32[3]")  # fmt: skip
raises("reduce_scatter dtype", lambda: (dt := kiln.float64 if odd else kiln.float32,
       dist.reduce_scatter(t((2,), dt), [t((2,), dt) for _ in range(world)])), "float32[2]", "float64[2]")  # fmt: skip
raises("gather count", lambda: dist.gather(t((3 if odd else 2,)), [t((2,)) for _ in range(world)] if rank == 0 else None),
       "float32[2]", "float32[3]")  # fmt: skip
raises("scatter count", lambda: dist.scatter(t((3 if odd else 2,)), [t((2,)) for _ in range(world)] if rank == 0 else None),
       "float32[2]", "float32[3]")  # fmt: skip
raises("barrier against all_reduce", lambda: dist.all_reduce(t((2,))) if odd else dist.barrier(), "barrier",
       "all_reduce of float32[2]", op="all_reduce" if odd else "barrier")  # fmt: skip


@kiln.compile(fullgraph=True)
def reduced(x):
    y = x * 2.0
    dist.all_reduce(y)
    return y


raises("all_reduce compiled", lambda: reduced(t((6,) if odd else (4,))), "float32[4]", "float32[6]")

# a message: rank 0 receives 4 float32 from every other rank; the last one sends 4 float64, then 8.
for tag, sent, shown in ((11, t((4,), kiln.float64), "float64[4]"), (12, t((8,)), "float32[8]")):
    if rank != 0:
        dist.send(sent if odd else kiln.full((4,), float(rank)), dst=0, tag=tag)  # the sender cannot know
        continue
    for r in range(1, world - 1):
        dist.recv(box := t((4,)), src=r, tag=tag)
        check.close(box, np.full(4, r), what="the right message from another rank arrives")
    try:
        dist.recv(t((4,)), src=world - 1, tag=tag)
        check.true(False, f"recv of {shown}: no error")
    except RuntimeError as error:  # CollectiveMismatchError is one, as PyTorch's errors are
        check.true(type(error).__name__ == "CollectiveMismatchError", repr(error))
        text = str(error)
        print(f"rank {rank} recv {shown}: {text.splitlines()[0]}", flush=True)
        check.true(text.startswith(f"recv: the message from rank {world - 1} (tag {tag})"), "recv names the sender")
        check.true(f"rank {world - 1} sent: send of {shown}" in text, f"recv shows what was sent: {text}")
        check.true("rank 0 expected: send of float32[4]" in text, f"recv shows what was expected: {text}")

# the switch must agree across ranks: a group made with it on some ranks only raises on every rank
os.environ["KILN_DISTRIBUTED_DEBUG"] = "OFF" if odd else "DETAIL"
try:
    dist.new_group(list(range(world)))
    check.true(False, "a switch that differs across ranks must raise")
except RuntimeError as error:
    check.true("KILN_DISTRIBUTED_DEBUG differs across the ranks" in str(error), str(error))
del os.environ["KILN_DISTRIBUTED_DEBUG"]

# after all that, the group still works
x = kiln.full((3,), float(rank))
dist.all_reduce(x)
check.close(x, np.full(3, sum(range(world))), what="the group works after the mismatches")
dist.barrier()
check.report()
