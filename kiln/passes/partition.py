"""Partition a compiled forward and its backward: what the forward saves, what the backward recomputes.

When a compiled call's results need gradients, the backward graph reads forward values (saved:
extra outputs of the forward graph, kept alive from the call until the backward runs). Many of
them are cheap functions of others: the output of a ReLU or a GELU next to its input, a scaled
or shifted copy of a saved tensor, a broadcast bias. Saving both costs memory for the whole time
between forward and backward; recomputing the cheap one inside the backward costs a few
elementwise operations, which the backward's fusion puts into the kernels that read it.

The policy, in topological order of the saved values: a saved value is recomputed instead when it
is made by a chain of at most ``MAX_RECOMPUTE`` elementwise or view nodes from values the
backward has anyway -- values still saved, captured state the backward reads already (a weight
its matmul gradients read: eager autograd saved it too, so reading it adds no hazard of an
in-place change between forward and backward that eager would not raise on), constants. So the saved bytes only go down, each recomputed value costs at most its chain's
elementwise work, and nothing expensive (a matmul, a reduction, random bits, a check) is ever
done twice. Random nodes are extern, never elementwise, so a recomputation never draws new numbers.

A recomputed value may differ from the forward's in its last bit: the backward's kernel is another
kernel, and LLVM may contract ``a * b + c`` into one FMA in one of them only. That is harmless for
arithmetic, not for a decision (a comparison, ``where``'s condition, amax's tie mask, relu's mask,
a sign or a floor): the backward must decide as the forward did -- amax's column whose recomputed
input no longer equals the saved max had no tie at all and divided 0 by 0. So a decision never
reads a rounded recomputation: a saved value that a backward decision reads is recomputed only
through ops that never differ between kernels (views, selections, comparisons: ``Primitive.exact``),
and a decision inside a recomputation reads only such values. Relu's mask and output are still
recomputed from its saved input; a fused ``x * w + b`` that amax compares is saved.

The pass is pure: ``partition`` returns the new forward and backward graphs and which saved
values remain (the frontend renumbers the backward's saved inputs after it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ..ir.analysis import ELEMENTWISE_ROLE, VIEW_ROLE, Liveness, body_role
from ..ir.graph import CONSTANT, Graph, GraphBuilder, Node, Value
from ..ir.primitives import PRIMITIVES
from ..ir.types import is_static

#: The most nodes recomputed for one saved value: beyond it the backward would redo real work.
MAX_RECOMPUTE = 8


def _exact(op: str) -> bool:
    """Whether two kernels always compute ``op`` alike from the same input bits (``Primitive.exact``:
    it selects, compares or converts). Arithmetic may differ: LLVM may contract ``a * b + c`` into
    one FMA in one kernel and not in another (codegen/llvm/flags.py)."""
    prim = PRIMITIVES.get(op)
    return prim is not None and prim.exact


def _step(op: str) -> bool:
    prim = PRIMITIVES.get(op)
    return prim is not None and prim.step


@dataclass(frozen=True)
class Partition:
    forward: Graph  # without the outputs no longer saved; then one output per promoted value
    backward: Graph  # its inputs but those of recomputed values, in order; then one per promoted value
    saved: tuple[int, ...]  # forward output index of each value saved now: the kept ones, then the promoted
    kept: tuple[int, ...]  # which of the original saved values are still saved (their indices)
    promoted: int  # values saved now that were not before (each lets the backward recompute several)
    recomputed: tuple[int, ...]  # which of the original saved values the backward recomputes
    saved_bytes: int  # what the forward saves now
    saved_bytes_before: int  # what it saved before the pass


def _nbytes(value: Value) -> int:
    if not is_static(value.type.shape):  # a symbolic dimension: the size is known per call, not here
        return 0
    return value.type.numel * value.type.dtype.itemsize


def _recomputable(node: Node | None) -> bool:
    return node is not None and (node.op == CONSTANT or body_role(node.op) in (ELEMENTWISE_ROLE, VIEW_ROLE))


def decides(node: Node) -> bool:
    """Whether ``node`` makes a discrete decision from float values (a comparison, a cast to an
    integer, an argmax, a floor...): a last-bit change of its input may change its result wholly."""
    floats = any(u.type.dtype.is_floating_point for u in node.inputs)
    return floats and (_step(node.op) or any(not v.type.dtype.is_floating_point for v in node.outputs))


def _decided(backward: Graph) -> set[Value]:
    """The backward's inputs that a decision of the backward reads, directly or through any nodes."""
    producers = backward.producers()
    stack = [u for node in backward.nodes if decides(node) for u in node.inputs]
    seen: set[Value] = set()
    while stack:
        v = stack.pop()
        if v not in seen:
            seen.add(v)
            stack.extend(producers[v].inputs if v in producers else ())
    return seen.intersection(backward.inputs)


def _walk(
    value: Value, available, producers: dict[Value, Node], exact: bool = False, decisions: bool = True
) -> tuple[list[Node], set[Value]] | None:
    """The recomputable nodes (topological order) between ``value`` and what it is made from, and
    the values it needs that are not ``available`` (made by real work, or arguments); None when the
    walk takes more than MAX_RECOMPUTE nodes, or ``value`` itself is not cheap to make, or a
    decision in it reads a rounded value (the recomputation could decide otherwise than the
    forward did; unless not ``decisions``), or ``exact`` and ``value`` is rounded (a backward
    decision reads it)."""
    order: list[Node] = []
    seen: set[Node] = set()
    missing: set[Value] = set()
    rounded: set[Value] = set()  # made by the walk's nodes with a rounding: maybe not the forward's bits

    def visit(v: Value, root: bool = False) -> bool:
        node = producers.get(v)
        if available(v) and not root:
            return True
        if node is None or not _recomputable(node):
            missing.add(v)
            return True
        if node in seen:
            return True
        seen.add(node)
        if len(seen) > MAX_RECOMPUTE or not all(visit(u) for u in node.inputs):
            return False
        inexact = rounded.intersection(node.inputs)
        if inexact and decisions and decides(node):
            return False
        if inexact or (body_role(node.op) == ELEMENTWISE_ROLE and not _exact(node.op)):
            rounded.update(node.outputs)
        order.append(node)
        return True

    producer = producers.get(value)
    if producer is None or not _recomputable(producer) or producer.op == CONSTANT:  # constants: saved as is
        return None
    if not visit(value, root=True) or (exact and value in rounded):
        return None
    return order, missing


def _promote(saved_values: list[Value], available, producers, changed: set[Value], decided: set[Value]) -> list[Value]:
    """Values worth saving instead of several saved ones: a value that saved values are cheap
    functions of, smaller than those it replaces (GELU's input instead of the intermediates its
    gradient reads). Greedy: the best gain first, until no value gains. Never one of ``changed``
    (memory the call itself writes into later: the backward would read the new values). A value
    of ``decided`` only where its recomputation is exact."""
    covers: dict[Value, set[Value]] = {}
    for v in set(saved_values):
        walk = _walk(v, available, producers, decisions=False)  # what v is made from; checked below
        if walk is None:
            continue
        ancestors = {u for node in walk[0] for u in node.inputs if not available(u)} | walk[1]
        ancestors = {u for u in ancestors if getattr(producers.get(u), "op", None) != CONSTANT}  # recomputed anyway
        ancestors -= changed
        for u in ancestors - {v}:
            again = _walk(v, lambda w, u=u: w is u or available(w), producers, v in decided)
            if again is not None and not again[1]:
                covers.setdefault(u, set()).add(v)
    promoted: list[Value] = []
    covered: set[Value] = set()
    while covers:
        gain, u = max(((sum(map(_nbytes, c - covered)) - _nbytes(u), u) for u, c in covers.items()), key=lambda t: t[0])
        if gain <= 0:
            break
        promoted.append(u)
        covered |= covers.pop(u)
    return promoted


def partition(
    forward: Graph,
    backward: Graph,
    saved: Sequence[int],
    saved_inputs: Sequence[int],
    readable: Mapping[int, int],
    mutated: Collection[int] = (),
) -> Partition:
    """``saved[j]``: the forward output index of saved value j; ``saved_inputs[j]``: the backward
    input reading it; ``readable``: forward input index -> the backward input reading the same
    captured tensor; ``mutated``: the forward inputs the call writes into (their memory, views of
    them included, is never promoted to saved: it holds other values by the time the backward runs)."""
    producers = forward.producers()
    written = {forward.inputs[i] for i in mutated}
    root = Liveness(forward).root
    changed = {v for v in forward.values() if root.get(v, v) in written}
    input_index = {v: i for i, v in enumerate(forward.inputs)}
    original = [forward.outputs[i] for i in saved]
    order = {v: k for k, v in enumerate(forward.values())}

    def can_read(v: Value) -> bool:
        return input_index.get(v, -1) in readable

    # A saved value a backward decision reads (amax's input and result, which its ties compare) is
    # recomputed only bitwise: the backward must decide as the forward did (a tie mask with no tie
    # in a column divided 0 by 0 there).
    read_by_decisions = _decided(backward)
    decided = {original[j] for j, i in enumerate(saved_inputs) if backward.inputs[i] in read_by_decisions}
    promoted = _promote(original, lambda v: v in set(original) or can_read(v), producers, changed, decided)
    candidates = original + promoted  # j < len(original): saved before; the rest: promoted
    kept = set(range(len(candidates)))
    chains: dict[int, list[Node]] = {}
    for j in sorted(range(len(original)), key=lambda j: order[original[j]]):
        still_saved = {candidates[i] for i in kept if i != j}
        available = lambda v, still=still_saved: v in still or can_read(v)  # noqa: E731
        walk = _walk(original[j], available, producers, original[j] in decided)
        if walk is not None and not walk[1]:
            chains[j] = walk[0]
            kept.discard(j)
    before = sum(map(_nbytes, set(original)))
    unused = [i for i in range(len(original), len(candidates)) if i in kept and not _read_by(candidates[i], chains)]
    kept -= set(unused)  # a promoted value no chain ended up reading
    if not chains:
        return Partition(forward, backward, tuple(saved), tuple(range(len(saved))), 0, (), before, before)

    kept_original = sorted(j for j in kept if j < len(original))
    kept_promoted = sorted(j for j in kept if j >= len(original))
    # The forward: the same nodes; the outputs without the dropped ones (unless also a result), then the promoted.
    others = {v for i, v in enumerate(forward.outputs) if i not in set(saved)}
    dropped = {saved[j] for j in chains} - {i for i, v in enumerate(forward.outputs) if v in others}
    outputs = [v for i, v in enumerate(forward.outputs) if i not in dropped]
    index_after = {i: i - sum(d < i for d in dropped) for i in range(len(forward.outputs)) if i not in dropped}
    new_saved = [index_after[saved[j]] for j in kept_original] + list(
        range(len(outputs), len(outputs) + len(kept_promoted))
    )
    outputs += [candidates[j] for j in kept_promoted]
    new_forward = Graph(forward.inputs, forward.nodes, tuple(outputs), forward.constants)

    # The backward: its inputs but the recomputed ones, then the promoted; the chains, then its own nodes.
    b = GraphBuilder()
    b._next_id = 1 + max((v.id for v in backward.values()), default=-1)
    b.constants.update(backward.constants)  # first, so the chains' constants take other names
    recomputed_inputs = {saved_inputs[j] for j in chains}
    b.inputs.extend(v for i, v in enumerate(backward.inputs) if i not in recomputed_inputs)
    remapped = {original[j]: backward.inputs[saved_inputs[j]] for j in kept_original}  # forward -> backward
    remapped.update({candidates[j]: b.input(candidates[j].type) for j in kept_promoted})
    remapped.update({forward.inputs[f]: backward.inputs[i] for f, i in readable.items()})
    env: dict[Value, Value] = {}
    for j in sorted(chains, key=lambda j: order[original[j]]):
        for node in chains[j]:
            if node.outputs[0] in remapped:
                continue
            if node.op == CONSTANT:
                out = b.constant(forward.constants[node.attrs["name"]], node.output.type, node.loc)
            else:
                out = b.node(node.op, [remapped[u] for u in node.inputs], node.attrs, node.output.type, node.loc)
            remapped[node.outputs[0]] = out
        env[backward.inputs[saved_inputs[j]]] = remapped[original[j]]
    for node in backward.nodes:
        inputs = tuple(env.get(u, u) for u in node.inputs)
        b.append(Node(node.op, inputs, node.attrs, node.outputs, node.loc))
    new_backward = b.build([env.get(v, v) for v in backward.outputs])
    return Partition(
        forward=new_forward,
        backward=new_backward,
        saved=tuple(new_saved),
        kept=tuple(kept_original),
        promoted=len(kept_promoted),
        recomputed=tuple(sorted(chains)),
        saved_bytes=sum(map(_nbytes, {candidates[j] for j in kept})),
        saved_bytes_before=before,
    )


def _read_by(value: Value, chains: Mapping[int, list[Node]]) -> bool:
    return any(value in node.inputs for chain in chains.values() for node in chain)
