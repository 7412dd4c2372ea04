"""Pilot tests (App.run_test) for every screen's actions. Fast ones use fixed host facts, libvirt's
test:///default driver and a results database built here; the slow ones (marked) launch a real guest and run
a quick storage test through the UI against the real libvirtd and QEMU (TCG here)."""

from __future__ import annotations

import asyncio
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest_results import (
    REPEATED_WRITE_BARE,
    REPEATED_WRITE_GUEST,
    add_repeated_virtio,
    add_study_a_default,
    add_virtio_tcg,
)

from cloudbox.core.record.results import ResultStore
from cloudbox.core.spec import profiles
from cloudbox.core.studies import evidence, loading
from cloudbox.core.views import host
from cloudbox.core.virt import accel
from cloudbox.tui import create_app
from cloudbox.tui.backend import Backend
from cloudbox.tui.widgets.checklist import CheckList
from cloudbox.tui.widgets.dialogs import ConfirmDialog, ExportDialog, PickDialog, TextDialog
from cloudbox.tui.widgets.keybar import KeyBar

SIZE = (100, 32)


def facts(emulated: bool = True) -> host.HostFacts:
    acc = (accel.Accelerator("tcg", "qemu", True, True, "KVM unusable (test facts)") if emulated
           else accel.Accelerator("kvm", "kvm", False, False, "KVM usable (test facts)"))
    return host.HostFacts(
        hostname="lab1", role="all-in-one", role_source="default (test facts)",
        nodes=[host.Node("lab1", "all-in-one", "up", "this box")], accelerator=acc, accelerator_problem=None,
        libvirtd="libvirtd running (test facts)",
        disks=[host.Disk("sda", 512 * 1024**3, "TestDisk SSD", False, "sata", ["/"])],
        nics=[host.Nic("eth0", "02:00:00:00:00:01", 9000, "up", ["10.0.0.1/24"])])


def text(widget) -> str:
    """What a Static shows, as plain text."""
    v = widget.content
    return v.plain if hasattr(v, "plain") else str(v)


def rows(table) -> list[list[str]]:
    return [[str(getattr(c, "plain", c)) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def until(pilot, cond: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            if cond():
                return
        except Exception:  # noqa: BLE001 - the widget may not be mounted yet
            pass
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or cond}")
        await pilot.pause(0.05)


@pytest.fixture
def backend(state) -> Backend:
    b = Backend(facts=facts(), libvirt_uri="test:///default")
    yield b
    b.close()


# -- app shell --------------------------------------------------------------------------------------------
async def test_screens_switch_with_number_keys_and_help_lists_keys(backend):
    app = create_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.current_mode == "overview")
        for key, mode in (("2", "profiles"), ("3", "guests"), ("4", "tests"), ("5", "results"),
                          ("6", "studies"), ("1", "overview")):
            await pilot.press(key)
            await until(pilot, lambda m=mode: app.current_mode == m, what=f"mode {mode}")
        await pilot.press("question_mark")
        await until(pilot, lambda: app.screen.__class__.__name__ == "HelpScreen")
        md = app.screen.query_one("#help-text")
        assert "(this screen)" in md.source and "**u** Use" in md.source and "**s** Start" in md.source
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.__class__.__name__ == "OverviewScreen")


async def test_a_click_on_the_key_bar_runs_that_key(backend):
    app = create_app(backend, mode="profiles")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.current_mode == "profiles")
        bar = app.screen.query_one(KeyBar)
        await until(pilot, lambda: any(action == "help" for *_, action in bar.spans), what="the Help key")
        start, _end, _node, _action = next(s for s in bar.spans if s[3] == "help")
        assert await pilot.click(KeyBar, offset=(start + 1, 0))
        await until(pilot, lambda: app.screen.__class__.__name__ == "HelpScreen", what="the help screen")


async def test_command_palette_offers_every_screen_and_the_screens_actions(backend):
    app = create_app(backend, mode="profiles")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.current_mode == "profiles")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for t in ("Go to Overview", "Go to Results", "Help", "Use", "Diff", "New from", "Quit"):
            assert t in titles, titles
        # running a palette command does what its key does
        cmd = next(c for c in app.get_system_commands(app.screen) if c.title == "Go to Guests")
        cmd.callback()
        await until(pilot, lambda: app.current_mode == "guests")


async def test_overview_shows_role_accelerator_warning_and_devices(backend):
    app = create_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "WARNING: TCG emulation" in text(app.screen.query_one("#accel-banner")))
        box = _render(app, app.screen.query_one("#box"))
        assert re.search(r"^Role +all-in-one", box, re.M)
        assert re.search(r"^Active profile +virtio-disk *$", box, re.M)
        assert rows(app.screen.query_one("#nodes"))[0][:3] == ["lab1", "all-in-one", "UP"]
        assert rows(app.screen.query_one("#disks"))[0][0] == "sda"
        assert rows(app.screen.query_one("#nics"))[0][2] == "9000"


async def test_overview_without_tcg_has_no_warning(state):
    app = create_app(Backend(facts=facts(emulated=False), libvirt_uri="test:///default"))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: text(app.screen.query_one("#accel-banner")).startswith("Accelerator: KVM"))
        assert "WARNING" not in text(app.screen.query_one("#accel-banner"))


async def test_overview_shows_the_answers_of_host_readiness(backend):
    """The Overview's readiness is `cloudbox host readiness --fio-seconds 0 --link-seconds 0` of this host (with
    the fixed accelerator): what is measured natively and what only emulated, IOMMU, Secure Boot, the links, and
    each study's cells at each size."""
    from rich.console import Console

    from cloudbox.core.studies import capability
    from cloudbox.core.views import readiness

    def wide(widget) -> str:
        console = Console(width=400, record=True, color_system=None)
        console.print(widget.content)
        return console.export_text()

    app = create_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.screen.answers is not None, timeout=60, what="the readiness report")
        shown, cells = wide(app.screen.query_one("#readiness")), wide(app.screen.query_one("#answers"))
        app.screen.answers = None
        await pilot.press("r")  # checks again
        await until(pilot, lambda: app.screen.answers is not None, timeout=60, what="the report checked again")
    same = capability.answers(facts().accelerator, fio_seconds=0, link_seconds=0)
    r = same.facts
    assert [what for what, _ in readiness.measures(r)] == ["natively", "emulated"]
    for what, how in readiness.measures(r):
        assert re.search(rf"^{what.capitalize()} +{re.escape(how)} *$", shown, re.M), shown
    assert "every guest row: guests run under TCG" in shown  # the fixed facts' accelerator
    assert re.search(rf"^IOMMU +{re.escape(r.iommu)}", shown, re.M)
    assert re.search(rf"^Secure Boot +{re.escape(r.secure_boot)} *$", shown, re.M)
    assert re.search(rf"^CPUs, memory +{r.cpus} CPUs ", shown, re.M)
    if r.link_note:
        assert re.search(rf"^Links +{re.escape(r.link_note)}", shown, re.M)
    assert re.search(r"^ *Study +Size +Cells here +What the others need", cells, re.M)
    for c in same.studies:
        count = f"all {c.cells}" if c.whole else f"{c.runnable} of {c.cells}"
        assert re.search(rf"^ *{c.study} +{c.size} +{count} ", cells, re.M), (c, cells)
        for need in capability.needs(c):
            assert need in cells
    assert {c.study for c in same.studies} >= {"a", "b", "c", "d"}


# -- profiles ----------------------------------------------------------------------------------------------
async def _profiles(app, pilot):
    await until(pilot, lambda: app.screen.query_one("#profiles").row_count > 5, what="profile list")
    return app.screen.query_one("#profiles")


async def _goto_row(pilot, table, name: str) -> None:
    names = [r[2] for r in rows(table)]
    table.move_cursor(row=names.index(name))
    await pilot.pause()


async def test_profiles_use_switches_the_active_profile(backend):
    app = create_app(backend, mode="profiles")
    async with app.run_test(size=SIZE) as pilot:
        table = await _profiles(app, pilot)
        await _goto_row(pilot, table, "kvm-cache-none")
        await pilot.press("u")
        await until(pilot, lambda: any(r[0] == "active" and r[2] == "kvm-cache-none" for r in rows(table)),
                    what="kvm-cache-none marked active")
        assert profiles.active_profile_name() == "kvm-cache-none"


async def test_profiles_detail_and_diff_of_two_marked(backend):
    app = create_app(backend, mode="profiles")
    async with app.run_test(size=SIZE) as pilot:
        table = await _profiles(app, pilot)
        await _goto_row(pilot, table, "eucalyptus-default")
        detail = app.screen.query_one("#profile-detail")
        await until(pilot, lambda: "disk.bus" in _render(app, detail))
        assert "scsi-lsi" in _render(app, detail)
        await pilot.press("space")  # marks eucalyptus-default
        await _goto_row(pilot, table, "virtio-disk")
        await pilot.press("space")
        await pilot.press("d")
        out = _render(app, detail)
        assert "≠" in out and "knobs differ" in out
        lines = out.splitlines()
        at = next(i for i, ln in enumerate(lines) if "disk.bus" in ln)
        if "eucalyptus-default  vs  virtio-disk" in out:  # side by side
            assert "≠" in lines[at] and "scsi-lsi" in lines[at] and "virtio-blk" in lines[at]
        else:  # the pane too narrow beside the list of presets: B's value under A's
            assert "A: eucalyptus-default" in out and "B: virtio-disk" in out
            assert "≠" in lines[at] and "scsi-lsi" in lines[at] and "virtio-blk" in lines[at + 1]


XEN_ENTRY = "Xen profile: boot the appliance's Xen entry"
LINUX_ENTRY = "KVM profile: boot the appliance's default Linux entry"


def test_boot_and_the_reason_a_profile_cannot_run_come_from_core():
    tcg = accel.Accelerator("tcg", "qemu", True, True, "test")
    assert accel.boot_of(tcg).label == "tcg (emulated)"
    assert accel.boot_of(accel.Accelerator("kvm", "kvm", False, False, "test")).label == "kvm"
    assert accel.boot_of(None, xen=False).label == "linux (kvm or tcg: not probed yet)"
    xen = accel.boot_of(accel.Accelerator("xen", "xen", True, True, "test"))
    assert (xen.xen, xen.label) == (True, "xen dom0 (in a VM, emulated)")
    assert accel.boot_of(tcg).refusal("xen") == XEN_ENTRY and accel.boot_of(tcg).refusal("kvm") is None
    assert xen.refusal("kvm") == LINUX_ENTRY and xen.refusal("xen") is None


def _dim(table, name: str) -> bool:
    names = [r[2] for r in rows(table)]
    return all("dim" in str(c.style) for c in table.get_row_at(names.index(name)))


async def _start_is_refused(app, pilot, cl, name: str) -> None:
    """Ticking the greyed profile `name` and pressing s starts nothing and says why."""
    cl.checked = {name}
    await pilot.press("s")
    await until(pilot, lambda: any("cannot run on this boot" in n.message for n in app._notifications))
    assert not ResultStore().list_runs()


@pytest.mark.parametrize(("acc", "label", "greyed", "runs", "why"), [
    (accel.Accelerator("tcg", "qemu", True, True, "test facts"), "tcg (emulated)", "xen-xvd-phy", "virtio-disk",
     XEN_ENTRY),
    (accel.Accelerator("xen", "xen", True, True, "test facts"), "xen dom0 (in a VM, emulated)", "virtio-disk",
     "xen-xvd-phy", LINUX_ENTRY),
])
async def test_profiles_of_the_other_hypervisor_are_greyed_with_the_reason(state, acc, label, greyed, runs, why):
    f = facts()
    f.accelerator = acc
    b = Backend(facts=f, libvirt_uri="test:///default")

    try:
        app = create_app(b, mode="profiles")
        async with app.run_test(size=SIZE) as pilot:
            table = await _profiles(app, pilot)
            line = " ".join(text(app.screen.query_one("#boot-line")).split())
            assert line.startswith(f"Booted into: {label}") and why in line
            assert _dim(table, greyed) and not _dim(table, runs)
            detail = app.screen.query_one("#profile-detail")
            await _goto_row(pilot, table, greyed)
            await until(pilot, lambda: "disk.bus" in _render(app, detail))
            assert f"Cannot run on this boot ({label}): {why}" in " ".join(_render(app, detail).split())
            await _goto_row(pilot, table, runs)
            await until(pilot, lambda: runs in _render(app, detail).splitlines()[0])
            assert "Cannot run on this boot" not in _render(app, detail)
            # Tests: the greyed profile carries its reason in the list and is not started.
            await pilot.press("4")
            cl = app.screen.query_one(CheckList)
            await until(pilot, lambda: cl.items and cl.blocked, what="the profiles to tick")
            assert f"booted into {label}" in str(app.screen.query_one("#profiles-label").content)
            assert cl.blocked == {n: why for n, _ in cl.items if (n.startswith("xen") == greyed.startswith("xen"))}
            prompt = cl.get_option(greyed).prompt
            assert f"{greyed}  ({why})" in str(prompt) and "dim" in str(prompt.spans[0].style)
            await _start_is_refused(app, pilot, cl, greyed)
    finally:
        b.close()


async def test_a_host_raid_profile_is_greyed_where_the_host_has_no_md(state, monkeypatch):
    """Without md or mdadm on this host, virtio-raid0-host is greyed with the reason in Profiles and Tests, and Start
    refuses it; the guest's own RAID (virtio-raid0) stays runnable."""
    missing = "mdadm is not installed (Debian package mdadm; the cloudbox appliance has it)"
    monkeypatch.setattr(Backend, "boot", lambda self: accel.Boot(False, "tcg (emulated)", host_raid=missing))
    b = Backend(facts=facts(), libvirt_uri="test:///default")
    why = "host RAID: mdadm is not installed"

    try:
        app = create_app(b, mode="profiles")
        async with app.run_test(size=SIZE) as pilot:
            table = await _profiles(app, pilot)
            assert why in " ".join(text(app.screen.query_one("#boot-line")).split())
            assert _dim(table, "virtio-raid0-host") and not _dim(table, "virtio-raid0")
            await pilot.press("4")
            cl = app.screen.query_one(CheckList)
            await until(pilot, lambda: cl.items and cl.blocked, what="the profiles to tick")
            assert cl.blocked.get("virtio-raid0-host") == why and "virtio-raid0" not in cl.blocked
            await _start_is_refused(app, pilot, cl, "virtio-raid0-host")
    finally:
        b.close()
    assert accel.Boot(False, "kvm").refusal("kvm", "", "host") is None  # a host with md and mdadm runs it


def _render(app, widget) -> str:
    """A widget's content rendered to plain text at its width (for rich renderables like tables)."""
    from rich.console import Console

    console = Console(width=max(40, widget.size.width or 60), record=True, color_system=None)
    console.print(widget.content)
    return console.export_text()


async def test_new_profile_form_shows_errors_next_to_fields_then_saves(backend):
    from textual.widgets import Input, Label

    app = create_app(backend, mode="profiles")
    async with app.run_test(size=SIZE) as pilot:
        table = await _profiles(app, pilot)
        await _goto_row(pilot, table, "virtio-disk")
        await pilot.press("n")
        await until(pilot, lambda: app.screen.__class__.__name__ == "ProfileForm")
        form = app.screen
        form.query_one("#f-name", Input).value = "my-tuned"
        form.query_one("#f-guest-memory_mib", Input).value = "64"  # below the 256 MiB minimum
        form.query_one("#f-network-mtu", Input).value = "12000"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "not saved" in str(form.query_one("#form-error", Label).content))
        mem_err = str(form.query_one("#e-guest-memory_mib", Label).content)
        mtu_err = str(form.query_one("#e-network-mtu", Label).content)
        assert "256..262144" in mem_err and "64" in mem_err
        assert "1500..9000" in mtu_err
        assert str(form.query_one("#e-disk-cache", Label).content) == ""
        assert not (Path(os.environ["CLOUDBOX_STATE_DIR"]) / "profiles" / "my-tuned.toml").exists()
        form.query_one("#f-guest-memory_mib", Input).value = "512"
        form.query_one("#f-network-mtu", Input).value = "9000"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: app.screen.__class__.__name__ == "ProfilesScreen")
        saved = profiles.find_profile("my-tuned")
        assert saved.guest.memory_mib == 512 and saved.network.mtu == 9000 and saved.disk.bus == "virtio-blk"
        await until(pilot, lambda: any(r[2] == "my-tuned" and r[3] == "user" for r in rows(table)))


async def test_edit_in_editor_validates_before_saving_and_delete_asks_first(backend, tmp_path, monkeypatch):
    base = profiles.find_profile("virtio-disk")
    data = base.model_dump()
    data["name"] = "mine"
    profiles.save_user_profile(profiles.validate_data(data, "test"))
    editor = tmp_path / "editor"
    editor.write_text("#!/bin/sh\nsed -i 's/^cache = .*/cache = \"sometimes\"/' \"$1\"\n")
    editor.chmod(editor.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("EDITOR", str(editor))
    monkeypatch.delenv("VISUAL", raising=False)

    app = create_app(backend, mode="profiles")
    async with app.run_test(size=SIZE) as pilot:
        table = await _profiles(app, pilot)
        await _goto_row(pilot, table, "mine")
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, TextDialog) and bool(app.screen.query("#text")))
        assert "disk.cache" in text(app.screen.query_one("#text")) and "writeback" in text(
            app.screen.query_one("#text"))
        await pilot.press("escape")
        assert profiles.find_profile("mine").disk.cache == base.disk.cache  # unchanged
        draft = Path(os.environ["CLOUDBOX_STATE_DIR"]) / "drafts" / "mine.toml"
        assert 'cache = "sometimes"' in draft.read_text()  # the failed edit is kept, not thrown away
        # the next edit starts from that draft: this editor fixes only the bad value
        editor.write_text("#!/bin/sh\ngrep -q sometimes \"$1\" || exit 3\n"
                          "sed -i 's/^cache = .*/cache = \"writeback\"/' \"$1\"\n")
        await _goto_row(pilot, table, "mine")
        await pilot.press("e")
        await until(pilot, lambda: profiles.find_profile("mine").disk.cache == "writeback")
        assert not draft.exists()
        # presets are read-only
        await _goto_row(pilot, table, "virtio-disk")
        await pilot.press("e")
        await pilot.press("x")
        assert not isinstance(app.screen, ConfirmDialog)
        # delete asks; "n" keeps it, "y" deletes it
        await _goto_row(pilot, table, "mine")
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        await pilot.press("n")
        await pilot.pause()
        assert profiles.find_profile_path("mine").exists()
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        await pilot.press("y")
        await until(pilot, lambda: not any(r[2] == "mine" for r in rows(table)))
        assert not (Path(os.environ["CLOUDBOX_STATE_DIR"]) / "profiles" / "mine.toml").exists()


# -- results -----------------------------------------------------------------------------------------------
@pytest.fixture
def results_backend(state) -> Backend:
    with ResultStore() as store:
        add_study_a_default(store)
        add_virtio_tcg(store)
    b = Backend(facts=facts(), libvirt_uri="test:///default")
    yield b
    b.close()


async def test_results_compare_marked_runs_and_export(results_backend, tmp_path):
    app = create_app(results_backend, mode="results")
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one("#runs")
        await until(pilot, lambda: table.row_count == 2)
        listed = rows(table)
        assert {r[2] for r in listed} == {"study-a-default", "virtio-phy"}
        tcg = next(r for r in listed if r[2] == "virtio-phy")
        assert tcg[4] == "TCG*" and "55*" in tcg[3] and "(50%)" in tcg[3]
        table.move_cursor(row=0)
        await pilot.press("space")  # marks row 0, moves down
        await pilot.press("space")  # marks row 1
        assert [r[0] for r in rows(table)] == ["x", "x"]
        await pilot.press("c")
        out = app.screen.query_one("#compare")
        await until(pilot, lambda: "study-a-default" in text(out) and "virtio-phy" in text(out))
        assert "*" in text(out)
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, ExportDialog))
        from textual.widgets import Input

        target = tmp_path / "out" / "cmp.md"
        app.screen.query_one("#path", Input).value = str(target)
        await pilot.press("enter")
        await until(pilot, lambda: target.exists(), what="export written")
        md = target.read_text()
        assert "study-a-default" in md and "virtio-phy" in md and md.count("|") > 10


async def test_results_of_a_run_of_two_guests_show_each_guest_and_the_spread(backend):
    from cloudbox.core.record.provenance import Guests, GuestStart, Provenance

    with ResultStore() as store:
        rid = store.create_run(profile_name="virtio-disk", suite="storage", accelerator="tcg",
                               provenance=Provenance(guests=Guests(count=2, guests=[GuestStart(name="g1"),
                                                                                    GuestStart(name="g2")])))
        for k, v in ((1, 30.0), (2, 10.0)):
            store.add_measurement(rid, side="guest", test="seq-write-64k", metric="MB/s", value=v, instance=k)
        store.add_measurement(rid, side="guest", test="seq-write-64k", metric="MB/s", value=40.0)
        store.add_measurement(rid, side="baseline", test="seq-write-64k", metric="MB/s", value=200.0)
        store.finish_run(rid, "completed")

    app = create_app(backend, mode="results")
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one("#runs")
        await until(pilot, lambda: table.row_count == 1)
        assert rows(table)[0][6] == "storage, 2 guests" and rows(table)[0][3].startswith("W 40* MB/s (20%)")
        await pilot.press("c")
        compare = app.screen.query_one("#compare")
        await until(pilot, lambda: "Jain" in text(compare), what="the comparison")
        for words in ("#1 sum", "#1 g1", "#1 g2", "per guest min 10.0 / median 20.0 / max 30.0",
                      "Jain's fairness index 0.800"):
            assert words in " ".join(text(compare).split()), words  # the table wraps to the box


async def test_results_of_a_repeated_run_show_each_figures_interval(backend):
    """A run whose tests were repeated, beside one measured once: its headline gives each % of bare metal's interval
    and n, a figure that varies is marked, and the comparison shows every interval with its notes."""
    from cloudbox.core.record import stats
    from cloudbox.core.views import labels

    with ResultStore() as store:
        once = add_study_a_default(store)
        rep = add_repeated_virtio(store)
    s = stats.summarize(REPEATED_WRITE_GUEST)
    q = stats.ratio(REPEATED_WRITE_GUEST, REPEATED_WRITE_BARE)
    assert s.low is not None and s.high is not None and q is not None and q.low is not None and q.high is not None
    app = create_app(backend, mode="results")
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one("#runs")
        await until(pilot, lambda: table.row_count == 2)
        by_id = {r[1]: r for r in rows(table)}
        head = by_id[str(rep)][3]
        assert head.startswith(f"W {s.median:.0f} MB/s ({q.percent:.0f}% [{q.low:.0f}, {q.high:.0f}]) n=8  R 71~ ")
        assert head.endswith(" n=3")  # tcp-stream, three a side
        assert "[" not in by_id[str(once)][3] and "n=" not in by_id[str(once)][3]  # measured once: as before
        await pilot.press("space")
        await pilot.press("space")
        await pilot.press("c")
        out = app.screen.query_one("#compare")
        await until(pilot, lambda: "virtio-phy" in text(out) and "study-a-default" in text(out), what="comparison")
        shown = text(out)
        for words in (f"[{s.low:.1f}, {s.high:.1f}]", f"[{q.low:.1f}, {q.high:.1f}]", "n=8+8", "905 n=3"):
            assert words in shown, words
        flat = " ".join(shown.split())
        for note in (labels.VARIES_NOTE, labels.INTERVAL_NOTE, labels.ONCE_SOME_NOTE):
            assert note in flat, note


async def test_results_delete_asks_and_refuses_nothing_silently(results_backend):
    app = create_app(results_backend, mode="results")
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one("#runs")
        await until(pilot, lambda: table.row_count == 2)
        table.move_cursor(row=0)
        victim = rows(table)[0][1]
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        await pilot.press("y")
        await until(pilot, lambda: table.row_count == 1)
        assert rows(table)[0][1] != victim


# -- errors become notifications, not tracebacks -------------------------------------------------------------
# -- studies ----------------------------------------------------------------------------------------------
def record_study_run(store: ResultStore, profile: str, tests: dict[str, float], *, started_at: float,
                     state: str = "completed", accelerator: str = "tcg", size: str = "quick") -> int:
    """A run of `profile` as the executor records one, through the results store's API."""
    prof = profiles.find_profile(profile)
    rid = store.create_run(profile_name=profile, profile_hash=prof.hash, suite="storage", size_label=size,
                           accelerator=accelerator, started_at=started_at)
    for test, value in tests.items():
        store.add_measurement(rid, side="baseline", test=test, metric="MB/s", value=110.0)
        store.add_measurement(rid, side="guest", test=test, metric="MB/s", value=value)
    store.finish_run(rid, state, None if state == "completed" else "guest did not boot")
    return rid


@pytest.fixture
def studies_backend(state) -> Backend:
    with ResultStore() as store:
        record_study_run(store, "eucalyptus-default", {"dd-write-64k": 1.3, "dd-read-64k": 71.9},
                         started_at=1_700_000_000.0)
    b = Backend(facts=facts(), libvirt_uri="test:///default")
    yield b
    b.close()


def cell_state(table, key: str) -> list[str]:
    return [str(getattr(c, "plain", c)) for c in table.get_row(key)]


async def test_studies_table_and_a_cell_filling_in_as_a_result_arrives(studies_backend):
    """The studies found, their counts over the seeded database, study A's matrix with labelled numbers; a run
    recorded while the screen is shown turns its cell from not run to done on the screen's own reload timer."""
    app = create_app(studies_backend, mode="studies", poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        studies_table = app.screen.query_one("#studies")
        cells = app.screen.query_one("#cells")
        await until(pilot, lambda: studies_table.row_count == 6 and cells.row_count > 0, what="the studies")
        listed = {r[0]: r for r in rows(studies_table)}
        assert set(listed) == {"a", "b", "c", "c-nfs", "d", "ladder"}
        name, total, with_results, findings, title = listed["a"]
        assert (total, with_results) == ("54", "2") and title.startswith("Study A")
        assert findings.startswith("0/") and findings.endswith("checked, 0 reproduced")
        assert listed["b"][2] == "0"
        assert cells.row_count == 54
        done = cell_state(cells, "eucalyptus-default/dd-write-64k")
        assert done[2:5] == ["done", "1.3 (emulated, quick)", "MB/s"] and done[6] == "#1"
        assert done[5] != "-"  # the paper's number beside ours
        assert cell_state(cells, "xen-default/dd-write-64k")[2] == "cannot run"
        assert cell_state(cells, "virtio-disk/dd-write-64k")[2:4] == ["not run", "-"]
        with ResultStore() as store:
            failed = record_study_run(store, "kvm-scsi-phy", {}, started_at=1_700_000_100.0, state="failed")
            rid = record_study_run(store, "virtio-disk", {"dd-write-64k": 21.4}, started_at=1_700_000_200.0,
                                   accelerator="nested-kvm")
        await until(pilot, lambda: cell_state(cells, "virtio-disk/dd-write-64k")[2] == "done", timeout=15,
                    what="the new result on the matrix")
        filled = cell_state(cells, "virtio-disk/dd-write-64k")
        assert (filled[3], filled[6]) == ("21.4 (nested, quick)", f"#{rid}")
        scsi = cell_state(cells, "kvm-scsi-phy/dd-write-64k")
        assert scsi[2] == "failed" and scsi[6] == f"#{failed}" and scsi[7] == "guest did not boot"
        await until(pilot, lambda: rows(studies_table)[0][2] == "3", timeout=15,
                    what="study A's count of cells with results in the list")  # read before the matrix
        await pilot.press("down")  # study B: its matrix replaces A's
        await until(pilot, lambda: cells.row_count and cells.get_row_at(0) and
                    "kvm-cache-writethrough" in str(cells.get_row_at(0)[0]), what="study B's cells")
        await pilot.press("down")  # study C: the record sweep on a whole disk, a file, RAID 0 of two and four
        await until(pilot, lambda: cells.row_count == 56 and "virtio-disk" in str(cells.get_row_at(0)[0]),
                    what="study C's cells")
        assert cell_state(cells, "virtio-file/iozone-read-16m")[2] == "not run"
        assert cell_state(cells, "virtio-raid0-4/iozone-write-4k")[2] == "not run"
        await pilot.press("down")  # study C's NFS part: three mounts of one export, four tests
        await until(pilot, lambda: cells.row_count == 12 and "nfs-async-tcp" in str(cells.get_row_at(0)[0]),
                    what="study c-nfs's cells")
        assert cell_state(cells, "nfs-async-tcp-9000/iozone-read-1m")[2] == "not run"
        await pilot.press("down")  # study D, a series: each cell counts its repeats
        await until(pilot, lambda: cells.row_count == 4 and "virtio-file" in str(cells.get_row_at(0)[0]),
                    what="study D's cells")
        assert cell_state(cells, "virtio-file/seq-write-2m")[2:] == ["not run", "-", "", "-", "-",
                                                                   "0 of 17 repeats"]


async def test_studies_report_view_shows_the_cli_report(studies_backend):
    from cloudbox.core.studies import markdown

    with ResultStore() as store:
        expected = markdown.to_markdown(evidence.gather(loading.find_study("a"), store.list_runs(state="completed")))
    app = create_app(studies_backend, mode="studies")
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one("#studies")
        await until(pilot, lambda: table.row_count == 6, what="the studies")
        for key in ("r", "enter"):
            await pilot.press(key)
            await until(pilot, lambda: app.screen.__class__.__name__ == "ReportScreen", what="the report")
            report = app.screen.query_one("#report")
            assert report.text.splitlines()[0] == "# Study A: Eucalyptus / UEC on KVM and Xen (Tables 1 and 2, " \
                "network)"
            assert report.text == expected
            await pilot.press("escape")
            await until(pilot, lambda: app.screen.__class__.__name__ == "StudiesScreen")


async def test_studies_start_plans_a_quick_run_like_the_cli(studies_backend, monkeypatch):
    """s plans study A at quick size as `cloudbox study run a --size quick --detach` does and hands the runs to
    the sweep launcher. The test stops there: the launcher is replaced by one that records the runs, so no guest
    starts (a real sweep would boot one per profile)."""
    from cloudbox.core.run import runs

    launched: list = []

    class FakeSweep:
        id = "sweep-test"

    def start_sweep(specs, store, offsets=None):
        launched.append(specs)
        return FakeSweep()

    monkeypatch.setattr(runs, "start_sweep", start_sweep)

    app = create_app(studies_backend, mode="studies")
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one("#studies")
        await until(pilot, lambda: table.row_count == 6, what="the studies")
        await pilot.press("s")
        await until(pilot, lambda: launched, what="the sweep")
        specs = launched[0]
        assert all(s.size == "quick" and s.node == "" for s in specs)
        assert {s.profile for s in specs} == {"eucalyptus-default", "eucalyptus-prealloc", "virtio-file",
                                              "kvm-scsi-phy", "virtio-disk"}
        default = next(s for s in specs if s.profile == "eucalyptus-default")
        # its two storage cells are stored at quick size, one sample a side: fewer than the quick plan's 3 repeats
        assert default.suite == "all" and all(s.repeats == 3 for s in specs)
        await until(pilot, lambda: any("sweep sweep-test started" in n.message for n in app._notifications),
                    what="the notification")


async def test_core_errors_are_notifications(state, monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("CLOUDBOX_STATE_DIR", str(blocker / "state"))  # cannot be created: a file is in the way

    app = create_app(Backend(facts=facts(), libvirt_uri="test:///default"), mode="results")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.errors, what="an error notification")
        assert "cannot create" in app.errors[0] and "CLOUDBOX_STATE_DIR" in app.errors[0]
        assert app.is_running
        await pilot.press("1")
        await until(pilot, lambda: app.current_mode == "overview")


async def test_libvirt_down_is_explained_on_the_guests_screen(state):
    app = create_app(Backend(facts=facts(), libvirt_uri="qemu+unix:///system?socket=/nonexistent/sock"),
                     mode="guests")
    async with app.run_test(size=SIZE) as pilot:
        status = app.screen.query_one("#guests-status")
        await until(pilot, lambda: text(status).startswith("libvirt:"), what="libvirt problem shown")
        assert "cannot reach libvirtd" in text(status)
        await pilot.press("s")  # nothing to stop: a warning, not a crash
        assert app.is_running


async def test_tests_screen_needs_a_profile_ticked(backend):
    app = create_app(backend, mode="tests")
    async with app.run_test(size=SIZE) as pilot:
        cl = app.screen.query_one(CheckList)
        await until(pilot, lambda: cl.items)
        assert cl.selected == ["virtio-disk"]  # the active profile is ticked by default
        # ... and the cursor is on it, the list scrolled to it (below the first screenful of presets)
        assert cl.highlighted == [n for n, _ in cl.items].index("virtio-disk") > 0
        # scrolled once the list has its size: after a refresh or more on a loaded machine (one pause was not)
        await until(pilot, lambda: cl.scroll_offset.y > 0, what="the profile list scrolled to virtio-disk")
        cl.focus()
        await pilot.press("space")
        assert cl.selected == []
        assert "[ ] virtio-disk" in str(cl.get_option("virtio-disk").prompt)
        await pilot.press("s")
        await pilot.pause()
        assert app.screen.query_one("#run-head") is not None
        assert not ResultStore().list_runs()


async def _guests_refused(pilot, app, value: str, *, start: bool = True) -> str:
    """Type `value` as the guest count, start (or press Enter in the field); the note under the field."""
    from textual.widgets import Input

    field = app.screen.query_one("#guest-count", Input)
    field.value = value
    await pilot.pause()
    if start:
        app.screen.query_one("#start").focus()
        await pilot.press("s")
    else:
        field.focus()
        await pilot.press("enter")
    note = app.screen.query_one("#guest-note")
    await until(pilot, lambda: "not started" in text(note), what=f"the refusal of {value!r}")
    assert field.has_class("-invalid")
    return text(note)


async def test_tests_screen_guest_count_is_checked_as_the_cli_checks_it(backend):
    from textual.widgets import Select

    from cloudbox.core.spec.runspec import MAX_GUESTS

    app = create_app(backend, mode="tests")
    async with app.run_test(size=SIZE) as pilot:
        cl = app.screen.query_one(CheckList)
        await until(pilot, lambda: cl.selected == ["virtio-disk"])
        assert text(app.screen.query_one("#guests-label")) == "Guests at once (on this host)"
        assert text(app.screen.query_one("#guests-hint")) == "1 to 64; 1,2,4 = a sweep"
        assert app.screen.query_one("#guest-count").value == "1"
        # tests/tui.bats reaches the storage tests by four Shift+Tabs from the tab bar, then Size by one more
        app.screen.query_one("#tests-tabs").query_one("Tabs").focus()
        for want in ("start", "run-profiles", "cpu-overcommit", "test-set", "size"):
            await pilot.press("shift+tab")
            assert app.focused is not None and app.focused.id == want, (want, app.focused)
        app.screen.query_one("#suite", Select).value = "storage"
        for value, says in (("0", "--guests 0 is not allowed; allowed: 1 to 64 guests"),
                            (str(MAX_GUESTS + 1), f"--guests {MAX_GUESTS + 1} is not allowed; allowed: 1 to 64"),
                            ("x", "'x' is not understood; allowed: one value or a comma-separated list"),
                            ("2,2", "2 is given twice; allowed: each value once"),
                            ("", "'' is not understood")):
            note = await _guests_refused(pilot, app, value)
            assert note.startswith("not started: Guests at once: ") and says in note, note
        # N guests with the network suite (and both suites): one run, checked as the CLI checks it
        field = app.screen.query_one("#guest-count")
        for suite in ("network", "all"):
            app.screen.query_one("#suite", Select).value = suite
            field.value = "2"
            await pilot.pause()
            field.focus()
            await pilot.press("enter")
            assert "2 on this host: one run" in text(app.screen.query_one("#guest-note")), suite
            assert [(sp.suite, sp.guests) for sp in app.screen.form.specs()] == [(suite, 2)]
        # more guests than this host holds: the capacity check, with its arithmetic, before anything starts
        app.screen.query_one("#suite", Select).value = "storage"
        note = await _guests_refused(pilot, app, str(MAX_GUESTS))
        assert f"--guests {MAX_GUESTS}: " in note and "allowed: --guests 1 to" in note, note
        assert not ResultStore().list_runs()
        # a list is a sweep: one spec per count, in order, through the same parser as `cloudbox run`
        field = app.screen.query_one("#guest-count")
        field.value = "1, 2,4"
        await pilot.pause()
        assert not field.has_class("-invalid") and not app.screen.query_one("#guest-note").display
        assert [(sp.profile, sp.suite, sp.guests) for sp in app.screen.form.specs()] == [
            ("virtio-disk", "storage", 1), ("virtio-disk", "storage", 2), ("virtio-disk", "storage", 4)]
        field.focus()
        await pilot.press("enter")
        assert "1, 2, 4 on this host: a sweep of 3 runs" in text(app.screen.query_one("#guest-note"))
        assert app.focused is app.screen.query_one("#start")
        # a node under Where: its guests all go there (the node checks its own memory when its run starts)
        where = app.screen.query_one("#where", Select)
        where.set_options([("this host", ""), ("be1", "be1")])
        where.value = "be1"
        await pilot.pause()
        assert text(app.screen.query_one("#guests-label")) == "Guests at once (on be1)"
        field.value = str(MAX_GUESTS)
        await pilot.pause()
        field.focus()
        await pilot.press("enter")
        assert f"{MAX_GUESTS} on be1: one run" in text(app.screen.query_one("#guest-note"))
        assert [(sp.node, sp.guests) for sp in app.screen.form.specs()] == [("be1", MAX_GUESTS)]
        # a spread entry: the guests split over this host and the node, each count checked as the CLI does
        where.set_options([("this host", ""), ("be1", "be1"), ("spread: this host, be1", "local,be1")])
        where.value = "local,be1"
        await pilot.pause()
        assert text(app.screen.query_one("#guests-label")) == "Guests at once (spread over local, be1)"
        field.value = "2"
        await pilot.pause()
        field.focus()
        await pilot.press("enter")
        assert "2 spread over local, be1: one run" in text(app.screen.query_one("#guest-note"))
        assert [(sp.node, sp.guests) for sp in app.screen.form.specs()] == [("local,be1", 2)]
        note = await _guests_refused(pilot, app, "1")
        assert "--guests 1 leaves one empty; allowed: --guests 2 or more" in note, note


async def _storage_form(app, pilot):
    """The Tests screen once its profile list is loaded (virtio-disk ticked), with the storage suite chosen; the
    profile list."""
    from textual.widgets import Select

    cl = app.screen.query_one(CheckList)
    await until(pilot, lambda: cl.selected == ["virtio-disk"])
    app.screen.query_one("#suite", Select).value = "storage"
    return cl


async def test_tests_screen_mixes_the_ticked_profiles_in_one_run(backend):
    """'mix them' turns the ticked profiles into one run per count whose guests take them in turn (--profile a+b),
    refused as the CLI refuses it: fewer guests than profiles under the count, a host-side difference by name."""
    from textual.widgets import Checkbox

    app = create_app(backend, mode="tests")
    async with app.run_test(size=SIZE) as pilot:
        cl = await _storage_form(app, pilot)
        cl.set_items(cl.items, {"kvm-cache-none", "virtio-file"}, cl.blocked)
        app.screen.query_one("#guest-count").value = "2"
        await pilot.pause()
        assert [sp.profile for sp in app.screen.form.specs()] == ["kvm-cache-none", "virtio-file"]  # a sweep
        mix = app.screen.query_one("#mix", Checkbox)
        app.screen.query_one("#run-profiles").focus()
        await pilot.press("m")  # off the Tab order; its key ticks it
        await pilot.pause()
        assert mix.value
        assert [(sp.profile, sp.guests) for sp in app.screen.form.specs()] == [("kvm-cache-none+virtio-file", 2)]
        app.screen.query_one("#guest-count").value = "2,4"
        await pilot.pause()
        assert [sp.guests for sp in app.screen.form.specs()] == [2, 4]  # a sweep of mixes
        note = await _guests_refused(pilot, app, "1")
        assert "--profile kvm-cache-none+virtio-file names 2 profiles, one per guest in turn; --guests 1 " \
               "leaves one unused; allowed: --guests 2 or more" in note, note
        # a difference the run sets up once: refused by name before anything starts
        cl.set_items(cl.items, {"virtio-disk", "virtio-file"}, cl.blocked)
        app.screen.query_one("#guest-count").value = "2"
        await pilot.pause()
        app.screen.query_one("#start").focus()
        await pilot.press("s")
        await until(pilot, lambda: any("differ in disk.backing" in n.message for n in app._notifications),
                    what="the mix's refusal")
        assert not ResultStore().list_runs()


async def test_tests_screen_lets_guests_share_cpus_with_vcpus_per_cpu(backend):
    """'vCPUs per host CPU' under the guest count is --cpu-overcommit: 1 by default, carried into every spec, a value
    outside 1-16 or not a number refused under the count with the field marked (not the count)."""
    from textual.widgets import Input

    app = create_app(backend, mode="tests")
    async with app.run_test(size=SIZE) as pilot:
        await _storage_form(app, pilot)
        app.screen.query_one("#guest-count", Input).value = "2,4"
        await pilot.pause()
        assert [(sp.guests, sp.cpu_overcommit) for sp in app.screen.form.specs()] == [(2, 1.0), (4, 1.0)]
        field = app.screen.query_one("#cpu-overcommit", Input)
        field.value = "2"
        await pilot.pause()
        assert [(sp.guests, sp.cpu_overcommit) for sp in app.screen.form.specs()] == [(2, 2.0), (4, 2.0)]
        note = app.screen.query_one("#guest-note")
        for bad, says in (("0.5", "--cpu-overcommit 0.5 is not allowed; allowed: 1 "),
                          ("two", "vCPUs per host CPU 'two' is not a number; allowed: 1 to 16")):
            field.value = bad
            await pilot.pause()
            field.focus()
            await pilot.press("enter")
            await until(pilot, lambda: "not started" in text(note), what=f"the refusal of {bad!r}")
            assert says in text(note), text(note)
            assert field.has_class("-invalid")
            assert not app.screen.query_one("#guest-count", Input).has_class("-invalid")


async def test_live_view_shows_a_repeated_tests_figures_with_their_intervals(backend):
    """The Live view of a run whose test is repeated, guest and bare metal alternating: after the second sample a
    line gives each side's median so far with its n, the % of bare metal with its interval; a run that measures
    each test once never shows the line."""
    from cloudbox.core.record import stats
    from cloudbox.core.record.events import MeasurementEvent, StateEvent
    from cloudbox.core.spec.runspec import RunSpec

    spec = RunSpec(profile="virtio-disk", suite="storage", storage_tests="seq-write-64k")
    with ResultStore() as store:
        rid = store.create_run(profile_name="virtio-disk", suite="storage", size_label="quick", accelerator="kvm")
        store.add_event(rid, "state", StateEvent("running", profile="virtio-disk", suite="storage",
                                                 plan=tuple(spec.plan())).to_payload(), t=1000.0)
        first = [MeasurementEvent("baseline", "seq-write-64k", "MB/s", REPEATED_WRITE_BARE[0]),
                 MeasurementEvent("guest", "seq-write-64k", "MB/s", REPEATED_WRITE_GUEST[0])]
        for i, rec in enumerate(first, 1):
            store.add_event(rid, rec.kind, rec.to_payload(), t=1000.0 + i)

    app = create_app(backend, mode="tests")
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        screen.action_attach(rid)
        box = screen.query_one("#run-repeats")
        log = screen.query_one("#run-log")
        await until(pilot, lambda: any("= guest seq-write-64k:" in line for line in log.lines), what="the sample")
        assert not box.display and text(box) == ""  # one sample a side: nothing repeated yet
        with ResultStore() as store:
            for k, (g, b) in enumerate(zip(REPEATED_WRITE_GUEST, REPEATED_WRITE_BARE, strict=True), 1):
                if k == 1:
                    continue
                for side, v in (("baseline", b), ("guest", g)):
                    ev = MeasurementEvent(side, "seq-write-64k", "MB/s", v, repeat=k, iteration=k)
                    store.add_event(rid, ev.kind, ev.to_payload())
        q = stats.ratio(REPEATED_WRITE_GUEST, REPEATED_WRITE_BARE)
        assert q is not None
        await until(pilot, lambda: "n=8+8" in text(box), what="the repeated figures")
        assert box.display
        assert text(box) == (f"seq-write-64k MB/s: guest {stats.summarize(REPEATED_WRITE_GUEST).text()}, bare metal "
                             f"{stats.summarize(REPEATED_WRITE_BARE).text()}, {q.text()} of bare metal")
        assert any("= guest seq-write-64k (repeat 8): 73.1 MB/s" in line for line in log.lines)


async def test_live_view_shows_each_guest_and_their_sum(backend):
    from cloudbox.core.record.events import MeasurementEvent, ProgressEvent, StateEvent
    from cloudbox.core.record.provenance import Guests, GuestStart, Provenance
    from cloudbox.core.spec.runspec import RunSpec

    spec = RunSpec(profile="virtio-disk", suite="storage", storage_tests="seq-write-64k", guests=2)
    with ResultStore() as store:
        rid = store.create_run(profile_name="virtio-disk", suite="storage", size_label="quick", accelerator="tcg",
                               provenance=Provenance(guests=Guests(count=2, guests=[GuestStart(name="g1"),
                                                                                    GuestStart(name="g2")])))
        recs = [StateEvent("running", profile="virtio-disk", suite="storage", plan=tuple(spec.plan())),
                ProgressEvent("baseline", "seq-write-64k", 50.0, None, 200.0, instance=1),
                ProgressEvent("baseline", "seq-write-64k", 50.0, None, 180.0, instance=2),
                MeasurementEvent("baseline", "seq-write-64k", "MB/s", 190.0, (), instance=1),
                MeasurementEvent("baseline", "seq-write-64k", "MB/s", 170.0, (), instance=2),
                MeasurementEvent("baseline", "seq-write-64k", "MB/s", 360.0, ()),
                ProgressEvent("guest", "boot", 100.0),
                ProgressEvent("guest", "seq-write-64k", 40.0, None, 31.0, instance=1),
                ProgressEvent("guest", "seq-write-64k", 35.0, None, 24.0, instance=2)]
        for i, rec in enumerate(recs):
            store.add_event(rid, rec.kind, rec.to_payload(), t=1000.0 + i)

    app = create_app(backend, mode="tests")
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        screen.action_attach(rid)
        box = screen.query_one("#run-guests")
        await until(pilot, lambda: "guest seq-write-64k now" in text(box), what="each guest's figures")
        assert box.display
        assert text(box) == "guest seq-write-64k now: g1 31.0  g2 24.0  sum 55.0 MB/s"
        assert "· storage · 2 guests ·" in text(screen.query_one("#run-head"))
        chart = screen.query_one("#chart-mbps")
        assert [v for _, v in chart.data["g1"]] == [31.0] and [v for _, v in chart.data["g2"]] == [24.0]
        assert [v for _, v in chart.data["guests' sum"]] == [31.0, 55.0]  # the sum as each guest's figure came
        assert [v for _, v in chart.data["bare metal"]] == [200.0, 380.0, 360.0]
        assert not chart.data["guest"]
        with ResultStore() as store:
            for k, v in ((1, 30.0), (2, 20.0)):
                ev = MeasurementEvent("guest", "seq-write-64k", "MB/s", v, ("emulated",), instance=k)
                store.add_event(rid, ev.kind, ev.to_payload())
            ev = MeasurementEvent("guest", "seq-write-64k", "MB/s", 50.0, ("emulated",))
            store.add_event(rid, ev.kind, ev.to_payload())
        await until(pilot, lambda: "guest seq-write-64k done" in text(box), what="the test's spread")
        assert text(box) == ("guest seq-write-64k done: sum 50.0 MB/s, per guest min 20.0 / median 25.0 / max "
                             "30.0, Jain 0.962 [emulated]")
        assert [v for _, v in chart.data["g1"]] == [31.0, 30.0]
        assert [v for _, v in chart.data["guests' sum"]][-1] == 50.0
        log = "\n".join(screen.query_one("#run-log").lines)
        assert "= guest seq-write-64k g2: 20 MB/s [emulated]" in log
        screen.action_attach(rid - 1 if rid > 1 else rid + 1)  # another run: the figures go with the run
        await until(pilot, lambda: not box.display, what="the figures cleared")


# -- real guests (full tier: tests/tui.bats drives the same through a real terminal in make test) ---------------
@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full
async def test_launch_a_guest_show_its_xml_and_stop_it(state, libvirt_conn):
    from cloudbox.core.virt.guest import list_guests

    app = create_app(Backend(facts=facts()), mode="guests", poll_interval=0.5)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one("#guests")
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, PickDialog), what="profile picker")
        await pilot.press("enter")  # the active profile is preselected
        await until(pilot, lambda: any(r[1] == "running" and r[3] == "virtio-disk" for r in rows(table)),
                    timeout=120, what="guest running in the list")
        row = next(r for r in rows(table) if r[1] == "running")
        assert row[4].endswith("(guest)") and row[2] != "-"
        # the session's run reaches the "holding" step once the guest is up
        with ResultStore() as store:
            await until(pilot, lambda: any("running; stop it" in (e.payload.get("text") or "")
                                           for r in store.active_runs() for e in store.events_since(r.id)),
                        timeout=180, what="guest session up")
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, TextDialog) and bool(app.screen.query("#text")))
        assert "<domain" in text(app.screen.query_one("#text")) and "cbbr0" in text(app.screen.query_one("#text"))
        await pilot.press("escape")
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        await pilot.press("y")
        await until(pilot, lambda: table.row_count == 0, timeout=90, what="guest gone")
        # the guest goes first; the run finishes once the disk and network are cleaned up too
        with ResultStore() as store:
            await until(pilot, lambda: store.list_runs()[0].finished, timeout=120, what="the session's end")
    assert not [g for g in list_guests(libvirt_conn)]
    with ResultStore() as store:
        (run_,) = store.list_runs()
        assert run_.suite == "guest" and run_.state == "completed" and "guest stopped" in (run_.reason or "")
    assert not list((Path(os.environ["CLOUDBOX_STATE_DIR"]) / "work").glob("*"))


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full
async def test_quick_storage_test_through_the_ui(state, libvirt_conn):
    from textual.widgets import Select

    app = create_app(Backend(facts=facts()), mode="tests", poll_interval=0.5)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.screen.query_one(CheckList).selected == ["virtio-disk"])
        app.screen.query_one("#test-set", Select).value = "smoke"
        app.screen.query_one("#size", Select).value = "quick"
        await pilot.press("s")
        head = app.screen.query_one("#run-head")
        await until(pilot, lambda: "COMPLETED" in text(head) or "ABORTED" in text(head)
                    or "FAILED" in text(head), timeout=420, what="run finished")
        assert "COMPLETED" in text(head), text(head)
        assert "EMULATED" in text(head) or "kvm" in text(head)
        assert app.screen.query_one("#run-progress").percentage == 1.0
        log = "\n".join(app.screen.query_one("#run-log").lines)
        assert "= guest seq-write-64k" in log and "= baseline seq-read-64k" in log
        assert app.screen.query_one("#chart-rq").data["avgrq"], "no host samples charted"
        await pilot.press("5")
        table = app.screen.query_one("#runs")
        await until(pilot, lambda: table.row_count == 1)
        assert "W " in rows(table)[0][3] and "%" in rows(table)[0][3]
    with ResultStore() as store:
        (r,) = store.list_runs()
        assert r.state == "completed" and r.value("guest", "seq-write-64k", "MB/s") > 0
        assert r.value("baseline", "seq-write-64k", "MB/s") > 0


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full
async def test_two_guests_run_from_the_tests_screen(state, libvirt_conn):
    """A guest count of 2 typed on the Tests screen: a run of two TCG guests, each guest's MB/s and their sum
    charted live and stored, the spread shown, the comparison on Results with each guest and Jain's index."""
    from textual.widgets import Select

    from cloudbox.core.virt.guest import list_guests

    app = create_app(Backend(facts=facts()), mode="tests", poll_interval=0.5)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.screen.query_one(CheckList).selected == ["virtio-disk"])
        app.screen.query_one("#suite", Select).value = "storage"
        app.screen.query_one("#size", Select).value = "quick"
        app.screen.query_one("#test-set", Select).value = "smoke"
        app.screen.query_one("#guest-count").value = "2"
        app.screen.query_one("#start").focus()
        await pilot.press("s")
        head = app.screen.query_one("#run-head")
        await until(pilot, lambda: "2 guests" in text(head), timeout=60, what="the run of two guests started")
        await until(pilot, lambda: any(w in text(head) for w in ("COMPLETED", "ABORTED", "FAILED")),
                    timeout=600, what="run finished")
        assert "COMPLETED" in text(head), text(head)
        box = app.screen.query_one("#run-guests")
        assert box.display and " done: sum " in text(box) and "Jain" in text(box), text(box)
        done = [(step.side, step.test, g.n) for step, g, *_ in app.screen.live.figures.done]
        assert ("guest", "seq-write-64k", 2) in done and ("baseline", "seq-write-64k", 2) in done, done
        chart = app.screen.query_one("#chart-mbps")
        assert chart.data["g1"] and chart.data["g2"] and chart.data["guests' sum"], "no per-guest figures charted"
        log = "\n".join(app.screen.query_one("#run-log").lines)
        assert "= guest seq-write-64k g1:" in log and "= guest seq-write-64k g2:" in log
        await pilot.press("5")
        table = app.screen.query_one("#runs")
        await until(pilot, lambda: table.row_count == 1)
        await pilot.press("c")
        compare = app.screen.query_one("#compare")
        await until(pilot, lambda: "Jain" in text(compare), what="the comparison")
        assert " g1" in text(compare) and " g2" in text(compare) and "sum" in text(compare)
    with ResultStore() as store:
        (r,) = store.list_runs()
        assert r.state == "completed" and r.provenance.guests is not None and r.provenance.guests.count == 2
        each = r.instances("guest", "seq-write-64k", "MB/s")
        assert [m.instance for m in each] == [1, 2] and all(m.value > 0 for m in each)
        assert r.value("guest", "seq-write-64k", "MB/s") == pytest.approx(sum(m.value for m in each))
    assert not [g for g in list_guests(libvirt_conn) if r.uuid[:8] in g.name]
    assert not list((Path(os.environ["CLOUDBOX_STATE_DIR"]) / "work").glob("*"))


async def test_a_series_waiting_between_runs_says_when_the_next_starts_and_c_cancels_it(backend, request):
    """The Tests screen on a finished run of a series sweep waiting for its next start (a real sweep process):
    its head says when the next run starts, and c (confirmed) cancels the sweep, not the finished run."""
    import time

    from cloudbox.core.run import runs
    from cloudbox.core.spec.runspec import RunSpec

    with ResultStore() as store:
        done = store.create_run(profile_name="virtio-file", suite="storage", size_label="quick",
                                accelerator="tcg", started_at=time.time() - 60)
        store.finish_run(done, "completed")
        sweep = runs.start_sweep([RunSpec(profile="virtio-file", size="quick")] * 2, store,
                                 offsets=[3600.0, 3660.0])
    request.addfinalizer(lambda: runs.cancel_sweep(sweep.id, timeout=10))

    def waiting():
        return next((s for s in runs.list_sweeps() if s.id == sweep.id and s.waiting_until), None)

    app = create_app(backend, mode="tests")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, waiting, timeout=30, what="the sweep waiting")
        live = app.screen.live
        with ResultStore() as store:
            live.run = store.get_run(done, raw=False)
        live.sweep = waiting()
        live.sweep.runs[0] = done  # as if its first run were the finished one
        live.show_head(live.run, live.sweep)
        due = time.strftime("%H:%M:%S", time.localtime(sweep.started_at + 3600.0))
        assert f"the next run starts at {due}" in text(live.query_one("#run-head"))
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the confirmation")
        assert "Cancel sweep" in text(app.screen.query_one(".dialog-title"))
        await pilot.press("y")
        await until(pilot, lambda: any(s.id == sweep.id and s.state == "cancelled" for s in runs.list_sweeps()),
                    timeout=30, what="the sweep cancelled")
        with ResultStore() as store:
            assert store.get_run(done).state == "completed"  # the finished run is kept as it was
