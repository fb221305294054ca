"""A module's backward hooks: ``register_full_backward_hook`` and ``register_full_backward_pre_hook``.

A module is not a node of the autograd graph, so its call is bracketed by two identity Functions,
as PyTorch does: one over the tensors among the positional arguments (after the forward pre-hooks),
one over the result's tensors (after the forward hooks). In the backward, the outputs' node runs
first: it has the gradients of the outputs (None for an output that got none), runs the pre-hooks
(which may replace them) and keeps them; the inputs' node runs when the gradients of the inputs are
done and calls the full hooks with ``(module, grad_input, grad_output)`` -- an entry per positional
argument (None for one that is not a tensor, zeros for a tensor no gradient reached) and one per
output. Where no argument needs a gradient (the first layer's input), the outputs' node calls the
full hooks itself, with every ``grad_input`` None, and they may not replace it.

Only a result that is a tensor or a tuple is bracketed (PyTorch's rule): the hooks of a module
returning a dict never run. The hooks run inside the backward, so a traced call traces through them
like any other code of the user's (their ops, with their lines).
"""

from __future__ import annotations

from kiln.frontend.autograd.function import Function
from kiln.frontend.autograd.grad_mode import is_grad_enabled
from kiln.frontend.jit import state as _jit
from kiln.frontend.tensor import Tensor


def _call_user(hook, *args):
    return _jit.own_lines(hook, *args) if _jit.tracing else hook(*args)


class BackwardHooks:
    """One call's bracket: the module, its hook tables as they were at the call, and what the
    backward has learnt so far (the outputs' gradients)."""

    def __init__(self, module, full: list, pre: list) -> None:
        self.module, self.full, self.pre = module, full, pre
        self.n_inputs = self.n_outputs = 0
        self.output_positions: list[int] = []
        self.input_positions: list[int] | None = None  # the arguments bracketed, where any needs a gradient
        self.grad_outputs: tuple | None = None

    # ------------------------------------------------------------------ the forward
    def inputs(self, args: tuple) -> tuple:
        """``args`` with its tensors passed through the inputs' identity (when any needs a gradient)."""
        self.n_inputs = len(args)
        positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        if not (is_grad_enabled() and any(args[i].requires_grad for i in positions)):
            return args
        self.input_positions = positions
        passed = _InputsHook.apply(self, *(args[i] for i in positions))
        out = list(args)
        for i, t in zip(positions, passed if isinstance(passed, tuple) else (passed,), strict=True):
            out[i] = t
        return tuple(out)

    def outputs(self, result):
        """``result`` with its tensors passed through the outputs' identity."""
        single = not isinstance(result, tuple)
        items = (result,) if single else result
        positions = [i for i, a in enumerate(items) if isinstance(a, Tensor)]
        if not (is_grad_enabled() and any(items[i].requires_grad for i in positions)):
            return result
        self.n_outputs, self.output_positions = len(items), positions
        passed = _OutputsHook.apply(self, *(items[i] for i in positions))
        out = list(items)
        for i, t in zip(positions, passed if isinstance(passed, tuple) else (passed,), strict=True):
            out[i] = t
        return out[0] if single else type(result)(out) if type(result) is tuple else type(result)(*out)

    # ------------------------------------------------------------------ the backward
    def outputs_backward(self, grads: tuple) -> tuple:
        packed = _spread(self.output_positions, grads, self.n_outputs)
        for hook in self.pre:
            new = _call_user(hook, self.module, packed)
            if new is not None:
                new = new if isinstance(new, tuple) else (new,)
                if len(new) != len(packed):
                    raise RuntimeError(
                        f"backward pre hook returned an invalid number of grad_output, got {len(new)}, "
                        f"but expected {len(packed)}"
                    )
                packed = new
        if self.input_positions is not None:  # kept for the inputs' node (which lets go of them)
            self.grad_outputs = packed
        else:  # no inputs' node: the full hooks run now
            nothing = (None,) * self.n_inputs
            for hook in self.full:
                new = _call_user(hook, self.module, nothing, packed)
                if new is not None and not (isinstance(new, tuple) and all(g is None for g in new)):
                    raise RuntimeError(
                        "backward hook for a module whose inputs need no gradient should always return None "
                        "or None for every gradient"
                    )
        return tuple(packed[i] for i in self.output_positions)

    def inputs_backward(self, grads: tuple) -> tuple:
        assert self.input_positions is not None  # (the inputs' node exists only with positions)
        packed = _spread(self.input_positions, grads, self.n_inputs)
        grad_outputs = self.grad_outputs if self.grad_outputs is not None else ()
        for hook in self.full:
            new = _call_user(hook, self.module, packed, grad_outputs)
            if new is not None:
                new = new if isinstance(new, tuple) else (new,)
                if len(new) != len(packed):
                    raise RuntimeError(
                        f"backward hook returned an invalid number of grad_input, got {len(new)}, but expected {len(packed)}"
                    )
                packed = new
        self.grad_outputs = None  # (a second backward through a retained graph gets its own)
        return tuple(packed[i] for i in self.input_positions)


def _spread(positions: list[int], grads: tuple, n: int) -> tuple:
    """``grads`` (one per bracketed tensor) at their positions among ``n`` entries, None elsewhere."""
    out: list = [None] * n
    for i, g in zip(positions, grads, strict=True):
        out[i] = g
    return tuple(out)


def _identity(ctx, tensors: tuple):
    """Views of ``tensors`` (new objects, so that the ones needing no gradient can be marked)."""
    outs = tuple(t.view_as(t) for t in tensors)
    ctx.mark_non_differentiable(*(o for o, t in zip(outs, tensors, strict=True) if not t.requires_grad))
    return outs[0] if len(outs) == 1 else outs


class _InputsHook(Function):
    @staticmethod
    def forward(ctx, hooks: BackwardHooks, *tensors):
        ctx.hooks = hooks
        return _identity(ctx, tensors)

    @staticmethod
    def backward(ctx, *grads):
        return (None, *ctx.hooks.inputs_backward(grads))


class _OutputsHook(Function):
    @staticmethod
    def forward(ctx, hooks: BackwardHooks, *tensors):
        ctx.hooks = hooks
        ctx.set_materialize_grads(False)  # an output that got no gradient is None to the hooks
        return _identity(ctx, tensors)

    @staticmethod
    def backward(ctx, *grads):
        return (None, *ctx.hooks.outputs_backward(grads))
