"""Imports flow one way (DESIGN.md, "Layers"): ``ir`` imports no other layer, ``passes`` only ``ir``,
``runtime`` only ``ir``, ``codegen`` never the frontend; the compiler (``kiln.compiler``: the driver,
its options and cache) calls them in order and never imports the frontend, which calls it.
Every import statement counts, those inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import kiln

#: Per layer, the layers it must not import.
FORBIDDEN = {
    "ir": {"passes", "codegen", "runtime", "compiler", "frontend", "nn", "optim", "data", "jit"},
    "passes": {"codegen", "runtime", "compiler", "frontend"},
    "codegen": {"compiler", "frontend"},
    "runtime": {"passes", "codegen", "compiler", "frontend"},
    "compiler": {"frontend", "nn", "optim", "data", "jit"},
}


def imported_layers(path: Path, root: Path) -> list[tuple[int, str]]:
    """``(line, first package under kiln)`` for every import of kiln in the module at ``path``."""
    parts = path.relative_to(root).with_suffix("").parts
    package = list(parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[list[str]] = []
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            targets = [base + node.module.split(".")] if node.module else [base + [a.name] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kiln":
            targets = [node.module.split(".")[1:]]
        elif isinstance(node, ast.Import):
            targets = [a.name.split(".")[1:] for a in node.names if a.name.split(".")[0] == "kiln"]
        found += [(node.lineno, t[0] if t else "kiln") for t in targets]
    return found


def violations(root: Path) -> list[str]:
    bad = []
    for layer, banned in FORBIDDEN.items():
        for path in sorted((root / layer).rglob("*.py")):
            for line, target in imported_layers(path, root):
                if target in banned or target == "kiln":
                    bad.append(f"{path.relative_to(root)}:{line} imports kiln.{target}" if target != "kiln" else
                               f"{path.relative_to(root)}:{line} imports kiln itself")  # fmt: skip
    return bad


def test_layers_import_only_downwards():
    assert violations(Path(kiln.__file__).parent) == []


def test_the_check_sees_imports_up_the_layers(tmp_path):
    for layer in FORBIDDEN:
        (tmp_path / layer).mkdir()
    (tmp_path / "runtime" / "a.py").write_text("def f():\n    from ..passes.fusion import fuse\n")
    (tmp_path / "ir" / "b.py").write_text("import kiln.frontend.tensor\nfrom . import graph\n")
    (tmp_path / "codegen" / "c.py").write_text("import kiln\nfrom ..ir import graph\n")
    assert violations(tmp_path) == [
        "ir/b.py:1 imports kiln.frontend",
        "codegen/c.py:1 imports kiln itself",
        "runtime/a.py:2 imports kiln.passes",
    ]
