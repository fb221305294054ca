"""The interpreter hooks through which ``hazards.Watch`` follows a traced call's Python code.

The watch needs two kinds of event: the start of each user function (to scan its bytecode, see
``hazards``) and the C calls made by the user's code and by library code run for the user (a
container's ``append``, a random draw). A ``sys.setprofile`` hook alone sees them, but it sees every
call and return of every function as well, C functions included: about 130,000 events in the trace
of a DCGAN step, nearly all inside kiln's own ops, each a Python call, and a hook keeps the
interpreter off its specialized instructions meanwhile (that trace took 40 ms of CPU, 15 ms with no
hook; 28 ms with these, most of it the cost of any ``sys.settrace`` function: a no-op one costs as
much). So ``Hooks`` runs

- a ``sys.settrace`` function, called once as each Python frame starts (not at C calls, nor at
  returns), which reports user functions and, in a frame that is not kiln's own, turns on
- the profile hook, for that frame's C calls. A kiln frame turns it off as it starts; a user
  frame turns it back on at its next opcode after a call into kiln returns; a frame the profile
  hook serves turns it off as it returns into kiln. (A library frame, whose opcodes are not
  followed, leaves C calls made after a call into kiln returned unwatched until the next frame
  starts: library code run for the user that calls kiln, then draws from a random generator.
  kiln's own frames' C calls go unwatched: kiln draws from no Python or numpy generator of the
  user's, and the global generators' states are compared after the call anyway.)

Where a debugger or a coverage tool holds ``sys.settrace``, the profile hook alone runs everywhere
(``whole``), as it did before. Where one holds ``sys.setprofile``, nothing is installed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from . import reads
from .trace import _KILN_DIR

KILN, USER, LIBRARY = "kiln", "user", "library"
#: kiln's layers below the frontend (DESIGN.md): their code never calls the user's (kiln.nn, the
#: autograd and the frontend do: a module's forward, a hook, a custom Function)
_KILN_LOWER = tuple(_KILN_DIR + layer + os.sep for layer in ("ir", "passes", "codegen", "runtime"))
#: The standard library's and installed packages' folders (set by first_use): their module-level
#: caches and registries are not the user's state.
_LIBRARIES: tuple = ()
_KINDS: dict[str, str] = {}  # a code object's file -> its kind


def first_use() -> None:
    global _LIBRARIES
    if not _LIBRARIES:
        _LIBRARIES = reads.library_folders()


def user_code(code) -> bool:
    """Whether ``code`` is the user's: not kiln's, the standard library's nor an installed package's."""
    return _kind(code.co_filename) is USER


def _kind(filename: str) -> str:
    if filename.startswith(_KILN_DIR):
        return KILN
    if filename.startswith(_LIBRARIES) or filename.startswith("<frozen"):
        return LIBRARY
    return USER


def kind_of(frame) -> str:
    """Whose code ``frame`` runs. Code made by ``exec`` (``<string>``: a dataclass's ``__init__``)
    is its module's, named by the globals it runs with."""
    filename = frame.f_code.co_filename
    kind = _KINDS.get(filename)
    if kind is None:
        if filename.startswith("<") and not filename.startswith("<frozen"):
            module_file = frame.f_globals.get("__file__")
            if module_file is None:
                return USER
            filename = module_file
        kind = _KINDS.get(filename) or _KINDS.setdefault(filename, _kind(filename))
    return kind


def for_the_user(frame) -> bool:
    """Whether the code running ``frame`` was called for the user's program rather than for kiln's
    own work: the nearest caller that is not library code is user code or kiln's frontend (the
    user's program calls ``random.randint``; ``Module.__call__`` calls a forward from an installed
    package), not kiln's lower layers (an eager kernel or a code generator whose library names a
    temporary file with a generator of its own)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_KILN_DIR):
            return not name.startswith(_KILN_LOWER)
        if user_code(frame.f_code):
            return True
        frame = frame.f_back
    return True


class Hooks:
    """Calls ``on_user_call(frame)`` as each user function starts and ``on_c_call(frame, function)``
    at the C calls of user and library frames run for the user (see the module's docstring)."""

    def __init__(self, on_user_call: Callable, on_c_call: Callable) -> None:
        self._on_user_call = on_user_call
        self._on_c_call = on_c_call
        self._profiling = False
        self.whole = False  # the profile hook alone, everywhere
        self._profile_hook: Callable = self._c_calls  # the objects installed, to remove only those
        self._tracer_hook: Callable | None = None

    def start(self) -> bool:
        """Install the hooks in this thread; False (nothing installed) when a profiler holds ``sys.setprofile``."""
        first_use()
        if sys.getprofile() is not None:
            return False
        if sys.gettrace() is not None:
            self.whole = True
            self._profile_hook = self._whole
            sys.setprofile(self._profile_hook)
        else:
            self._tracer_hook = self._tracer()
            sys.settrace(self._tracer_hook)
        return True

    def stop(self) -> None:
        """Remove the hooks -- those still installed: a debugger the call started (``breakpoint()``)
        keeps its own."""
        if self._tracer_hook is not None and sys.gettrace() is self._tracer_hook:
            sys.settrace(None)
        if sys.getprofile() is self._profile_hook:
            sys.setprofile(None)
        self._profiling = False

    def _whole(self, frame, event: str, arg) -> None:
        if event == "c_call":
            self._on_c_call(frame, arg)
        elif event == "call" and kind_of(frame) is USER:
            self._on_user_call(frame)

    def _c_calls(self, frame, event: str, arg) -> None:
        if event == "c_call":
            self._on_c_call(frame, arg)

    def _tracer(self) -> Callable:
        """``sys.settrace``'s function: called as each Python frame starts, kiln's own tens of
        thousands of times in a trace, so a kiln frame while C calls are not watched costs a lookup."""
        kinds, started = _KINDS, self._frame_started

        def frame_started(frame, event: str, arg):
            kind = kinds.get(frame.f_code.co_filename) or kind_of(frame)
            if kind is KILN and not self._profiling:
                return None
            return started(frame, kind)

        return frame_started

    def _frame_started(self, frame, kind: str):
        if kind is KILN or (kind is LIBRARY and not for_the_user(frame)):
            if self._profiling:
                sys.setprofile(None)
                self._profiling = False
            return None  # no events of this frame's own
        if kind is USER:
            self._on_user_call(frame)
            frame.f_trace_opcodes = True
        else:  # library code run for the user (kiln's frontend calls contextlib, numpy...): its return alone
            frame.f_trace_lines = False
        if not self._profiling:
            sys.setprofile(self._profile_hook)
            self._profiling = True
        return self._frame_event

    def _frame_event(self, frame, event: str, arg):
        """A watched frame's own events: its opcodes resume C-call watching after a call into kiln
        turned it off; its return into kiln turns it off."""
        if event == "return":
            caller = frame.f_back
            if self._profiling and caller is not None and kind_of(caller) is KILN:
                sys.setprofile(None)
                self._profiling = False
        elif not self._profiling:
            sys.setprofile(self._profile_hook)
            self._profiling = True
        return self._frame_event
