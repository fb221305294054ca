"""The benchmark table, the targets' table, and the JSON file of a run."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from .common import KILN, Result, TargetCheck, environment, format_time, ratios, reference_impl

HEADER = ("workload", "case", "impl", "median", "IQR", "kiln/impl", "target", "check", "note")


def _target_cells(checks: Iterable[TargetCheck], found: dict) -> dict[tuple[str, str, str], str]:
    """(workload, case, impl) -> "goal: status" for the row each target is about (kiln's for
    absolute ones; the fastest variant's for a target on the fastest PyTorch eager)."""
    cells: dict[tuple[str, str, str], list[str]] = {}
    for c in checks:
        t = c.target
        goal = f"< {format_time(t.max_ns)}" if t.reference is None else f"<= {t.max_ratio:.3g}x"
        status = c.status + (f" ({c.by})" if c.by else "")
        row = KILN if t.reference is None else (reference_impl(t, found) or t.reference)
        cells.setdefault((t.workload, t.case, row), []).append(f"{goal} {status}")
    return {key: "; ".join(parts) for key, parts in cells.items()}


def format_table(results: Iterable[Result], checks: Iterable[TargetCheck] = ()) -> str:
    """One line per result: median, IQR, kiln's ratio to it (for references), the target on
    that ratio with its status, and kiln's correctness check."""
    results = list(results)
    found = ratios(results)
    targets = _target_cells(checks, found)
    rows = [HEADER]
    for r in results:
        key = (r.workload, r.case, r.impl)
        ratio = found.get(key)
        timing = r.timing
        rows.append((
            r.workload, r.case, r.impl,
            ("error" if r.note.startswith("error") else "skipped") if timing is None else format_time(timing.median_ns),
            "" if timing is None else format_time(timing.iqr_ns),
            "" if ratio is None else f"{ratio:.2f}x",
            targets.get(key, ""),
            r.check.split(":")[0] if r.check else "",
            r.note if not r.failed else f"{r.check}; {r.note}".strip("; "),
        ))  # fmt: skip
    return _columns(rows)


def format_targets(checks: Iterable[TargetCheck]) -> str:
    rows = [("workload", "target", "value", "status")]
    for c in checks:
        status = c.status + (f", {c.by}" if c.by else "") + (f": {c.kiln_error}" if c.kiln_error else "")
        rows.append((c.target.workload, c.target.goal, c.value, status))
    return _columns(rows)


def failures(results: Iterable[Result]) -> list[str]:
    """A loud line per kiln result whose answer was wrong."""
    return [f"FAIL: kiln's {r.workload} / {r.case} is WRONG: {r.check}" for r in results if r.failed]


def _columns(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def to_json(results: Iterable[Result], checks: Iterable[TargetCheck] = (), env: dict | None = None) -> dict:
    results = list(results)
    found = ratios(results)
    entries = []
    for r in results:
        entry = asdict(r)
        entry["iqr_ns"] = None if r.timing is None else r.timing.iqr_ns
        entry["kiln_ratio"] = found.get((r.workload, r.case, r.impl))
        entries.append(entry)
    targets = [{**asdict(c.target), "ratio": c.ratio, "status": c.status} for c in checks]
    return {"environment": env or environment(), "results": entries, "targets": targets}


def write_json(
    path: str | os.PathLike, results: Iterable[Result], checks: Iterable[TargetCheck] = (), env: dict | None = None
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(results, checks, env), indent=2) + "\n")
    return path
