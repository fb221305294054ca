"""``backward`` and ``grad``: the two ways to run the engine, with PyTorch's signatures."""

from __future__ import annotations

from collections.abc import Sequence

from ..tensor import Tensor
from .engine import run_backward
from .grad_mode import set_mode, state
from .graph import _edge_of


def _as_tuple(x) -> tuple:
    if x is None:
        return ()
    return (x,) if isinstance(x, Tensor) else tuple(x)


def _roots(outputs: Sequence[Tensor], grad_outputs: Sequence, what: str):
    from ..ops import ones_like  # noqa: PLC0415

    roots, grads = [], []
    if len(grad_outputs) not in (0, len(outputs)):
        raise RuntimeError(f"{what}: got {len(grad_outputs)} gradients for {len(outputs)} outputs")
    for i, out in enumerate(outputs):
        if not isinstance(out, Tensor):
            raise TypeError(f"{what}: expected Tensors as outputs, got {type(out).__name__}")
        if not out._requires_grad:
            raise RuntimeError(
                f"{what}: element {i} of tensors does not require grad and does not have a grad_fn "
                "(was it computed under no_grad, or from tensors without requires_grad=True?)"
            )
        g = grad_outputs[i] if grad_outputs else None
        if g is None:
            if out.numel() != 1:
                raise RuntimeError(
                    f"{what}: grad can be implicitly created only for scalar outputs; output {i} has "
                    f"shape {tuple(out.shape)}. Pass a gradient of that shape."
                )
            g = ones_like(out)
        elif not isinstance(g, Tensor):
            from ..ops import full_like  # noqa: PLC0415

            g = full_like(out, g)
        elif tuple(g.shape) != tuple(out.shape):
            raise RuntimeError(f"{what}: gradient {i} has shape {tuple(g.shape)}, expected {tuple(out.shape)}")
        roots.append(_edge_of(out))
        grads.append(g)
    return roots, grads


def backward(
    tensors, grad_tensors=None, retain_graph: bool | None = None, create_graph: bool = False, inputs=None
) -> None:
    """Accumulate d(tensors)/d(leaf) into each leaf's ``.grad`` (``inputs`` limits which leaves)."""
    tensors = _as_tuple(tensors)
    roots, grads = _roots(tensors, _as_tuple(grad_tensors), "backward")
    keep = create_graph if retain_graph is None else retain_graph
    if inputs is None:
        run_backward(roots, grads, retain_graph=keep, create_graph=create_graph)
        return
    inputs = _as_tuple(inputs)
    captured = grad(tensors, inputs, grads, retain_graph=keep, create_graph=create_graph, allow_unused=True)
    from .graph import accumulate_into_grad  # noqa: PLC0415

    for t, g in zip(inputs, captured, strict=True):
        if g is not None:
            with_state = state.grad_enabled
            set_mode(create_graph)
            try:
                accumulate_into_grad(t, g)
            finally:
                set_mode(with_state)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None, create_graph: bool = False,
         allow_unused: bool | None = None, materialize_grads: bool = False) -> tuple:  # fmt: skip
    """The gradients of ``outputs`` with respect to ``inputs``, returned rather than accumulated.

    >>> import kiln
    >>> x = kiln.tensor(3.0, requires_grad=True)
    >>> (dx,) = kiln.autograd.grad(x * x, x, create_graph=True)
    >>> kiln.autograd.grad(dx, x)[0].item()
    2.0
    """
    return _grad(outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused, materialize_grads)


def partial_grad(outputs, inputs, grad_outputs, retain_graph: bool = False) -> tuple:
    """``grad`` treating each of ``inputs`` as an independent leaf: no gradient flows on through one
    input into another that it was computed from (the compiled backward of a function of them)."""
    return _grad(outputs, inputs, grad_outputs, retain_graph, False, True, False, stop_at_inputs=True)


def _grad(outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused, materialize_grads,
          stop_at_inputs: bool = False) -> tuple:  # fmt: skip
    outputs, inputs = _as_tuple(outputs), _as_tuple(inputs)
    for i, t in enumerate(inputs):
        if not isinstance(t, Tensor) or not t._requires_grad:
            raise RuntimeError(f"grad: input {i} does not require grad; pass tensors with requires_grad=True")
    roots, grads = _roots(outputs, _as_tuple(grad_outputs), "grad")
    keep = create_graph if retain_graph is None else retain_graph
    edges: list = [_edge_of(t) for t in inputs]  # none is None: each input requires grad
    results = run_backward(roots, grads, retain_graph=keep, create_graph=create_graph, capture=edges,
                           stop_at_capture=stop_at_inputs)  # fmt: skip
    assert results is not None
    out = []
    for i, (t, g) in enumerate(zip(inputs, results, strict=True)):
        if g is None:
            if materialize_grads:
                from ..ops import zeros_like  # noqa: PLC0415

                g = zeros_like(t)
            elif not allow_unused:
                raise RuntimeError(
                    f"grad: input {i} was not used in the graph of the outputs. Set allow_unused=True "
                    "if this is what you want (its gradient is then None)."
                )
        out.append(g)
    return tuple(out)
