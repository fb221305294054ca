"""``kiln.multiprocessing``: the standard ``multiprocessing`` plus tensors in shared memory.

``share_memory_(t)`` moves a CPU tensor's values into a POSIX shared-memory segment (``/dev/shm/kiln_*``)
in place. Importing this module registers a reducer with ``multiprocessing``'s pickler, so a shared tensor
sent through a ``Queue``, a ``Pipe`` or as a ``Process`` argument travels as (segment name, offset, shape,
strides, dtype): the receiving process maps the same segment and writes are seen by both sides. Tensors
not in shared memory pickle as before (a copy of their values).

Lifetime: the process that created a segment unlinks it when its last array over the segment is
garbage-collected (or at exit); other processes only unmap. A receiver must map the segment while the
sender still holds the tensor, as in PyTorch.

>>> import kiln, kiln.multiprocessing as kmp
>>> t = kmp.share_memory_(kiln.zeros(3))
>>> kmp.is_shared(t)
True
"""

from __future__ import annotations

import _posixshmem
import mmap
import multiprocessing as _mp
import os
import secrets
import weakref
from multiprocessing import *  # noqa: F403 - kiln.multiprocessing extends the standard module, as PyTorch's does
from multiprocessing.reduction import ForkingPickler

import numpy as np

from .frontend.tensor import Tensor, make_tensor
from .ir import dtypes as dt
from .ir.types import CPU

__all__ = [*_mp.__all__, "is_shared", "share_memory_"]  # noqa: PLE0604

SHM_DIR = "/dev/shm"
PREFIX = "kiln_"

# name -> (start address, size, weakref to the memoryview every array over the segment leads to)
_segments: dict[str, tuple[int, int, weakref.ref]] = {}


def segment_prefix(pid: int | None = None) -> str:
    """The name prefix of the segments a process creates (leftovers of a dead process are found by it)."""
    return f"{PREFIX}{os.getpid() if pid is None else pid}_"


def _map(name: str, nbytes: int, create: bool, own: bool = False) -> np.ndarray:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
    try:
        if create:
            os.ftruncate(fd, nbytes)
        else:
            nbytes = os.fstat(fd).st_size
        mm = mmap.mmap(fd, nbytes)
    except BaseException:
        if create:
            _posixshmem.shm_unlink("/" + name)
        raise
    finally:
        os.close(fd)
    base = np.frombuffer(mm, dtype=np.uint8)
    anchor = base.base  # the buffer object every array over the segment leads back to
    owner = os.getpid() if own else None
    weakref.finalize(anchor, _release, name, mm, owner)
    _segments[name] = (base.ctypes.data, nbytes, weakref.ref(anchor))
    return base


def _release(name: str, mm: mmap.mmap, owner: int | None) -> None:
    _segments.pop(name, None)
    try:
        mm.close()
    except BufferError:  # still exported somewhere (interpreter shutdown): the OS unmaps at exit
        pass
    if owner == os.getpid():  # a forked child inherits the finalizer, but must not unlink its parent's segment
        unlink(name)


def create_segment(nbytes: int, own: bool = True) -> tuple[str, np.ndarray]:
    """A new segment of ``nbytes`` bytes: its name and a uint8 array over it. ``own``: this process unlinks
    it when its arrays are gone; otherwise the receiver must (``unlink``)."""
    name = segment_prefix() + secrets.token_hex(8)
    return name, _map(name, max(int(nbytes), 1), create=True, own=own)


def attach_segment(name: str) -> np.ndarray:
    """Map an existing segment by name (as a uint8 array); raises RuntimeError if it is gone."""
    try:
        return _map(name, 0, create=False)
    except FileNotFoundError:
        raise RuntimeError(
            f"shared memory segment {name!r} no longer exists: the sending process released the tensor "
            "before this process received it (keep the tensor alive until the receiver has it)"
        ) from None


def unlink(name: str) -> None:
    """Remove a segment's name (mappings stay valid until unmapped); a missing name is ignored."""
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


def _segment_of(array: np.ndarray) -> tuple[str, int] | None:
    """(segment name, byte offset) of the memory ``array`` starts in, if it lies in a live kiln segment."""
    if array.size == 0:
        return None
    ptr = array.ctypes.data
    for name, (start, size, ref) in _segments.items():
        if start <= ptr < start + size and ref() is not None:
            return name, ptr - start
    return None


def is_shared(tensor: Tensor) -> bool:
    """Whether a tensor's memory lies in a shared-memory segment (``Tensor.is_shared``)."""
    return tensor._device is CPU and _segment_of(tensor._data) is not None


def share_memory_(tensor: Tensor) -> Tensor:
    """Move a CPU tensor's values into shared memory in place; returns the tensor (``Tensor.share_memory_``).

    Only this tensor object is moved: other views of its old memory keep the old memory.
    """
    if not isinstance(tensor, Tensor):
        raise TypeError(f"share_memory_ expected a kiln Tensor, got {type(tensor).__name__}")
    if tensor._device is not CPU:
        return tensor  # device memory is shared through IPC handles, not here
    if is_shared(tensor):
        return tensor
    data = tensor._data
    _, base = create_segment(data.nbytes)
    shared = base[: data.nbytes].view(data.dtype).reshape(data.shape)
    shared[...] = data
    tensor._data = shared
    return tensor


def _rebuild_shared(name: str, offset: int, shape: tuple, strides: tuple, dtype: str, requires_grad: bool) -> Tensor:
    base = attach_segment(name)
    kind = dt.BY_NAME[dtype]
    array = np.ndarray(shape, dtype=kind.np, buffer=base, offset=offset, strides=strides)
    return make_tensor(array, CPU, kind).requires_grad_(requires_grad)


def shared_reduction(tensor: Tensor) -> tuple | None:
    """``_rebuild_shared``'s arguments for a CPU tensor without history whose memory lies in a shared
    segment (segment name, offset, shape, strides, dtype name, requires_grad), else None."""
    if tensor._device is CPU and tensor.grad_fn is None:
        where = _segment_of(tensor._data)
        if where is not None:
            data = tensor._data
            return (*where, data.shape, data.strides, tensor._dtype.name, tensor._requires_grad)
    return None


def _reduce_tensor(tensor: Tensor):
    args = shared_reduction(tensor)
    return (_rebuild_shared, args) if args is not None else tensor.__reduce_ex__(4)


ForkingPickler.register(Tensor, _reduce_tensor)
