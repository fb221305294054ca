"""Analyses of graphs that every consumer shares: storage and liveness, aliasing, same-element reads,
and the legality of kernels. The interpreter, the verifier, fusion, the memory plan and the executor
all ask these questions; each is answered here once.

- ``Liveness(graph)``: over a graph in schedule order, the value owning each value's storage
  (views share their base's), the first and last node at which each storage is in use, the
  storages a graph output escapes through, and per node the values an executor may drop after it
  (``dead_after``). ``views``/``constant_views``: the values that may share memory with given ones.
- ``pointwise_inputs(body)`` / ``reads_at_own_index(node, source, result)``: where a kernel reads an
  input only at the element it writes (so an output may take that input's memory).
- Kernel legality (``kernel_legality``, and the pieces fusion combines incrementally): which nodes
  make a legal ``elementwise`` or ``reduction`` kernel body (see ``kiln.ir.graph``):

  * every reduction reduces the same trailing axes (at least one) of the same shape, the *domain*;
    with no reduction, the domain is the one shape of the outputs;
  * an output is a full value (the domain's shape) or, with reductions, a *row value*: the outer
    shape with up to ``k`` trailing 1s (``k`` reduced axes); constants in a body are 0-d;
  * every other value *fits* (broadcasts to the domain, or is a row value) or reaches the domain
    by index remapping: each reader is a view, or an elementwise node whose result reaches it so
    (``remapped``);
  * a value computed from a reduction is read at its own row (``misread_row``): broadcast only at
    equal rank (``(n, 1)`` against ``(n, m)``, never ``(n,)`` against ``(n, n)``, which would read
    row ``j`` at column ``j``), reshaped only between row shapes, never permuted or sliced.

>>> from kiln.ir.graph import GraphBuilder
>>> from kiln.ir.types import TensorType
>>> from kiln.ir.dtypes import float32
>>> b = GraphBuilder()
>>> x = b.input(TensorType((2, 3), float32))
>>> t = b.node("permute", [x], {"perm": (1, 0)})
>>> y = b.node("exp", [t])
>>> live = Liveness(b.build([y]))
>>> live.root[t] is x, live.end[x], [[v.id for v in d] for d in live.dead_after()]
(True, 1, [[0], [1]])
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .graph import BODY_REDUCE_OPS, BODY_VIEW_OPS, CONSTANT, KERNEL, Graph, Node, Value, body_inputs_outputs
from .primitives import ELEMENTWISE, PRIMITIVES
from .types import Dim

#: A shape: concrete sizes, or symbolic ones (``Sym``) where a graph leaves them open.
Shape = tuple[Dim, ...]


#: The ops whose result shares its first input's memory (PyTorch's view ops).
_VIEW_OPS = frozenset(name for name, prim in PRIMITIVES.items() if prim.is_view)


def is_view(node: Node) -> bool:
    """Whether ``node``'s result shares its first input's memory (PyTorch's view ops)."""
    return node.op in _VIEW_OPS


# ----------------------------------------------------------------------------- storage and liveness
class Liveness:
    """Storage and lifetimes of a graph's values, by node index in schedule order.

    ``root[v]`` is the value owning ``v``'s storage (``v`` itself unless ``v`` is a view);
    ``start[r]``/``end[r]`` (roots only) the first and last node index at which ``r``'s storage is
    in use (inputs: -1); ``escaped`` the roots that a graph output is or views; ``producer[v]`` the
    node defining ``v``.
    """

    def __init__(self, graph: Graph) -> None:
        self._graph = graph
        root: dict[Value, Value] = {v: v for v in graph.inputs}
        start: dict[Value, int] = dict.fromkeys(graph.inputs, -1)
        end: dict[Value, int] = dict.fromkeys(graph.inputs, -1)
        producer: dict[Value, Node] = {}
        views = _VIEW_OPS
        for i, node in enumerate(graph.nodes):
            for v in node.inputs:
                end[root[v]] = i  # nodes come in order: the last assignment is the last use
            if node.op in views:
                out = node.outputs[0]
                producer[out] = node
                root[out] = root[node.inputs[0]]
                continue
            for out in node.outputs:
                producer[out] = node
                root[out] = out
                start[out] = end[out] = i
        self.root, self.start, self.end, self.producer = root, start, end, producer
        self.escaped: set[Value] = {root[v] for v in graph.outputs}

    def roots(self) -> Iterable[Value]:
        """Every value owning storage, in definition order."""
        return self.start.keys()

    def views(self, roots: Iterable[Value]) -> dict[Value, list[Value]]:
        """Per root of ``roots``: the values over its storage, itself first, then its views
        (transitively) in definition order."""
        sharing: dict[Value, list[Value]] = {r: [r] for r in roots}
        for v, r in self.root.items():
            if v is not r and r in sharing:
                sharing[r].append(v)
        return sharing

    def aliases(self, inputs: bool = False) -> set[Value]:
        """The values that may share memory with a constant array (or with an input, if ``inputs``):
        the constants themselves and their views. Other nodes' outputs are memory of their own
        (executors copy an extern's result that aliases an argument; kernels write fresh arrays)."""
        sources = {node.outputs[0] for node in self._graph.nodes if node.op == CONSTANT}
        if inputs:
            sources.update(self._graph.inputs)
        if not sources:
            return sources
        return {v for v, r in self.root.items() if r in sources}

    def dead_after(self, keep: Collection[Value] = ()) -> list[tuple[Value, ...]]:
        """Per node (aligned with ``graph.nodes``), the values no later node reads: an executor
        drops its reference to them right after that node runs (a view keeps its base's memory
        alive by itself, so this is per value, not per storage).

        A value nothing reads dies where it is defined; inputs and constants nothing reads die at
        the first node that runs. Constant nodes never run (executors hold their arrays from the
        start), so their lists are empty. Graph outputs and the values of ``keep`` (an executor's
        arena views) never die.
        """
        nodes = self._graph.nodes
        dead: list[list[Value]] = [[] for _ in nodes]
        first = next((i for i, node in enumerate(nodes) if node.op != CONSTANT), None)
        if first is None:
            return [()] * len(nodes)
        last: dict[Value, int] = dict.fromkeys(self._graph.inputs, first)
        for i, node in enumerate(nodes):
            defined = first if node.op == CONSTANT else i
            for v in node.outputs:
                last[v] = defined
            for v in node.inputs:
                last[v] = i
        for v in (*self._graph.outputs, *keep):
            last.pop(v, None)
        for v, i in last.items():
            dead[i].append(v)
        return [tuple(d) for d in dead]


def constant_views(graph: Graph, inputs: bool = False) -> set[Value]:
    """``Liveness(graph).aliases(inputs=inputs)``: the values that may share memory with a constant."""
    return Liveness(graph).aliases(inputs=inputs)


# ----------------------------------------------------------------------------- same-element reads
def pointwise_from(body: Graph, start: Value, domain: Shape) -> bool:
    """Whether every value computed from ``start`` in ``body`` is elementwise at the domain's shape,
    transitively: then the kernel reads ``start`` only at the element it is computing. (A view
    anywhere downstream, even of an elementwise result, re-indexes ``start`` itself.)"""
    derived = {start}
    for node in body.nodes:
        if not any(v in derived for v in node.inputs):
            continue
        prim = PRIMITIVES.get(node.op)
        if prim is None or prim.kind not in ELEMENTWISE or any(v.type.shape != domain for v in node.outputs):
            return False
        derived.update(node.outputs)
    return True


def pointwise_inputs(body: Graph) -> frozenset[int]:
    """The positions of ``body``'s inputs (an elementwise body) read only at the element each
    output writes: of the domain's shape, and everything computed from them elementwise."""
    if not body.outputs:
        return frozenset()
    domain = body.outputs[0].type.shape
    return frozenset(p for p, v in enumerate(body.inputs) if v.type.shape == domain and pointwise_from(body, v, domain))


def pointwise_kind(node: Node) -> bool:
    """Whether kernel ``node``'s kind computes each output element from the same element of the inputs
    (``KernelKind.pointwise``)."""
    from .kernel_kinds import kernel_kind  # noqa: PLC0415 - the kinds' rules build on this module

    kind = kernel_kind(node.attrs.get("kind"))
    return kind is not None and kind.pointwise


def reads_at_own_index(node: Node, source: Value, result: Value) -> bool:
    """Whether kernel ``node`` reads ``source`` only at the index where it writes ``result``: both in
    the same elementwise body (one member of a horizontal kernel), of one shape, and everything the
    body computes from ``source`` is elementwise at that shape. A view or broadcast anywhere
    downstream (``t = a.pow(2).T``) makes the generated loop read ``source`` at another element,
    which an in-place write may have overwritten already."""
    if node.op != KERNEL or not pointwise_kind(node) or source.type.shape != result.type.shape:
        return False
    for body, inputs, outputs in body_inputs_outputs(node):
        if result in outputs and source in inputs:
            return pointwise_from(body, body.inputs[inputs.index(source)], result.type.shape)
    return False


# ----------------------------------------------------------------------------- kernel legality
#: A kernel's iteration space: its domain and, for a reduction kernel, the shapes of its row values.
Space = tuple[Shape, frozenset]
#: A kernel's reductions: the shape they reduce and their axes (None: no reduction).
ReduceSignature = tuple[Shape, tuple[int, ...]] | None


#: What a node may be in a kernel body (``body_role``).
ELEMENTWISE_ROLE, VIEW_ROLE, REDUCE_ROLE = "elementwise", "view", "reduce"


def body_role(op: str) -> str | None:
    """What a node of ``op`` may be in a kernel body: an elementwise primitive, a view (index
    remapping), a reduction (in a reduction body, of trailing axes), or None (never in a body;
    constants, which a body may hold 0-d, aside)."""
    prim = PRIMITIVES.get(op)
    if prim is None:
        return None
    if prim.kind in ELEMENTWISE:
        return ELEMENTWISE_ROLE
    if op in BODY_VIEW_OPS:
        return VIEW_ROLE
    return REDUCE_ROLE if op in BODY_REDUCE_OPS else None


def trailing_axes(axes: Sequence[int], ndim: int) -> bool:
    """Whether ``axes`` (sorted) are the last ``len(axes) >= 1`` axes of an ``ndim``-d input."""
    k = len(axes)
    return k > 0 and tuple(axes) == tuple(range(ndim - k, ndim))


def broadcasts_to(shape: Shape, domain: Shape) -> bool:
    """Whether ``shape`` broadcasts to exactly ``domain`` (numpy's right-aligned rule)."""
    if shape == domain:  # most of fusion's questions (DCGAN's fuse: 39.7 against 41.6 ms of CPU, medians)
        return True
    if len(shape) > len(domain):
        return False
    offset = len(domain) - len(shape)
    return all(d == 1 or d == domain[offset + i] for i, d in enumerate(shape))


def reduce_signature(reduces: Sequence[Node]) -> ReduceSignature | bool:
    """The common (shape, axes) of ``reduces``; None when there are none, False when they differ."""
    if not reduces:
        return None
    signatures = {(n.inputs[0].type.shape, tuple(n.attrs["axes"])) for n in reduces}
    return signatures.pop() if len(signatures) == 1 else False


def join_signatures(x: ReduceSignature | bool, y: ReduceSignature | bool) -> ReduceSignature | bool:
    """The reduce signature of the union of two node sets: the common one, or False when they differ."""
    if x is None:
        return y
    if y is None or x == y:
        return x
    return False


def kernel_space(signature: ReduceSignature | bool, output_shapes: Collection[Shape]) -> Space | None:
    """The space of a kernel whose reductions have ``signature`` and whose outputs have these shapes,
    or None when they make no kernel (no outputs, outputs of different shapes, mixed reductions)."""
    if isinstance(signature, bool) or not output_shapes:  # False: reductions that differ
        return None
    if signature is None:
        if len(output_shapes) != 1:
            return None
        return next(iter(output_shapes)), frozenset()
    domain, axes = signature
    outer = domain[: len(domain) - len(axes)]
    rows = frozenset(outer + (1,) * j for j in range(len(axes) + 1))
    if any(shape != domain and shape not in rows for shape in output_shapes):
        return None
    return domain, rows


def fits(v: Value, space: Space) -> bool:
    """Whether ``v`` is read at the domain element's own index (broadcast) or is a row value."""
    return v.type.shape in space[1] or broadcasts_to(v.type.shape, space[0])


def unremapped(
    misfits: Sequence[Value],
    inside: Callable[[Node], bool],
    users: Mapping[Value, list[Node]],
    outputs: Collection[Value],
) -> Value | None:
    """The first value of ``misfits`` (readers before what they read) that is not an output and
    does not reach the domain by index remapping (every reader inside is a view, or an elementwise
    node, the value broadcasting to its result, whose result does); None when every one does."""
    remapped: set[Value] = set()
    for v in misfits:
        if v in outputs:
            continue
        readers = [u for u in users.get(v, ()) if inside(u)]
        if readers and all(_remaps(u, v, remapped) for u in readers):
            remapped.add(v)
        else:
            return v
    return None


def _remaps(reader: Node, v: Value, remapped: set[Value]) -> bool:
    if reader.op in BODY_VIEW_OPS:
        return True
    out = reader.outputs[0]
    return reader.op not in BODY_REDUCE_OPS and out in remapped and broadcasts_to(v.type.shape, out.type.shape)


def misread_row(
    starts: Iterable[Value],
    inside: Callable[[Node], bool],
    users: Mapping[Value, list[Node]],
    space: Space,
    known: Container[Value] = frozenset(),
) -> tuple[Value | None, set[Value]]:
    """Whether values computed from a reduction are read at their own row (see the module docstring):
    walking from ``starts`` (values computed from a reduction: the reductions' outputs) through the
    readers inside, the first value read at another row (None if none) and the values found to be
    computed from a reduction on the way. Values of ``known`` were walked before: their readers are
    not walked again unless they are among ``starts`` (fusion's merges walk only what is new)."""
    rows = space[1]
    pending = list(starts)
    derived: set[Value] = set(pending)
    while pending:
        v = pending.pop()
        for reader in users.get(v, ()):
            if not inside(reader):
                continue
            out = reader.outputs[0]
            if reader.op in BODY_REDUCE_OPS:
                ok = True  # reads the full domain at the domain's own index
            elif reader.op == "reshape":
                ok = v.type.shape in rows and out.type.shape in rows
            elif reader.op in BODY_VIEW_OPS and reader.op != "expand":
                ok = False
            else:  # elementwise or expand: right-aligned broadcasting keeps the row only at equal rank
                ok = len(v.type.shape) == len(out.type.shape) or all(d == 1 for d in v.type.shape)
            if not ok:
                return v, derived
            if out not in derived and out not in known:
                derived.add(out)
                pending.append(out)
    return None, derived


@dataclass(frozen=True)
class Legality:
    """``kernel_legality``'s answer: the kernel's kind when legal, else what is wrong with it."""

    kind: str | None
    problem: str | None = None


def kernel_legality(
    nodes: Sequence[Node],
    outputs: Sequence[Value],
    users: Mapping[Value, list[Node]],
    inside: Callable[[Node], bool] | None = None,
) -> Legality:
    """Whether ``nodes`` (in order) make a legal kernel whose outputs are ``outputs``: its kind
    (``"elementwise"`` or ``"reduction"``) or the problem. ``users`` lists each value's readers;
    only those ``inside(reader)`` (default: among ``nodes``) count. The verifier checks every
    kernel body with this; fusion forms kernels from the same pieces, merged incrementally."""
    if inside is None:
        members = set(nodes)
        inside = members.__contains__
    for node in nodes:
        if node.op == CONSTANT and node.outputs[0].type.shape != ():
            return Legality(None, f"constant %{node.outputs[0].id} in a body must be 0-d")
    reduces = [node for node in nodes if node.op in BODY_REDUCE_OPS]
    for node in reduces:
        axes, shape = tuple(node.attrs["axes"]), node.inputs[0].type.shape
        if not trailing_axes(axes, len(shape)):
            return Legality(None, f"a reduction kernel reduces trailing axes, got axes {axes} of {list(shape)}")
    signature = reduce_signature(reduces)
    if signature is False:
        domain, axes = reduces[0].inputs[0].type.shape, tuple(reduces[0].attrs["axes"])
        other = next(n for n in reduces if (n.inputs[0].type.shape, tuple(n.attrs["axes"])) != (domain, axes))
        return Legality(None, f"every reduce of a body reduces axes {axes} of shape {list(domain)}, got axes "
                              f"{tuple(other.attrs['axes'])} of {list(other.inputs[0].type.shape)} "
                              f"(%{other.outputs[0].id})")  # fmt: skip
    if not outputs:
        return Legality(None, "a kernel makes at least one output")
    space = kernel_space(signature, {v.type.shape for v in outputs})
    if space is None:
        return Legality(None, _output_problem(signature, outputs))
    values = [v for node in reversed(nodes) for v in node.outputs]  # readers before what they read
    seen = set(values)
    for node in nodes:
        for v in node.inputs:
            if v not in seen:
                seen.add(v)
                values.append(v)
    domain, rows = space
    bad = unremapped([v for v in values if not fits(v, space)], inside, users, set(outputs))
    if bad is not None:
        expected = f"a shape that broadcasts to {list(domain)}"
        if reduces:
            expected = f"a full value (broadcasting to {list(domain)}) or a row value {_outer(space)}"
        return Legality(None, f"%{bad.id} has shape {list(bad.type.shape)}, expected {expected} (or a value that "
                              "reaches it through view nodes)")  # fmt: skip
    misread, _ = misread_row([v for node in reduces for v in node.outputs], inside, users, space)
    if misread is not None:
        return Legality(
            None,
            f"%{misread.id} (shape {list(misread.type.shape)}) is computed from a reduction but "
            f"read at another row's index: row values broadcast at equal rank, as {_outer(space)}",
        )
    return Legality("reduction" if reduces else "elementwise")


def _outer(space: Space) -> str:
    domain, rows = space
    outer = min(rows, key=len)
    return f"{list(outer)} (with up to {len(domain) - len(outer)} trailing 1s)"


def _output_problem(signature: ReduceSignature | bool, outputs: Sequence[Value]) -> str:
    if signature is None:
        domain = outputs[0].type.shape
        other = next(v for v in outputs if v.type.shape != domain)
        return (f"every output of an elementwise body has the domain's shape {list(domain)}, got %{other.id} of "
                f"shape {list(other.type.shape)}")  # fmt: skip
    assert not isinstance(signature, bool)
    space = kernel_space(signature, {signature[0]})
    assert space is not None
    other = next(v for v in outputs if not (v.type.shape == space[0] or v.type.shape in space[1]))
    return (f"an output of a reduction body is a full value {list(space[0])} or a row value {_outer(space)}, "
            f"got %{other.id} of shape {list(other.type.shape)}")  # fmt: skip
