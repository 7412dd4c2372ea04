"""The three dependency locks agree: the image installs the runtime and build locks, make venv the dev lock."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

TUI = Path(__file__).resolve().parents[1]


def _pins(name: str) -> dict[str, tuple[str, frozenset[str]]]:
    """{package: (version, hashes)} of a pip-compile lock in tui/."""
    pins: dict[str, tuple[str, frozenset[str]]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", (TUI / name).read_text()):
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", block)
        if m:
            pins[canonicalize_name(m[1])] = (m[2], frozenset(re.findall(r"--hash=(\S+)", block)))
    return pins


def _project() -> dict:
    return tomllib.loads((TUI / "pyproject.toml").read_text())["project"]


def test_runtime_lock_pins_every_runtime_dependency_and_no_dev_tool():
    runtime = _pins("requirements.lock")
    for dep in _project()["dependencies"]:
        assert canonicalize_name(Requirement(dep).name) in runtime, dep
    dev_only = {canonicalize_name(Requirement(d).name) for d in _project()["optional-dependencies"]["dev"]}
    assert not dev_only & runtime.keys(), sorted(dev_only & runtime.keys())


def test_build_lock_holds_setuptools_only():
    assert set(_pins("requirements-build.lock")) == {"setuptools"}


def test_runtime_and_build_pins_are_the_dev_lock_pins():
    dev = _pins("requirements-dev.lock")
    for lock in ("requirements.lock", "requirements-build.lock"):
        for name, pin in _pins(lock).items():
            assert dev.get(name) == pin, f"{lock}: {name} {pin[0]} differs from requirements-dev.lock"
