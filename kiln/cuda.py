"""``kiln.cuda``: whether CUDA is usable (cupy installed and a GPU present)."""

from .runtime.devices import cuda_available, cuda_device_count


def is_available() -> bool:
    return cuda_available()


def device_count() -> int:
    return cuda_device_count()
