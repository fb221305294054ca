"""``torch.utils.data.distributed``'s path: ``DistributedSampler`` (defined in ``kiln.data``)."""

import kiln.data as _data


def __getattr__(name: str):
    if name == "DistributedSampler":
        return _data.DistributedSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DistributedSampler"]  # noqa: F822 - served by __getattr__
