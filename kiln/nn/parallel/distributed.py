"""``DistributedDataParallel``: one model replica per process, gradients averaged over the processes.

At wrap, rank 0's parameters and buffers are broadcast, so every replica starts equal. The
parameters are split into buckets (about ``bucket_cap_mb`` each, in reverse order of
``parameters()``: roughly the order in which backward completes their gradients; the first
bucket is small so that communication starts early). Each parameter has a post-accumulate-grad
hook; when the last gradient of a bucket is complete the bucket's gradients are flattened into
one buffer and an asynchronous all-reduce (AVG) starts, in bucket order on every process (MPI
and NCCL need the same order everywhere), while backward goes on computing the earlier layers'
gradients. When the last bucket has started, the backward is done: every all-reduce is waited
for and the averages are written back into ``.grad``.

Inside ``kiln.compile`` the same hooks run while tracing, and each bucket's all-reduce becomes a
graph node (``kiln.distributed.all_reduce``); the compiled step reduces the same buckets.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import kiln
import kiln.distributed as dist
from kiln.frontend.autograd.graph import AccumulateGrad

from ..modules.module import Module

_FIRST_BUCKET_BYTES = 1024 * 1024  # PyTorch's: a small first bucket starts communication early


class _Bucket:
    __slots__ = ("params", "pending", "flat", "work")

    def __init__(self, params: list) -> None:
        self.params = params
        self.pending = len(params)
        self.flat: Any = None  # the bucket's gradients in one tensor, from _launch on
        self.work: Any = None  # the all-reduce in flight, from _launch on


def _assign_buckets(params: list, cap_bytes: int) -> list[list]:
    """Reverse parameter order, one dtype and device per bucket, each up to ``cap_bytes``."""
    buckets: list[list] = []
    current: list = []
    size, cap = 0, min(_FIRST_BUCKET_BYTES, cap_bytes)
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if current and (size + nbytes > cap or p.dtype != current[0].dtype or p.device != current[0].device):
            buckets.append(current)
            current, size, cap = [], 0, cap_bytes
        current.append(p)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def _broadcast_coalesced(tensors: list, group) -> None:
    """Make ``tensors`` equal to rank 0's, one broadcast per dtype."""
    by_dtype: dict = {}
    for t in tensors:
        by_dtype.setdefault((t.dtype, t.device), []).append(t)
    with kiln.no_grad():
        for same in by_dtype.values():
            flat = kiln.cat([t.detach().reshape(-1) for t in same])
            dist.broadcast(flat, src=dist.get_process_group_ranks(group)[0], group=group)
            _unflatten_into(flat, same)


def _unflatten_into(flat, tensors: list) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.detach().copy_(flat[offset : offset + n].view(t.shape))
        offset += n


class DistributedDataParallel(Module):
    """Data parallelism over the processes of ``process_group`` (default: all of them).

    ``module``'s forward runs on this process's share of the batch; after ``loss.backward()``
    every parameter's ``.grad`` holds the average over the processes, so an optimizer step keeps
    the replicas equal. ``no_sync()`` skips the reduction (gradient accumulation);
    ``find_unused_parameters=True`` allows forwards that leave some parameters without gradient.
    """

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, process_group=None, bucket_cap_mb: float | None = 25,
                 find_unused_parameters: bool = False, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False) -> None:  # fmt: skip
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: expected a kiln.nn.Module, got {type(module).__name__}")
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("DistributedDataParallel: device_ids must hold one device (one process per device), "
                             f"got {device_ids}")  # fmt: skip
        self.module = module
        self.process_group = process_group
        self.device_ids = device_ids
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self._world = dist.get_world_size(process_group)
        self._params = [p for p in module.parameters() if p.requires_grad]  # shared parameters appear once
        cap = int((25 if bucket_cap_mb is None else bucket_cap_mb) * 1024 * 1024)
        self._buckets = [_Bucket(b) for b in _assign_buckets(self._params, cap)]
        self._bucket_of = {id(p): i for i, b in enumerate(self._buckets) for p in b.params}
        self._ready: set[int] = set()  # ids of parameters whose gradient is final in this backward
        self._next_bucket = 0  # buckets start in index order on every process
        self._syncing = False  # this backward reduces (the forward ran with sync on)
        self._used_here: set[int] | None = None  # find_unused_parameters: parameters the forward used
        _broadcast_coalesced(list(module.parameters()) + list(module.buffers()), process_group)
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in self._params]

    # ------------------------------------------------------------------ forward
    def forward(self, *inputs, **kwargs):
        if self._syncing and self._ready:
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration before starting a new one. "
                f"{len(self._params) - len(self._ready)} parameter(s) received no gradient in the last backward: "
                "pass find_unused_parameters=True to DistributedDataParallel if the forward does not use every "
                "parameter, and make sure every process's loss depends on the forward's outputs."
            )
        if self.broadcast_buffers and self._world > 1:
            buffers = list(self.module.buffers())
            if buffers:
                _broadcast_coalesced(buffers, self.process_group)
        self._reset(kiln.is_grad_enabled() and self.require_backward_grad_sync)
        output = self.module(*inputs, **kwargs)
        if self._syncing and self.find_unused_parameters:
            self._mark_unused(output)
        return output

    def _reset(self, sync: bool) -> None:
        self._syncing = sync
        self._ready.clear()
        self._next_bucket = 0
        self._used_here = None
        for b in self._buckets:
            b.pending, b.flat, b.work = len(b.params), None, None

    def _mark_unused(self, output) -> None:
        """Walk the autograd graph from the outputs; parameters it does not reach are ready now."""
        used: set[int] = set()
        stack = [t.grad_fn for t in _tensors_in(output) if t.grad_fn is not None]
        seen: set[int] = set()
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, AccumulateGrad):
                used.add(id(node.variable))
            stack.extend(edge[0] for edge in node.next_edges if edge is not None)
        self._used_here = used
        for p in self._params:
            if id(p) not in used:
                self._mark_ready(p)

    # ------------------------------------------------------------------ backward
    def _on_grad_ready(self, param) -> None:
        if not self._syncing:
            return
        if id(param) in self._ready:
            raise RuntimeError("Expected to mark a variable ready only once: a parameter received its gradient twice "
                               "in one backward of DistributedDataParallel (reentrant backward, or a second backward "
                               "without a forward in between)")  # fmt: skip
        self._mark_ready(param)

    def _mark_ready(self, param) -> None:
        self._ready.add(id(param))
        bucket = self._buckets[self._bucket_of[id(param)]]
        bucket.pending -= 1
        # MPI moves a non-blocking collective forward only inside MPI calls: testing the ones in
        # flight as each gradient arrives lets them proceed while backward computes.
        for started in self._buckets[: self._next_bucket]:
            started.work.is_completed()
        while self._next_bucket < len(self._buckets) and self._buckets[self._next_bucket].pending == 0:
            self._launch(self._buckets[self._next_bucket])
            self._next_bucket += 1
        if self._next_bucket == len(self._buckets):
            self._finish()

    def _launch(self, bucket: _Bucket) -> None:
        with kiln.no_grad():
            pieces = [
                (p.grad if p.grad is not None else kiln.zeros_like(p)).detach().reshape(-1) for p in bucket.params
            ]
            bucket.flat = kiln.cat(pieces)
            bucket.work = dist.all_reduce(bucket.flat, op=dist.ReduceOp.AVG, group=self.process_group, async_op=True)

    def _finish(self) -> None:
        globally_used = self._global_usage() if self._used_here is not None else None
        with kiln.no_grad():
            for bucket in self._buckets:
                bucket.work.wait()
                offset = 0
                for p in bucket.params:
                    n = p.numel()
                    averaged = bucket.flat[offset : offset + n].view(p.shape)
                    offset += n
                    if globally_used is not None and id(p) not in globally_used:
                        continue  # no process used it: its gradient stays as it was (None), as in PyTorch
                    if p.grad is None:
                        p.grad = averaged.clone()
                    else:
                        p.grad.copy_(averaged)
        # Back to the state between iterations, the same after every step: a compiled step (which
        # replays only the tensor work) leaves this object as the traced call left it.
        self._reset(False)

    def _global_usage(self) -> set[int]:
        assert self._used_here is not None  # _finish calls this only then
        flags = kiln.tensor([1 if id(p) in self._used_here else 0 for p in self._params], dtype=kiln.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.process_group)
        return {id(p) for p, used in zip(self._params, flags.tolist(), strict=True) if used}

    # ------------------------------------------------------------------ API
    @contextmanager
    def no_sync(self):
        """Backwards of forwards run inside this context accumulate gradients locally, without
        reduction; the first backward after it reduces the accumulated gradients."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def extra_repr(self) -> str:
        return f"world_size={self._world}, buckets={len(self._buckets)}"


def _tensors_in(value) -> list:
    if isinstance(value, kiln.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors_in(v)]
    return []
