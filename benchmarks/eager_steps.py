"""Eager training steps, kiln next to PyTorch in one process (issue 34's "what it must show").

Every program of ``benchmarks/programs.py`` (an MLP from a batch list, a CNN with BatchNorm and
dropout in train mode, a DCGAN step, a 2-layer LSTM LM with SGD and clipping, two LSTMCells
looped over 100 steps, a 2-block GPT) runs as kiln eager ("kiln"), PyTorch eager ("torch") and
kiln compiled ("kiln compiled"), from the same weights on the same batches. Before anything is
timed, fresh copies built with dropout p=0 take ``CHECK_STEPS`` steps and kiln's losses (eager and
compiled) must equal PyTorch's within float32 tolerance: a mismatch is a ``FAIL`` row and a loud
line under the table. The timed copies keep their dropout. Then the per-op overhead cases of
``eager_overhead`` (a one-element add, autograd off and on).

In the table, kiln's ratio on the "kiln compiled" row is kiln eager's time over the compiled
step's. The summary gives the median over programs of kiln's eager ratio to PyTorch's. With ``--busy``
every program is timed again while a second process keeps one core busy (as a DataLoader worker
does), and the summary compares each implementation's busy time with its quiet one.

    python -m benchmarks.run eager [--busy] [--quick]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import kiln

from . import common, eager_overhead
from .common import KILN, Result, Target, close, error_note, kiln_compile, side_by_side
from .programs import PROGRAMS, Program, batches, cycling, losses, on, setup

WORKLOAD = "eager"
TORCH, KILN_COMPILED = "torch", "kiln compiled"
BUSY = " [one core busy]"  # appended to a case timed beside the busy process
CHECK_STEPS = 4
LOSS_TOL = (1e-4, 1e-5)  # (rtol, atol) on each step's loss, kiln vs PyTorch, float32 throughout
BATCHES = 4  # distinct batches each step cycles through
EAGER_MAX, MEDIAN_MAX = 1.3, 1.1  # issue 34: every program at most 1.3x PyTorch eager, the median 1.1x
OVERHEAD_CASES = (eager_overhead.ADD_TINY, eager_overhead.ADD_TINY_GRAD)

TARGETS = [Target(WORKLOAD, p.title, TORCH, EAGER_MAX) for p in PROGRAMS.values()] + [
    Target(eager_overhead.WORKLOAD, case, TORCH, 1.0) for case in OVERHEAD_CASES
]


# ----------------------------------------------------------------------------- the check
def check_losses(program: Program, sizes: dict, torch) -> str:
    """``ok ...`` when kiln eager's and kiln compiled's losses equal PyTorch's over CHECK_STEPS
    steps (dropout off, same weights and batches), else ``FAIL ...`` saying which differs."""
    if torch is None:
        return "unchecked: the reference is PyTorch, which is not installed"
    batch_list = batches(program, sizes, BATCHES)
    ours = setup(program, kiln, sizes, dropout=False)
    theirs = setup(program, torch, sizes, dropout=False, reference=ours)
    expected = losses(cycling(theirs.step, on(torch, batch_list)), CHECK_STEPS)
    eager = losses(cycling(ours.step, on(kiln, batch_list)), CHECK_STEPS)
    verdicts = [f"eager {close(eager, expected, rtol=LOSS_TOL[0], atol=LOSS_TOL[1])}"]
    try:
        compiled = setup(program, kiln, sizes, dropout=False)
        found = losses(cycling(kiln_compile(compiled.step), on(kiln, batch_list)), CHECK_STEPS)
        verdicts.append(f"compiled {close(found, expected, rtol=LOSS_TOL[0], atol=LOSS_TOL[1])}")
    except Exception as error:  # noqa: BLE001 - a compile that fails is reported on its row, not as wrong
        verdicts.append(f"compiled not checked ({error_note(error)})")
    failed = [v for v in verdicts if v.split(" ", 1)[1].startswith("FAIL")]
    summary = "; ".join(verdicts) + f" on losses over {CHECK_STEPS} steps vs torch"
    return ("FAIL: " if failed else "ok: ") + summary


# ----------------------------------------------------------------------------- one program
def _builders(program: Program, sizes: dict, torch) -> dict[str, Callable | str]:
    """kiln eager, PyTorch eager (kiln's weights) and kiln compiled, each cycling over the same batches."""
    batch_list = batches(program, sizes, BATCHES)

    def kiln_eager():
        return cycling(setup(program, kiln, sizes).step, on(kiln, batch_list))

    def torch_eager():  # from a fresh kiln copy's weights: kiln's timed copy has trained by now
        reference = setup(program, kiln, sizes)
        return cycling(setup(program, torch, sizes, reference=reference).step, on(torch, batch_list))

    def compiled():
        return cycling(kiln_compile(setup(program, kiln, sizes).step), on(kiln, batch_list))

    return {KILN: kiln_eager, TORCH: torch_eager if torch is not None else "torch is not installed",
            KILN_COMPILED: compiled}  # fmt: skip


def run_program(program: Program, quick: bool, torch, suffix: str = "", check: str = "") -> list[Result]:
    """The program's three implementations side by side; ``check`` (from :func:`check_losses`) goes
    on kiln's row, so a wrong answer is a FAIL whatever the speed."""
    sizes = program.sizes[quick]
    return side_by_side(
        WORKLOAD,
        program.title + suffix,
        _builders(program, sizes, torch),
        quick=quick,
        verify=(lambda _call: check) if check else None,
        params={**sizes, "dtype": "float32"},
        notes=lambda impl, t: f"{1e9 / t.median_ns:.1f} steps/s",
    )


@contextmanager
def busy_core() -> Iterator[None]:
    """A second Python process spinning on one core for the duration (stopped after, by its pid)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.terminate()
        spinner.wait(timeout=10)


def run(quick: bool = False, programs: Iterable[str] | None = None) -> list[Result]:
    """Every program (or those named) quiet, the overhead cases, then with ``--busy`` every program
    again beside a busy core."""
    chosen = [PROGRAMS[name] for name in (programs or PROGRAMS)]
    results: list[Result] = []
    with common.torch_with_kiln_threads() as (torch, _threads):
        for program in chosen:
            common.progress(f"eager: {program.name}")
            try:
                check = check_losses(program, program.sizes[quick], torch)
            except Exception as error:  # noqa: BLE001 - the timed run below shows kiln's error on its row
                check = f"unchecked: {error_note(error)}"
            results += run_program(program, quick, torch, check=check)
    results += eager_overhead.run(quick, cases=OVERHEAD_CASES)
    if common.OPTIONS.busy:
        with busy_core(), common.torch_with_kiln_threads() as (torch, _threads):
            for program in chosen:
                common.progress(f"eager: {program.name}, one core busy")
                results += run_program(program, quick, torch, suffix=BUSY)
    return results


# ----------------------------------------------------------------------------- the summary
def _medians(results: Iterable[Result]) -> dict[tuple[str, str], float]:
    return {(r.case, r.impl): r.median_ns for r in results if r.workload == WORKLOAD and r.median_ns}


def summary(results: list[Result]) -> str:
    """The median of kiln's eager ratios to PyTorch's (target <= MEDIAN_MAX), and with ``--busy``
    each implementation's busy time over its quiet time next to PyTorch's."""
    found = _medians(results)
    titles = [p.title for p in PROGRAMS.values() if (p.title, KILN) in found]
    eager = [found[t, KILN] / found[t, TORCH] for t in titles if (t, TORCH) in found]
    lines = []
    if eager:
        median = statistics.median(eager)
        status = "met" if median <= MEDIAN_MAX else "MISSED"
        lines.append(f"eager: median of kiln/torch over {len(eager)} programs {median:.2f}x "
                     f"(target <= {MEDIAN_MAX}x: {status})")  # fmt: skip
    busy = [t for t in titles if (t + BUSY, KILN) in found]
    if busy:
        lines.append(_busy_table(busy, found))
    return "\n".join(lines)


def _busy_table(titles: list[str], found: dict) -> str:
    """Per program: busy/quiet of each implementation; kiln's (eager and compiled) should be no worse
    than PyTorch's (issue 34: the ratios get no worse beside a busy core than PyTorch's do)."""
    rows = [
        ("program", "kiln busy/quiet", "torch busy/quiet", "compiled busy/quiet", "kiln vs torch", "compiled vs torch")
    ]
    for title in titles:
        slow = {impl: found.get((title + BUSY, impl), 0) / found[title, impl] if (title, impl) in found else None
                for impl in (KILN, TORCH, KILN_COMPILED)}  # fmt: skip
        reference = slow[TORCH]
        verdicts = [
            "" if slow[impl] is None or not reference else ("met" if slow[impl] <= reference else "MISSED")
            for impl in (KILN, KILN_COMPILED)
        ]
        cells = ["" if v is None else f"{v:.2f}x" for v in (slow[KILN], slow[TORCH], slow[KILN_COMPILED])]
        rows.append((title, *cells, *verdicts))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


if __name__ == "__main__":
    from .run import main

    sys.exit(main([*sys.argv[1:], WORKLOAD]))
