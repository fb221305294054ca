"""Memory planning: place every intermediate of a fused graph in one arena, reusing dead buffers.

``plan_memory(graph)`` reads a fused graph (nodes in schedule order) and returns a ``MemoryPlan``:
a byte offset into one arena for each *planned* value, the arena's size, and the buffers that
kernels may overwrite in place. The executor allocates the arena once (per thread) and runs every
kernel and ``matmul`` (``np.matmul(..., out=view)``) into views of it, so a steady-state call
allocates nothing but the outputs it hands to the caller.

What is planned: outputs of kernel nodes and of the extern nodes whose primitive can write into a
given array (those with ``eager_into``: ``matmul``, ``reduce_sum``, ``copy``, ``pad``, the tile
transforms, ``rnn_scan`` and its backward) that are not graph outputs. Graph
inputs (the caller's), constants (the graph's), graph outputs (the caller's, from the caching
allocator), outputs of other extern nodes (numpy allocates them) and views are not.

Liveness (``kiln.ir.analysis.Liveness``). A value lives from the node that defines it to its last
use, both included: a node reads its inputs while it writes its outputs. A view (``reshape``,
``expand``, ``permute``, ``slice``) shares its base's storage, so a base lives until the last use
of any view of it, transitively; a value of which a graph output is (a view) escapes to the caller
and is not planned.

Placement is offline and greedy by size (as in TFLite's arena planner): buffers in decreasing
size each take the tightest gap between the already-placed buffers whose lifetimes overlap theirs,
or the top of them; offsets and sizes are multiples of 64 bytes. The same greedy in schedule order
is tried as well and the smaller arena kept (it wins now and then on small graphs). Both look at
every pair of buffers alive at once, which grows with the square of a long program (an unrolled
RNN keeps each step's activations for its backward): past ``MAX_PAIRS_PER_BUFFER`` pairs per
buffer, the greedy in schedule order runs alone, as an allocator that frees each buffer after its
last use and takes the tightest free block (``_sweep``: n log n).

In place: an elementwise kernel's output takes the buffer of an input that dies at that kernel
when the input is planned (never the caller's), has the same size, and the kernel reads it only at
the element it writes: the body input has the domain's shape and flows only through elementwise
nodes (no view, no broadcast, no reduction) before reaching the outputs.

>>> from kiln.ir.graph import GraphBuilder
>>> from kiln.ir.types import TensorType
>>> from kiln.ir.dtypes import float32
>>> b = GraphBuilder()
>>> x = b.input(TensorType((4, 4), float32))
>>> y = b.node("matmul", [x, x])  # 64 bytes, alive at nodes 0..1
>>> z = b.node("matmul", [y, y])  # alive at nodes 1..2: overlaps y
>>> w = b.node("matmul", [z, z])  # alive at nodes 2..3: y's buffer is free again
>>> plan = plan_memory(b.build([b.node("exp", [w])]))
>>> [plan.offsets[v] for v in (y, z, w)], plan.arena_bytes, plan.intermediate_bytes
([0, 64, 0], 128, 192)
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..ir.analysis import Liveness, pointwise_inputs, pointwise_kind
from ..ir.graph import CONSTANT, KERNEL, Graph, Node, Value, body_inputs_outputs
from ..ir.primitives import PRIMITIVES

#: Offsets into the arena (and buffer sizes) are multiples of this many bytes: a cache line, and
#: enough for any vector load the code generator emits.
ALIGNMENT = 64

#: Extern (non-kernel) ops whose executor writes the result into a planned buffer (``out=``).
PLANNED_EXTERNS = frozenset(name for name, prim in PRIMITIVES.items() if prim.eager_into is not None)


@dataclass
class MemoryPlan:
    """Where each planned intermediate lives in the arena, and what that costs.

    ``peak_bytes`` is the most bytes of planned buffers alive at once (a lower bound on any
    arena); ``intermediate_bytes`` what the planned values take with no reuse at all; both count
    sizes rounded up to ``ALIGNMENT``. ``eager_peak_bytes`` (when the unfused graph is given) is the
    most bytes of intermediates eager execution holds at once, freeing each after its last use.
    ``inplace[out] = inp``: the kernel writing ``out`` overwrites ``inp`` (same offset).
    """

    offsets: dict[Value, int]
    arena_bytes: int
    peak_bytes: int
    intermediate_bytes: int
    eager_peak_bytes: int | None = None
    inplace: dict[Value, Value] = field(default_factory=dict)

    def describe(self) -> str:
        """A few lines for ``kiln.explain``: arena size, peak, eager's peak, buffers, in-place reuses."""
        n, buffers = len(self.offsets), len(self.offsets) - len(self.inplace)
        lines = [
            f"memory plan: arena {format_bytes(self.arena_bytes)} for {n} intermediate{'s' * (n != 1)} in "
            f"{buffers} buffer{'s' * (buffers != 1)} ({format_bytes(self.intermediate_bytes)} without reuse, "
            f"peak live {format_bytes(self.peak_bytes)})"
        ]
        if self.eager_peak_bytes is not None:
            ratio = f" ({self.arena_bytes / self.eager_peak_bytes:.2f}x)" if self.eager_peak_bytes else ""
            lines.append(f"  eager would hold up to {format_bytes(self.eager_peak_bytes)} of intermediates{ratio}")
        if self.inplace:
            pairs = ", ".join(f"%{out.id} <- %{inp.id}" for out, inp in list(self.inplace.items())[:8])
            more = ", ..." if len(self.inplace) > 8 else ""
            lines.append(f"  in place: {len(self.inplace)} kernel output(s) overwrite a dead input ({pairs}{more})")
        return "\n".join(lines)


def format_bytes(n: int) -> str:
    """``1536 -> '1.5 KiB'``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def plan_memory(graph: Graph, *, eager_graph: Graph | None = None, allow_inplace: bool = True) -> MemoryPlan:
    """Plan the arena of ``graph`` (a fused graph in schedule order).

    Needs: a graph in topological order whose node order is the run order. Establishes: no two
    planned values alive at the same node share a byte, except an in-place output and its input.
    ``eager_graph`` (the unfused graph) adds eager execution's peak for comparison.
    """
    live = Liveness(graph)
    planned = [v for v in live.roots() if _planned_op(live.producer.get(v)) and v not in live.escaped]
    planned_set = set(planned)
    inplace = _choose_inplace(graph, live, planned_set) if allow_inplace else {}

    # Buffers: an in-place output joins its input's buffer (a chain of them shares one).
    buffer_of: dict[Value, int] = {}
    buffers: list[list[Value]] = []
    for v in planned:  # definition order: an in-place input is seen before its output
        if v in inplace:
            buffer_of[v] = buffer_of[inplace[v]]
            buffers[buffer_of[v]].append(v)
        else:
            buffer_of[v] = len(buffers)
            buffers.append([v])
    sizes = [aligned(nbytes(values[0])) for values in buffers]
    starts = [live.start[values[0]] for values in buffers]
    ends = [max(live.end[v] for v in values) for values in buffers]

    offsets, arena = place(sizes, starts, ends)
    return MemoryPlan(
        offsets={v: offsets[buffer_of[v]] for v in planned},
        arena_bytes=arena,
        peak_bytes=peak(sizes, starts, ends),
        intermediate_bytes=sum(aligned(nbytes(v)) for v in planned),
        eager_peak_bytes=None if eager_graph is None else eager_peak_bytes(eager_graph),
        inplace=inplace,
    )


def eager_peak_bytes(graph: Graph) -> int:
    """The most bytes of intermediates alive at once when eager runs ``graph`` node by node.

    Every non-view node output is allocated when its node runs and freed after its last use (a
    base after the last use of its views). Inputs, constants and graph outputs are not counted
    (the compiled program holds the same), views cost nothing.
    """
    live = Liveness(graph)
    values = [v for v in live.roots() if v in live.producer and live.producer[v].op != CONSTANT]
    values = [v for v in values if v not in live.escaped]
    return peak([nbytes(v) for v in values], [live.start[v] for v in values], [live.end[v] for v in values])


# ----------------------------------------------------------------------------- sizes
def nbytes(value: Value) -> int:
    return value.type.numel * value.type.dtype.itemsize


def aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _planned_op(node: Node | None) -> bool:
    return node is not None and (node.op == KERNEL or node.op in PLANNED_EXTERNS)


def peak(sizes: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> int:
    """The largest sum of ``sizes`` over intervals ``[start, end]`` covering one point."""
    if not sizes:
        return 0
    lo = min(starts)
    delta = [0] * (max(ends) - lo + 2)
    for size, start, end in zip(sizes, starts, ends):
        delta[start - lo] += size
        delta[end - lo + 1] -= size
    best = running = 0
    for d in delta:
        running += d
        best = max(best, running)
    return best


# ----------------------------------------------------------------------------- in place
def _choose_inplace(graph: Graph, live: Liveness, planned: set[Value]) -> dict[Value, Value]:
    """``{output: input}`` for each kernel output that may overwrite a dead planned input."""
    inplace: dict[Value, Value] = {}
    taken: set[Value] = set()
    for i, node in enumerate(graph.nodes):
        if node.op != KERNEL or not pointwise_kind(node):
            continue
        members = _members(node)
        # Where the kernel reads each planned storage: (member, body input position, value read).
        reads: dict[Value, list[tuple[int, int, Value]]] = {}
        for m, (inputs, _, _) in enumerate(members):
            for p, v in enumerate(inputs):
                reads.setdefault(live.root[v], []).append((m, p, v))
        for m, (inputs, outputs, safe) in enumerate(members):
            for out in outputs:
                if out not in planned:
                    continue
                for inp in inputs:
                    if inp in taken or inp not in planned or live.end[inp] != i or nbytes(inp) != nbytes(out):
                        continue
                    # Every read of inp's storage (also through a view, or by another member)
                    # must be a same-element read of this member.
                    if all(v is inp and rm == m and p in safe for rm, p, v in reads[inp]):
                        inplace[out] = inp
                        taken.add(inp)
                        break
    return inplace


def _members(node: Node) -> list[tuple[Sequence[Value], Sequence[Value], frozenset[int]]]:
    """Per body: the node's inputs and outputs it takes, and the positions of the body inputs
    read only at the element each output writes."""
    return [(inputs, outputs, pointwise_inputs(body)) for body, inputs, outputs in body_inputs_outputs(node)]


# ----------------------------------------------------------------------------- placement
#: Above this many pairs of buffers alive at once per buffer, placement sweeps in schedule order
#: alone (``_sweep``) instead of comparing two greedy orders over every pair.
MAX_PAIRS_PER_BUFFER = 64


def place(sizes: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> tuple[list[int], int]:
    """Offsets for buffers of ``sizes`` alive over ``[start, end]`` such that no two alive at once
    overlap, and the arena size: the better of greedy by size and greedy in schedule order (the
    latter alone past ``MAX_PAIRS_PER_BUFFER`` pairs alive at once per buffer)."""
    if overlapping_pairs(starts, ends) > MAX_PAIRS_PER_BUFFER * len(sizes):
        return _sweep(sizes, starts, ends)
    conflicts = _conflicts(starts, ends)
    n = range(len(sizes))
    by_size = sorted(n, key=lambda b: (-sizes[b], starts[b] - ends[b], starts[b]))
    by_start = sorted(n, key=lambda b: (starts[b], -sizes[b]))
    best: tuple[list[int], int] | None = None
    for order in (by_size, by_start):
        offsets, arena = _greedy(order, sizes, conflicts)
        if best is None or arena < best[1]:
            best = (offsets, arena)
    return best if best is not None else ([], 0)


def _conflicts(starts: Sequence[int], ends: Sequence[int]) -> list[list[int]]:
    """For each interval, the others it overlaps (a sweep: cost ~ n log n + number of pairs)."""
    conflicts: list[list[int]] = [[] for _ in starts]
    active: list[int] = []
    for b in sorted(range(len(starts)), key=starts.__getitem__):
        active = [c for c in active if ends[c] >= starts[b]]
        for c in active:
            conflicts[b].append(c)
            conflicts[c].append(b)
        active.append(b)
    return conflicts


def overlapping_pairs(starts: Sequence[int], ends: Sequence[int]) -> int:
    """How many pairs of intervals ``[start, end]`` overlap (n log n: each interval counts those
    that started before it, or with it and before it in the list, and have not ended)."""
    ordered_ends = sorted(ends)
    pairs = 0
    for rank, b in enumerate(sorted(range(len(starts)), key=starts.__getitem__)):
        pairs += rank - bisect.bisect_left(ordered_ends, starts[b])  # those that end before it starts began earlier
    return pairs


def _sweep(sizes: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> tuple[list[int], int]:
    """The greedy in schedule order as an allocator: buffers freed after their last use (their
    neighbouring free blocks joined), each new one placed in the tightest free block that holds it,
    or on top of the live ones."""
    offsets = [0] * len(sizes)
    free = _FreeBlocks()
    dying: list[tuple[int, int]] = []  # (end, buffer) of the live buffers
    arena = 0
    for b in sorted(range(len(sizes)), key=lambda b: (starts[b], -sizes[b])):
        while dying and dying[0][0] < starts[b]:
            c = heapq.heappop(dying)[1]
            free.release(offsets[c], sizes[c])
        if sizes[b] == 0:
            continue
        offsets[b] = free.take(sizes[b])
        heapq.heappush(dying, (ends[b], b))
        arena = max(arena, offsets[b] + sizes[b])
    return offsets, arena


class _FreeBlocks:
    """The free byte ranges below the top of the live buffers, best fit first, joined when adjacent."""

    def __init__(self) -> None:
        self.top = 0
        self.by_size: list[tuple[int, int]] = []  # (size, offset), sorted
        self.end_at: dict[int, int] = {}  # offset -> end of the free block starting there
        self.start_at: dict[int, int] = {}  # end -> offset of the free block ending there

    def take(self, size: int) -> int:
        at = bisect.bisect_left(self.by_size, (size, -1))
        if at == len(self.by_size):
            self.top += size
            return self.top - size
        gap, offset = self.by_size.pop(at)
        self._forget(offset, offset + gap, listed=False)
        if gap > size:
            self._add(offset + size, offset + gap)
        return offset

    def release(self, offset: int, size: int) -> None:
        lo, hi = offset, offset + size
        if hi in self.end_at:  # the free block after it
            after = self.end_at[hi]
            self._forget(hi, after)
            hi = after
        if lo in self.start_at:  # the free block before it
            before = self.start_at[lo]
            self._forget(before, lo)
            lo = before
        if hi == self.top:
            self.top = lo
        else:
            self._add(lo, hi)

    def _add(self, lo: int, hi: int) -> None:
        bisect.insort(self.by_size, (hi - lo, lo))
        self.end_at[lo], self.start_at[hi] = hi, lo

    def _forget(self, lo: int, hi: int, listed: bool = True) -> None:
        if listed:
            del self.by_size[bisect.bisect_left(self.by_size, (hi - lo, lo))]
        del self.end_at[lo], self.start_at[hi]


def _greedy(order: Sequence[int], sizes: Sequence[int], conflicts: list[list[int]]) -> tuple[list[int], int]:
    """Place buffers in ``order``, each in the tightest gap left by its placed conflicts."""
    offsets: list[int] = [-1] * len(sizes)
    offsets_array = np.full(len(sizes), -1, np.int64)  # the same, for the vectorized search
    # int64 holds every offset unless the sizes add up past it (a plan for shapes no machine has,
    # which the pure-Python search still places)
    vectorize = sum(sizes) < 2**62
    sizes_array = np.asarray(sizes, np.int64) if vectorize else None
    arena = 0
    for b in order:
        size = sizes[b]
        if size == 0:
            offsets[b] = 0
            continue
        others = conflicts[b]
        if sizes_array is not None and len(others) > _VECTOR_ABOVE:
            offset = _tightest_gap_vectorized(size, np.asarray(others), offsets_array, sizes_array)
        else:
            offset = _tightest_gap(size, sorted((offsets[c], offsets[c] + sizes[c]) for c in others if offsets[c] >= 0))
        offsets[b] = offset
        if vectorize:
            offsets_array[b] = offset
        arena = max(arena, offset + size)
    return offsets, arena


#: Conflict lists longer than this search their gaps with numpy (long-lived values of big graphs).
_VECTOR_ABOVE = 48


def _tightest_gap(size: int, placed: Sequence[tuple[int, int]]) -> int:
    """The lowest offset of the smallest gap of at least ``size`` bytes between the byte ranges
    ``placed`` (sorted by start), or the top of them."""
    best_offset, best_gap, top = -1, -1, 0
    for lo, hi in placed:
        gap = lo - top
        if gap >= size and (best_gap < 0 or gap < best_gap):
            best_offset, best_gap = top, gap
        top = max(top, hi)
    return top if best_offset < 0 else best_offset


def _tightest_gap_vectorized(size: int, others: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> int:
    """``_tightest_gap`` over the placed buffers among ``others``, with numpy."""
    lo = offsets[others]
    placed = lo >= 0
    lo, hi = lo[placed], lo[placed] + sizes[others[placed]]
    if lo.size == 0:
        return 0
    by_start = np.argsort(lo, kind="stable")
    lo, hi = lo[by_start], hi[by_start]
    tops = np.maximum.accumulate(hi)
    below = np.concatenate(([0], tops[:-1]))  # the top of everything placed below each range
    gaps = lo - below
    fits = np.flatnonzero(gaps >= size)
    if fits.size == 0:
        return int(tops[-1])
    return int(below[fits[np.argmin(gaps[fits])]])
