"""The memory plan's picture: a box per planned buffer, placed by its lifetime and arena offset."""

from __future__ import annotations

import os
import re

import pytest

import kiln
from kiln.ir.dot import dot_available, render
from kiln.passes.memory_picture import HEIGHT, WIDTH

BOX = re.compile(r'"v(\d+)" \[pos="([\d.]+),([\d.]+)!", width=([\d.]+), height=([\d.]+),')


def _report():
    w1, w2 = kiln.randn(64, 128), kiln.randn(128, 32)

    def f(x):
        h = (x @ w1).tanh() * 2.0
        return (h @ w2).softmax(-1).sum(0)

    return kiln.explain(f, kiln.randn(256, 64))


def test_one_box_per_planned_buffer_and_no_two_live_buffers_overlap():
    report = _report()
    spec = report.specializations[-1]
    plan = spec.program.plan
    text = report.memory_to_dot()
    boxes = {int(m[0]): tuple(map(float, m[1:])) for m in BOX.findall(text)}
    assert set(boxes) == {v.id for v in plan.offsets} and len(boxes) >= 2
    for x, y, w, h in boxes.values():
        assert -1e-3 <= x - w / 2 and x + w / 2 <= WIDTH + 1e-3 and -1e-3 <= y - h / 2 <= HEIGHT + 1e-3
    inplace = {(out.id, inp.id) for out, inp in plan.inplace.items()}
    items = list(boxes.items())
    for i, (a, (xa, ya, wa, ha)) in enumerate(items):
        for b, (xb, yb, wb, hb) in items[i + 1 :]:
            if (a, b) in inplace or (b, a) in inplace:
                continue
            overlap_x = abs(xa - xb) < (wa + wb) / 2 - 1e-6
            overlap_y = abs(ya - yb) < (ha + hb) / 2 - 1e-6
            assert not (overlap_x and overlap_y), (a, b)
    assert "arena" in text and f"{len(plan.offsets)} intermediates" in text


def test_the_picture_renders_and_explain_points_at_it(tmp_path):
    report = _report()
    assert "memory_to_dot()" in report.summary()
    with pytest.raises(ValueError, match="no specialization"):
        kiln.explain(lambda x: x.sum().item(), kiln.ones(2)).memory_to_dot()
    if not dot_available():
        if os.environ.get("KILN_REQUIRE_DOT"):
            pytest.fail("KILN_REQUIRE_DOT is set but Graphviz's dot or the graphviz package is missing")
        pytest.skip("Graphviz's dot program (or the graphviz package) is not installed")
    svg = render(report.memory_to_dot(), tmp_path / "plan.svg").read_text()
    assert "<svg" in svg and "memory plan of specialization 1" in svg
