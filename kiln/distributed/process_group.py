"""Process groups: ``init_process_group``, the world, ``new_group``, and PyTorch's query functions.

A process group is a communicator (MPI's on the CPU, NCCL's on the GPU) plus the global ranks
it spans and the timeout its operations wait at most. ``init_process_group`` builds the world
from what the launcher left in the environment: MPI knows its own rank and size
(``mpiexec``, or ``python -m kiln.distributed.run`` which starts ``mpiexec``); ``RANK`` and
``WORLD_SIZE`` as ``torchrun`` sets them are checked against it.
"""

from __future__ import annotations

import datetime
import enum
import logging
import os
from typing import TYPE_CHECKING

from . import _check, _mpi
from .supervise import PeerWatch

if TYPE_CHECKING:
    from ._nccl import NCCLCommunicator

log = logging.getLogger("kiln.distributed")

#: PyTorch's default: collectives wait 30 minutes for a peer before giving up.
default_pg_timeout = datetime.timedelta(minutes=30)


class ReduceOp(enum.Enum):
    """How ``all_reduce`` and friends combine the ranks' tensors (``ReduceOp.SUM``...)."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MAX = "max"
    MIN = "min"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    def __repr__(self) -> str:
        return f"<ReduceOp.{self.name}>"


class Backend(str):
    """Backend names as PyTorch spells them: ``Backend.MPI``, ``Backend.NCCL``, ``Backend.GLOO``."""

    MPI = "mpi"
    NCCL = "nccl"
    GLOO = "gloo"


class ProcessGroup:
    """A set of processes that run collectives together (``new_group`` makes one; the world is one).

    Besides its communicator a group keeps what the cross-rank check needs (``_check``): whether
    it is on, the MPI communicator it runs over, one more for the signatures of sends, and the
    watch over its peers' records (to tell a waiting rank that a peer has ended)."""

    def __init__(self, communicator, ranks: list[int], backend: str, timeout: datetime.timedelta) -> None:
        self.communicator = communicator
        self.ranks = ranks  # global rank of each group rank
        self.backend = backend
        self.timeout = timeout
        self.control = communicator.control
        self.check_calls = _check.agreed_switch(self.control)
        self.messages = self.control.dup() if self.check_calls else None
        self.peers = PeerWatch([r for i, r in enumerate(ranks) if i != communicator.rank])
        self.group_id = len(_state.groups)  # the number a compiled program names this group by
        _state.groups.append(self)
        from .traced import register_communicator  # noqa: PLC0415

        register_communicator(self)

    def rank(self) -> int:
        return self.communicator.rank

    def size(self) -> int:
        return self.communicator.size

    def group_rank(self, global_rank: int, what: str) -> int:
        """The rank inside this group of the process with ``global_rank``."""
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            raise ValueError(
                f"{what}: global rank {global_rank} is not part of this group (ranks {self.ranks})"
            ) from None

    def free(self) -> None:
        if self.messages is not None:
            self.messages.free()
        self.communicator.free()

    def __repr__(self) -> str:
        return f"ProcessGroup(backend={self.backend!r}, ranks={self.ranks})"


class _NonGroupMember:
    """What ``new_group`` returns on a process outside the group: collectives on it do nothing."""

    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"


class GroupMember:
    WORLD: ProcessGroup | None = None
    NON_GROUP_MEMBER = _NonGroupMember()


class _State:
    def __init__(self) -> None:
        self.world: ProcessGroup | None = None
        self.groups: list[ProcessGroup | None] = []  # None: a group this process is not part of


_state = _State()


def is_available() -> bool:
    """Whether kiln.distributed can run here (mpi4py and an MPI library import)."""
    try:
        _mpi.mpi()
    except RuntimeError:
        return False
    return True


def is_initialized() -> bool:
    return _state.world is not None


def is_mpi_available() -> bool:
    return is_available()


def is_nccl_available() -> bool:
    try:
        from cupy.cuda import nccl  # noqa: F401, PLC0415 - optional dependency
    except Exception:  # noqa: BLE001 - any failure to load cupy's NCCL means "not available"
        return False
    return True


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: datetime.timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store=None,
    group_name: str = "",
    pg_options=None,
    device_id=None,
) -> None:
    """Join the job's processes into the default group (the world).

    ``backend``: ``"mpi"`` (CPU tensors, through mpi4py), ``"nccl"`` (CUDA tensors, through cupy's
    NCCL, bootstrapped over MPI), or ``"gloo"``, accepted as a PyTorch program's CPU backend and
    served by MPI; ``None`` picks MPI. Rank and world size come from MPI (the launcher started the
    processes); ``rank``/``world_size`` given here, or ``RANK``/``WORLD_SIZE`` in the environment,
    must agree with it. ``init_method`` (``env://``, ``tcp://...``) and ``store`` are accepted for
    PyTorch programs but not needed: MPI's launcher already did the rendezvous.

    >>> import kiln.distributed as dist                      # doctest: +SKIP
    >>> dist.init_process_group("mpi"); dist.get_world_size()  # doctest: +SKIP
    2
    """
    if _state.world is not None:
        raise RuntimeError("trying to initialize the default process group twice! (call destroy_process_group first)")
    name = Backend.MPI if backend in (None, "", "cpu:gloo") else str(backend).lower()
    if name == Backend.GLOO:
        log.info("kiln.distributed: backend 'gloo' runs on MPI (kiln has no gloo); same collectives, same results")
        name = Backend.MPI
    if name not in (Backend.MPI, Backend.NCCL):
        raise ValueError(f"init_process_group: unknown backend {backend!r}; expected 'mpi', 'nccl' or 'gloo'")
    if init_method not in (None, "env://"):
        log.info(
            "kiln.distributed: init_method %r ignored: MPI's launcher already connected the processes", init_method
        )
    timeout = default_pg_timeout if timeout is None else timeout
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"init_process_group: expected timeout as a datetime.timedelta, got {type(timeout).__name__}")
    world = _mpi.MPICommunicator(_mpi.mpi().COMM_WORLD)
    for given, source in ((rank, "rank"), (_env_int("RANK"), "RANK")):
        if given is not None and given >= 0 and given != world.rank:
            raise RuntimeError(f"init_process_group: {source}={given} but MPI says this process is rank {world.rank}")
    for given, source in ((world_size, "world_size"), (_env_int("WORLD_SIZE"), "WORLD_SIZE")):
        if given is not None and given > 0 and given != world.size:
            raise RuntimeError(
                f"init_process_group: {source}={given} but MPI started {world.size} process(es). Start the job with "
                f"`python -m kiln.distributed.run --nproc-per-node {given} script.py` (or mpiexec -n {given})"
            )
    communicator: _mpi.MPICommunicator | NCCLCommunicator = world
    if name == Backend.NCCL:
        from ._nccl import NCCLCommunicator  # noqa: PLC0415 - cupy is imported only for NCCL

        communicator = NCCLCommunicator.from_mpi(world, device_id)
    _state.groups.clear()
    _state.world = ProcessGroup(communicator, list(range(world.size)), name, timeout)
    GroupMember.WORLD = _state.world
    log.info("kiln.distributed: rank %d of %d (%s)", world.rank, world.size, name)


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Free ``group`` (default: every group, and the world: the process may init again)."""
    if group is not None and group is not _state.world:
        group.free()
        return
    from .traced import unregister_all  # noqa: PLC0415

    for pg in _state.groups[1:]:
        if pg is not None:
            pg.free()
    if _state.world is not None and _state.world.messages is not None:
        _state.world.messages.free()  # the world's own communicator stays: MPI_COMM_WORLD
    _state.groups.clear()
    unregister_all()
    _state.world = None
    GroupMember.WORLD = None


def default_group() -> ProcessGroup:
    if _state.world is None:
        raise RuntimeError(
            "Default process group has not been initialized, please make sure to call init_process_group."
        )
    return _state.world


def resolve(group) -> ProcessGroup | None:
    """``group`` or the world; ``None`` for a process outside ``group`` (its collectives do nothing)."""
    if group is None or group is GroupMember.WORLD:
        return default_group()
    if group is GroupMember.NON_GROUP_MEMBER:
        return None
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"expected a ProcessGroup (from new_group) or None, got {type(group).__name__}")
    return group


def get_rank(group=None) -> int:
    """This process's rank in ``group`` (default: the world); -1 outside the group."""
    pg = resolve(group)
    return -1 if pg is None else pg.rank()


def get_world_size(group=None) -> int:
    """The number of processes in ``group`` (default: the world); -1 outside the group."""
    pg = resolve(group)
    return -1 if pg is None else pg.size()


def get_backend(group=None) -> str:
    pg = resolve(group)
    if pg is None:
        raise ValueError("Invalid process group specified")
    return pg.backend


def get_process_group_ranks(group) -> list[int]:
    pg = resolve(group)
    return [] if pg is None else list(pg.ranks)


def new_group(ranks=None, timeout: datetime.timedelta | None = None, backend=None, pg_options=None, **kwargs):
    """A group of the given global ``ranks`` (default: all). As in PyTorch every process of the
    world must call it, in the same order, members or not; non-members get
    ``GroupMember.NON_GROUP_MEMBER``."""
    world = default_group()
    members = sorted(set(range(world.size()) if ranks is None else (int(r) for r in ranks)))
    bad = [r for r in members if not 0 <= r < world.size()]
    if bad:
        raise ValueError(f"new_group: ranks {bad} are outside the world of {world.size()} processes")
    me = world.rank()
    communicator = world.communicator.split(0 if me in members else None, me)
    if communicator is None:
        # Keep the numbering of groups equal on every process (compiled programs name them by it).
        _state.groups.append(None)
        return GroupMember.NON_GROUP_MEMBER
    return ProcessGroup(communicator, members, world.backend, world.timeout if timeout is None else timeout)
