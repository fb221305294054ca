"""``kiln.distributed``: processes that train together, with PyTorch's names (``torch.distributed``).

kiln runs on an existing communication engine: MPI through mpi4py for CPU tensors, NCCL through
cupy for CUDA tensors (``pip install 'kiln[distributed]'``). Start a job with the launcher::

    python -m kiln.distributed.run --nproc-per-node 2 train.py --epochs 3

and in ``train.py``::

    import kiln.distributed as dist
    dist.init_process_group("mpi")
    model = kiln.nn.parallel.DistributedDataParallel(model)

Importing this package does not import mpi4py; ``init_process_group`` does.
"""

from ._mpi import DistributedTimeoutError
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
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "send",
]
