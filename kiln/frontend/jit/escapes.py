"""What a traced call stored in Python state: tensors it made that are still alive afterwards.

A call that keeps a tensor it made (an optimizer's moments on its first step, a list it appends
to) cannot be replayed by a compiled program, which makes its tensors anew at every call; the
caller (``build.py``) makes such a call run eagerly and says so.
"""

from __future__ import annotations


def escaped_tensors(born: list, keep: list) -> list[str]:
    """The tensors of ``born`` (weak references to those the call made) still alive other than
    ``keep`` (the results, the new gradients, the externals) and what those hold on to."""
    allowed = _reachable(keep)
    escaped = []
    for ref in born:
        t = ref()
        if t is not None and id(t) not in allowed:
            escaped.append(f"a {t._dtype.name} tensor of shape {tuple(t._data.shape)}")
    return escaped


def _reachable(roots: list) -> set[int]:
    """ids of the tensors reachable from ``roots`` through views, grads and autograd graphs."""
    seen: set[int] = set()
    nodes_seen: set[int] = set()
    stack = list(roots)
    nodes: list = []
    while stack or nodes:
        while stack:
            t = stack.pop()
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            stack.extend((t._base, t._grad))
            if t.grad_fn is not None:
                nodes.append(t.grad_fn)
        if nodes:
            node = nodes.pop()
            if id(node) in nodes_seen:
                continue
            nodes_seen.add(id(node))
            stack.extend(getattr(node, "saved_inputs", None) or ())  # (a PrimBackward's: the input tensors)
            for saved in getattr(getattr(node, "ctx", None), "_saved", None) or ():
                stack.append(getattr(saved, "tensor", None))
            for edge in node.next_edges:
                if edge is not None:
                    nodes.append(edge[0])
            variable = getattr(node, "variable", None)
            if variable is not None:
                stack.append(variable)
    return seen
