"""The last rank ends in the way ``sys.argv[1]`` names while the others wait for it in a collective
(or, with ``busy``, work on their own): the launcher must stop the job and name the rank.

- ``exit0``: ``os._exit(0)`` in the middle of the script; ``exit3``: ``os._exit(3)``;
- ``sigkill`` / ``sigterm`` / ``sigsegv``: killed by that signal;
- ``finish``: its script ends normally, skipping the collective the others wait in;
- ``late``: no fault -- every rank does every collective, and the last rank ends seconds before
  the others, which work on after the last collective.
"""

import os
import signal
import sys
import time

import kiln
import kiln.distributed as dist

how = sys.argv[1]
busy = sys.argv[2:] == ["busy"]
dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
x = kiln.ones(3)
dist.all_reduce(x)  # every rank gets this far
print(f"rank {rank} started", flush=True)
if rank == world - 1 and how != "late":
    if how.startswith("exit"):
        os._exit(int(how[4:]))
    if how.startswith("sig"):
        os.kill(os.getpid(), getattr(signal, how.upper()))
    print(f"rank {rank} ends its script", flush=True)
    sys.exit(0)  # "finish": the same as reaching the end of the script
if busy:
    time.sleep(60)  # no collective: only the launcher can end this
elif how == "late":
    if rank != world - 1:
        time.sleep(1.5)
else:
    dist.all_reduce(x)  # waits for the last rank, which never comes
print(f"rank {rank} passed 1 checks", flush=True)
