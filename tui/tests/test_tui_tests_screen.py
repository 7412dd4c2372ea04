"""Regression tests for the Tests screen found by driving the installed TUI in tmux (tests/tui.bats): starting a
run with `s` while a Setup control has the focus must show the Live view of that run."""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import Select, TabbedContent

from cloudbox.core import accel, host
from cloudbox.core.results import ResultStore
from cloudbox.tui import create_app
from cloudbox.tui.backend import Backend
from cloudbox.tui.widgets.checklist import CheckList


def _facts() -> host.HostFacts:
    return host.HostFacts(
        hostname="lab1", role="all-in-one", role_source="default (test facts)",
        nodes=[host.Node("lab1", "all-in-one", "up", "this box")],
        accelerator=accel.Accelerator("tcg", "qemu", True, True, "KVM unusable (test facts)"),
        accelerator_problem=None, libvirtd="libvirtd running (test facts)")


@pytest.mark.parametrize("focus", ["#test-set", "#size", "#run-profiles"])
def test_start_from_a_focused_setup_control_shows_the_live_view(state, focus):
    with ResultStore() as store:
        rid = store.create_run(profile_name="virtio-disk", suite="storage", size_label="quick", state="completed")
    backend = Backend(facts=_facts(), libvirt_uri="test:///default")
    started = []

    def start_runs(specs):
        started.append(specs)
        return rid, None

    backend.start_runs = start_runs  # type: ignore[method-assign]

    async def go() -> None:
        app = create_app(backend, mode="tests", poll_interval=0.2)
        async with app.run_test(size=(100, 32)) as pilot:
            await pilot.pause(0.5)
            tabs = app.screen.query_one("#tests-tabs", TabbedContent)
            widget = app.screen.query_one(focus, Select if focus != "#run-profiles" else CheckList)
            widget.focus()
            await pilot.pause(0.2)
            assert app.focused is widget and tabs.active == "setup"
            await pilot.press("s")
            for _ in range(50):
                await pilot.pause(0.1)
                if tabs.active == "live" and getattr(app.screen, "run", None) is not None:
                    break
            assert len(started) == 1
            assert tabs.active == "live", f"still on {tabs.active} after s with {focus} focused"
            assert app.screen.run_id == rid  # type: ignore[attr-defined]

    asyncio.run(go())
    backend.close()
