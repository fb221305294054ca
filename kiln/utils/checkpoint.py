"""Activation checkpointing: ``checkpoint(fn, *args)`` keeps no intermediate of ``fn`` for backward;
backward runs ``fn`` again (with the random state it first saw, so dropout draws the same mask) and
backpropagates through the recomputation. Gradients equal those of calling ``fn`` directly. The
random state is saved and restored as copies of the generators' state tensors (ops, no values
read), so a compiled training step with a checkpointed dropout block runs compiled whole.

>>> import kiln
>>> x = kiln.tensor([1.0, 2.0], requires_grad=True)
>>> checkpoint(lambda t: (t * t).sum(), x, use_reentrant=False).backward()
>>> x.grad.tolist()
[2.0, 4.0]
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import kiln
from kiln.frontend.ops.generator import _generator

__all__ = ["checkpoint", "checkpoint_sequential", "noop_context_fn"]


def noop_context_fn() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    return contextlib.nullcontext(), contextlib.nullcontext()


def _flatten_outputs(outputs) -> tuple[list, Callable[[list], Any]]:
    """The tensors of a tensor / tuple / list output, and how to rebuild the output from new tensors."""
    if isinstance(outputs, kiln.Tensor):
        return [outputs], lambda ts: ts[0]
    if isinstance(outputs, tuple | list):
        positions = [i for i, o in enumerate(outputs) if isinstance(o, kiln.Tensor)]

        def rebuild(ts):
            items = list(outputs)
            for i, t in zip(positions, ts, strict=True):
                items[i] = t
            return type(outputs)(items)

        return [outputs[i] for i in positions], rebuild
    raise TypeError(f"checkpoint: the function must return a tensor or a tuple/list of tensors, got "
                    f"{type(outputs).__name__}")  # fmt: skip


def _generators(args) -> list:
    """The default generators ``function`` may draw from: the CPU one and those of its arguments' devices."""
    devices = {kiln.device("cpu")} | {a.device for a in args if isinstance(a, kiln.Tensor)}
    return [_generator(None, d) for d in sorted(devices, key=str)]


def _states(generators: list) -> list:
    # Copies of the state tensors (ops, not values read): a traced call saves and restores the
    # state it is called with, so that the recomputation draws the forward's numbers on every call.
    return [g.philox_state.clone() for g in generators]


def _restore(generators: list, states: list) -> None:
    for g, state in zip(generators, states, strict=True):
        g.set_state(state)


def checkpoint(function: Callable, *args, use_reentrant: bool | None = None, context_fn=noop_context_fn,
               determinism_check: str = "default", debug: bool = False, preserve_rng_state: bool = True,
               **kwargs) -> Any:  # fmt: skip
    """``function(*args, **kwargs)``, recomputed in backward instead of keeping its intermediates.

    Parameters used inside ``function`` receive their gradients when backward recomputes it. With
    ``use_reentrant=True`` (PyTorch's default, with a warning when not given) at least one tensor
    argument must require grad, or nothing is differentiated (PyTorch's rule); with
    ``use_reentrant=False`` parameters get gradients either way.
    """
    if use_reentrant is None:
        warnings.warn("kiln.utils.checkpoint: the use_reentrant parameter should be passed explicitly. "
                      "use_reentrant=False is recommended.", stacklevel=2)  # fmt: skip
        use_reentrant = True
    if use_reentrant and kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    if determinism_check not in ("default", "none"):
        raise ValueError(f"determinism_check should be one of ['default', 'none'], but got {determinism_check}")
    if not kiln.is_grad_enabled():
        return function(*args, **kwargs)
    if use_reentrant and not any(isinstance(a, kiln.Tensor) and a.requires_grad for a in args):
        warnings.warn("None of the inputs have requires_grad=True. Gradients will be None", stacklevel=2)
        with kiln.no_grad():
            return function(*args, **kwargs)
    generators = _generators(args) if preserve_rng_state else []
    rng_states = _states(generators)
    forward_context, recompute_context = context_fn()
    with kiln.no_grad(), forward_context:
        outputs = function(*args, **kwargs)
    out_tensors, rebuild = _flatten_outputs(outputs)
    run = _Recompute(function, args, kwargs, generators, recompute_context)
    # The anchor makes a graph node even when no argument requires grad (parameters inside still do).
    anchor = kiln.zeros((), requires_grad=True)
    inputs = (args[i] for i in run.tensor_positions)
    results = CheckpointFunction.apply(anchor, run, out_tensors, rng_states, *inputs)
    results = results if isinstance(results, tuple) else (results,)
    return rebuild(list(results))


class _Recompute:
    """What backward needs to run ``function`` again, held by the autograd node. (A class made per
    call, as this once was, lives in a reference cycle until the garbage collector runs, and held
    the saved random state: a compiled call saw that as state stored away and ran eagerly.)"""

    def __init__(self, function, args, kwargs, generators, recompute_context) -> None:
        self.function, self.args, self.kwargs, self.recompute_context = function, args, kwargs, recompute_context
        self.generators = generators
        self.tensor_positions = [i for i, a in enumerate(args) if isinstance(a, kiln.Tensor)]

    def gradients(self, grads, rng_states) -> tuple:
        """The gradients of the tensor arguments, from recomputing ``function`` (under the generators'
        states ``rng_states``) and backpropagating ``grads``."""
        args, positions = self.args, self.tensor_positions
        inputs = list(args)
        for i in positions:
            inputs[i] = args[i].detach().requires_grad_(args[i].requires_grad)
        # Recompute under the forward's random state, then give the caller's state back.
        saved = _states(self.generators)
        _restore(self.generators, rng_states)
        try:
            with kiln.enable_grad(), self.recompute_context:
                recomputed, _ = _flatten_outputs(self.function(*inputs, **self.kwargs))
        finally:
            _restore(self.generators, saved)
        pairs = [(o, g) for o, g in zip(recomputed, grads, strict=True) if o.requires_grad and g is not None]
        if pairs:
            kiln.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return tuple(inputs[i].grad if args[i].requires_grad else None for i in positions)


class CheckpointFunction(kiln.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, run: _Recompute, out_tensors: list, rng_states: list, *inputs):
        ctx.run = run
        # saved with the node (so freed with the graph, and seen by a trace as the graph's tensors)
        ctx.save_for_backward(*rng_states)
        return tuple(t.detach() for t in out_tensors)

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, None, *ctx.run.gradients(grads, ctx.saved_tensors))


def checkpoint_sequential(functions, segments: int, input, use_reentrant: bool | None = None, **kwargs):
    """Run a ``Sequential`` (or list of modules) in ``segments`` checkpointed chunks; the last runs normally."""
    functions = list(functions.children()) if isinstance(functions, kiln.nn.Sequential) else list(functions)  # type: ignore[attr-defined]
    size = len(functions) // segments

    def run(start: int, end: int):
        def forward(x):
            for f in functions[start : end + 1]:
                x = f(x)
            return x

        return forward

    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(run(start, end), input, use_reentrant=use_reentrant, **kwargs)
    return run(end + 1, len(functions) - 1)(input)
