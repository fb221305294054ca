"""The code generators' modules import one another in one direction, by public names (issue 37).

Read from the source (every import, those inside functions too): no module of kiln/codegen imports a
private name (``_Body``) of another, and the kernel-building modules -- all of kiln/codegen but the
backends' loading side (the backend registry, the LLVM backend, its thread pool, compile worker,
engine and cache host, and the packages' ``__init__``) -- form no import cycle. Each module also
imports alone in a fresh interpreter."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import kiln.codegen

ROOT = pathlib.Path(kiln.codegen.__file__).parent
#: The loading side: registries and lazy imports that are cycles by design (a backend registry names
#: its backends, and they name it), and the LLVM package, whose ``__init__`` installs the thread pool.
LOADING = {"backend", "cuda.backend", "llvm", "llvm.backend", "llvm.pool", "llvm.worker", "llvm.engine", "llvm.host"}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "."] = path
    return out


MODULES = _modules()


def _imports(name: str) -> list[tuple[str, str]]:
    """``(module, imported name)`` for every ``from ... import`` of ``name``'s source that names a
    module of kiln/codegen (relative names resolved; the module itself when a name is a module)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = package.split(".") if package else []
        up = node.level - 1
        if up > len(base):
            continue  # above kiln/codegen (kiln.ir...)
        target = ".".join(base[: len(base) - up] + (node.module.split(".") if node.module else []))
        for alias in node.names:
            full = f"{target}.{alias.name}" if target else alias.name
            found.append((full if full in MODULES else target or ".", alias.name))
    return found


def test_no_module_imports_another_modules_private_names():
    private = [
        f"{name}: from {module} import {imported}"
        for name in MODULES
        for module, imported in _imports(name)
        if imported.startswith("_") and not imported.startswith("__")
    ]
    assert not private, "private names imported across modules:\n" + "\n".join(private)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_kernel_building_modules_form_no_import_cycle():
    building = [name for name in MODULES if name not in LOADING and name != "."]
    graph = {name: {m for m, _ in _imports(name) if m in building and m != name} for name in building}
    assert {"llvm.kernels", "llvm.body", "llvm.elementwise", "plans", "cuda.kernels"} <= set(graph)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", [n for n in MODULES if n.startswith("llvm.") or n == "plans"])
def test_each_module_imports_alone(name):
    module = "kiln.codegen" + ("" if name == "." else f".{name}")
    result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
