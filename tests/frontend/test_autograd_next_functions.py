"""``grad_fn.next_functions``: PyTorch's view of the backward graph (torchviz and friends walk it)."""

from __future__ import annotations

import kiln


def _shape(node, leaves: list) -> object:
    """The graph below ``node`` with node names left out (kiln's differ from PyTorch's): each node
    as its next functions, a leaf as its position in ``leaves``."""
    if node is None:
        return None
    if hasattr(node, "variable"):  # AccumulateGrad
        return ("leaf", [i for i, leaf in enumerate(leaves) if leaf is node.variable])
    return tuple((_shape(child, leaves), index) for child, index in node.next_functions)


def _program(lib):
    a = lib.ones(3, 4, requires_grad=True)
    b = lib.ones(3, 4)
    w = lib.ones(4, 2, requires_grad=True)
    c0, c1 = (a * 2 + b).chunk(2, dim=1)
    return ((c0 * c1) @ w[:2]).relu().sum() + a.sum(), [a, w]


def test_next_functions_name_each_input_s_node_and_output_with_none_for_no_gradient():
    a = kiln.ones(3, requires_grad=True)
    y = a * kiln.ones(3)
    (leaf, index), none = y.grad_fn.next_functions
    assert leaf.variable is a and index == 0
    assert none == (None, 0)
    halves = kiln.ones(4, requires_grad=True).chunk(2)
    z = halves[0] * halves[1]
    (first, i), (second, j) = z.grad_fn.next_functions
    assert first is second and (i, j) == (0, 1)  # one node, two outputs


def test_next_functions_walk_the_same_graph_as_pytorch(torch):
    y, leaves = _program(kiln)
    expected, torch_leaves = _program(torch)
    assert _shape(y.grad_fn, leaves) == _shape(expected.grad_fn, torch_leaves)
