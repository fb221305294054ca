"""Rank 1 raises while rank 0 waits for it in a collective: the job must end, not hang."""

import kiln
import kiln.distributed as dist

dist.init_process_group("mpi")
if dist.get_rank() == 1:
    raise ValueError("boom on rank 1")
dist.all_reduce(kiln.ones(3))  # rank 1 never comes: only the abort ends this wait
print("rank 0 should never get here", flush=True)
