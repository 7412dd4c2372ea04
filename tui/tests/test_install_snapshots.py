"""Snapshot tests of the installer's TUI at 80x24 (the size of a serial console): the disk page, the disk page
with the core's serial error under the field, and the review page with its plan. The machine is install_demo's
(fixed Disk and Nic objects, no probing), so the screens are the same on every host.

Update after an intended change: tui/.venv/bin/pytest tui/tests/test_install_snapshots.py --snapshot-update,
then look at the changed SVGs."""

from __future__ import annotations

from pathlib import Path

import install_demo
import pytest
import pytest_textual_snapshot
from textual.widgets import DataTable

from cloudbox.tui.install_app import create_install_app
from cloudbox.tui.screens.install.disk import DiskPage
from cloudbox.tui.screens.install.review import ReviewPage

pytest_textual_snapshot.SVGImageExtension.file_extension = "svg"  # as in test_tui_snapshots.py
SNAPSHOTS = Path(__file__).parent / "__snapshots__" / Path(__file__).stem
SIZE = (80, 24)


async def _disk_page(pilot) -> None:  # type: ignore[no-untyped-def]
    app = pilot.app
    while app.machine is None:
        await pilot.pause(0.02)
    await pilot.press("up", "enter")  # back-end
    while not isinstance(app.screen, DiskPage):
        await pilot.pause(0.02)
    await pilot.pause()


async def disk(pilot) -> None:  # type: ignore[no-untyped-def]
    await _disk_page(pilot)


async def disk_serial(pilot) -> None:  # type: ignore[no-untyped-def]
    await _disk_page(pilot)
    await pilot.press("enter", *"S5GXNX0T", "enter")  # the NVMe disk holds data: a partial serial is refused
    await pilot.pause()


async def review(pilot) -> None:  # type: ignore[no-untyped-def]
    await _disk_page(pilot)
    app = pilot.app
    app.screen.query_one(DataTable).move_cursor(row=2)  # sdb, blank
    await pilot.press("enter")
    await pilot.pause()
    await pilot.press("ctrl+n")
    while not isinstance(app.screen, ReviewPage):
        await pilot.pause(0.02)
    await pilot.pause()


SCENES = {"disk": disk, "disk-serial": disk_serial, "review": review}


@pytest.fixture(autouse=True)
def _fixed_disks():
    with install_demo.by_id_lookup():
        yield


@pytest.mark.parametrize("scene", list(SCENES))
def test_install_screen(scene: str, snap_compare):
    app = create_install_app(install_demo.fixed_backend())
    assert snap_compare(app, terminal_size=SIZE, run_before=SCENES[scene])


def test_every_scene_has_a_snapshot():
    names = {p.name for p in SNAPSHOTS.glob("*.svg")}
    expected = {f"test_install_screen[{n}].svg" for n in SCENES}
    assert names == expected, "run with --snapshot-update, then look at the SVGs"
