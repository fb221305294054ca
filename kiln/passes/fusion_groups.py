"""Vertical fusion's grouping: union-find over the graph's nodes, groups merged when legal and acyclic.

Every node starts as a group of its own (extern nodes and constants stay so). Walking the graph
in order, each fusable node's group tries to merge with the group of each fusable producer; a
merge is kept when the union has at most ``MAX_KERNEL_NODES`` nodes, is still a legal kernel
(``kiln.ir.analysis``) and no path leaves it and comes back. The checks cost what the *smaller* group
and the searched region cost, never the size of the larger group, so a chain of ten thousand
nodes groups in linear time:

- Each group keeps a summary: the values it makes that something outside reads (its outputs,
  with the number of reading edges outside), the outer values it reads (with edge counts), the
  number of outputs per shape, its reductions' signature, its space (domain and row shapes) and
  its *misfits* (values that do not fit the space and must be reached by index remapping). A
  merge combines the smaller summary into the larger: the values at the interface of the two
  stop being outputs when no reader is left outside. Only when the union's space differs from
  the larger group's are the misfits recomputed from every member.
- The groups form a DAG (groups as nodes, values as edges), kept in a topological order (a
  key per group, ``fusion_order``). A merge of ``a`` into its consumer ``b`` makes a cycle exactly when
  some other group lies on a path from ``a`` to ``b``, that is between their keys. Two searches
  run in lockstep over that region, forward from ``a`` and backward from ``b``, and the first to
  finish decides: it met the other end (a cycle), or it holds every descendant of ``a`` (every
  ancestor of ``b``) in the region, which then moves to just after ``b`` (just before ``a``) while
  the union takes ``b``'s key (``a``'s). So a merge costs the smaller side, not the region: in an
  unrolled RNN's training step, a forward value fused into its backward kernel has the whole
  rest of the program as descendants but a few ancestors, and a one-sided search (Pearce and
  Kelly's, 2006, needs both sides) made the grouping quadratic in the loop's length. Each side
  takes in at most ``MAX_ORDER_SEARCH`` groups: a merge that needs more is declined. No search
  is needed when ``b`` is ``a``'s only consumer or ``a`` is ``b``'s only producer (a chain), and a
  merge that failed is not tried again while neither group has grown.

A declined merge says why (``fusion_refusals``): ``_try_merge`` returns the kind and details of its
refusal, and ``refusals`` keeps, per pair of groups still apart at the end, the last one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ..ir.analysis import (
    Shape,
    Space,
    fits,
    join_signatures,
    kernel_space,
    misread_row,
    reduce_signature,
    trailing_axes,
    unremapped,
)
from ..ir.graph import BODY_REDUCE_OPS, Graph, Node, Value
from .fusion_order import GroupOrder
from .fusion_refusals import Refusal
from .fusion_rules import EXTERN, MAX_KERNEL_NODES, VIEW, classify

#: Why ``_try_merge`` declined: a kind of ``fusion_refusals.WORDING`` and its details.
Declined = tuple[str, tuple]

#: The most groups each side of a merge's cycle search takes in. Past it the merge is declined
#: ("far"), so a merge costs at most this much whatever the program's length: an exact answer
#: can cost the length of the program (an unrolled RNN's gate and its backward kernel, with the
#: rest of the loop between them), and so fusion would be quadratic in it. The merges that need
#: more are between groups far apart in a long program, where fusing saves one write and read.
#: The 2-layer LSTM LM at T=100 fuses into the same 422 kernels with 256, 128, 64 or 32, in 1.18,
#: 1.07, 0.78 and 0.73 s.
MAX_ORDER_SEARCH = 64


class _Group:
    """A group's summary (see the module docstring); ``members`` are unordered until the end."""

    __slots__ = ("members", "out", "reads", "shapes", "signature", "derived", "space", "misfits")

    def __init__(self, node: Node, out: dict[Value, int], fusable: bool) -> None:
        self.members = [node]
        self.out = out  # value made here -> reading edges outside (+1 for a graph output)
        self.reads: dict[Value, int] = {}  # outer value -> reading edges from here
        for v in node.inputs:
            self.reads[v] = self.reads.get(v, 0) + 1
        self.shapes: dict[Shape, int] = {}  # output shape -> number of outputs
        for v in out:
            self.shapes[v.type.shape] = self.shapes.get(v.type.shape, 0) + 1
        reduces = [node] if node.op in BODY_REDUCE_OPS else []
        self.signature = reduce_signature(reduces)
        self.derived: set[Value] = set(node.outputs) if reduces else set()  # computed from a reduction
        self.space: Space | None = kernel_space(self.signature, self.shapes.keys()) if fusable else None
        self.misfits: set[Value] = set()
        if self.space is not None:
            self.misfits = {v for v in (*node.outputs, *node.inputs) if not fits(v, self.space)}


class Grouping:
    """The kernels of ``graph`` after vertical fusion: ``Grouping(graph).groups()``."""

    def __init__(self, graph: Graph, supports: Callable[[Node], bool] | None = None) -> None:
        self.nodes = graph.nodes
        self.index = {node: i for i, node in enumerate(self.nodes)}
        self.users: dict[Value, list[Node]] = {}
        self.producer: dict[Value, int] = {}
        for i, node in enumerate(self.nodes):
            for v in node.inputs:
                self.users.setdefault(v, []).append(node)
            for v in node.outputs:
                self.producer[v] = i
        outputs = set(graph.outputs)
        self.classes = classify(self.nodes, self.users, outputs, supports)
        self.fusable = [self.classes[node] != EXTERN for node in self.nodes]
        self.parent = list(range(len(self.nodes)))
        self.order = GroupOrder(len(self.nodes))  # the groups' topological order
        self.group: dict[int, _Group] = {}
        self.refusals: list[Refusal] = []  # after ``groups()``: why the groups still apart did not merge
        for i, node in enumerate(self.nodes):
            out = {v: len(self.users.get(v, ())) + (v in outputs) for v in node.outputs}
            self.group[i] = _Group(node, {v: n for v, n in out.items() if n}, self.fusable[i])

    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:  # path compression
            self.parent[i], i = root, self.parent[i]
        return root

    def groups(self) -> list[list[Node]]:
        """The kernels' node lists (graph order), after vertical fusion; views alone are left out."""
        # Repeat until nothing merges: a node that joined a kernel late may let that kernel take
        # in a producer it could not take before (e.g. a view whose reader joined after it).
        merged = True
        failed: dict[tuple[int, int, int, int], tuple[int, int, Declined]] = {}
        while merged:
            merged = False
            for i, node in enumerate(self.nodes):
                if not self.fusable[i]:
                    continue
                for v in node.inputs:
                    p = self.producer.get(v)
                    if p is None or not self.fusable[p]:
                        continue
                    a, b = self.find(p), self.find(i)
                    if a == b:
                        continue
                    # A failed merge fails again while neither group has changed (groups only grow).
                    attempt = (a, b, len(self.group[a].members), len(self.group[b].members))
                    if attempt in failed:
                        continue
                    declined = self._try_merge(a, b)
                    if declined is None:
                        merged = True
                    else:
                        failed[attempt] = (a, b, declined)
        self.refusals = self._reductions_kept_out() + self._final_refusals(failed.values())
        roots = {self.find(i) for i in range(len(self.nodes)) if self.fusable[i]}
        groups = [sorted(self.group[r].members, key=self.index.__getitem__) for r in roots]
        groups.sort(key=lambda g: self.index[g[0]])
        return [g for g in groups if any(self.classes[node] != VIEW for node in g)]

    def space(self, group: list[Node]) -> Space | None:
        """The space (domain and row shapes) of a group ``groups()`` returned (None: none)."""
        return self.group[self.find(self.index[group[0]])].space

    def _reductions_kept_out(self) -> list[Refusal]:
        """The reductions that stay extern for their axes (``fusion_rules``: not trailing ones)."""
        return [
            Refusal("axes", node.outputs[0], None, (tuple(node.attrs["axes"]), node.inputs[0].type.shape))
            for node, fusable in zip(self.nodes, self.fusable, strict=True)
            if not fusable
            and node.op in BODY_REDUCE_OPS
            and not trailing_axes(node.attrs["axes"], node.inputs[0].type.ndim)
        ]

    def _final_refusals(self, failed) -> list[Refusal]:
        """The refusals between groups still apart at the end (``failed``: ``(a, b, declined)`` in the
        order they came), the last one of each pair of groups; each side named by a value it makes."""
        last: dict[tuple[int, int], Declined] = {}
        for a, b, declined in failed:
            ra, rb = self.find(a), self.find(b)
            if ra != rb:
                last[ra, rb] = declined
        refusals = []
        for (ra, rb), (kind, detail) in last.items():
            if kind == "cycle":  # the group on the path, by a value of its own (the last pass saw these groups)
                via = self._first_on_path(ra, rb)
                detail = () if via is None else (self._value_of(via),)
            refusals.append(Refusal(kind, self._value_of(ra), self._value_of(rb), detail))
        return refusals

    def _value_of(self, root: int) -> Value:
        """A value the group of ``root`` makes, which names it once fused: an output if it has one."""
        return next(iter(self.group[root].out), self.nodes[root].outputs[0])

    # ------------------------------------------------------------------ one merge
    def _try_merge(self, a: int, b: int) -> Declined | None:
        """Merge group ``a`` into its consumer ``b`` if the union is a legal, acyclic kernel; else
        return why not (a kind of ``fusion_refusals.WORDING`` and its details, built only here)."""
        ga, gb = self.group[a], self.group[b]
        if ga.space is None or gb.space is None:
            return "no domain", (0 if ga.space is None else 1,)
        if len(ga.members) + len(gb.members) > MAX_KERNEL_NODES:
            return "size", (len(ga.members) + len(gb.members), MAX_KERNEL_NODES)
        small, large = (a, b) if len(ga.members) <= len(gb.members) else (b, a)
        gs, gl = self.group[small], self.group[large]
        # The interface: values one group makes and the other reads (edges that become internal).
        interface = [(v, n, gl.out[v] == n) for v, n in gs.reads.items() if v in gl.out]
        interface += [(v, gl.reads[v], n == gl.reads[v]) for v, n in gs.out.items() if v in gl.reads]
        gone = {v for v, _, last in interface if last}  # no reader left outside: no longer outputs
        shapes = dict(gl.shapes)  # a legal group's outputs have a few shapes: cheap to copy
        for shape, n in gs.shapes.items():
            shapes[shape] = shapes.get(shape, 0) + n
        for v in gone:
            shapes[v.type.shape] -= 1
            if not shapes[v.type.shape]:
                del shapes[v.type.shape]
        signature = join_signatures(ga.signature, gb.signature)
        space = kernel_space(signature, shapes.keys())
        if space is None:
            if signature is False:
                return "reductions", (ga.signature, gb.signature)
            return ("outputs", (tuple(shapes),)) if signature is None else ("row outputs", (signature, tuple(shapes)))
        misfits = self._misfits(large, small, space)
        stray = self._unremapped(misfits, (a, b), gone)
        if stray is not None:
            return "remap", (stray, space[0])
        derived: set[Value] = set()
        if signature is not None:  # walk what the merge joins: the interface's values computed from a reduction
            starts = [v for v, _, _ in interface if v in gs.derived or v in gl.derived]
            known = _Union(gs.derived, gl.derived)
            misread, derived = misread_row(starts, self._inside((a, b)), self.users, space, known)
            if misread is not None:
                return "row read", (misread,)
        unordered = self._reorder(a, b, large)
        if unordered is not None:
            return unordered
        for v, n in gs.out.items():
            gl.out[v] = n
        for v, n in gs.reads.items():
            gl.reads[v] = gl.reads.get(v, 0) + n
        for v, n, last in interface:
            if last:
                del gl.out[v]
            else:
                gl.out[v] -= n
            del gl.reads[v]
        gl.members += gs.members
        gl.derived |= gs.derived
        gl.derived |= derived
        gl.shapes, gl.signature, gl.space, gl.misfits = shapes, signature, space, misfits
        self.parent[small] = large
        del self.group[small]
        return None

    def _misfits(self, large: int, small: int, space: Space) -> set[Value]:
        gl, gs = self.group[large], self.group[small]
        if gl.space == space and gs.space == space:
            return gl.misfits | gs.misfits
        values = {v for g in (gl, gs) for node in g.members for v in (*node.inputs, *node.outputs)}
        return {v for v in values if not fits(v, space)}

    def _unremapped(self, misfits: set[Value], roots: tuple[int, int], gone: set[Value]) -> Value | None:
        """The first misfit of the union (readers before what they read) that does not reach the
        domain by remapping; None when each one does."""
        if not misfits:
            return None

        def order(v: Value) -> tuple[int, int]:
            p = self.producer.get(v)
            return (0, -p) if p is not None and self.find(p) in roots else (1, 0)

        outputs = {v for v in misfits if v not in gone and any(v in self.group[r].out for r in roots)}
        return unremapped(sorted(misfits, key=order), self._inside(roots), self.users, outputs)

    def _inside(self, roots: tuple[int, int]):
        """Membership in the union of the groups of ``roots``."""
        return lambda node: self.find(self.index[node]) in roots

    # ------------------------------------------------------------------ the order of the groups
    def _successors(self, root: int) -> Iterator[int]:
        for v in self.group[root].out:
            for node in self.users.get(v, ()):
                yield self.find(self.index[node])

    def _predecessors(self, root: int) -> Iterator[int]:
        for v in self.group[root].reads:
            p = self.producer.get(v)
            if p is not None:
                yield self.find(p)

    def _reorder(self, a: int, b: int, merged: int) -> Declined | None:
        """Why not, if a path from ``a`` to its consumer ``b`` may pass through another group; else
        give the union (root ``merged``) a place in the order, moving the smaller side's region."""
        order = self.order
        low, high = order.key[a], order.key[b]
        assert low < high, "the groups' order is not topological"
        # The common cases need no search: when b is a's only consumer, nothing else descends from
        # a, so the union can stand where b stood; when a is b's only producer, where a stood.
        if all(r in (a, b) for r in self._successors(a)):
            order.join(merged, a, b, b)
            return None
        if all(r in (a, b) for r in self._predecessors(b)):
            order.join(merged, a, b, a)
            return None
        found = self._search(a, b)
        if found == "cycle":
            return "cycle", ()  # the group on the path is found for the refusals that remain (_final_refusals)
        if found == "far":
            return "far", (MAX_ORDER_SEARCH,)
        assert not isinstance(found, str)
        forward, region = found
        if forward:  # a's descendants in the region go right after b; the union takes b's key
            order.move_after(region, b)
            order.join(merged, a, b, b)
        else:  # b's ancestors in the region go right before a; the union takes a's key
            order.move_before(region, a)
            order.join(merged, a, b, a)
        return None

    def _search(self, a: int, b: int) -> tuple[bool, list[int]] | str:
        """Search forward from ``a`` and backward from ``b`` (within their keys) one step each in
        turn: ``"cycle"`` when a path ``a -> ... -> b`` through another group is found, ``"far"``
        when both sides took in ``MAX_ORDER_SEARCH`` groups without finishing; else, from the search
        that finished first, ``(True, a's descendants)`` or ``(False, b's ancestors)``."""
        key = self.order.key
        low, high = key[a], key[b]
        sides = (
            (True, self._successors, b, lambda r: key[r] > high, [r for r in self._successors(a) if r != b]),
            (False, self._predecessors, a, lambda r: key[r] < low, [r for r in self._predecessors(b) if r != a]),
        )
        seen: tuple[set[int], set[int]] = ({a, b}, {a, b})
        found: tuple[list[int], list[int]] = ([], [])
        for _ in range(MAX_ORDER_SEARCH):
            for side, (forward, step, other_end, outside, stack) in enumerate(sides):
                while stack:  # one group taken in, after any number skipped
                    r = stack.pop()
                    if r == other_end:
                        return "cycle"
                    if r in seen[side] or outside(r):
                        continue
                    seen[side].add(r)
                    found[side].append(r)
                    stack.extend(step(r))
                    break
                else:
                    return forward, found[side]
        return "far"

    def _first_on_path(self, a: int, b: int) -> int | None:
        """A group right after ``a`` on a path from ``a`` to ``b`` through other groups (None: none)."""
        budget = MAX_ORDER_SEARCH  # a refusal's wording is not worth more than a merge's search
        for first in self._successors(a):
            if first in (a, b):
                continue
            seen, stack = set(), [first]
            while stack and budget > 0:
                r = stack.pop()
                if r == b:
                    return first
                if r not in seen and self.order.key[r] <= self.order.key[b]:
                    seen.add(r)
                    budget -= 1
                    stack.extend(self._successors(r))
        return None


class _Union:
    """Membership in either of two sets, without building their union."""

    __slots__ = ("a", "b")

    def __init__(self, a: set[Value], b: set[Value]) -> None:
        self.a, self.b = a, b

    def __contains__(self, v: object) -> bool:
        return v in self.a or v in self.b
