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


# ------------------------------------------------------------------------------------------------- the map
REPO = CORE.parents[3]
PACKAGES = ("spec", "virt", "disks", "record", "bench", "cluster", "run", "studies", "views", "install")
SHARED = ("errors", "inputs", "paths", "procs", "db", "ledger")
_DOTTED = __import__("re").compile(r"`((?:cloudbox\.)?(?:core\.)?(?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)")


def _resolves(dotted: str) -> bool:
    import importlib

    parts = dotted.removeprefix("cloudbox.").removeprefix("core.").split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module("cloudbox.core." + ".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_the_core_holds_concern_packages_and_the_shared_helpers_only():
    top = sorted(p.stem for p in CORE.glob("*.py") if p.stem != "__init__")
    assert top == sorted(SHARED)
    assert sorted(p.name for p in CORE.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_docstring_is_its_map(package):
    """Its __init__ names every module of the package, and names no module that is not there."""
    import re

    pkg = CORE / package
    doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text()), clean=False) or ""
    named = set(re.findall(r"^    ([a-z0-9_]+/?)\s{2,}", doc, re.M)) or set(re.findall(r"`([a-z_]+)` \(", doc))
    have = {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"} | {
        p.name + "/" for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    if package == "install":  # its map is the API in call order, then "Modules: `answers` (...), ..."
        named = set(re.findall(r"`([a-z_]+)` \(", doc))
    assert named == have, f"{package}/__init__.py names {sorted(named)}; the package holds {sorted(have)}"


def test_every_module_the_architecture_page_names_exists():
    text = (REPO / "docs" / "architecture.md").read_text()
    names = sorted(set(_DOTTED.findall(text)))
    assert names, "docs/architecture.md names no module"
    missing = [n for n in names if not _resolves(n)]
    assert not missing, f"docs/architecture.md names modules or functions that do not exist: {missing}"
    paths = set(__import__("re").findall(r"`((?:tui|docs|profiles|studies|appliance|tests)/[\w./-]+)`", text))
    assert not [p for p in paths if not (REPO / p).exists()], [p for p in paths if not (REPO / p).exists()]
