"""``DataParallel`` on one device: the module itself, as PyTorch's on the CPU."""

from __future__ import annotations

from ..modules.module import Module


class DataParallel(Module):
    """Runs ``module`` unchanged. kiln does not split a batch over several devices of one process:
    with several GPUs use ``DistributedDataParallel`` (one process per GPU), as PyTorch recommends."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0) -> None:
        super().__init__()
        if device_ids is not None and len(device_ids) > 1:
            raise NotImplementedError(
                f"DataParallel over several devices ({device_ids}): kiln runs one device per process; "
                "use kiln.nn.parallel.DistributedDataParallel with `python -m kiln.distributed.run`"
            )
        self.module = module
        self.device_ids = device_ids
        self.dim = dim

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)
