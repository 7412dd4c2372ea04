"""Text that comes from the system (disk models, error messages, NIC names) is shown as it is, never
parsed as Rich markup: "[/dev/sdz]" is a closing tag to Rich and used to crash the overview."""

from __future__ import annotations

import dataclasses

import pytest
import tui_demo

from cloudbox.tui.app import create_app
from cloudbox.tui.backend import Backend


@pytest.fixture
def demo():
    with tui_demo.demo_environment() as root:
        yield root


def _screen_text(svg: str) -> str:
    return svg.replace("&#160;", " ")


async def test_overview_shows_brackets_literally(demo):
    facts = tui_demo.host_facts()
    facts.problems = ["disks: lsblk: [/dev/sdz] is not a block device"]
    facts.disks[1] = dataclasses.replace(facts.disks[1], model="[b]WDC[/b] [x]")
    facts.nics[0] = dataclasses.replace(facts.nics[0], name="[red]eth9")
    app = create_app(Backend(facts=facts), mode="overview", poll_interval=3600.0)

    async def run() -> str:
        async with app.run_test(size=tui_demo.SIZE) as pilot:
            await tui_demo.overview(pilot)
            return app.export_screenshot()

    text = _screen_text(await run())
    assert "disks: lsblk: [/dev/sdz] is not a block device" in text
    assert "[b]WDC[/b] [x]" in text
    assert "[red]eth9" in text
    assert app.errors == []

