"""Regressions found by driving the installed TUI in tmux (tests/tui.bats): starting a run with `s` while a
Setup control has the focus shows the Live view of that run; the results comparison fits its box at 80x24
(no wrapped rows); the profile diff in the narrow detail pane at 80x24 keeps knob names and values whole."""

from __future__ import annotations

import asyncio

import pytest
from conftest_results import add_study_a_default, add_virtio_tcg
from rich.console import Console
from textual.widgets import Select, Static, TabbedContent

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


@pytest.mark.parametrize("size", [(80, 24), (100, 32)])
def test_comparison_rows_fit_the_box_without_wrapping(state, size):
    with ResultStore() as store:
        ids = [add_study_a_default(store), add_virtio_tcg(store)]
    backend = Backend(facts=_facts(), libvirt_uri="test:///default")

    async def go() -> None:
        app = create_app(backend, mode="results", poll_interval=0.2)
        async with app.run_test(size=size) as pilot:
            screen = app.screen
            for _ in range(50):
                await pilot.pause(0.1)
                if getattr(screen, "runs", None):
                    break
            await pilot.press("space", "space", "c")
            compare = screen.query_one("#compare", Static)
            for _ in range(50):
                await pilot.pause(0.1)
                if "% bare" in str(compare.content) or "% of bare metal" in str(compare.content):
                    break
            text = str(compare.content)
            assert all(f"#{i}" in text for i in ids), text
            # One screen row per line of the table: nothing wrapped.
            lines = text.count("\n") + 1
            assert compare.size.height == lines, f"{compare.size.height} screen rows for {lines} lines"

    asyncio.run(go())
    backend.close()


@pytest.mark.parametrize("size", [(80, 24), (130, 32)])
def test_profile_diff_keeps_knob_names_and_values_whole(state, size):
    backend = Backend(facts=_facts(), libvirt_uri="test:///default")

    async def go() -> None:
        app = create_app(backend, mode="profiles", poll_interval=0.2)
        async with app.run_test(size=size) as pilot:
            screen = app.screen
            for _ in range(50):
                await pilot.pause(0.1)
                if getattr(screen, "loaded", None) or getattr(screen, "entries", None):
                    break
            await pilot.pause(0.3)
            await pilot.press("d")  # the highlighted profile (eucalyptus-default) against the active one
            await pilot.pause(0.5)
            detail = screen.query_one("#profile-detail", Static)
            console = Console(width=detail.size.width, record=True, color_system=None)
            console.print(detail.content)
            out = console.export_text()
            assert "knobs differ" in out, out
            for word in ("network.model", "disk.backing", "block-device", "sparse-file", "writethrough"):
                assert word in out, f"{word!r} cut or folded at {size}:\n{out}"

    asyncio.run(go())
    backend.close()


def test_screen_switch_frames_wait_for_the_new_screen_and_no_longer(state):
    """A screen key's first frame is held until the new screen has resumed (styles, layout), then written:
    the hold ends by the screen's own resume callback, not by the fallback timer, and no hold is left over.
    (Textual's stock fixed 50 ms hold made most of a screen key's answer time; make bench, section "tui".)"""
    from textual import events

    app = create_app(Backend(facts=_facts(), libvirt_uri="test:///default"), mode="overview", poll_interval=3600)
    written: list[tuple[str, int]] = []

    async def drive() -> None:
        async with app.run_test(size=(100, 32)) as pilot:
            await pilot.pause(0.5)
            display = app._display

            def spy(screen, renderable):
                if renderable is not None and not app._batch_count:
                    written.append((app.current_mode, screen.stack_updates))
                display(screen, renderable)

            app._display = spy
            for key, mode in (("5", "results"), ("2", "profiles"), ("4", "tests"), ("3", "guests"), ("1", "overview"),
                              ("5", "results")):
                written.clear()
                resumes = app.get_screen_stack(mode)[0].stack_updates if mode in app._screen_stacks else 0
                app._driver.send_message(events.Key(key, key))
                for _ in range(100):
                    await asyncio.sleep(0.01)
                    if any(m == mode for m, _ in written):
                        break
                hold = app.last_switch_hold
                assert hold is not None and hold.ended, f"key {key}: the switch's hold never ended"
                assert hold.ended_by == "resume", f"key {key}: the hold ended by {hold.ended_by}, not the resume"
                first = next(((m, n) for m, n in written if m == mode), None)
                assert first is not None, f"key {key}: no frame of the {mode} screen within 1 s"
                assert first[1] > resumes, f"key {key}: the {mode} screen's first frame came before its resume"
                await pilot.pause()
                assert app._batch_count == 0

    asyncio.run(drive())
