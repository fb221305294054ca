"""The README's links resolve, and its first bash block holds the two commands .ci/run runs verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_relative_links_point_at_files_in_the_repository():
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README)  # [text](path), not URLs
    assert "docs/DESIGN.md" in targets
    assert [t for t in targets if not (ROOT / t).exists()] == []


def test_the_docs_pages_links_point_at_files():
    for page in (ROOT / "docs").glob("*.md"):
        targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text())
        assert [t for t in targets if not (page.parent / t).exists()] == [], page.name


def test_first_bash_block_is_the_demo_and_the_test_command():
    block = re.search(r"^```bash\n(.*?)^```", README, re.S | re.M).group(1)
    commands = [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands == [
        'pip install -e ".[examples]" && python examples/train_digits.py',
        'pip install -e ".[dev]" && python -m pytest',
    ]


def test_the_docs_count_the_primitives_and_kernel_kinds_there_are():
    """README.md and docs/DESIGN.md name the registry's size and every kernel kind; they drift otherwise."""
    from kiln.ir.graph import KERNEL_KINDS
    from kiln.ir.primitives import PRIMITIVES

    design = (ROOT / "docs" / "DESIGN.md").read_text()
    for name, text in (("README.md", README), ("docs/DESIGN.md", design)):
        counts = {int(n) for n in re.findall(r"(\d+) primitives", text)}
        assert counts == {len(PRIMITIVES)}, (
            f"{name} says {sorted(counts)} primitives; the registry has {len(PRIMITIVES)}"
        )
    assert [kind for kind in KERNEL_KINDS if f"`{kind}`" not in design] == []


def test_the_readme_stays_a_front_door():
    """About 150 lines: what kiln is, the two commands, a first compiled step, where to read on (issue 37)."""
    assert len(README.splitlines()) <= 160
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)\)", README))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), "every docs page is linked from the README"
