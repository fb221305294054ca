"""kiln.multiprocessing: tensors in shared memory, passed between processes without copying."""

import gc
import os

import pytest

import kiln
import kiln.multiprocessing as kmp


def _segments():
    # this process's segments only: other test runs on the machine share /dev/shm
    return {f for f in os.listdir("/dev/shm") if f.startswith(kmp.segment_prefix())}


def _child_write(q, done):
    t = q.get(timeout=20)
    t[1] = 42.0  # lands in the parent's memory: the segment is mapped, not copied
    done.put(kmp.is_shared(t))


def test_share_memory_in_place_preserves_values():
    t = kiln.arange(6.0).reshape(2, 3)
    assert not kmp.is_shared(t)
    assert kmp.share_memory_(t) is t
    assert kmp.is_shared(t) and kmp.is_shared(t[1])  # views of shared memory are shared too
    assert t.tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(TypeError, match="expected a kiln Tensor, got list"):
        kmp.share_memory_([1.0])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_write_in_child_visible_in_parent(method):
    before = _segments()
    ctx = kmp.get_context(method)
    t = kmp.share_memory_(kiln.zeros(4))
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_child_write, args=(q, done))
    p.start()
    q.put(t)
    assert done.get(timeout=30) is True
    p.join(timeout=30)
    assert p.exitcode == 0
    assert t.tolist() == [0.0, 42.0, 0.0, 0.0]
    del t
    gc.collect()
    assert _segments() == before  # the owner unlinks the segment once its tensor is gone


def test_unshared_tensor_still_pickles_as_a_copy():
    ctx = kmp.get_context("fork")
    q = ctx.Queue()
    q.put(kiln.tensor([1, 2]))
    out = q.get(timeout=10)
    assert out.tolist() == [1, 2] and not kmp.is_shared(out)


def _hogwild_worker(model, done):
    """A worker of a Hogwild run: its own optimizer over the module it was handed."""
    params = list(model.parameters())
    optimizer = kiln.optim.SGD(params, lr=0.1, momentum=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        model(kiln.ones(2, 3)).sum().backward()
        optimizer.step()
    shared = all(isinstance(p, kiln.nn.Parameter) and kmp.is_shared(p) for p in params)
    done.put((shared, model.weight.tag, model.weight.sum().item()))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_module_in_shared_memory_is_trained_by_its_workers(method):
    """``Module.share_memory`` (it was a no-op: each worker trained a copy, and pytorch/examples'
    mnist_hogwild learned nothing): the worker's parameters are Parameters over the same segments,
    with their attributes, and the parent sees its updates."""
    model = kiln.nn.Linear(3, 2)
    model.weight.tag = "w"
    assert model.share_memory() is model
    assert all(kmp.is_shared(p) for p in model.parameters())
    before = model.weight.sum().item()
    ctx = kmp.get_context(method)
    done = ctx.Queue()
    p = ctx.Process(target=_hogwild_worker, args=(model, done))
    p.start()
    shared, tag, seen_by_worker = done.get(timeout=60)
    p.join(timeout=30)
    assert p.exitcode == 0
    assert shared and tag == "w"
    after = model.weight.sum().item()
    assert after != before and after == pytest.approx(seen_by_worker, rel=1e-6, abs=1e-6)


def test_a_shared_parameter_pickles_to_a_file_as_its_values():
    """Only multiprocessing's pickler passes the segment: ``pickle`` (a checkpoint) keeps the values."""
    import pickle

    model = kiln.nn.Linear(2, 2).share_memory()
    restored = pickle.loads(pickle.dumps(model.weight))
    assert isinstance(restored, kiln.nn.Parameter) and not kmp.is_shared(restored)
    assert restored.tolist() == model.weight.tolist()
