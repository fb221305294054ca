"""The NCCL backend on this machine's GPUs (one process per GPU): collectives and a DDP step."""

from __future__ import annotations

import numpy as np
from common import Checks, data

import kiln
import kiln.distributed as dist
from kiln import nn

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
check = Checks(rank)
device = f"cuda:{rank}"
t = kiln.from_numpy(data(rank, (3, 4))).to(device)
dist.all_reduce(t)
check.close(t.cpu(), sum(data(r, (3, 4)) for r in range(world)), rtol=1e-5, what="NCCL all_reduce")
t = kiln.from_numpy(data(rank, (5,))).to(device)
dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True).wait()
check.close(t.cpu(), sum(data(r, (5,)) for r in range(world)) / world, rtol=1e-5, what="NCCL async AVG")
t = kiln.from_numpy(data(rank, (4,))).to(device)
dist.broadcast(t, src=0)
check.close(t.cpu(), data(0, (4,)), what="NCCL broadcast")
out = kiln.zeros(world * 2, device=device)
dist.all_gather_into_tensor(out, kiln.from_numpy(data(rank, (2,))).to(device))
check.close(out.cpu(), np.concatenate([data(r, (2,)) for r in range(world)]), what="NCCL all_gather")
kiln.manual_seed(rank)
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2).to(device), device_ids=[rank])
model(kiln.from_numpy(data(rank, (3, 4))).to(device)).sum().backward()
grads = [kiln.zeros(2, 4, device=device) for _ in range(world)]
dist.all_gather(grads, model.module.weight.grad)
check.true(all(np.array_equal(g.cpu().numpy(), grads[0].cpu().numpy()) for g in grads), "DDP grads equal")
dist.destroy_process_group()
check.report()
