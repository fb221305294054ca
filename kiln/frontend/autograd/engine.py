"""The backward engine: runs the graph's nodes in reverse, iteratively.

No recursion anywhere, so a chain of 100,000 ops backpropagates like a chain of ten. Nodes
become ready when every consumer has delivered its gradient (dependency counting); among ready
nodes the most recently created runs first, as in PyTorch.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from ..jit import state as _jit
from .function import FunctionBackward
from .grad_mode import set_grad_enabled, state
from .graph import AccumulateGrad, Node


def _collect(roots: Sequence[Node]) -> dict[Node, int]:
    """Every node reachable from the roots, with the number of edges that enter it."""
    dependencies: dict[Node, int] = {}
    stack = list(roots)
    seen = set(roots)
    while stack:
        node = stack.pop()
        for edge in node.next_edges:
            if edge is None:
                continue
            nxt = edge[0]
            dependencies[nxt] = dependencies.get(nxt, 0) + 1
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    for root in roots:
        dependencies.setdefault(root, 0)
    return dependencies


def _needed(dependencies: dict[Node, int], targets: set[Node]) -> set[Node]:
    """The nodes from which some target can be reached through an edge: only those need to run (a
    target itself need not: the gradient captured is the one arriving at it)."""
    parents: dict[Node, list[Node]] = {}
    for node in dependencies:
        for edge in node.next_edges:
            if edge is not None:
                parents.setdefault(edge[0], []).append(node)
    needed: set[Node] = set()
    stack = list(targets)
    while stack:
        for parent in parents.get(stack.pop(), ()):
            if parent not in needed:
                needed.add(parent)
                stack.append(parent)
    return needed


def _accumulate(buffer: list, index: int, grad) -> None:
    if grad is None:
        return
    current = buffer[index]
    buffer[index] = grad if current is None else current + grad


def _check_anomaly(node: Node, grads: Sequence) -> None:
    for i, g in enumerate(grads):
        if g is not None and bool(g.isnan().any()):
            where = "".join(node.forward_stack or ["(stack not recorded)\n"])
            raise RuntimeError(
                f"Function '{node.name()}' returned nan values in its {i}th output.\n"
                f"The forward op that created it was called from:\n{where}"
            )


def run_backward(
    roots: Sequence[tuple[Node, int]],
    grad_roots: Sequence,
    *,
    retain_graph: bool,
    create_graph: bool,
    capture: Sequence[tuple[Node, int]] | None = None,
    stop_at_capture: bool = False,
) -> list | None:
    """Backpropagate ``grad_roots`` from ``roots``.

    Without ``capture`` this is ``backward()``: leaves accumulate into ``.grad``. With it, this is
    ``autograd.grad()``: the gradient arriving at each captured edge is returned instead, no
    ``.grad`` is touched, and only nodes on a path to a captured edge run. ``stop_at_capture``:
    a captured gradient goes no further, so each result is the partial derivative with respect to
    that tensor alone, as if the captured tensors were independent leaves (a compiled function's
    backward: the caller's graph carries a gradient on from each of its inputs).
    """
    args = (roots, grad_roots, retain_graph, create_graph, capture, stop_at_capture)
    if _jit.watch_hooks:  # a traced call's hazard watch is on: it sees the user's code only
        watch = _jit.watch_here()
        if watch is not None:
            return _jit.unwatched(watch, _run, *args, watch)
    return _run(*args, None)


def _run(roots, grad_roots, retain_graph, create_graph, capture, stop_at_capture, watch) -> list | None:
    """``run_backward``'s body; ``watch``: the hazard watch paused around it (see ``_calls_user_code``)."""
    root_nodes = list(dict.fromkeys(node for node, _ in roots))
    dependencies = _collect(root_nodes)
    captured: dict[tuple[Node, int], int] = {}
    needed = None
    edge: tuple[Node, int] | None  # a captured edge here, a node's next edge (None: no gradient) below
    if capture is not None:
        for i, edge in enumerate(capture):
            captured.setdefault(edge, i)
        needed = _needed(dependencies, {node for node, _ in capture})
    results: list = [None] * len(capture or ())
    # Tracing a compiled call's backward: the hooks of the externals' own nodes are not part of the
    # call -- the engine runs them when the compiled backward delivers its gradients there.
    own_hooks = {node for node, _ in capture} if capture is not None and _jit.tracing and _jit.backward_trace() else ()

    buffers: dict[Node, list] = {}
    for (node, nr), g in zip(roots, grad_roots, strict=True):
        _accumulate(buffers.setdefault(node, [None] * node.num_outputs), nr, g)
    ready = [(-n.seq, id(n), n) for n in root_nodes if dependencies[n] == 0]
    heapq.heapify(ready)
    pop, push = heapq.heappop, heapq.heappush
    # The buffer slots holding a sum this backward made: the next gradient to arrive there is added
    # in place (a weight used at each step of a loop: no new array and no op per arrival). Not where
    # the sums are themselves differentiated (create_graph) or recorded (a trace).
    summed: set | None = None if create_graph or _jit.tracing else set()

    # The loop runs once per node of the graph: its common case (one output, no hooks, no capture)
    # is written out without helper calls or generators, each of which is a visible part of a
    # small node's time.
    with set_grad_enabled(create_graph):
        while ready:
            # (the last node's gradients dropped: an AccumulateGrad takes a gradient no one else holds)
            outputs = g = current = None
            node = pop(ready)[2]
            grads = buffers.pop(node, None) or [None] * node.num_outputs
            if (node.pre_hooks or node.__class__ is AccumulateGrad) and node not in own_hooks:
                # (a leaf's AccumulateGrad without tensor hooks runs none: no user code to watch)
                if watch is None or not (node.pre_hooks or node.variable._hooks):
                    _run_pre_hooks(node, grads)
                else:
                    _jit.watched(watch, _run_pre_hooks, node, grads)
            if captured:
                for nr, g in enumerate(grads):
                    index = captured.get((node, nr))
                    if index is not None:
                        results[index] = g if results[index] is None else results[index] + g
                        if stop_at_capture:
                            grads[nr] = None
            runs = (needed is None or node in needed) and not (capture is not None and node.__class__ is AccumulateGrad)
            edges = node.next_edges  # (a property on most nodes: read once)
            if runs and (grads[0] is not None if len(grads) == 1 else any([g is not None for g in grads])):
                if watch is None or not _calls_user_code(node):
                    outputs = _apply(node, grads, retain_graph)
                else:
                    outputs = _jit.watched(watch, _apply, node, grads, retain_graph)
                if len(outputs) != len(edges):
                    raise AssertionError(f"{node.name()} returned {len(outputs)} gradients for {len(edges)} inputs")
            else:
                outputs = ()
            n_outputs = len(outputs)
            for i, edge in enumerate(edges):
                if edge is None:
                    continue
                nxt, nr = edge
                g = outputs[i] if i < n_outputs else None
                if g is not None:
                    buffer = buffers.get(nxt)
                    if buffer is None:
                        buffer = buffers[nxt] = [None] * nxt.num_outputs
                    current = buffer[nr]
                    if current is None:
                        buffer[nr] = g
                    elif summed is not None and (nxt, nr) in summed and _add_into(current, g):
                        pass
                    else:
                        buffer[nr] = current + g
                        if summed is not None:
                            summed.add((nxt, nr))
                waiting = dependencies[nxt] - 1
                dependencies[nxt] = waiting
                if waiting == 0:
                    push(ready, (-nxt.seq, id(nxt), nxt))
    return results if capture is not None else None


def _calls_user_code(node: Node) -> bool:
    """Whether running ``node`` may run user code: its hooks, a backward not marked ``kiln_only``."""
    if node.hooks:
        return True
    if node.__class__ is AccumulateGrad:  # kiln's sum into ``.grad``; the leaf's hooks after it are the user's
        return bool(node.variable._post_accumulate_hooks)
    return not (node.cls.__dict__.get("kiln_only") if node.__class__ is FunctionBackward else node.kiln_only)


def _add_into(total, grad) -> bool:
    """Add ``grad`` into ``total`` (a sum the engine made and nothing else holds) in place; False,
    changing nothing, where the two differ in shape, dtype or device (``total + grad`` then)."""
    if total._data.shape != grad._data.shape or total._dtype is not grad._dtype or total._device is not grad._device:
        return False
    total._data += grad._data
    return True


def _run_pre_hooks(node: Node, grads: list) -> None:
    # A leaf's hooks live on the tensor (its AccumulateGrad is held weakly and may be rebuilt).
    table = {0: node.variable._hooks} if node.__class__ is AccumulateGrad and node.variable._hooks else node.pre_hooks
    if not table:
        return
    if _jit.tracing and node.__class__ is AccumulateGrad:
        _jit.ran_hooks(node.variable)
    for nr, hooks in table.items():
        for hook in list(hooks):
            if grads[nr] is None:
                continue
            new = hook(grads[nr])
            if new is not None:
                grads[nr] = new


def _apply(node: Node, grads: list, retain_graph: bool) -> tuple:
    if node.__class__ is AccumulateGrad:
        node.apply(grads)
        return ()
    if len(grads) > 1 and (node.__class__ is not FunctionBackward or node.ctx.materialize_grads):
        # (a single gradient is not None: the node would not run; a Function that set
        # ``ctx.set_materialize_grads(False)`` gets None for the outputs no gradient reached)
        grads = [g if g is not None else _zeros_for(node, i) for i, g in enumerate(grads)]
    try:
        outputs = tuple(node.apply(grads))
    except Exception as error:
        if node.forward_stack and not getattr(error, "_kiln_anomaly", False):
            error.add_note(  # type: ignore[attr-defined]  # Python 3.11+, though requires-python says 3.10
                f"The forward op of {node.name()} was called from:\n" + "".join(node.forward_stack)
            )
            error._kiln_anomaly = True  # type: ignore[attr-defined]
        raise
    if node.hooks:
        for hook in node.hooks:
            new = hook(outputs, tuple(grads))
            if new is not None:
                outputs = tuple(new)
    if state.anomaly:
        _check_anomaly(node, outputs)
    if not retain_graph:
        node.release()
    return outputs  # (as many as the node's edges: checked by the caller)


def _zeros_for(node: Node, output_nr: int):
    """A zero gradient for an output of a multi-output node that received none."""
    meta = getattr(node, "output_meta", None)
    if meta is None:
        return None
    from ..ops import zeros  # noqa: PLC0415

    shape, dtype, device = meta[output_nr]
    return zeros(shape, dtype=dtype, device=device)
