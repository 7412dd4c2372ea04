"""Snapshot tests of every TUI screen and dialog (pytest-textual-snapshot), at 100x32 and, for the
overview, results, a front-end's nodes, the join code dialog, the studies, the volumes, the new-volume form, the
tests' setup and the live view of two guests, at 80x24 to show they fit.

The data is tui_demo's: fixed host facts, a results history with fixed timestamps shown in UTC,
guests in libvirt's test:///default driver, state at a fixed path. Each scene's `drive` waits until
the screen shows its data (and fails saying what never appeared), so a snapshot is never of a
half-loaded screen.

Update after an intended change: tui/.venv/bin/pytest tui/tests/test_tui_snapshots.py --snapshot-update,
then look at the changed SVGs (a failing run writes snapshot_report.html with both side by side).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import pytest
import pytest_textual_snapshot
import tui_demo
from tui_demo import SCENES, SIZE, SMALL

# pytest-textual-snapshot 1.0.0 names its extension in syrupy's old attribute (_file_extension); syrupy 7
# reads file_extension, so the snapshots would be saved as .raw. As .svg they open in any browser.
pytest_textual_snapshot.SVGImageExtension.file_extension = "svg"

SNAPSHOTS = Path(__file__).parent / "__snapshots__" / Path(__file__).stem

CASES = [(name, SIZE) for name in SCENES] + [(n, SMALL) for n in ("overview", "results", "nodes", "join-code",
                                                                    "studies", "volumes", "volume-form", "tests-setup",
                                                                    "tests-live-guests")]


@pytest.fixture
def demo():
    with tui_demo.demo_environment() as root:
        yield root


@pytest.mark.parametrize(("scene", "size"), CASES, ids=[f"{n}-{w}x{h}" for n, (w, h) in CASES])
def test_screen(scene: str, size: tuple[int, int], demo, snap_compare):
    guests = tui_demo.demo_guests() if SCENES[scene].guests else contextlib.nullcontext()
    with guests:
        assert snap_compare(tui_demo.demo_app(scene), terminal_size=size, run_before=SCENES[scene].drive)


def test_every_scene_has_a_snapshot():
    names = {p.name for p in SNAPSHOTS.glob("*.svg")}
    expected = {f"test_screen[{n}-{w}x{h}].svg" for n, (w, h) in CASES}
    assert expected <= names, f"no snapshot yet for {sorted(expected - names)}: run with --snapshot-update"
    assert names <= expected, f"stale snapshots: {sorted(names - expected)}"


def test_snapshots_show_nothing_of_this_host():
    """Host name, checkout path and home directory of the machine that made them must not appear."""
    leaks = [re.escape(str(tui_demo.REPO)), re.escape(os.path.expanduser("~")) + "/"]
    host = os.uname().nodename
    if len(host) >= 4:  # a very short name ("vm") also matches ordinary words
        leaks.append(rf"(?<![\w.-]){re.escape(host)}(?![\w-])")
    svgs = sorted(SNAPSHOTS.glob("*.svg"))
    assert svgs
    for svg in svgs:
        text = svg.read_text().replace("&#160;", " ")
        for pattern in leaks:
            assert not re.search(pattern, text), f"{svg.name} shows {pattern!r}"
        assert tui_demo.HOST in text or "cloudbox" in text  # it is a cloudbox screen at all
