"""What the autograd graph costs beyond its arithmetic: the objects each recorded node keeps for
Python's cyclic collector to walk (each full collection walks them all, and their number sets how
often one runs), and the copies a backward makes into ``.grad`` (a fresh gradient nothing else
holds becomes ``.grad`` as it is, as in PyTorch's AccumulateGrad)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.ir.types import CPU, TensorType
from tests.conftest import assert_close


def _address(t) -> int:
    return t._data.__array_interface__["data"][0]


# ----------------------------------------------------------------------------- objects per node
def _objects_per_op(op, steps: int = 200) -> float:
    """The collector-tracked objects a chain of ``steps`` calls of ``op`` keeps alive, per call."""
    y = kiln.randn(4, 8, dtype=kiln.float64, requires_grad=True)
    op(y)  # first call: whatever is made once (kernels, caches) is not the graph's
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(steps):
        y = op(y)
    gc.collect()
    per_op = (len(gc.get_objects()) - before) / steps
    y.sum().backward()  # and the chain backpropagates
    return per_op


def _objects_per_call(fn, steps: int = 200) -> float:
    """The collector-tracked objects ``steps`` calls of ``fn`` keep alive (results kept), per call."""
    fn()
    gc.collect()
    before = len(gc.get_objects())
    results = [fn() for _ in range(steps)]
    gc.collect()
    per_call = (len(gc.get_objects()) - before - 1) / steps  # (less the results' list)
    kiln.stack(results).sum().backward()
    return per_call


W = kiln.randn(8, 8, dtype=kiln.float64, requires_grad=True)
LIN = nn.Linear(8, 8, dtype=kiln.float64)
BN = nn.BatchNorm1d(8, dtype=kiln.float64)

# Each call keeps its output tensor and that tensor's version counter (2 objects), and its node.
# Before: a binary op's node kept a tuple of SavedTensors and one per input, tuples of input shapes
# and dtypes of its own, and an edge tuple per input (mul 10.9 objects, matmul 11.1); a Linear call
# kept two SavedTensors and an edge tuple per input (9.0); an op saving its output a SavedTensor and
# its weak reference (tanh 7.3); batch_norm three SavedTensors and edge tuples (11.0).
LIMITS = {
    "mul by a constant": (lambda y: y * 1.5, 7.5),  # + the constant's tensor and its counter
    "matmul": (lambda y: y @ W, 7.5),  # + the node's edges and saved inputs' tuples
    "reshape (a view) twice": (lambda y: y.reshape(32).reshape(4, 8), 4.5),
    "linear": (LIN, 4.5),
    "relu": (F.relu, 3.5),
    "tanh (saves its output)": (lambda y: y.tanh(), 3.5),
    "batch_norm": (BN, 5.5),
}


@pytest.mark.parametrize("name", LIMITS)
def test_a_recorded_op_keeps_few_objects_for_the_collector(name):
    op, limit = LIMITS[name]
    per_op = _objects_per_op(op)
    assert per_op <= limit, f"{name}: {per_op} tracked objects per call (at most {limit})"


def test_a_convolution_node_keeps_few_objects_for_the_collector():
    conv = nn.Conv2d(2, 3, 2, stride=2, padding=1, dtype=kiln.float64)  # (the im2col node, ConvBackward)
    x = kiln.randn(1, 2, 5, 5, dtype=kiln.float64, requires_grad=True)
    assert type(conv(x).grad_fn).__name__ == "ConvBackward"
    per_call = _objects_per_call(lambda: conv(x))
    # 13.2 before (a SavedTensor each for input, weight and bias, an edge tuple per parameter); now
    # the output and its counter, the node, its edges, saved tensors' and geometry tuples, and the
    # composite it recomputes under create_graph (a functools.partial, with its dict)
    assert per_call <= 7.5, per_call


def test_nodes_share_their_shape_and_dtype_tuples():
    x = kiln.randn(3, 4, requires_grad=True)
    z = kiln.randn(5, dtype=kiln.float64, requires_grad=True)
    a, b, c, d = x * 2.0, z * 3.0, z * 4.0, x * 5.0  # shapes met in turn (the last one's kept at hand)
    assert a.grad_fn.input_shapes is d.grad_fn.input_shapes and b.grad_fn.input_shapes is c.grad_fn.input_shapes
    assert a.grad_fn.input_shapes == ((3, 4), ()) and b.grad_fn.input_shapes == ((5,), ())
    # inputs of one dtype: that dtype, no tuple; mixed ones: a shared tuple
    assert a.grad_fn.input_dtypes is kiln.float32 and b.grad_fn.input_dtypes is kiln.float64
    i, j = (z[kiln.tensor([0, 2])] for _ in range(2))
    assert i.grad_fn.input_dtypes == (kiln.float64, kiln.int64) and i.grad_fn.input_dtypes is j.grad_fn.input_dtypes


def test_the_input_types_a_vjp_reads_with_one_and_with_mixed_input_dtypes():
    x = kiln.randn(3, 4, dtype=kiln.float64, requires_grad=True)
    one, mixed = x * kiln.ones(4, dtype=kiln.float64), x[kiln.tensor([0, 2])]
    assert one.grad_fn.input_types == (TensorType((3, 4), kiln.float64, CPU), TensorType((4,), kiln.float64, CPU))
    assert mixed.grad_fn.input_types[1].dtype is kiln.int64
    (one.sum() + mixed.sum()).backward()
    assert_close(x.grad.numpy(), np.array([[2.0] * 4, [1.0] * 4, [2.0] * 4]), rtol=0, atol=0)


# ----------------------------------------------------------------------------- saved inputs
def test_a_saved_input_changed_in_place_is_still_caught():
    x = kiln.randn(3, dtype=kiln.float64, requires_grad=True)
    w = kiln.randn(3, dtype=kiln.float64)
    y = x * w
    with kiln.no_grad():
        w.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*MulBackward"):
        y.sum().backward()


def test_linear_catches_an_in_place_change_of_its_saved_weight():
    lin = nn.Linear(3, 2, dtype=kiln.float64)
    x = kiln.randn(4, 3, dtype=kiln.float64, requires_grad=True)
    y = lin(x)
    with kiln.no_grad():
        lin.weight.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*LinearBackward"):
        y.sum().backward()


def test_an_in_place_op_snapshots_its_saved_input():
    # x.mul_(w) saves the old x (to differentiate by w); the write must not reach the saved copy.
    x0 = kiln.tensor([1.0, 2.0, 3.0], dtype=kiln.float64, requires_grad=True)
    w = kiln.tensor([4.0, 5.0, 6.0], dtype=kiln.float64, requires_grad=True)
    x = x0 * 1.0
    x.mul_(w)
    x.sum().backward()
    assert w.grad.tolist() == [1.0, 2.0, 3.0]
    assert x0.grad.tolist() == [4.0, 5.0, 6.0]


def test_linear_leaf_edges_made_at_backward_reach_the_parameters():
    lin = nn.Linear(3, 2, dtype=kiln.float64)
    x = kiln.randn(4, 3, dtype=kiln.float64)
    y = lin(x)
    assert y.grad_fn._edges_pending  # no AccumulateGrad made by the forward
    assert lin.weight._grad_acc is None
    y.sum().backward()
    assert_close(lin.weight.grad, np.ones((2, 4)) @ x.numpy(), rtol=1e-12, atol=1e-12)
    assert lin.bias.grad.tolist() == [4.0, 4.0]


# ----------------------------------------------------------------------------- gradient stealing
def test_a_fresh_gradient_becomes_grad_without_a_copy():
    w = kiln.randn(3, 4, dtype=kiln.float64, requires_grad=True)
    arrived = []
    w.register_hook(lambda g: arrived.append(_address(g)))  # (keeps only the address)
    (w * 3.0).sum().backward()
    assert _address(w.grad) == arrived[0]
    assert (w.grad.numpy() == 3.0).all()


def test_two_leaves_fed_the_same_gradient_never_share_grad():
    # add passes its incoming gradient to both inputs unchanged: one tensor reaches both leaves.
    a = kiln.zeros(3, dtype=kiln.float64, requires_grad=True)
    b = kiln.zeros(3, dtype=kiln.float64, requires_grad=True)
    ((a + b) * 2.0).sum().backward()
    assert not np.shares_memory(a.grad._data, b.grad._data)
    a.grad.add_(1.0)
    assert a.grad.tolist() == [3.0] * 3 and b.grad.tolist() == [2.0] * 3


def test_the_users_gradient_is_never_taken():
    a = kiln.zeros(3, dtype=kiln.float64, requires_grad=True)
    b = kiln.zeros(3, dtype=kiln.float64, requires_grad=True)
    g = kiln.tensor([1.0, 2.0, 3.0], dtype=kiln.float64)
    (a + b).backward(g)
    for leaf in (a, b):
        assert not np.shares_memory(leaf.grad._data, g._data)
    a.grad.mul_(10.0)
    b.grad.mul_(100.0)
    assert g.tolist() == [1.0, 2.0, 3.0]


def test_grads_taken_from_a_retained_graph_stay_independent_of_it():
    # The grads are changed in place between two backwards through the same (retained) graph.
    x = kiln.tensor([1.0, 2.0], dtype=kiln.float64, requires_grad=True)
    w = kiln.tensor([3.0, 4.0], dtype=kiln.float64, requires_grad=True)
    y = (x * w).sum()
    y.backward(retain_graph=True)
    x.grad.zero_()
    w.grad.zero_()
    y.backward()
    assert x.grad.tolist() == [3.0, 4.0] and w.grad.tolist() == [1.0, 2.0]


def test_a_broadcast_gradient_becomes_a_writable_grad_of_its_own():
    x = kiln.zeros(2, 3, dtype=kiln.float64, requires_grad=True)
    x.sum().backward()  # sum's gradient is a broadcast view of one element
    x.grad.add_(1.0)
    assert x.grad.tolist() == [[2.0] * 3] * 2


def test_a_gradient_a_hook_keeps_is_copied():
    x = kiln.zeros(3, dtype=kiln.float64, requires_grad=True)
    kept = []
    x.register_hook(kept.append)
    (x * 2.0).sum().backward()
    x.grad.add_(1.0)
    assert kept[0].tolist() == [2.0] * 3 and x.grad.tolist() == [3.0] * 3


def test_create_graph_keeps_the_differentiable_gradient():
    x = kiln.tensor([1.0, 2.0], dtype=kiln.float64, requires_grad=True)
    (x * x * x).sum().backward(create_graph=True)
    assert x.grad.grad_fn is not None
    g = x.grad
    x.grad = None
    g.sum().backward()
    assert x.grad.tolist() == [6.0, 12.0]


def test_linear_gradients_become_grad_without_a_copy():
    # The weight's gradient is a product taken through a transpose: a view of all of an array that
    # nothing else holds, so it is taken too.
    lin = nn.Linear(3, 2, dtype=kiln.float64)
    arrived = {}
    for name, p in (("weight", lin.weight), ("bias", lin.bias)):
        p.register_hook(lambda g, name=name: arrived.__setitem__(name, _address(g)))
    x = kiln.randn(4, 3, dtype=kiln.float64)
    lin(x).sum().backward()
    assert _address(lin.weight.grad) == arrived["weight"] and _address(lin.bias.grad) == arrived["bias"]
    assert_close(lin.weight.grad, np.ones((2, 4)) @ x.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("make", "taken"),
    [
        (lambda: np.full(6, 2.0).reshape(2, 3), True),  # a view of all of a private array
        (lambda: np.full(12, 2.0)[:6].reshape(2, 3), False),  # of part of one: copied, the rest freed
        (lambda: np.full((3, 2), 2.0).T, False),  # not C-contiguous (as a copy would be): copied
    ],
)
def test_which_gradient_arrays_are_taken(make, taken):
    w = kiln.zeros(2, 3, dtype=kiln.float64, requires_grad=True)
    arrived = []

    def swap(g):  # the hook's result replaces the gradient; only the engine holds it afterwards
        new = kiln.from_numpy(make())
        arrived.append(_address(new))
        return new

    w.register_hook(swap)
    (w * 1.0).sum().backward()
    assert (_address(w.grad) == arrived[0]) is taken
    assert w.grad._data.flags.c_contiguous
    assert w.grad.tolist() == [[2.0] * 3] * 2


@pytest.mark.parametrize("backward", [False, True])
def test_a_dropped_graph_is_freed_without_the_collector(backward):
    """What a node keeps makes no reference cycle: the graph goes when its last tensor does, by
    reference counting alone (before or after a backward that made its edges)."""
    lin, bn = nn.Linear(3, 4, dtype=kiln.float64), nn.BatchNorm1d(4, dtype=kiln.float64)
    x = kiln.randn(5, 3, dtype=kiln.float64, requires_grad=True)
    gc.disable()
    try:
        h = lin(x)
        y = bn(h).tanh() * 2.0
        z = (y.reshape(20) @ kiln.ones(20, dtype=kiln.float64)).exp()
        nodes = [weakref.ref(t.grad_fn) for t in (h, y, z)]
        if backward:
            z.backward(retain_graph=True)
        del h, y, z
        assert [ref() for ref in nodes] == [None, None, None]
    finally:
        gc.enable()
