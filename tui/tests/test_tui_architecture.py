"""Architecture rules of cloudbox.tui, checked on the source so that a change that breaks one fails here:

- no import circle among its modules, counting every import (inside functions and `if TYPE_CHECKING:` too):
  screens reach their app through a base class that does not import them (app_base, install_base).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cloudbox
import cloudbox.tui

SRC = Path(cloudbox.__file__).resolve().parent.parent
TUI = Path(cloudbox.tui.__file__).resolve().parent
TUI_MODULES = sorted(TUI.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules in `known` that module `name` imports anywhere in its source."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):  # function bodies and `if TYPE_CHECKING:` blocks too
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            # `from package import module` imports the module; `from module import name` the module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import a.b.c` where only a.b is ours
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph(files: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """{module: modules it imports} for sources given as {module: (source text, is a package)}."""
    known = set(files)
    return {name: imports_of(ast.parse(text), name, pkg, known) for name, (text, pkg) in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*path[path.index(n):], n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_circle_in_the_tui():
    files = {module_name(p): (p.read_text(), p.name == "__init__.py") for p in TUI_MODULES}
    assert "cloudbox.tui.screens.base" in files
    graph = import_graph(files)
    assert "cloudbox.tui.app_base" in graph["cloudbox.tui.screens.base"]  # the walk sees imports
    cycle = find_cycle(graph)
    assert cycle is None, "import circle in cloudbox.tui: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("where", ["top", "function", "type-checking", "relative"])
def test_the_check_finds_a_circle(where):
    back = {
        "top": "from p.a import A\n",
        "function": "def f():\n    from p import a\n",
        "type-checking": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.a import A\n",
        "relative": "from .a import A\n",
    }[where]
    files = {"p": ("", True), "p.a": ("from p.b import B\n", False), "p.b": (back, False), "p.c": ("", False)}
    assert find_cycle(import_graph(files)) == ["p.a", "p.b", "p.a"]
    files["p.b"] = ("import p.c\n", False)
    assert find_cycle(import_graph(files)) is None
