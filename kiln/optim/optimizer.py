# mypy: disable-error-code="assignment"
# reason: a group's numbers are floats or tuples of floats (betas); the written-value cache holds either
"""The ``Optimizer`` base class: parameter groups, per-parameter state, state dicts.

Every value that changes from one step to the next lives in a kiln tensor updated in place. Each
optimizer declares how ``step()`` reads the Python values in ``param_groups``, so that a compiled
training step honours every change to them (DESIGN.md, "What a trace reads"):

- ``numbers`` (``lr``, betas, ``eps``, ``weight_decay``...) are read through 0-d float64 tensors
  refreshed from the group before each step: a traced ``step()`` reads them as inputs, and a
  schedule changes them without a retrace;
- ``flags`` (``nesterov``, ``amsgrad``, ``maximize``...) decide which operations a step runs, and
  so do the signs of ``zero_skips`` (eager skips weight decay when it is 0): a compiled step is
  guarded on them (``kiln.jit.guard``) and traces again when one changes.

>>> import kiln
>>> w = kiln.tensor([1.0, 2.0], requires_grad=True)
>>> opt = kiln.optim.SGD([w], lr=0.5)
>>> (w * w).sum().backward()
>>> opt.step()
>>> w
tensor([0., 0.], requires_grad=True)
"""

from __future__ import annotations

import copy
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import kiln
from kiln.frontend import fused_steps
from kiln.frontend.jit import state as _jit
from kiln.utils.hooks import RemovableHandle, add_hook

from . import _hooks
from ._hooks import (  # noqa: F401 - torch.optim.optimizer's names
    OptimizerPostHook,
    OptimizerPreHook,
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)


class _RequiredParameter:
    """Marks a hyperparameter that has no default and must be given."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()


def weight_decay_of(group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> kiln.Tensor | None:
    """The group's weight decay tensor, or None when it is 0: eager skips it then, and a traced
    step neither reads it nor records the work (the sign of weight_decay is a guard)."""
    return scalars["weight_decay"] if group["weight_decay"] != 0 else None


def step_count(p: kiln.Tensor) -> kiln.Tensor:
    """A parameter's step count at its first step: a 0-d float32 zero on its device, as PyTorch's."""
    return kiln.tensor(0.0, dtype=kiln.float32, device=p.device)


def check_range(name: str, value: float, low: float = 0.0) -> None:
    """Raise PyTorch's ``Invalid <name>: <value>`` error when ``value < low``."""
    if not value >= low:  # also rejects nan
        raise ValueError(f"Invalid {name}: {value}")


class Optimizer:
    """Base class of all optimizers.

    Subclasses declare ``numbers``, ``flags`` and ``zero_skips`` (see the module's docstring) and
    implement ``_update_group(group, scalars)``, where ``scalars`` maps each of ``numbers`` to a 0-d
    float64 tensor holding its current value (a tuple of them for a tuple such as ``betas``). It
    reads numbers only through ``scalars``, and other keys of ``group`` only if they are flags or
    the zero tests of ``zero_skips``. Its loop over the parameters is ``_gradients(group, scalars)``,
    which does what every optimizer does first (maximize, weight decay, state, step count); a
    subclass says what state a parameter starts with in ``_fresh_state(p, group)``.
    """

    numbers: tuple[str, ...] = ("lr",)
    flags: tuple[str, ...] = ("maximize",)
    zero_skips: tuple[str, ...] = ()
    # Whether _gradients makes each parameter's state and counts its steps: all but SGD, whose state
    # is its momentum buffer alone (none at all without momentum, as in PyTorch).
    _counts_steps = True
    # Weight decay's form where "decoupled_weight_decay" is a flag but a group lacks it (AdamW: True).
    _decoupled = False
    # Its hook tables, id -> hook (``_hooks.TABLES``, made by ``_hooks.new_tables``)
    _optimizer_step_pre_hooks: OrderedDict
    _optimizer_step_post_hooks: OrderedDict
    _optimizer_state_dict_pre_hooks: OrderedDict
    _optimizer_state_dict_post_hooks: OrderedDict
    _optimizer_load_state_dict_pre_hooks: OrderedDict
    _optimizer_load_state_dict_post_hooks: OrderedDict

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:  # a subclass's own step runs the step hooks too
            cls.step = _hooks.with_step_hooks(cls.__dict__["step"])  # type: ignore[method-assign]

    def __init__(self, params: Iterable, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self.state: defaultdict = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        self._per_call = _PerCall()
        _hooks.new_tables(self)
        if isinstance(params, kiln.Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or dicts, "
                f"but got {type(params).__name__}"
            )
        groups = list(params)
        if len(groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {key}: {group[key]}" for key in sorted(group) if key != "params"]
        return "\n".join(lines) + "\n)"

    def __getstate__(self) -> dict[str, Any]:
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """An unpickled optimizer (``copy.deepcopy``, ``pickle``): its hyperparameter tensors are made
        again from ``param_groups`` by the next ``sync_hyperparameters``."""
        self.__dict__.update(state)
        self._per_call = _PerCall(len(self.param_groups))
        _hooks.new_tables(self)

    # -- hooks (``_hooks.py``) ---------------------------------------------------------------------

    def register_step_pre_hook(self, hook: Callable) -> RemovableHandle:
        """Run ``hook(optimizer, args, kwargs)`` before each step; it may return ``(new_args, new_kwargs)``."""
        return add_hook(self._optimizer_step_pre_hooks, hook)

    def register_step_post_hook(self, hook: Callable) -> RemovableHandle:
        """Run ``hook(optimizer, args, kwargs)`` after each step."""
        return add_hook(self._optimizer_step_post_hooks, hook)

    def register_state_dict_pre_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """Run ``hook(optimizer)`` before ``state_dict()`` makes the dict."""
        return add_hook(self._optimizer_state_dict_pre_hooks, hook, prepend)

    def register_state_dict_post_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """Run ``hook(optimizer, state_dict)`` on the dict ``state_dict()`` made; what it returns (if not
        None) is the dict returned."""
        return add_hook(self._optimizer_state_dict_post_hooks, hook, prepend)

    def register_load_state_dict_pre_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """Run ``hook(optimizer, state_dict)`` before ``load_state_dict`` loads a (shallow) copy of the dict;
        what it returns (if not None) is loaded instead."""
        return add_hook(self._optimizer_load_state_dict_pre_hooks, hook, prepend)

    def register_load_state_dict_post_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """Run ``hook(optimizer)`` after ``load_state_dict`` loaded."""
        return add_hook(self._optimizer_load_state_dict_post_hooks, hook, prepend)

    # -- parameter groups ---------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters with its own hyperparameters (defaults fill the rest)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, kiln.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(
                "optimizer parameters need to be organized in ordered collections, but the ordering of "
                "tensors in sets will change between runs. Please use a list instead."
            )
        params = list(params)
        for p in params:
            if not isinstance(p, kiln.Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params is {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        group = dict(param_group, params=params)
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {name}")
            group.setdefault(name, default)
        if len({id(p) for p in params}) != len(params):
            warnings.warn(
                "optimizer contains a parameter group with duplicate parameters; in future, this will cause an error",
                stacklevel=3,
            )
        existing = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in existing for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)
        self._per_call.scalars.append({})
        self._per_call.written.append({})

    # -- stepping -----------------------------------------------------------------------------

    @property
    def _scalars(self) -> list[dict[str, Any]]:
        """Each group's hyperparameter tensors (``kiln.explain`` names them after ``param_groups``)."""
        return self._per_call.scalars

    def sync_hyperparameters(self) -> list[dict[str, Any]]:
        """Refresh each group's 0-d tensors of ``numbers`` from ``param_groups`` (in place).

        ``step()`` calls this first; under ``kiln.compile`` it also runs before every compiled call.
        A tensor already holding its value is left alone (these tensors are the optimizer's own):
        a compiled training step runs this before every call, where each ``fill_`` cost about 20 us
        with the caches cold from the step before.
        """
        with kiln.no_grad():
            per_call = self._per_call
            for group, scalars, written in zip(self.param_groups, per_call.scalars, per_call.written, strict=True):
                for name in self.numbers:
                    value, old = group[name], written.get(name)
                    if old == value:  # the usual call: nothing changed (NaN never equals: rewritten)
                        continue
                    number = tuple(map(float, value)) if isinstance(value, tuple | list) else float(value)
                    scalars[name] = _refreshed(scalars.get(name), number, old, group["params"])
                    written[name] = number
        return self._scalars

    #: Set on kiln's own optimizers, whose step calls nothing of the user's but a closure: a traced
    #: call runs a step without one with its hazard watch paused (``jit.hazards``; an Adam step of a
    #: GPT was three quarters of the calls the watch saw). Read from the optimizer's own class only:
    #: a subclass's methods may be the user's.
    kiln_only = False

    @_hooks.with_step_hooks
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient; returns ``closure()``'s loss if given."""
        if closure is None and _jit.watch_hooks and type(self).__dict__.get("kiln_only"):
            watch = _jit.watch_here()
            if watch is not None:
                return _jit.unwatched(watch, self._step, None)
        return self._step(closure)

    def _step(self, closure: Callable[[], Any] | None) -> Any:
        loss = None
        if closure is not None:
            with kiln.enable_grad():
                loss = closure()
        # Under kiln.compile this also runs before every compiled call: the floats are read each time.
        scalars = kiln.jit.before_each_call(self.sync_hyperparameters)
        traced = kiln.jit.guard(self._structure_guard)  # and the flags checked before each compiled call
        if traced:  # note which numbers the graph reads, for kiln.explain
            scalars = [_Reading(group_scalars) for group_scalars in scalars]
        with kiln.no_grad():
            for group, group_scalars in zip(self.param_groups, scalars, strict=True):
                with fused_steps.timed_loop():  # where the loop runs on numpy, its time is noted
                    self._update_group(group, group_scalars)
        if traced:
            kiln.jit.guard(lambda: (None, self._number_reads(scalars)))
        return loss

    def _structure(self) -> list[tuple]:
        """Per group, what decides which operations a step runs: each flag, each zero skip's sign."""
        flags, zero_skips = self.flags, self.zero_skips
        return [(*map(group.get, flags), *map(_sign, map(group.get, zero_skips))) for group in self.param_groups]

    def _structure_guard(self) -> tuple[Callable[[], str | None], list[tuple[str, str]]]:
        """``kiln.jit.guard``'s pair for a traced step: the check of ``_structure``, and the reads."""
        traced, name, hooks = self._structure(), type(self).__name__, _hooks.hook_tables(self)

        def check() -> str | None:
            if _hooks.hook_tables(self) != hooks:  # (a traced step ran the hooks it had)
                return f"a step hook of {name} was registered or removed"
            now = self._structure()
            return None if now == traced else _structure_change(name, self.flags, self.zero_skips, traced, now)

        reads = []
        for i in range(len(self.param_groups)):
            where = f"{name}.param_groups[{i}]"
            reads += [(f"{where}[{key!r}]", "guard") for key in self.flags]
            reads += [(f"the sign of {where}[{key!r}]", "guard") for key in self.zero_skips]
        return check, reads

    def _number_reads(self, scalars: list[_Reading]) -> list[tuple[str, str]]:
        """The numbers a traced step read (its graph's inputs), as ``kiln.jit.guard``'s reads."""
        name = type(self).__name__
        return [(f"{name}.param_groups[{i}][{key!r}]", "input")
                for i, read in enumerate(scalars) for key in self.numbers if key in read.keys_read]  # fmt: skip

    def _update_group(self, group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> None:
        """Update the parameters of one group: ``for p, grad, state in self._gradients(group, scalars)``."""
        raise NotImplementedError

    def _fresh_state(self, p: kiln.Tensor, group: dict[str, Any]) -> dict[str, kiln.Tensor]:
        """The state ``p`` starts with at its first step, in PyTorch's order of keys: ``step`` first."""
        raise NotImplementedError

    @staticmethod
    def _wants_compiled_step(group: dict[str, Any]) -> bool:
        """Whether an eager step tries the group as one compiled program (``kiln.frontend.fused_steps``,
        where an optimizer has one): asked for with ``fused=True`` or ``foreach=True``, and by default
        (both None), as PyTorch takes its faster multi-tensor path by default where it has one;
        ``fused=False`` or ``foreach=False`` keeps the per-parameter loop. The program runs only when
        eager kernels are on (``kiln.backends.cpu.eager_kernels``) and compiled; the same update on
        the arrays otherwise (``kiln.optim._on_arrays``), the loop in a trace or a profile."""
        fused, foreach = group.get("fused"), group.get("foreach")
        return bool(fused or foreach) or (fused is None and foreach is None)

    def _gradients(self, group: dict[str, Any], scalars: dict[str, kiln.Tensor]) -> Iterator[tuple]:
        """``(p, grad, state)`` for each parameter of ``group`` that has a gradient, after the work
        every optimizer starts with, in this order:

        - ``grad`` is ``p.grad``, negated under ``maximize``;
        - ``state`` (``self.state[p]``) is made by ``_fresh_state`` at ``p``'s first step, and its
          ``step`` advanced by one (with ``_counts_steps`` false, ``state`` is None and untouched);
        - where ``weight_decay`` is one of ``zero_skips`` and not 0, ``grad`` gains ``p * weight_decay``,
          or ``p`` shrinks by ``1 - lr * weight_decay`` in place where the group's
          ``decoupled_weight_decay`` (a flag) is true.

        A plain function that returns the loop, not a generator: the weight decay is read, and the
        decoupled factor computed, when ``_update_group`` calls it (once per group), so its 0-d work
        stays where ``_update_group`` writes the call, before the loop's.
        """
        decay = weight_decay_of(group, scalars) if "weight_decay" in self.zero_skips else None
        shrink = None
        if decay is not None and "decoupled_weight_decay" in self.flags:
            if group.get("decoupled_weight_decay", self._decoupled):
                shrink, decay = 1 - scalars["lr"] * decay, None
        return self._each_gradient(group, decay, shrink)

    def _each_gradient(self, group: dict[str, Any], decay, shrink) -> Iterator[tuple]:
        """``_gradients``' loop, given its weight decay (``decay``, or ``shrink`` when decoupled)."""
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = -p.grad if group["maximize"] else p.grad
            state = None
            if self._counts_steps:
                state = self.state[p]
                if not state:  # made outside a trace: state the compiled step reads, not a value it makes
                    state.update(kiln.jit.make_state(self._fresh_state, p, group))
                state["step"].add_(1)
            if shrink is not None:
                p.mul_(shrink)
            elif decay is not None:
                grad = grad + p * decay
            yield p, grad, state

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of all parameters: to ``None`` by default, else to zeros in place."""
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:  # without reading .grad: a compiled step then holds whether it was set or not
                    p.grad = None
                elif p.grad is not None:
                    if p.grad.grad_fn is not None:
                        p.grad = p.grad.detach()
                    with kiln.no_grad():
                        p.grad.zero_()

    # -- state dicts --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The state as ``{"state": {id: {...}}, "param_groups": [...]}`` with parameters as integer ids."""
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        ids: dict[int, int] = {}
        packed_groups = []
        for group in self.param_groups:
            for p in group["params"]:
                ids.setdefault(id(p), len(ids))
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [ids[id(p)] for p in group["params"]]
            packed_groups.append(packed)
        packed_state = {(ids[id(p)] if isinstance(p, kiln.Tensor) else p): value for p, value in self.state.items()}
        state_dict = {"state": packed_state, "param_groups": packed_groups}
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, state_dict)
            state_dict = state_dict if result is None else result
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state from :meth:`state_dict`; state tensors are copied, cast to each parameter's dtype."""
        state_dict = state_dict.copy()  # (shallow: a pre hook may change its entries)
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            state_dict = state_dict if result is None else result
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                "loaded state dict has a different number of parameter groups: "
                f"expected {len(self.param_groups)}, got {len(saved_groups)}"
            )
        for group, saved in zip(self.param_groups, saved_groups, strict=True):
            if len(group["params"]) != len(saved["params"]):
                raise ValueError(
                    "loaded state dict contains a parameter group that doesn't match the size of optimizer's "
                    f"group: expected {len(group['params'])} parameters, got {len(saved['params'])}"
                )
        id_to_param = {
            saved_id: p
            for group, saved in zip(self.param_groups, saved_groups, strict=True)
            for saved_id, p in zip(saved["params"], group["params"], strict=True)
        }
        state: defaultdict = defaultdict(dict)
        for key, value in state_dict["state"].items():
            param = id_to_param.get(key)
            if param is None:
                state[key] = copy.deepcopy(value)
            else:
                state[param] = {name: _restore(name, v, param) for name, v in value.items()}
        self.state = state
        self.param_groups = [
            dict(saved, params=group["params"]) for group, saved in zip(self.param_groups, saved_groups, strict=True)
        ]
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)


class _Reading(dict):
    """A group's scalars, noting which of them ``_update_group`` reads (while a step is traced)."""

    def __init__(self, scalars: dict) -> None:
        super().__init__(scalars)
        self.keys_read: set[str] = set()

    def __getitem__(self, key: str):
        self.keys_read.add(key)
        return super().__getitem__(key)


def _refreshed(tensor, number, old, params: list):
    """``tensor`` (a 0-d float64 tensor, or a tuple of them for a tuple ``number``) holding ``number``
    now: filled in place where its value ``old`` differs, made on the parameters' device if new."""
    if isinstance(number, tuple):
        if not (isinstance(tensor, tuple) and isinstance(old, tuple) and len(tensor) == len(number) == len(old)):
            tensor, old = (None,) * len(number), (None,) * len(number)
        return tuple(_refreshed(t, x, was, params) for t, x, was in zip(tensor, number, old, strict=True))
    if tensor is None or isinstance(tensor, tuple):  # on the parameters' device, as the state: no mixing
        return kiln.tensor(number, dtype=kiln.float64, device=params[0].device if params else None)
    if old != number:
        tensor.fill_(number)
    return tensor


_SIGN_WORDS = {0: "zero", 1: "positive", -1: "negative", "nan": "nan", "missing": "missing"}


def _sign(value) -> int | str:
    """0, 1 or -1 by the sign of ``value`` ("nan", or "missing" for None): what a zero skip's guard
    compares (eager tests ``!= 0`` or ``> 0``; nan passes the first and fails the second)."""
    if value is None:
        return "missing"
    number = value if type(value) is float else float(value)
    return (number > 0) - (number < 0) if number == number else "nan"


def _structure_change(name: str, flags: tuple, zero_skips: tuple, before: list, now: list) -> str:
    """Why a traced step no longer applies, in words (``Optimizer._structure`` changed)."""
    if len(before) != len(now):
        return f"{name} has {len(now)} parameter group(s), not {len(before)}"
    for i, (was, is_) in enumerate(zip(before, now, strict=True)):
        for j, (key, x, y) in enumerate(zip(flags + zero_skips, was, is_, strict=True)):
            where = f"{name}.param_groups[{i}][{key!r}]"
            if x != y and j < len(flags):
                return f"{where} changed from {x!r} to {y!r}"
            if x != y:
                return f"{where} is {_SIGN_WORDS[y]} now, {_SIGN_WORDS[x]} when traced"
    return f"{name}'s flags changed"


def _restore(name: str, value: Any, param: kiln.Tensor) -> Any:
    """A fresh copy of one saved state value on the parameter's device; floating tensors take the
    parameter's dtype, except ``step``."""
    if not isinstance(value, kiln.Tensor):
        return copy.deepcopy(value)
    value = value.detach().to(param.device)
    if name != "step" and value.dtype.is_floating_point:
        return value.to(param.dtype).clone()
    return value.clone()


class _PerCall:
    """Each group's hyperparameters as 0-d tensors (``scalars``: dicts parallel to ``param_groups``, not
    part of the state dict) and the numbers they were last given (``written``). An object of kiln's
    own without a ``__dict__``: the tracer's walks of Python state do not enter it, so that refreshing
    it before each call is no store into the state of a user's optimizer subclass (whose own
    attributes are watched and guarded as any object of the user's)."""

    __slots__ = ("scalars", "written")

    def __init__(self, groups: int = 0) -> None:
        self.scalars: list[dict[str, Any]] = [{} for _ in range(groups)]
        self.written: list[dict[str, Any]] = [{} for _ in range(groups)]
