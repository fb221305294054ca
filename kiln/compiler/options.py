"""``CompileOptions``, what ``kiln.compile`` and the compile driver are told, and the compile deadline's
default."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..codegen.backend import backend_names

DEFAULT_COMPILE_TIMEOUT = 60.0  # seconds; LLVM takes well under one for most programs


def check_compile_timeout(seconds: object) -> None:
    """``ValueError`` unless ``seconds`` is None or a number of seconds > 0 (``CompileOptions``)."""
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0):
        raise ValueError(f"CompileOptions: compile_timeout must be a number of seconds > 0 or None, got {seconds!r}")


def default_compile_timeout() -> float | None:
    """``$KILN_COMPILE_TIMEOUT`` (seconds; ``0``, ``none`` or ``off``: no deadline), else
    ``DEFAULT_COMPILE_TIMEOUT``: the default of ``CompileOptions.compile_timeout``."""
    text = os.environ.get("KILN_COMPILE_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_COMPILE_TIMEOUT
    if text.lower() in ("0", "none", "off"):
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:  # also nan
        raise ValueError(f"KILN_COMPILE_TIMEOUT must be a number of seconds > 0 (or 0/none/off), got {text!r}")
    return seconds


def default_wait() -> bool:
    """``$KILN_COMPILE_WAIT``: ``1`` (or true/yes/on) waits for each compile, ``0`` (or empty) compiles in
    the background: the default of ``CompileOptions.wait``."""
    text = os.environ.get("KILN_COMPILE_WAIT", "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise ValueError(
        f"KILN_COMPILE_WAIT must be 1 (wait for each compile) or 0 (compile in the background), got {text!r}"
    )


def default_loops() -> bool:
    """``$KILN_LOOPS``: ``0`` (or false/no/off) leaves repeated computations unrolled; anything else, or
    unset, rolls them into loops: the default of ``CompileOptions.loops``."""
    return os.environ.get("KILN_LOOPS", "").strip().lower() not in ("0", "false", "no", "off")


@dataclass
class CompileOptions:
    """Options of ``kiln.compile``.

    - ``recompile_limit``: new specializations per function; later unmatched calls run eagerly.
    - ``backend``: None (the default) chooses the backend from the graph's device: ``"llvm"`` for
      the CPU (fused kernels compiled for the host through llvmlite; nodes without a kernel run
      their eager kernels), the interpreter elsewhere. A name overrides it (tests):
      ``"interpreter"`` (the IR interpreter: every node runs its eager kernel), ``"llvm"``, or any
      backend registered with ``kiln.codegen.backend.register_backend``.
    - ``passes``: the pass pipeline (None: ``kiln.passes.DEFAULT_PIPELINE``).
    - ``dump_dir``: write each specialization's traced IR and the result of every compile stage
      there (the IR after each pass and after fusion, the layouts, write-backs and memory plan).
    - ``verify``: run the IR verifier after each pass (tests and debugging).
    - ``compile_timeout``: seconds a compile may take (None: no limit); past it the call runs on
      the interpreter, saying why (``kiln.compiler.driver``). Default: ``$KILN_COMPILE_TIMEOUT``
      or 60.
    - ``wait``: whether a traced call waits for its program to compile (True), or returns its eager
      result at once while the program compiles in the background, later calls switching to it
      when it is ready (False). Default: ``$KILN_COMPILE_WAIT`` (``1``: wait), else False.
    - ``dynamic``: None (the default) makes an argument's leading size dynamic once a second size
      is seen for it; True makes every tensor argument's leading size dynamic from the first call
      (which is traced, then compiled when a call brings another size); False never
      (``kiln.frontend.jit.dynamic``).
    - ``loops``: whether a trace that repeats one computation (a Python loop over time steps or
      layers) is rolled into a loop node whose body is compiled once (``kiln.passes.roll_loops``;
      backends that run no loop nodes get the unrolled graph). Default: ``$KILN_LOOPS`` (``0``: off),
      else True.
    """

    recompile_limit: int = 8
    backend: str | None = None
    passes: tuple | None = None
    dump_dir: str | None = None
    verify: bool = False
    compile_timeout: float | None = field(default_factory=default_compile_timeout)
    wait: bool = field(default_factory=default_wait)
    dynamic: bool | None = None
    loops: bool = field(default_factory=default_loops)

    def __post_init__(self) -> None:
        if self.dynamic not in (None, True, False):
            raise ValueError(f"CompileOptions: dynamic must be None, True or False, got {self.dynamic!r}")
        if not isinstance(self.loops, bool):
            raise ValueError(f"CompileOptions: loops must be True or False, got {self.loops!r}")
        if not isinstance(self.wait, bool):
            raise ValueError(f"CompileOptions: wait must be True or False, got {self.wait!r}")
        if not isinstance(self.recompile_limit, int) or self.recompile_limit < 0:
            raise ValueError(f"CompileOptions: recompile_limit must be an int >= 0, got {self.recompile_limit!r}")
        check_compile_timeout(self.compile_timeout)
        if self.backend is not None and self.backend not in backend_names():
            raise ValueError(f"CompileOptions: unknown backend {self.backend!r}; expected None (chosen from the "
                             f"device) or one of {', '.join(backend_names())}")  # fmt: skip


def options_text(options: CompileOptions) -> str:
    """The compile options that change the compiled program, as text for the cache key."""
    passes = "default" if options.passes is None else ",".join(getattr(p, "__name__", repr(p)) for p in options.passes)
    return f"backend={options.backend}; passes={passes}; loops={options.loops}"
