"""The work of the compile stages grows linearly with the program: an unrolled loop of n steps
and of 4n steps, counted in operations (groups visited, conflicts placed), never timed."""

from __future__ import annotations

import itertools
import random

from kiln.ir.dtypes import float32
from kiln.ir.graph import KERNEL, Graph, GraphBuilder
from kiln.ir.types import TensorType
from kiln.passes import fusion_groups, memory_plan
from kiln.passes.fusion import fuse
from kiln.passes.fusion_order import GroupOrder

MAT = TensorType((4, 8), float32)
WEIGHT = TensorType((8, 8), float32)


def rnn_step_graph(steps: int) -> Graph:
    """An RNN's forward and backward, unrolled: each step's gate (a sigmoid) is read by the next
    step (through an extern matmul) and again by its own backward step, at the other end of the
    program, together with a value made before it."""
    b = GraphBuilder()
    h, w, v = b.input(MAT), b.input(WEIGHT), b.input(WEIGHT)
    saved = []
    for _ in range(steps):
        early = b.node("matmul", [h, v])  # an extern made before the gate
        gate = b.node("sigmoid", [h])
        saved.append((gate, early))
        h = b.node("matmul", [gate, w])
    grad = h
    for gate, early in reversed(saved):
        local = b.node("mul", [gate, early])  # fuses with the gate, far back in the program
        grad = b.node("matmul", [b.node("mul", [grad, local]), w])
    return b.build([grad])


def _count_order_steps(monkeypatch) -> list[int]:
    """A counter of the groups the fusion's order searches step through."""
    count = [0]
    for name in ("_successors", "_predecessors"):
        walk = getattr(fusion_groups.Grouping, name)

        def counted(self, root, walk=walk):
            for r in walk(self, root):
                count[0] += 1
                yield r

        monkeypatch.setattr(fusion_groups.Grouping, name, counted)
    return count


def test_grouping_an_unrolled_loop_is_linear_in_its_length(monkeypatch):
    """Past a few dozen steps (``MAX_ORDER_SEARCH`` groups on each side of a search), 4x the steps
    cost about 4x the searching (4.6x measured from 64 steps, 4.1x from 256); searching the
    region between the two groups of each merge cost 16x."""
    count = _count_order_steps(monkeypatch)
    steps = 64
    work = []
    for n in (steps, 4 * steps):
        count[0] = 0
        fused = fuse(rnn_step_graph(n))
        work.append(count[0])
        # each step's gate fused with its backward product: the merges the searches decide
        gates = [node for node in fused.nodes if node.op == KERNEL and len(node.attrs["bodies"][0].nodes) >= 2]
        assert len(gates) >= n
    assert work[1] / work[0] < 6, f"the order searches took {work[1] / work[0]:.1f}x the work for 4x the nodes"


def test_group_order_moves_past_a_floats_precision_by_numbering_again():
    order = GroupOrder(4)
    for i in range(200):  # each move halves the gap after group 0: past 50 or so, it is renumbered
        moved = 1 + i % 2
        order.move_after([moved], 0)
        assert order.key[0] < order.key[moved] < order.key[3 - moved] < order.key[3]
        assert order.keys == sorted(order.key[r] for r in range(4))
    order.move_before([3], 0)
    order.join(0, 0, 1, 1)  # 0 and 1 merged, standing where 1 stood
    assert [order.root[k] for k in order.keys] == [3, 2, 0]  # before: 3, 0, 2, 1


def test_placing_buffers_of_an_unrolled_loop_looks_at_a_linear_number_of_pairs(monkeypatch):
    """Each step's activation lives until its backward step (nested lifetimes, all alive at the
    middle): n^2/2 pairs alive at once, which the greedy placements walked one by one."""
    examined = [0]
    conflicts = memory_plan._conflicts

    def counted(starts, ends):
        found = conflicts(starts, ends)
        examined[0] += sum(map(len, found))
        return found

    monkeypatch.setattr(memory_plan, "_conflicts", counted)
    for n in (50, 800):
        examined[0] = 0
        sizes = [64 * (1 + i % 3) for i in range(n)]
        starts, ends = list(range(n)), [2 * n - i for i in range(n)]
        offsets, arena = memory_plan.place(sizes, starts, ends)
        assert examined[0] <= 2 * memory_plan.MAX_PAIRS_PER_BUFFER * n
        assert arena == memory_plan.peak(sizes, starts, ends)  # nested lifetimes stack with no gap
        spans = sorted((offsets[b], offsets[b] + sizes[b]) for b in range(n))  # all alive at step n
        assert all(hi <= lo for (_, hi), (lo, _) in zip(spans, spans[1:], strict=False))


def test_the_sweep_places_like_the_greedy_in_schedule_order():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 40)
        sizes = [64 * rng.randint(0, 6) for _ in range(n)]
        starts = [rng.randint(0, 30) for _ in range(n)]
        ends = [s + rng.randint(0, 20) for s in starts]
        overlapping = [
            (a, b) for a, b in itertools.combinations(range(n), 2) if starts[a] <= ends[b] and starts[b] <= ends[a]
        ]
        assert memory_plan.overlapping_pairs(starts, ends) == len(overlapping)
        offsets, arena = memory_plan._sweep(sizes, starts, ends)
        for a, b in overlapping:
            assert (
                offsets[a] + sizes[a] <= offsets[b] or offsets[b] + sizes[b] <= offsets[a] or 0 in (sizes[a], sizes[b])
            )
        in_order = sorted(range(n), key=lambda b: (starts[b], -sizes[b]))
        assert arena == memory_plan._greedy(in_order, sizes, memory_plan._conflicts(starts, ends))[1]
