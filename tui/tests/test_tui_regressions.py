"""Regressions found by driving the installed TUI in tmux (tests/tui.bats): starting a run with `s` while a
Setup control has the focus shows the Live view of that run; the results comparison fits its box at 80x24
(no wrapped rows); the profile diff in the narrow detail pane at 80x24 keeps knob names and values whole; a
screen key is answered by one frame of the whole new screen, once it has resumed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pytest
from conftest_results import add_study_a_default, add_virtio_tcg
from rich.console import Console
from textual.widgets import DataTable, Select, Static, TabbedContent

from cloudbox.core.record.results import ResultStore
from cloudbox.core.views import host
from cloudbox.core.virt import accel
from cloudbox.tui import bench, create_app
from cloudbox.tui.app import CloudboxApp
from cloudbox.tui.backend import Backend
from cloudbox.tui.widgets.checklist import CheckList


def _facts() -> host.HostFacts:
    return host.HostFacts(
        hostname="lab1", role="all-in-one", role_source="default (test facts)",
        nodes=[host.Node("lab1", "all-in-one", "up", "this box")],
        accelerator=accel.Accelerator("tcg", "qemu", True, True, "KVM unusable (test facts)"),
        accelerator_problem=None, libvirtd="libvirtd running (test facts)")


@pytest.mark.parametrize("focus", ["#test-set", "#size", "#run-profiles"])
async def test_start_from_a_focused_setup_control_shows_the_live_view(state, focus):
    with ResultStore() as store:
        rid = store.create_run(profile_name="virtio-disk", suite="storage", size_label="quick", state="completed")
    backend = Backend(facts=_facts(), libvirt_uri="test:///default")
    started = []

    def start_runs(specs):
        started.append(specs)
        return rid, None

    backend.start_runs = start_runs  # type: ignore[method-assign]

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
            if tabs.active == "live" and app.screen.live.run is not None:
                break
        assert len(started) == 1
        assert tabs.active == "live", f"still on {tabs.active} after s with {focus} focused"
        assert app.screen.live.run_id == rid  # type: ignore[attr-defined]
    backend.close()


@pytest.mark.parametrize("size", [(80, 24), (100, 32)])
async def test_comparison_rows_fit_the_box_without_wrapping(state, size):
    with ResultStore() as store:
        ids = [add_study_a_default(store), add_virtio_tcg(store)]
    backend = Backend(facts=_facts(), libvirt_uri="test:///default")

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
    backend.close()


@pytest.mark.parametrize("size", [(80, 24), (130, 32)])
async def test_profile_diff_keeps_knob_names_and_values_whole(state, size):
    backend = Backend(facts=_facts(), libvirt_uri="test:///default")

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
    backend.close()


async def test_screen_switch_frames_wait_for_the_new_screen_and_no_longer(state, monkeypatch):
    """A screen key's frames are held (a batch update) until the new screen has resumed, then its first frame is
    the whole new screen, written well before the fallback timer would end the hold. Seen through public API: the
    app draws to bench.KeyTimer's recording terminal; App.batch_update and Screen.stack_updates are watched.
    (Textual's stock fixed 50 ms hold made most of a screen key's answer time; make bench, section "tui".)"""
    monkeypatch.setattr(CloudboxApp, "SWITCH_HOLD_MAX_S", 5.0)
    app = create_app(Backend(facts=_facts(), libvirt_uri="test:///default"), mode="overview", poll_interval=3600)
    timer = bench.KeyTimer(app)
    writes: list[tuple[float, str, int]] = []  # (time, data, the current screen's resume count)
    record = timer.written

    def written(data: str) -> None:
        writes.append((time.perf_counter(), data, app.screen.stack_updates))
        record(data)

    timer.written = written  # type: ignore[method-assign]
    batches: list[tuple[float, float, int]] = []  # (start, end, the current screen's resume count at the end)
    batch_update = app.batch_update

    @contextlib.contextmanager
    def timed_batch():
        t = time.perf_counter()
        with batch_update():
            yield
        batches.append((t, time.perf_counter(), app.screen.stack_updates))

    app.batch_update = timed_batch  # type: ignore[method-assign]
    switch_mode = app.switch_mode

    def switch_and_relayout(mode: str):  # as when the screen's reloaded rows land inside the hold (seen in CI)
        switched = switch_mode(mode)
        for table in app.screen.query(DataTable):
            table.refresh(layout=True)
        return switched

    async with app.run_test(headless=False, size=(100, 32)) as pilot:
        for key, mode in bench.KEYS:  # every screen built once: a first build keeps Textual's own hold
            await timer.press(pilot, key, bench.switch_shows(mode))
        for key, mode in (("5", "results"), ("2", "profiles"), ("4", "tests"), ("3", "guests"),
                          ("1", "overview"), ("5", "results")):
            app.switch_mode = switch_and_relayout  # type: ignore[method-assign]
            await pilot.pause(0.2)
            resumes = app.get_screen_stack(mode)[0].stack_updates
            writes.clear()
            batches.clear()
            t0 = time.perf_counter()
            answered = (await timer.press(pilot, key, bench.switch_shows(mode)))["switch"]
            assert answered < 2500, f"key {key}: {answered:.0f} ms: the hold lasted until its fallback timer"
            held = [b for b in batches if b[0] >= t0 and b[2] > resumes]
            assert held, f"key {key}: no batch update held the frames until the {mode} screen resumed"
            first = next(w for w in writes if w[0] >= t0 and len(w[1]) > 100)
            assert bench.BAR[mode] in first[1], f"key {key}: the first frame was not the {mode} screen"
            assert first[2] > resumes, f"key {key}: the {mode} screen's first frame came before its resume"
            assert first[0] >= held[0][1], f"key {key}: a frame was written while the switch was held"


async def test_a_switch_hold_ends_once(state, monkeypatch):
    """The fallback timer of a hold that its screen's resume ended is stopped: it does not end the hold again
    later, with a refresh of the whole screen in the middle of whatever the user does next."""
    monkeypatch.setattr(CloudboxApp, "SWITCH_HOLD_MAX_S", 0.3)
    app = create_app(Backend(facts=_facts(), libvirt_uri="test:///default"), mode="overview", poll_interval=3600)
    ended: list[float] = []
    end = app._end_switch_hold

    def counted(hold: contextlib.ExitStack) -> None:
        ended.append(time.perf_counter())
        end(hold)

    app._end_switch_hold = counted  # type: ignore[method-assign]

    async with app.run_test(size=(100, 32)) as pilot:
        for key, mode in (("5", "results"), ("1", "overview"), ("5", "results"), ("1", "overview")):
            await pilot.press(key)
            await pilot.pause(0.2)
            assert app.current_mode == mode
        await pilot.pause(0.5)  # past SWITCH_HOLD_MAX_S
        assert len(ended) == 3, f"three switches to screens shown before, their holds ended {len(ended)} times"


def spy(obj: object, name: str, record: Callable[..., object]) -> None:
    """Have every call of obj.name passed to `record` first, then made as before."""
    original = getattr(obj, name)

    def wrapped(*args, **kwargs):
        record(*args, **kwargs)
        return original(*args, **kwargs)

    setattr(obj, name, wrapped)


async def test_a_screen_shown_again_is_restyled_only_when_the_apps_classes_changed_while_it_was_hidden(state):
    """A screen key skips Textual's restyle of every node (most of a key's answer on the Tests screen) unless
    the app's own classes changed while the screen was hidden: those restyle only the screen on show, so the
    hidden one would keep the old look."""
    app = create_app(Backend(facts=_facts(), libvirt_uri="test:///default"), mode="tests", poll_interval=3600)
    restyled: list[int] = []
    spy(app, "update_styles", lambda node, animate=True: restyled.append(len(list(node.walk_children(with_self=True)))))

    async with app.run_test(size=(100, 32)) as pilot:
        app.stylesheet.add_source(".-probe #run-head { color: red; }", read_from=("test", "probe"))
        app.refresh_css()
        await pilot.pause(0.2)
        head = app.screen.query_one("#run-head", Static)
        red = head.styles.color
        assert red.rgb != (255, 0, 0)
        for key, mode in (("5", "results"), ("4", "tests"), ("5", "results")):
            await pilot.press(key)
            await pilot.pause(0.2)
            assert app.current_mode == mode
        restyled.clear()
        await pilot.press("4")  # nothing changed: the screen is not walked
        await pilot.pause(0.2)
        assert app.current_mode == "tests" and max(restyled, default=0) < 20, restyled
        await pilot.press("5")
        await pilot.pause(0.2)
        app.add_class("-probe")  # restyles the Results screen on show, not the hidden Tests screen
        await pilot.pause(0.1)
        assert head.styles.color.rgb != (255, 0, 0)
        await pilot.press("4")
        await pilot.pause(0.2)
        assert app.current_mode == "tests" and head.styles.color.rgb == (255, 0, 0)


async def test_a_screen_shown_again_does_not_reparse_the_stylesheet(state):
    """Textual counts a new screen's stylesheet applied only once it is mounted, after its switch applied it, so
    the key that showed a screen the second time reparsed every stylesheet; the app settles that after the
    screen's first frame."""
    app = create_app(Backend(facts=_facts(), libvirt_uri="test:///default"), mode="overview", poll_interval=3600)
    reparsed: list[str] = []
    spy(app, "refresh_css", lambda animate=True: reparsed.append(app.current_mode))

    async with app.run_test(size=(100, 32)) as pilot:
        for key, mode in (("5", "results"), ("1", "overview"), ("6", "studies"), ("3", "guests")):
            await pilot.press(key)
            await pilot.pause(0.3)
            assert app.current_mode == mode
        reparsed.clear()
        for key, mode in (("5", "results"), ("6", "studies"), ("1", "overview"), ("3", "guests")):
            await pilot.press(key)
            await pilot.pause(0.2)
            assert app.current_mode == mode
        assert reparsed == []


async def test_the_app_sets_its_collector_thresholds_and_restores_them(state):
    """While the app runs, the collector uses the app's thresholds (a large gen 0, so drawing's short-lived cycles
    die young instead of feeding full collections); when it exits, the process gets its own back."""
    import gc

    before = gc.get_threshold()
    assert before != CloudboxApp.GC_THRESHOLD, "the test needs a process threshold unlike the app's"
    app = create_app(Backend(facts=_facts(), libvirt_uri="test:///default"), mode="overview", poll_interval=3600)
    seen = []

    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause(0.1)
        seen.append(gc.get_threshold())
    assert seen == [CloudboxApp.GC_THRESHOLD]
    assert gc.get_threshold() == before


def test_a_diff_of_an_nfs_profile_and_a_disk_one_shows_the_nfs_table_beside_its_defaults():
    from cloudbox.core.spec import profiles
    from cloudbox.tui.screens.profiles import diff_table

    a, b = profiles.find_profile("nfs-sync-tcp"), profiles.find_profile("virtio-disk")
    console = Console(width=100, record=True, color_system=None)
    console.print(diff_table(a, b, 100))
    out = console.export_text()
    assert "≠ nfs.writes" in out and "sync" in out and "async" in out
    assert "dom0." not in out  # neither is a Xen profile
