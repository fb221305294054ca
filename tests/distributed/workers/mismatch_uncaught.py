"""An all_reduce of 4 elements on rank 0 and 8 on rank 1, not caught: the job must fail."""

import kiln
import kiln.distributed as dist

dist.init_process_group("mpi")
dist.all_reduce(kiln.ones(8 if dist.get_rank() == 1 else 4))
print(f"rank {dist.get_rank()} should never get here", flush=True)
