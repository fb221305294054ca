"""``kiln.distributed``: processes that train together, with PyTorch's names (``torch.distributed``).

kiln runs on an existing communication engine: MPI through mpi4py for CPU tensors, NCCL through
cupy for CUDA tensors (``pip install 'kiln[distributed]'``). Start a job with the launcher::

    python -m kiln.distributed.run --nproc-per-node 2 train.py --epochs 3

and in ``train.py``::

    import kiln.distributed as dist
    dist.init_process_group("mpi")
    model = kiln.nn.parallel.DistributedDataParallel(model)

Importing this package does not import mpi4py; ``init_process_group`` does.

Faults end the job instead of going unnoticed:

- **Calls that differ across ranks.** Before each collective the ranks compare their calls (the
  operation, the tensor's shape and dtype, the reduction, src/dst) in one all-reduce of a few
  integers; a receive compares the sender's shape and dtype with its own tensor before the data
  moves. A difference raises ``CollectiveMismatchError`` (a ``RuntimeError``) naming the operation
  and what each rank passed -- on every rank for a collective, on the receiver for a message.
  The check is on by default and costs one more small collective per call: on 2 ranks an
  all_reduce of 4 floats took about 2x as long (~380 against ~180 us), one of 1M floats
  0.96-1.13x, within this shared machine's noise (``tests/distributed/workers/check_cost.py``).
  ``KILN_DISTRIBUTED_DEBUG=OFF`` in the launcher's environment turns it off for the process groups
  made afterwards; making a group raises on every rank if the switch differs between ranks.
  PyTorch checks this only when asked to, with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (default
  ``OFF``), at a similar price (gloo, 4 floats: about 2.2-2.6x).
- **A rank that ends early.** Under ``python -m kiln.distributed.run`` a rank killed by a signal,
  exiting non-zero, or exiting 0 before its script ended (``os._exit(0)``) makes the launcher stop
  the others and exit non-zero, naming the rank and how it ended. A rank that waits in a
  collective for a peer that has ended -- even one whose script ended normally -- raises
  ``PeerEndedError`` about 5 seconds later instead of waiting for its timeout (30 minutes).
"""

from ._check import CollectiveMismatchError
from ._mpi import DistributedTimeoutError, PeerEndedError
from .collectives import (
    Work,
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    barrier,
    broadcast,
    gather,
    irecv,
    isend,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
    send,
)
from .process_group import (
    Backend,
    GroupMember,
    ProcessGroup,
    ReduceOp,
    default_pg_timeout,
    destroy_process_group,
    get_backend,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    init_process_group,
    is_available,
    is_initialized,
    is_mpi_available,
    is_nccl_available,
    new_group,
)

__all__ = [
    "Backend",
    "CollectiveMismatchError",
    "DistributedTimeoutError",
    "GroupMember",
    "ProcessGroup",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "barrier",
    "broadcast",
    "default_pg_timeout",
    "destroy_process_group",
    "gather",
    "get_backend",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "irecv",
    "is_available",
    "is_initialized",
    "is_mpi_available",
    "is_nccl_available",
    "isend",
    "new_group",
    "PeerEndedError",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "send",
]
