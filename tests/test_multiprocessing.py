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
