"""What needs no second process: the sampler, the autograd hook DDP starts from, DataParallel, the
passes keeping collectives, and the errors a user sees before any job starts."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.distributed as dist
from kiln.data import DistributedSampler
from kiln.ir.dtypes import float32
from kiln.ir.graph import GraphBuilder
from kiln.ir.types import TensorType
from kiln.passes import eliminate_common_subexpressions, eliminate_dead_code, fold_constants

F3 = TensorType((3,), float32)


@pytest.mark.parametrize("n", [0, 1, 5, 7, 10])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_without_shuffle_is_pytorchs(n, replicas, drop_last, torch):
    from torch.utils.data import DistributedSampler as TorchSampler

    for rank in range(replicas):
        ours = DistributedSampler(range(n), replicas, rank, shuffle=False, drop_last=drop_last)
        theirs = TorchSampler(range(n), replicas, rank, shuffle=False, drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_sampler_shuffles_per_epoch_and_splits_the_data_set():
    def shares(epoch, seed=0):
        samplers = [DistributedSampler(range(11), 3, r, seed=seed) for r in range(3)]
        for s in samplers:
            s.set_epoch(epoch)
        return [list(s) for s in samplers]

    first = shares(0)
    assert all(len(share) == 4 for share in first)  # 11 padded to 12: one index twice
    together = sorted(i for share in first for i in share)
    assert set(together) == set(range(11)) and len(together) == 12
    assert shares(0) == first  # same seed and epoch: the same order on every process
    assert shares(1) != first and shares(0, seed=1) != first
    dropped = [list(DistributedSampler(range(11), 3, r, drop_last=True)) for r in range(3)]
    assert all(len(share) == 3 for share in dropped) and len({i for s in dropped for i in s}) == 9


def test_sampler_errors():
    with pytest.raises(ValueError, match=r"Invalid rank 2, rank should be in the interval \[0, 1\]"):
        DistributedSampler(range(4), num_replicas=2, rank=2)
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedSampler(range(4))


def test_post_accumulate_grad_hook_sees_the_accumulated_gradient():
    w = kiln.tensor([1.0, 2.0], requires_grad=True)
    seen = []
    handle = w.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.tolist()))
    (w * 3).sum().backward()
    (w * w).sum().backward()  # accumulates: 3 + 2w
    assert seen == [[3.0, 3.0], [5.0, 7.0]]
    handle.remove()
    (w * 1).sum().backward()
    assert len(seen) == 2
    with pytest.raises(RuntimeError, match="non-leaf"):
        (w * 2).register_post_accumulate_grad_hook(print)


def test_post_accumulate_grad_hook_matches_pytorch(torch):
    order = {"kiln": [], "torch": []}
    for lib, name in ((kiln, "kiln"), (torch, "torch")):
        a = lib.tensor([1.0, 2.0], requires_grad=True)
        b = lib.tensor([3.0], requires_grad=True)
        for t, label in ((a, "a"), (b, "b")):
            t.register_post_accumulate_grad_hook(
                lambda p, label=label, seen=order[name]: seen.append((label, p.grad.tolist()))
            )
        ((a * b).sum() + b.sum()).backward()
    assert sorted(order["kiln"]) == sorted(order["torch"])


def test_data_parallel_is_the_module_on_one_device():
    kiln.manual_seed(0)
    inner = kiln.nn.Linear(3, 2)
    model = kiln.nn.DataParallel(inner)
    x = kiln.randn(4, 3)
    assert model.module is inner and kiln.equal(model(x), inner(x))
    assert list(model.state_dict()) == ["module.weight", "module.bias"]
    with pytest.raises(NotImplementedError, match="DistributedDataParallel"):
        kiln.nn.DataParallel(inner, device_ids=[0, 1])


def test_passes_keep_every_collective():
    b = GraphBuilder()
    x = b.input(F3)
    attrs = {"op": "sum", "group": 0}
    first, second = b.node("all_reduce", [x], attrs), b.node("all_reduce", [x], attrs)
    b.node("all_reduce", [x], attrs)  # nothing reads it: the other processes still wait for it
    const = b.node("all_reduce", [b.constant(np.ones(3, np.float32), F3)], attrs)
    graph = b.build([b.node("add", [first, second]), const])
    for transform in (eliminate_common_subexpressions, eliminate_dead_code, fold_constants):
        graph = transform(graph)
    assert [n.op for n in graph.nodes].count("all_reduce") == 4


def test_all_reduce_node_over_a_group_of_one_and_over_a_missing_group():
    from kiln.frontend.dispatch import apply
    from kiln.ir.primitives import PRIMITIVES

    x = kiln.tensor([1.0, -2.0])
    assert apply(PRIMITIVES["all_reduce"], x, op="sum", group=-1).tolist() == [1.0, -2.0]
    with pytest.raises(RuntimeError, match="process group 5 does not exist"):
        apply(PRIMITIVES["all_reduce"], x, op="sum", group=5)


def test_errors_before_init_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="Default process group has not been initialized"):
        dist.get_rank()
    with pytest.raises(RuntimeError, match="Default process group has not been initialized"):
        dist.all_reduce(kiln.ones(2))
    with pytest.raises(ValueError, match="unknown backend 'smoke'"):
        dist.init_process_group("smoke")


def test_launcher_arguments(monkeypatch):
    from kiln.distributed import run
    from kiln.distributed.run import parse, worker_command

    monkeypatch.setattr(run, "find_mpiexec", lambda: "mpiexec")
    options = parse(["--nproc-per-node", "3", "train.py", "--lr", "0.1"])
    assert options.nproc_per_node == 3 and options.args == ["--lr", "0.1"]
    command = worker_command(options)
    # each rank runs under its supervisor (run by path), which starts kiln.distributed.bootstrap
    assert command[1:3] == ["-n", "3"] and command[-4:] == [run.supervise.__file__, "train.py", "--lr", "0.1"]
    with pytest.raises(SystemExit):
        parse(["--nproc-per-node", "0", "train.py"])
    with pytest.raises(SystemExit):
        parse(["--nnodes", "2", "train.py"])


def test_call_signatures_tell_calls_apart_and_read_back():
    from kiln.distributed._check import Call

    f32 = np.dtype(np.float32)
    base = Call("all_reduce", f32, (2, 3), "sum")
    assert np.array_equal(base.encode(), Call("all_reduce", f32, (2, 3), "sum").encode())
    others = [Call("all_reduce", f32, (3, 2), "sum"), Call("all_reduce", np.dtype(np.float64), (2, 3), "sum"),
              Call("all_reduce", f32, (2, 3), "max"), Call("broadcast", f32, (2, 3), root=0), Call("barrier"),
              Call("all_reduce", f32, (1,) * 6 + (6,), "sum"), Call("all_reduce", f32, (1,) * 7 + (6,), "sum")]  # fmt: skip
    signatures = [base.encode(), *(c.encode() for c in others)]
    assert len({s.tobytes() for s in signatures}) == len(signatures)  # beyond 6 dims the checksum tells them apart
    assert Call.decode(base.encode()) == "all_reduce of float32[2, 3] (6 elements) (op sum)"
    assert Call.decode(Call("broadcast", np.dtype(np.int64), (4,), root=1).encode()) == (
        "broadcast of int64[4] (4 elements) (root 1)"
    )
    assert Call.decode(Call("barrier").encode()) == "barrier"
    assert Call.decode(others[-1].encode()).startswith("all_reduce of float32[1, 1, 1, 1, 1, 1, ...] (6 elements)")


@pytest.mark.parametrize(("value", "on"), [(None, True), ("", True), ("DETAIL", True), ("OFF", False), ("off", False)])
def test_the_check_switch(monkeypatch, value, on):
    from kiln.distributed._check import enabled

    if value is None:
        monkeypatch.delenv("KILN_DISTRIBUTED_DEBUG", raising=False)
    else:
        monkeypatch.setenv("KILN_DISTRIBUTED_DEBUG", value)
    assert enabled() is on


def test_how_a_rank_ended_is_read_from_its_records(tmp_path):
    from kiln.distributed import supervise
    from kiln.distributed.run import _Ending, _verdict

    folder = str(tmp_path)
    supervise.write_record(folder, 0, "exit", "0 10.0")
    supervise.write_record(folder, 0, "finished")
    supervise.write_record(folder, 1, "exit", "0 11.0")  # exit 0 without having finished: os._exit(0)
    supervise.write_record(folder, 2, "exit", "-9 12.0")
    endings = [_Ending(folder, rank) for rank in range(4)]
    assert [e.fault for e in endings] == [False, True, True, False]
    assert str(endings[0]) == "finished its script and exited with status 0"
    assert str(endings[1]).startswith("exited with status 0 before its script ended")
    assert str(endings[2]) == "killed by signal 9 (SIGKILL)"
    status, message = _verdict(folder, 4, 0)
    assert status == 1 and message.startswith("kiln.distributed.run: rank 1 exited with status 0 before")
    assert "  rank 3: stopped with the job" in message
    supervise.write_record(folder, 3, "txt", "[rank 3] ValueError")  # a rank that raised is named first
    assert _verdict(folder, 4, 0)[1].startswith("kiln.distributed.run: rank 3 raised")
