"""``Module``: the base class of every layer, with PyTorch's registration, state dict and hooks."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator

import kiln
from kiln.frontend.jit import state as _jit
from kiln.frontend.tensor import Tensor
from kiln.utils.hooks import RemovableHandle, replaced_arguments

from ..parameter import Buffer, Parameter
from .backward_hooks import BackwardHooks
from .module_state import STATE_DICT_HOOK_TABLES, StateDict

__all__ = ["Module", "RemovableHandle"]

#: A module's hook tables (id -> hook), and the tables that mark some of their hooks (id -> True),
#: as PyTorch names them.
HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks",
               "_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               *STATE_DICT_HOOK_TABLES)  # fmt: skip


def _addindent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    return lines[0] + "\n" + "\n".join(" " * spaces + line for line in lines[1:])


class Module(StateDict):
    """Base class for layers and models: assign Parameters, buffers and Modules as attributes."""

    training: bool

    def __init__(self) -> None:
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = OrderedDict()
        d["_buffers"] = OrderedDict()
        d["_non_persistent_buffers_set"] = set()
        d["_modules"] = OrderedDict()
        for table in HOOK_TABLES:
            d[table] = OrderedDict()
        if _jit.tracing:
            _jit.module_made(self)  # made inside a compiled call: the call's local, traced through

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    #: Set on kiln's own modules whose ``forward`` calls nothing of the user's (no submodule, no
    #: callable it was given): a traced call runs it with its hazard watch paused (``jit.hazards``).
    #: Read from the module's own class only: a subclass's methods may be the user's.
    kiln_only = False

    #: What ``compile()`` made of this module's calls (a ``CompiledFunction`` of ``_call_impl``), or None
    _compiled_call_impl = None

    # ------------------------------------------------------------------ calling and hooks
    def __call__(self, *args, **kwargs):
        if self._compiled_call_impl is not None:
            return self._compiled_call_impl(*args, **kwargs)
        return self._call_impl(*args, **kwargs)

    def compile(self, *args, **kwargs) -> None:
        """Compile this module's calls in place (``torch.nn.Module.compile``): ``kiln.compile``'s arguments
        (and ``torch.compile``'s), the module otherwise unchanged -- its class, its state dict's names."""
        compiled = getattr(kiln.compile(self, *args, **kwargs), "_compiled", None)  # (None: disable=True)
        if compiled is not None and compiled.fn != self._call_impl:
            # a class's own ``__call__`` (which ``kiln.compile(module)`` compiles) reaching ``Module.__call__``
            # would run this program again from inside its own trace: compile ``_call_impl`` instead
            from kiln.frontend.jit.call_cache import CompiledFunction  # noqa: PLC0415

            compiled = CompiledFunction(self._call_impl, guard_code=type(self).forward, name=type(self).__name__,
                                        fullgraph=compiled.fullgraph, check=compiled.check, options=compiled.options)  # fmt: skip
        self.__dict__["_compiled_call_impl"] = compiled

    def _call_impl(self, *args, **kwargs):
        """A call of the module as it is: its hooks, then ``forward``."""
        if _jit.tracing:
            if _jit.watch_hooks and type(self).__dict__.get("kiln_only"):
                watch = self._watch_to_pause()
                if watch is not None:  # (registered with the watch paused: each event it sees costs)
                    return _jit.unwatched(watch, self._registered_forward, *args, **kwargs)
            _jit.module_call(self)  # the training flag becomes a guard of kiln.compile
        if self._forward_pre_hooks or self._forward_hooks or self._backward_hooks or self._backward_pre_hooks:
            return self._call_with_hooks(args, kwargs)  # (tested first: a call without hooks copies no hook tuples)
        return self.forward(*args, **kwargs)

    def _call_with_hooks(self, args: tuple, kwargs: dict):
        """A call with hooks, in PyTorch's order: forward pre-hooks (which may replace the arguments),
        the backward hooks' bracket around the positional arguments, ``forward``, forward hooks (which
        may replace the result), the bracket around the result (``backward_hooks.py``). A forward
        hook registered with ``always_call`` runs even when ``forward`` raises."""
        d = self.__dict__
        with_kwargs = d["_forward_pre_hooks_with_kwargs"]
        for hook_id, hook in tuple(self._forward_pre_hooks.items()):
            if hook_id in with_kwargs:
                args, kwargs = replaced_arguments(hook(self, args, kwargs), args, kwargs, "forward pre-hook")
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        brackets = None
        if self._backward_hooks or self._backward_pre_hooks:
            brackets = BackwardHooks(self, list(self._backward_hooks.values()), list(self._backward_pre_hooks.values()))
            args = brackets.inputs(args)
        hooks, with_kwargs, always = (
            tuple(self._forward_hooks.items()),
            d["_forward_hooks_with_kwargs"],
            d["_forward_hooks_always_called"],
        )
        called: set = set()
        out = None
        try:
            out = self.forward(*args, **kwargs)
            for hook_id, hook in hooks:
                called.add(hook_id)
                result = hook(self, args, kwargs, out) if hook_id in with_kwargs else hook(self, args, out)
                if result is not None:
                    out = result
        except Exception:
            for hook_id, hook in hooks:
                if hook_id in always and hook_id not in called:
                    try:
                        hook(self, args, kwargs, out) if hook_id in with_kwargs else hook(self, args, out)
                    except Exception as error:  # the forward's error is the one raised
                        warnings.warn(
                            f"a forward hook with always_call=True raised {error!r}, silenced: the module's call "
                            "raised an error of its own",
                            stacklevel=2,
                        )
            raise
        return out if brackets is None else brackets.outputs(out)

    def _registered_forward(self, *args, **kwargs):
        """``forward`` of a traced call of a ``kiln_only`` module, after the trace notes the module."""
        _jit.module_call(self)
        return self.forward(*args, **kwargs)

    def _watch_to_pause(self):
        """This thread's hazard watch, when this call of a ``kiln_only`` module runs no hook and no
        ``forward`` the user set on the instance; else None."""
        hooked = self._forward_pre_hooks or self._forward_hooks or self._backward_hooks or self._backward_pre_hooks
        return None if hooked or "forward" in self.__dict__ else _jit.watch_here()

    def register_forward_pre_hook(self, hook: Callable, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:  # fmt: skip
        """``hook(module, args)`` runs before ``forward``; it may return replacement args. With
        ``with_kwargs``: ``hook(module, args, kwargs)``, which may return ``(args, kwargs)``."""
        return self._add_hook("_forward_pre_hooks", hook, prepend, ("_forward_pre_hooks_with_kwargs",) * with_kwargs)

    def register_forward_hook(self, hook: Callable, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:  # fmt: skip
        """``hook(module, args, output)`` runs after ``forward``; it may return a replacement output.
        With ``with_kwargs``: ``hook(module, args, kwargs, output)``; with ``always_call``, it runs
        even when ``forward`` raises."""
        marks = ("_forward_hooks_with_kwargs",) * with_kwargs + ("_forward_hooks_always_called",) * always_call
        return self._add_hook("_forward_hooks", hook, prepend, marks)

    def register_full_backward_pre_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_output)`` runs when the gradients of the module's outputs are known; it
        may return replacement ``grad_output`` (a tuple of as many)."""
        return self._add_hook("_backward_pre_hooks", hook, prepend)

    def register_full_backward_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_input, grad_output)`` runs when the gradients of the module's positional
        arguments are known; it may return replacement ``grad_input`` (``backward_hooks.py``)."""
        return self._add_hook("_backward_hooks", hook, prepend)

    def _add_hook(self, table: str, hook: Callable, prepend: bool, marks: tuple[str, ...] = ()) -> RemovableHandle:
        """Register ``hook`` in ``table`` (first with ``prepend``), its id in the flag tables ``marks``."""
        d = self.__dict__
        handle = RemovableHandle(d[table], *(d[mark] for mark in marks))
        d[table][handle.id] = hook
        if prepend:
            d[table].move_to_end(handle.id, last=False)
        for mark in marks:
            d[mark][handle.id] = True
        return handle

    def __getstate__(self) -> dict:
        """A copy or a pickle of the module runs uncompiled (``compile()``'s program is this module's)."""
        state = self.__dict__.copy()
        state.pop("_compiled_call_impl", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for table in HOOK_TABLES:  # (a module pickled before a table existed)
            self.__dict__.setdefault(table, OrderedDict())

    # ------------------------------------------------------------------ registration
    def __getattr__(self, name: str):
        # Every forward reads its parameters here (``self.weight``): the stores are read once each,
        # without a loop over their names (~0.3 us of ~0.7 a read).
        d = self.__dict__
        parameters, buffers, modules = d.get("_parameters"), d.get("_buffers"), d.get("_modules")
        if parameters is not None and name in parameters:
            return parameters[name]
        if buffers is not None and name in buffers:
            return buffers[name]
        if modules is not None and name in modules:
            return modules[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def _remove_from(self, name: str, *stores: str) -> None:
        for store in stores:
            self.__dict__[store].pop(name, None)
        self._non_persistent_buffers_set.discard(name)

    def __setattr__(self, name: str, value) -> None:
        d = self.__dict__
        if "_parameters" not in d and isinstance(value, Parameter | Module):
            raise AttributeError("cannot assign parameters or modules before Module.__init__() call")
        if isinstance(value, Parameter):
            d.pop(name, None)
            self._remove_from(name, "_buffers", "_modules")
            self.register_parameter(name, value)
        elif isinstance(value, Module):
            d.pop(name, None)
            self._remove_from(name, "_parameters", "_buffers")
            d["_modules"][name] = value
        elif isinstance(value, Buffer):
            d.pop(name, None)
            self._remove_from(name, "_parameters", "_modules")
            self.register_buffer(name, value.data, persistent=value.persistent)
        elif "_parameters" in d and name in d["_parameters"]:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as parameter '{name}' (kiln.nn.Parameter or None expected)"
                )
            d["_parameters"][name] = None
        elif "_modules" in d and name in d["_modules"]:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as child module '{name}' (Module or None expected)"
                )
            d["_modules"][name] = None
        elif "_buffers" in d and name in d["_buffers"]:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' (Tensor or None expected)")
            d["_buffers"][name] = value
        else:
            object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        for store in ("_parameters", "_buffers", "_modules"):
            if name in self.__dict__[store]:
                self._remove_from(name, store)
                return
        object.__delattr__(self, name)

    def _check_name(self, name, kind: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain ".", got: {name}')
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        self._check_name(name, "parameter")
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(
                f"cannot assign '{type(param).__name__}' object to parameter '{name}' (kiln.nn.Parameter or None required)"
            )
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        self._check_name(name, "buffer")
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' (Tensor or None required)"
            )
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def register_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._check_name(name, "module")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        self._modules[name] = module

    add_module = register_module

    def get_submodule(self, target: str) -> Module:
        mod = self
        for item in target.split(".") if target else ():
            if item not in mod._modules:
                raise AttributeError(f"{type(mod).__name__} has no attribute `{item}`")
            mod = mod._modules[item]
        return mod

    def set_submodule(self, target: str, module: Module, strict: bool = False) -> None:
        """Put ``module`` at the dotted path ``target`` (``strict``: only where a submodule is already)."""
        if target == "":
            raise ValueError("Cannot set the submodule without a target name!")
        if not isinstance(module, Module):
            raise ValueError(f"`module` is not an nn.Module, found {type(module)}")
        parent_path, _, name = target.rpartition(".")
        parent = self.get_submodule(parent_path)
        if strict and not hasattr(parent, name):
            raise AttributeError(f"{parent._get_name()} has no attribute `{name}`")
        if hasattr(parent, name) and not isinstance(getattr(parent, name), Module):
            raise AttributeError(f"`{name}` is not an nn.Module")
        setattr(parent, name, module)

    def get_parameter(self, target: str) -> Parameter:
        """The parameter at the dotted path ``target`` (``"encoder.0.weight"``)."""
        mod, name = self._owner_of(target)
        if not isinstance(getattr(mod, name), Parameter):
            raise AttributeError(f"`{name}` is not an nn.Parameter")
        return getattr(mod, name)

    def get_buffer(self, target: str) -> Tensor:
        """The buffer at the dotted path ``target``."""
        mod, name = self._owner_of(target)
        if name not in mod._buffers:
            raise AttributeError(f"`{name}` is not a buffer")
        return getattr(mod, name)

    def _owner_of(self, target: str) -> tuple[Module, str]:
        path, _, name = target.rpartition(".")
        mod = self.get_submodule(path)
        if not hasattr(mod, name):
            raise AttributeError(f"{mod._get_name()} has no attribute `{name}`")
        return mod, name

    # ------------------------------------------------------------------ traversal
    def _named_members(self, store: str, prefix: str, recurse: bool, remove_duplicate: bool = True):
        seen = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for mod_prefix, mod in modules:
            for name, value in mod.__dict__[store].items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))
                yield (mod_prefix + "." if mod_prefix else "") + name, value

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def named_children(self):
        seen = set()
        for name, mod in self._modules.items():
            if mod is not None and id(mod) not in seen:
                seen.add(id(mod))
                yield name, mod

    def children(self) -> Iterator[Module]:
        for _, mod in self.named_children():
            yield mod

    def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True):
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, mod in self._modules.items():
            if mod is not None:
                yield from mod.named_modules(memo, prefix + ("." if prefix else "") + name, remove_duplicate)

    def modules(self) -> Iterator[Module]:
        for _, mod in self.named_modules():
            yield mod

    # ------------------------------------------------------------------ modes, dtypes, grads
    def train(self, mode: bool = True) -> Module:
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        for mod in self.modules():
            mod.__dict__["training"] = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if set_to_none:  # without reading .grad: a compiled step then holds whether it was set or not
                p.grad = None
            elif p.grad is not None:  # zeros in place, through the public API, so that a trace sees it
                if p.grad.grad_fn is not None:
                    p.grad = p.grad.detach()
                with kiln.no_grad():
                    p.grad.zero_()

    def apply(self, fn: Callable[[Module], None]) -> Module:
        for mod in self.children():
            mod.apply(fn)
        fn(self)
        return self

    def _apply(self, fn: Callable[[Tensor], Tensor]) -> Module:
        """Replace every parameter's and buffer's data by ``fn(data)``, keeping the same Parameter objects."""
        for mod in self.modules():
            for p in mod._parameters.values():
                if p is not None:
                    with kiln.no_grad():
                        p.data = fn(p.detach())
                    if p.grad is not None:
                        p._grad = fn(p.grad)
            for name, b in mod._buffers.items():
                if b is not None:
                    mod._buffers[name] = fn(b)
        return self

    def to(self, *args, **kwargs) -> Module:
        """``to(device)``, ``to(dtype)`` or ``to(device, dtype)``: floating tensors change dtype, all move."""
        device, dtype = kwargs.get("device"), kwargs.get("dtype")
        for a in args:
            if isinstance(a, Tensor):
                device, dtype = a.device, a.dtype
            elif isinstance(a, kiln.dtype):
                dtype = a
            else:
                device = a
        if dtype is not None and not dtype.is_floating_point:
            raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got desired dtype={dtype}")

        def convert(t: Tensor) -> Tensor:
            want = dtype if dtype is not None and t.dtype.is_floating_point else None
            return t.to(device=device, dtype=want)

        return self._apply(convert)

    def float(self) -> Module:
        return self._apply(lambda t: t.float() if t.dtype.is_floating_point else t)

    def double(self) -> Module:
        return self._apply(lambda t: t.double() if t.dtype.is_floating_point else t)

    def half(self) -> Module:
        return self._apply(lambda t: t.half() if t.dtype.is_floating_point else t)

    def bfloat16(self) -> Module:
        return self._apply(lambda t: t.bfloat16() if t.dtype.is_floating_point else t)

    def type(self, dst_type) -> Module:
        """Every parameter and buffer as ``dst_type`` (a dtype, or its name)."""
        return self._apply(lambda t: t.type(dst_type))

    def to_empty(self, *, device, recurse: bool = True) -> Module:
        """Parameters and buffers on ``device``, their values not copied (uninitialized memory)."""
        if not recurse:
            raise NotImplementedError("kiln's Module.to_empty moves every submodule's tensors (recurse=True)")
        return self._apply(lambda t: kiln.empty_like(t, device=device))

    def share_memory(self) -> Module:
        """Every parameter and buffer (and a gradient already made) moved into shared memory in place,
        as PyTorch's: worker processes handed the module (a ``Process`` argument, a ``Queue``) then
        update the same memory (Hogwild training; ``kiln.multiprocessing``). Before, it returned the
        module unchanged and each worker trained a copy: pytorch/examples' mnist_hogwild learned
        nothing (test loss 2.30 after 3 epochs where PyTorch's reaches 0.21)."""
        for tensor in (*self.parameters(), *self.buffers()):
            tensor.share_memory_()
            if tensor.grad is not None:
                tensor.grad.share_memory_()
        return self

    def cpu(self) -> Module:
        return self.to("cpu")

    def cuda(self, device=None) -> Module:
        return self.to("cuda" if device is None else device)

    # ------------------------------------------------------------------ repr
    def extra_repr(self) -> str:
        return ""

    def _get_name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        extra = self.extra_repr()
        lines = extra.split("\n") if extra else []
        for name, mod in self._modules.items():
            lines.append(f"({name}): " + _addindent(repr(mod), 2))
        main = self._get_name() + "("
        if lines:
            if len(lines) == 1 and not self._modules:
                main += lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"

    def __dir__(self):
        keys = list(super().__dir__()) + list(self._parameters) + list(self._buffers) + list(self._modules)
        return sorted(k for k in set(keys) if not k[0].isdigit())
