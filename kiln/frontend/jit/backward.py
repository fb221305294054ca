"""Autograd through a compiled function: the backward graph and the node that runs it.

When a traced call returns tensors that need gradients, the compiler traces the backward too:
``autograd.grad`` of those results (with seed gradients as inputs) with respect to every
external that requires grad, recorded into a second graph whose other inputs are forward values
(saved: extra outputs of the forward graph). At run time each call attaches one
``CompiledBackward`` node to its differentiable results; its ``apply`` runs the backward graph on
the incoming gradients and the saved arrays and returns one gradient per external, along the
externals' own autograd edges (so the caller's backward continues into their history).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...ir.analysis import Liveness
from ...ir.graph import Graph
from ..autograd.grad_mode import state as grad_state
from ..autograd.graph import FreedGraphError, Node, _edge_of, _freed_error
from ..tensor import Tensor
from .layouts import memory_owner
from .signature import Captured, Signature, apply, bind, made_fresh


@dataclass
class BackwardPlan:
    graph: Graph
    program: Callable[[list], list]
    signature: Signature  # inputs: Seed, Saved and Captured kinds; results: per wrt, a Result or None
    diff_results: list[int]  # positions in the flattened results that carry gradients
    saved_outputs: list[int]  # forward-graph output indices holding what the backward reads
    wrt: list[int]  # the externals the backward returns gradients for
    saved_bytes: int = 0  # what each call's forward keeps for it (after the partition pass)
    saved_bytes_before: int = 0  # what it would keep without the partition pass
    recomputed: int = 0  # saved values the backward recomputes instead
    # what eager's backward checks for in-place changes (``eager_checks``), so this one checks too:
    # externals (the forward's inputs: arguments, captured tensors) and results (flattened positions)
    checked_inputs: list[int] = field(default_factory=list)
    checked_results: list[int] = field(default_factory=list)
    # the backward graph as the partition made it: lowered by ``symbolic_backward.lower_plan``, and
    # compared with a trace's at another size (a dynamic specialization)
    traced: Graph | None = None
    _fresh: tuple = field(default=(), repr=False)  # (program, made_fresh for it): see ``made_fresh``
    _shared: tuple = field(default=(), repr=False)  # (forward program, its saved values): ``_maybe_shared``

    def __post_init__(self) -> None:
        # the captured tensors the backward reads (see ``attach``), by their weak references
        self._captured_refs = [k.ref for k in self.signature.inputs if isinstance(k, Captured)]

    def made_fresh(self) -> bool:
        """Whether every gradient the program it runs now makes is new memory of its own
        (``signature.made_fresh``): none can be memory of a seed or a saved value."""
        cached = self._fresh
        if not cached or cached[0] is not self.program:  # lowered after the plan was made
            fresh: frozenset = getattr(self.program, "fresh_outputs", frozenset())
            cached = self._fresh = (self.program, made_fresh(self.signature, fresh))
        return cached[1]

    def _maybe_shared(self, spec) -> list[int]:
        """The saved values (positions in ``saved_outputs``) that the forward program of ``spec`` may
        return as memory the caller can reach and eager's backward did not check: an unchecked input's
        or a result's. The passes may make them so after the partition (``x * 1.0`` is ``x``). Not
        those the program makes new at every call, nor those over memory of its own that it hands
        out as no other output (an intermediate), nor views of an input the backward checks."""
        cached = self._shared
        if not cached or cached[0] is not spec.program:
            program, graph = spec.program, spec.graph
            # (an executor's new outputs: its fresh ones and extern results of their own)
            new: frozenset = getattr(program, "new_outputs", getattr(program, "fresh_outputs", frozenset()))
            root, position = Liveness(graph).root, {v: k for k, v in enumerate(graph.inputs)}
            saved = set(self.saved_outputs)
            handed_out = {root[v] for i, v in enumerate(graph.outputs) if i not in saved}
            checked = set(self.checked_inputs)

            def reachable(i: int) -> bool:
                r = root[graph.outputs[i]]
                return r in handed_out or (r in position and position[r] not in checked)

            shared = [k for k, i in enumerate(self.saved_outputs) if i not in new and reachable(i)]
            cached = self._shared = (program, shared)
        return cached[1]

    def attach(self, spec, results: list, outputs: list, leaves: list) -> None:
        saved = [outputs[i] for i in self.saved_outputs]
        externals = [spec.external(k, leaves) for k in self.wrt]
        # The tensors eager's backward would find changed in place and raise: those it saved (an
        # argument changed inside the call, then saved; a weight's transpose; a result, as exp saves
        # its own) and those it checked though it read copies (a convolution's input). Their version
        # counters, read now that the call wrote its inputs back, let the compiled backward raise the
        # same. Captured tensors the backward graph reads at its own time are checked as well.
        read = [ref() for ref in self._captured_refs]
        read += [spec.external(k, leaves) for k in self.checked_inputs]
        read += [results[i] for i in self.checked_results]
        counters = {id(t._version): t._version for t in read if t is not None}
        versions = [(counter, counter[0]) for counter in counters.values()]
        shared = self._maybe_shared(spec)
        if shared:
            reachable = [spec.external(k, leaves) for k in range(len(spec.sources))] + results
            saved = _own_copies(saved, shared, counters, [t for t in reachable if isinstance(t, Tensor)])
        node = CompiledBackward(self, saved, externals, [results[i] for i in self.diff_results], versions)
        for nr, position in enumerate(self.diff_results):
            t = results[position]
            t.grad_fn, t._output_nr, t._requires_grad = node, nr, True


def _own_copies(saved: list, positions: list[int], checked: dict, reachable: list) -> list:
    """``saved`` with the arrays at ``positions`` copied where they are memory of a tensor of
    ``reachable`` (the call's inputs and results) whose version counter is not in ``checked``: the
    caller may change it before the backward, and eager's backward, which saved memory of its own
    there, would not see that."""
    owners = {id(memory_owner(t._data)) for t in reachable if id(t._version) not in checked}
    saved = list(saved)
    for k in positions:
        if id(memory_owner(saved[k])) in owners:
            saved[k] = saved[k].copy()
    return saved


class CompiledBackward(Node):
    """The backward of one compiled call: runs the compiled backward graph. ``eager``, when set
    (a compiled composite op's call, ``eager_composites``), takes the gradients where they must be
    differentiable again (``create_graph=True``), which the compiled backward graph is not."""

    __slots__ = ("plan", "saved", "seed_types", "versions", "eager")
    saved: list | None  # None once released
    eager: Callable[[list], tuple] | None

    def __init__(self, plan: BackwardPlan, saved: list, externals: list, results: list, versions: list) -> None:
        super().__init__(tuple(_edge_of(t) for t in externals))
        self.plan, self.saved, self.versions = plan, saved, versions
        self.seed_types = [(r._data.shape, r._data.dtype, r._device) for r in results]
        self.eager = None

    @property
    def num_outputs(self) -> int:  # type: ignore[override]
        return len(self.seed_types)

    def name(self) -> str:
        return "CompiledFunctionBackward"

    def apply(self, grads: list) -> tuple:
        if self.saved is None:
            raise FreedGraphError(
                "Trying to backward through a compiled function a second time: its saved values were "
                "freed. Pass retain_graph=True to the first backward() if you need to run it again."
            )
        for counter, version in self.versions:
            if counter[0] != version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by an inplace "
                    f"operation: it was read by {self.name()} at version {version} and is now at version "
                    f"{counter[0]}. Hint: clone it before the inplace operation."
                )
        if grad_state.grad_enabled:
            if self.eager is not None:
                return self.eager(grads)
            raise RuntimeError(
                "a compiled function's backward is not differentiable again (create_graph=True): compile the "
                "function that also takes the second derivative, or run it eagerly (KILN_JIT=0)"
            )
        seeds = [np.zeros(shape, dtype) if g is None else g._data
                 for g, (shape, dtype, _) in zip(grads, self.seed_types, strict=True)]  # fmt: skip
        arrays = bind(self.plan.signature, seeds=seeds, saved=self.saved)
        plan = self.plan
        return tuple(apply(plan.signature, plan.program(arrays), arrays, fresh=plan.made_fresh()))

    def release(self) -> None:
        self.saved = self.eager = None


@dataclass
class ConsumedPlan:
    """Results whose graph the call itself already ran backward through (a training step that
    returns its loss): like eager's, they require grad, and a backward through them raises."""

    diff_results: list[int]

    def attach(self, spec, results: list, outputs: list, leaves: list) -> None:
        node = ConsumedBackward(len(self.diff_results))
        for nr, position in enumerate(self.diff_results):
            t = results[position]
            t.grad_fn, t._output_nr, t._requires_grad = node, nr, True


class ConsumedBackward(Node):
    """The grad_fn of a result whose graph was consumed inside the compiled call."""

    __slots__ = ("outputs",)

    def __init__(self, outputs: int) -> None:
        super().__init__(())
        self.outputs = outputs

    @property
    def num_outputs(self) -> int:  # type: ignore[override]
        return self.outputs

    def name(self) -> str:
        return "CompiledFunctionBackward"

    def apply(self, grads: list) -> tuple:
        raise _freed_error(self)
