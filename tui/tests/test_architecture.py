"""Architecture rules: cloudbox.core never imports Textual (checked on the source, so a new import fails)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cloudbox.core

CORE = Path(cloudbox.core.__file__).resolve().parent
MODULES = sorted(CORE.rglob("*.py"))
FORBIDDEN = ("textual",)


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):  # walks function bodies and `if TYPE_CHECKING:` blocks too
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
            )
        ):
            out.append((node.lineno, node.args[0].value))
    return out


def test_core_has_modules():
    assert any(m.name == "profiles.py" for m in MODULES)


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_does_not_import_textual(module: Path):
    tree = ast.parse(module.read_text(), filename=str(module))
    bad = [(line, name) for line, name in _imported_modules(tree) if name.split(".")[0] in FORBIDDEN]
    assert not bad, f"{module}: cloudbox.core must not import Textual: " + ", ".join(
        f"line {line}: {name}" for line, name in bad
    )


def test_the_check_catches_an_import():
    for src in (
        "import textual",
        "from textual.app import App",
        "def f():\n    import textual.widgets",
        "import importlib\nimportlib.import_module('textual')",
    ):
        names = [n for _, n in _imported_modules(ast.parse(src))]
        assert any(n.split(".")[0] == "textual" for n in names), src
