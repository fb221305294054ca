"""What the cross-rank check costs: all_reduce of 4 and of 1M float32 over a group with the check
and one without (made under KILN_DISTRIBUTED_DEBUG=OFF), interleaved in one process, medians of
several repeats. Not a test -- run it by hand:

    python -m kiln.distributed.run --nproc-per-node 2 tests/distributed/workers/check_cost.py
"""

import os
import statistics
import time

import kiln
import kiln.distributed as dist

kiln.set_num_threads(1)
dist.init_process_group("mpi")
checked = dist.GroupMember.WORLD
os.environ["KILN_DISTRIBUTED_DEBUG"] = "OFF"
unchecked = dist.new_group()
del os.environ["KILN_DISTRIBUTED_DEBUG"]
assert checked.check_calls and not unchecked.check_calls


def per_call(group, tensor, calls: int) -> float:
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(tensor, group=group)
    return (time.perf_counter() - start) / calls


for numel, calls in ((4, 2000), (1_000_000, 40)):
    tensor = kiln.ones(numel)
    times = {"on": [], "off": []}
    for _ in range(7):
        times["on"].append(per_call(checked, tensor, calls))
        times["off"].append(per_call(unchecked, tensor, calls))
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    if dist.get_rank() == 0:
        print(f"all_reduce of {numel} float32: check on {on * 1e6:.1f} us, off {off * 1e6:.1f} us, "
              f"ratio {on / off:.2f} (medians of 7 repeats of {calls} calls)", flush=True)  # fmt: skip
dist.destroy_process_group()
