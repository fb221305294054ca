"""A dynamic specialization's program in the disk cache: a second process loads it without the passes or LLVM.

A static program's entry (``compiler/program_cache.py``) is keyed by its traced graph; a dynamic
specialization's program (``symbolic_program.lower_symbolic``) is made from a *symbolic* graph by
more than the driver's stages -- the batch sums split, the symbolic prefixes collapsed, the layouts
probed at two sizes -- so its key is the static key of the symbolic graph (its printed text,
constants, input strides, options, backend and host, the compiler's source) and what decides
those steps too: this package's source, the probe sizes and the write-backs asked for. Its entry is
a static entry (the same format, signature, versioning and rebuilding of what does not load) of the
fused graph and the kernels' code, each kernel's record keeping the sizes it reads
(``kernel_cache.info_record``), plus the table of the layouts the code was generated for (``same``:
value position -> byte strides, or ``C_ORDER``), which is all ``SymbolicProgram`` needs beside them.

Without it every run of a training script whose last batch is smaller, or of a language model
over a second length, compiled its dynamic program from scratch (the kernel cache still spared
LLVM, not the passes, fusion, probing and code generation), and the call that made a dynamic
specialization waited for that compile even in the background mode (it compiles in the
background now, ``background_compiles.py``; the numbers below are the waiting mode's). Measured
(a 2-core machine shared with other work, 5 warm processes each, alternated): the CNN's ragged
last batch compiled its dynamic program in 0.10-0.11 s, 0.008-0.013 s from the entry, that call's
CPU time 0.16-0.18 s against 0.07-0.12 s; the LSTM LM's second length 0.03-0.06 s against
0.005-0.009 s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ...codegen.backend import LoweringReport
from ...compiler import program_cache
from ...compiler.options import options_text
from ...ir.graph import Graph
from ...runtime.cache import cache_key, source_digest

#: Bump when what a dynamic program's entry holds beyond a static entry changes.
SYMBOLIC_FORMAT = 1

#: The layout of a value its kernels take C-contiguous at every size (its strides follow the sizes).
C_ORDER = "C order"


def symbolic_key(graph: Graph, backend, options, strides: Sequence[tuple | None], requested: tuple,
                 probes: tuple[int, ...]) -> str | None:  # fmt: skip
    """The key of the program of symbolic ``graph``, or None when there is no cache to look in (it is
    off, or the backend's code cannot be told apart by host: ``signature()`` None)."""
    if not program_cache.disk_cache().enabled or backend.signature() is None:
        return None
    static = program_cache.program_key(graph, f"{backend.name}; {backend.signature()}", options_text(options),
                                       strides)  # fmt: skip
    return cache_key("kiln dynamic program", str(SYMBOLIC_FORMAT), static, source_digest("frontend/jit"),
                     repr(tuple(probes)), repr([tuple(pair) for pair in requested]))  # fmt: skip


def to_entry(fused: Graph, backend, code, report: LoweringReport, layouts: dict[int, tuple | str],
             traced: Graph) -> bytes:  # fmt: skip
    """The entry of a dynamic program: ``fused`` and ``code`` as a static entry holds them, and
    ``layouts`` (``symbolic_program``'s ``same``)."""
    table = {str(k): v if v == C_ORDER else list(v) for k, v in layouts.items()}
    return program_cache.to_entry(fused, backend.encode(code), report.kernels, report.declined, traced,
                                  report.not_fused, {"layouts": json.dumps(table)})  # fmt: skip


def from_entry(payload: bytes, traced: Graph, backend) -> tuple[Graph, object, LoweringReport, dict[int, tuple | str]]:
    """``(fused graph, the backend's code, the report, layouts)`` of ``to_entry``'s bytes, the graph's
    locations those of ``traced``; raises when the entry cannot be used (the caller rebuilds it)."""
    fused, data, kernels, declined, not_fused = program_cache.from_entry(payload, traced)
    count = sum(1 for _ in fused.values())
    layouts: dict[int, tuple | str] = {}
    for k, v in json.loads(program_cache.entry_text(payload, "layouts")).items():
        position = int(k)
        if not 0 <= position < count:
            raise ValueError(f"a layout for value {position} of a graph of {count} values")
        if v == C_ORDER:
            layouts[position] = C_ORDER
        elif isinstance(v, list) and all(isinstance(s, int) for s in v):
            layouts[position] = tuple(v)
        else:
            raise ValueError(f"a layout that is neither strides nor C order: {v!r}")
    code = backend.decode(data, fused)
    report = LoweringReport(kernels=kernels, declined=declined, cache="hit", not_fused=not_fused)
    return fused, code, report, layouts
