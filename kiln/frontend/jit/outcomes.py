"""What a compile says where it does not run compiled code: the trace stopped (``TraceBreak``), the
function asked for one graph and cannot have it (``TraceBreakError``), or the user is told once
(``CompileWarning``). Kept apart from the tracer, so that code which only reports -- ``kiln.jit``, the
cache of compiled calls, eager kernels' warnings -- need not load it."""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.graph import SourceLocation


class TraceBreakError(RuntimeError):
    """``fullgraph=True``: the function did something a graph cannot capture (the message says what and where)."""


class CompileWarning(UserWarning):
    """What ``kiln.compile`` did instead of running compiled code -- a trace that stopped (that call ran
    eagerly), the recompile limit reached -- said once per function and reason, at the user's call.
    Silence it as any warning: ``warnings.filterwarnings("ignore", category=kiln.CompileWarning)``."""


@dataclass(frozen=True)
class TraceBreak:
    """Why and where a trace stopped."""

    reason: str
    loc: SourceLocation | None

    def __str__(self) -> str:
        where = f" at {self.loc}" if self.loc else ""
        return f"{self.reason}{where}"
