"""Every compile is timed stage by stage (issue 33: compile time itself, profiled): the traced call,
each pass and lowering stage, code generation and loading, in kiln.explain and in the dump_dir."""

from __future__ import annotations

import os

import kiln


def _stages(line: str) -> list[str]:
    return [part.rsplit(" ", 2)[0] for part in line.split("stages: ", 1)[1].split(", ")]


def test_explain_times_every_stage_of_a_compile(tmp_path):
    weight = kiln.randn(8, 4)
    options = kiln.CompileOptions(dump_dir=str(tmp_path))
    f = kiln.compile(lambda x: (x @ weight).relu().sum(), options=options)
    x = kiln.randn(3, 8)
    f(x)
    (line,) = [line for line in kiln.explain(f, x).summary().splitlines() if "stages:" in line]
    names = _stages(line)
    assert names[0] == "trace (the eager call)" and names[-1] == "load"
    assert {"fuse", "plan_memory"} <= set(names) or "read the cache entry" in names  # a miss, or a hit
    (dumped,) = [n for n in os.listdir(tmp_path) if n.endswith("timings.txt")]
    rows = (tmp_path / dumped).read_text().splitlines()
    assert [row.split(": ")[0] for row in rows] == names
    assert all(float(row.split(": ")[1].removesuffix(" ms")) >= 0 for row in rows)
