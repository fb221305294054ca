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


def test_first_bash_block_is_the_demo_and_the_test_command():
    block = re.search(r"^```bash\n(.*?)^```", README, re.S | re.M).group(1)
    commands = [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands == [
        'pip install -e ".[examples]" && python examples/train_digits.py',
        'pip install -e ".[dev]" && python -m pytest',
    ]
