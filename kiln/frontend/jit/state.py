"""The tracer's footprint on the eager hot paths: one flag and one context variable.

``tracing`` counts the traces running in any thread, so that eager code pays one attribute
read per op when nothing is traced; the trace of *this* thread or task lives in the context
variable ``current`` (DESIGN.md: the active trace is never a module global). The hooks below are
what tensors, dispatch and autograd call; each looks up the current trace and does nothing
when there is none.
"""

from __future__ import annotations

import os
import sys
from contextvars import ContextVar
from typing import Any

from .locations import KILN_DIR

tracing = 0
current: ContextVar[Any] = ContextVar("kiln_trace", default=None)
#: The profile functions of the hazard watches on now, in any thread (``hazards.Watch``). A profile
#: function makes the interpreter report every call and run unspecialized code, more than half of a
#: traced op's time: kiln's own work that calls no user code runs with its thread's watch paused.
watch_hooks: set = set()
#: Set while ``kiln.onnx.export`` traces: RNN layers record their per-step ops (ONNX has no ``rnn_scan``).
per_step_recurrences: ContextVar[bool] = ContextVar("kiln_per_step_recurrences", default=False)


def watch_here():
    """The hazard watch's profile function when one is on in this thread and not paused, else None."""
    if watch_hooks:
        hook = sys.getprofile()
        if hook in watch_hooks:
            return hook
    return None


def unwatched(hook, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with this thread's watch ``hook`` (``watch_here()``) paused: for kiln's
    own work, which calls no user code.

    No user frame runs inside it either, so every op it records has the user's line of its first op:
    the trace finds that line once (``Trace.pin``), not with a walk up the stack per op (an LSTM
    cell's backward, run by the engine inside one such call, records thousands of ops)."""
    sys.setprofile(None)
    trace = current.get()
    if not _kiln_own(fn):  # the user's code (a class of theirs set ``kiln_only``) runs unseen
        watch = getattr(hook, "__self__", None)
        if watch is not None and getattr(watch, "whole", "") is None:
            watch.whole = f"{getattr(fn, '__qualname__', fn)} ran with the watch paused (kiln_only)"
    if trace is None or not _kiln_own(fn):
        try:
            return fn(*args, **kwargs)
        finally:
            sys.setprofile(hook)
    outer_pin, trace.pin = trace.pin, []
    try:
        return fn(*args, **kwargs)
    finally:
        trace.pin = outer_pin
        sys.setprofile(hook)


def own_lines(fn, *args):
    """``fn(*args)``, user code that kiln's own code calls without ``watched``: the ops it records
    find their own lines, not the line pinned by ``unwatched``."""
    trace = current.get()
    if trace is None or trace.pin is None:
        return fn(*args)
    outer_pin, trace.pin = trace.pin, None
    try:
        return fn(*args)
    finally:
        trace.pin = outer_pin


def _kiln_own(fn) -> bool:
    """Whether ``fn`` is kiln's own: a function of kiln, or a method of a class of kiln (not a user's
    class that set ``kiln_only`` itself, whose code would have lines of its own)."""
    owner = getattr(fn, "__self__", None)
    if owner is not None:
        fn = owner if isinstance(owner, type) else type(owner)
    return getattr(fn, "__module__", "").startswith("kiln.")


def watched(hook, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with the watch ``hook`` on again, from inside ``unwatched``: a call of
    user code (a hook, a custom Function's backward), whose ops have lines of their own."""
    sys.setprofile(hook)
    trace = current.get()
    outer_pin = None
    if trace is not None:
        outer_pin, trace.pin = trace.pin, None
    try:
        return fn(*args, **kwargs)
    finally:
        if trace is not None:
            trace.pin = outer_pin
        sys.setprofile(None)


def active() -> bool:
    """Whether a trace is running in this thread or task."""
    return bool(tracing) and current.get() is not None


def stamp(tensor) -> None:
    """``make_tensor`` calls this while tracing: mark ``tensor`` as born inside the trace."""
    trace = current.get()
    if trace is not None:
        trace.on_new_tensor(tensor)


def shape_of(tensor) -> tuple:
    """``tensor``'s shape as Python code reads it while tracing: the sizes a trace learning dynamic
    sizes watches come as ``dynamic.WatchedSize`` (comparing one makes the call specialize)."""
    trace = current.get()
    shape = tensor._data.shape
    if trace is None or not getattr(trace, "watched_sizes", None):
        return shape
    from .watched_sizes import watched_shape  # noqa: PLC0415

    return watched_shape(shape, trace)


def len_read(tensor) -> None:
    """The user's ``len(tensor)`` while a trace learns dynamic sizes: Python turns what ``__len__``
    returns into a plain int, which ``WatchedSize`` cannot follow (``len(x) // 4`` would fold two
    sizes into one constant unseen), so a leading size the trace watches keeps the call static, with
    the line; ``x.shape[0]`` is followed."""
    trace = current.get()
    watched = getattr(trace, "watched_sizes", None) if trace is not None else None
    if not watched or tensor._data.shape[0] not in watched:
        return
    frame = sys._getframe(2)  # the caller of Tensor.__len__
    if frame.f_code.co_filename.startswith(KILN_DIR):
        return  # kiln's own code folds no size into a constant
    trace.on_size_compared(f"len() of a tensor whose leading size would be dynamic, a plain int that a dynamic program "
                           f"cannot follow (x.shape[0] is followed) at {frame.f_code.co_filename}:{frame.f_lineno}")  # fmt: skip


def value_access(tensor, what: str) -> None:
    """Python is about to read ``tensor``'s values (``bool``, ``.item()``...): the trace stops here."""
    trace = current.get()
    if trace is not None:
        trace.on_value_access(tensor, what)


def ran_hooks(tensor) -> None:
    """The engine ran ``tensor``'s hooks in a traced call (a backward inside the compiled function):
    its compiled calls run them as traced, so an argument's must be the same at later calls."""
    trace = current.get()
    if trace is not None and trace.parent is None:
        index = trace._external_index.get(id(tensor))
        if index is not None:
            trace.externals[index].hooks_ran = True


def grad_change(tensor, overwrite: bool = False) -> None:
    """``tensor.grad`` is about to be replaced: by an assignment (``overwrite``, which does not depend
    on the ``.grad`` before it) or an accumulation (which reads it first)."""
    trace = current.get()
    if trace is not None:
        if not overwrite:
            trace.on_grad_read(tensor)
        trace.on_grad_change(tensor)


def grad_read(tensor) -> None:
    """Python reads ``tensor.grad`` (``if p.grad is None``): unless the traced call set it before,
    whether it was set at the call's start becomes a guard."""
    trace = current.get()
    if trace is not None:
        trace.on_grad_read(tensor)


def module_call(module) -> None:
    """A module runs: its ``training`` flag becomes a guard of the trace."""
    trace = current.get()
    if trace is not None:
        trace.on_module_call(module)


def module_made(module) -> None:
    """A module is constructed inside the traced call: it is the call's own local, made again by every
    call, so it is traced through and its ``training`` flag is not a guard (nor is it "freed")."""
    trace = current.get()
    if trace is not None:
        trace.made_modules.add(id(module))


def before_each_call(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` eagerly now and, when called inside ``kiln.compile``'s trace,
    again before every call of the compiled program.

    For code that copies Python state into tensors, such as an optimizer writing its learning
    rate (a Python float that a scheduler changes) into the 0-d tensor that ``step()`` reads: the
    compiled program then reads the tensor as an input instead of baking the float in.
    """
    trace = current.get()
    if trace is None:
        return fn(*args, **kwargs)
    return trace.run_prologue(fn, args, kwargs)


def guard(make) -> bool:
    """While ``kiln.compile`` traces this call, call ``make()``: it returns ``(check, reads)``. The
    specialization being traced then holds only while ``check()`` returns None (otherwise it returns
    why not, in words, and that call traces again; ``check`` may be None); ``reads`` are
    ``(what, how)`` pairs naming the Python values the traced code consumed, ``how`` being
    ``"input"`` (read at each call, as ``before_each_call`` does) or ``"guard"`` (checked by
    ``check``): ``kiln.explain`` lists them. Returns whether a trace is running (not tracing,
    ``make`` is not called).
    """
    trace = current.get()
    if trace is None:
        return False
    trace.on_guard(*make())
    return True


def unsafe(reason: str) -> None:
    """The call is doing something a compiled program could not repeat faithfully: the trace stops
    here (the call finishes eagerly, the reason and the user's line are kept)."""
    trace = current.get()
    if trace is not None:
        trace.break_here(reason)


_CREATION = os.path.join("frontend", "ops", "creation.py")


def numpy_tensor(array, tensor, shares_memory: bool) -> None:
    """``tensor`` was made from the numpy array ``array`` while tracing (``from_numpy`` when it
    ``shares_memory``, else a copy): the program reads the array's memory at each call."""
    trace = current.get()
    if trace is not None:
        # the code that called kiln.tensor / from_numpy: kiln's own (an index table interpolate built
        # from the shapes) or the user's (an array the call may have computed from data)
        caller: Any = sys._getframe(2)
        while caller is not None and caller.f_code.co_filename.endswith(_CREATION):  # (as_tensor -> from_numpy)
            caller = caller.f_back
        users = caller is None or not caller.f_code.co_filename.startswith(KILN_DIR)
        trace.on_numpy(array, tensor, shares_memory, users=users)


def born_in_trace(tensor) -> bool:
    """Whether ``tensor`` was made inside the current trace (not an argument or captured tensor)."""
    trace = current.get()
    return trace is None or trace.is_born(tensor)


def backward_trace() -> bool:
    """Whether a compiled call's backward is being traced (the forward trace's gradients)."""
    trace = current.get()
    return trace is not None and trace.parent is not None


def touch(tensor) -> None:
    """Bind ``tensor`` in the current trace (an input when it is from outside the call) before a
    write that replaces its whole contents: the write is then seen as a change to write back."""
    trace = current.get()
    if trace is not None:
        trace.value_of(tensor)


def make_state(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` eagerly, outside any ``kiln.compile`` trace, and return what it
    returns: for state made lazily on a first call (an optimizer's moments, a cache). The tensors it
    makes are then state from outside the call, which the compiled program reads and writes back at
    each call, rather than values the traced call made and stored away (which would make that call
    run eagerly, and cost the next one a second trace). ``fn`` must not read the call's tensors'
    values: it runs once, when the state is missing.

    >>> make_state(dict, step=0)
    {'step': 0}
    """
    token = current.set(None)
    try:
        return fn(*args, **kwargs)
    finally:
        current.reset(token)
