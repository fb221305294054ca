"""split / chunk / unbind: views of the input with one SplitBackward node, as PyTorch's."""

import numpy as np
import pytest

import kiln
from kiln.autograd import gradcheck, gradgradcheck

RNG = np.random.default_rng(0)


def _grads(lib, fn, x_np):
    x = lib.tensor(x_np, requires_grad=True)
    fn(x).backward()
    return x.grad.numpy()


CASES = [
    # (what, pieces -> loss): some pieces unused, so their gradient is zeros
    ("qkv", lambda x: (lambda q, k, v: (q * 2).sum() + (v * v).sum())(*x.split(4, dim=1))),
    ("sizes", lambda x: (lambda a, b, c: (b.exp()).sum() + a.sum())(*x.split([1, 5, 6], dim=1))),
    ("chunk", lambda x: (lambda a, b, c: (c * a[:, :1]).sum())(*x.chunk(3, dim=-1))),
    ("unbind", lambda x: (lambda *rows: (rows[0] * rows[2]).sum())(*x.unbind(0))),
    ("uneven", lambda x: sum((p * (i + 1)).sum() for i, p in enumerate(x.split(5, dim=1)))),
]


@pytest.mark.parametrize("fn", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_gradients_equal_pytorch(torch, fn):
    x = RNG.normal(size=(3, 12))
    np.testing.assert_allclose(_grads(kiln, fn, x), _grads(torch, fn, x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_gradients_and_second_gradients_by_finite_differences(fn):
    x = kiln.tensor(RNG.normal(size=(3, 12)), requires_grad=True)
    assert gradcheck(fn, (x,))
    assert gradgradcheck(fn, (x,))


def test_one_node_for_all_pieces_and_one_gradient_op():
    x = kiln.tensor(RNG.normal(size=(2, 9)), requires_grad=True)
    q, k, v = x.split(3, dim=1)
    assert q.grad_fn is k.grad_fn is v.grad_fn and q.grad_fn.name() == "SplitBackward0"
    assert [q._output_nr, k._output_nr, v._output_nr] == [0, 1, 2]
    assert x.unbind(1)[4].grad_fn.name() == "UnbindBackward0"
    loss = q.sum() + v.sum()
    with kiln.profiler.profile() as prof:  # a profile records the node's ops: one concatenate
        loss.backward()
    names = [a.key for a in prof.key_averages()]
    assert "concatenate" in names and "pad" not in names and "add" not in names, names  # was 3 pads, 2 adds
    np.testing.assert_array_equal(x.grad.numpy(), np.repeat([[1.0] * 3 + [0.0] * 3 + [1.0] * 3], 2, axis=0))


def test_pieces_are_views_sharing_memory_and_version():
    x = kiln.tensor(np.arange(12.0).reshape(3, 4))
    a, b = x.split([1, 3], dim=1)
    rows = x.unbind(0)
    assert a._base is x and rows[2]._base is x and a._version is x._version
    b[0, 0] = 100.0  # a write through a piece is a write into x
    assert x[0, 1].item() == 100.0 and x._version[0] == 1
    x.mul_(2)
    assert rows[0].tolist() == [0.0, 200.0, 4.0, 6.0] and rows[2].shape == (4,)
    assert x.unbind(0)[0].unbind(0)[1].shape == ()  # 0-d pieces of a 1-d tensor are arrays too


def test_base_written_in_place_after_the_split():
    # the pieces' history is rebuilt from x's new history when it is next used (as for any view)
    w = kiln.tensor(RNG.normal(size=(2, 6)), requires_grad=True)
    y = w * 1.0
    a, b = y.split(3, dim=1)
    y.mul_(3.0)
    (a.sum() + 2 * b.sum()).backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.repeat([[3.0] * 3 + [6.0] * 3], 2, axis=0))


def test_in_place_through_a_piece():
    w = kiln.tensor(RNG.normal(size=(2, 6)), requires_grad=True)
    y = w * 1.0
    a, b = y.split(3, dim=1)
    a.mul_(5.0)
    (y.sum() + b.sum()).backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.repeat([[5.0] * 3 + [2.0] * 3], 2, axis=0))


def test_traced_split_records_the_ops_and_equals_eager():
    def step(x):
        q, k, v = x.split(2, dim=-1)
        return (q * k + v).sum(dim=-1)

    compiled = kiln.compile(step)
    for _ in range(3):
        x = kiln.tensor(RNG.normal(size=(4, 6)))
        np.testing.assert_allclose(compiled(x).numpy(), step(x).numpy(), rtol=1e-12, atol=1e-12)


def test_errors_name_the_sizes():
    x = kiln.zeros(2, 5)
    with pytest.raises(RuntimeError, match=r"sum exactly to 5 .* split_sizes=\[2, 2\]"):
        x.split([2, 2], dim=1)
    with pytest.raises(RuntimeError, match="split_size=-1"):
        x.split(-1, dim=1)
    with pytest.raises(RuntimeError, match="chunks` to be greater than 0"):
        x.chunk(0)
    assert [p.shape for p in kiln.zeros(0, 3).chunk(2)] == [(0, 3), (0, 3)]
