"""The installer's TUI (cloudbox.tui.install_app) driven with Textual's Pilot, on real loop-device disks (as
test_install.py: real lsblk, wipefs, blkid, mkfs; root needed). Every answer is checked by the core, and its
problems appear under their fields; a dry run writes nothing (the disk's content hash and the mount table before
and after). Writing an install needs the appliance (tests/image/install.bats): here apply is a stand-in that
reports progress like the core's, to test the progress view, Ctrl+C and the end."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
import test_install
from test_install import Lab, _fake_esp, _mounts, _sha
from textual.widgets import DataTable, Input, Label, Log, ProgressBar

from cloudbox.cli import install as cli_install
from cloudbox.core.install import STEPS, InstallPlan, Machine, ProgressEvent, Sources, load_answers
from cloudbox.core.install.disks import GiB
from cloudbox.tui.install_app import InstallApp, InstallBackend, create_install_app
from cloudbox.tui.screens.install.disk import DiskPage
from cloudbox.tui.screens.install.done import DonePage
from cloudbox.tui.screens.install.node import NodePage
from cloudbox.tui.screens.install.progress import ProgressPage
from cloudbox.tui.screens.install.review import ReviewPage

pytestmark = pytest.mark.usefixtures("isolated")

SIZE = (80, 24)
lab, nic = test_install.lab, test_install.nic  # the real loop-device disks and a NIC of this host (fixtures)


def only_lab_disks(lab: Lab) -> Machine:
    m = lab.machine()
    m.disks = [d for d in m.disks if d.path in lab.loops]
    return m


def backend(lab: Lab, esp: Path, tmp_path: Path, **kw) -> InstallBackend:  # type: ignore[no-untyped-def]
    def forbidden(plan: InstallPlan, progress: object) -> bool:
        raise AssertionError("this test must not write")

    kw.setdefault("apply", forbidden)
    return InstallBackend(probe=lambda: only_lab_disks(lab), sources=lambda m: Sources(root="/", esp=str(esp)),
                          after=lambda what: None, answers_file=tmp_path / "answers.toml", **kw)


def text_of(app: InstallApp, selector: str) -> str:
    w = app.screen.query_one(selector)
    if isinstance(w, Log):
        return "\n".join(w.lines)
    return str(w.render()) if isinstance(w, Label) else str(w)


async def until(pilot, cond, what: str, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await pilot.pause(0.05)


async def to_disk_page(pilot, app: InstallApp, role: str) -> None:  # type: ignore[no-untyped-def]
    await until(pilot, lambda: app.machine is not None, "the machine probed")
    from cloudbox.core.install.answers import ROLES

    app.screen.query_one("#f-role").highlighted = ROLES.index(role)  # type: ignore[attr-defined]
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(app.screen, DiskPage), "the disk page")


async def pick_disk(pilot, app: InstallApp, dev: str, serial: str = "") -> None:  # type: ignore[no-untyped-def]
    table = app.screen.query_one(DataTable)
    table.focus()
    table.move_cursor(row=[d.path for d in app.machine.disks].index(dev))  # type: ignore[union-attr]
    await pilot.pause()
    await pilot.press("enter")
    if serial:
        await pilot.press(*serial, "enter")
    await pilot.pause()


async def to_review(pilot, app: InstallApp, role: str, dev: str, serial: str = "") -> None:  # type: ignore[no-untyped-def]
    await to_disk_page(pilot, app, role)
    await pick_disk(pilot, app, dev, serial)
    await until(pilot, lambda: isinstance(app.screen, NodePage), "the node page")
    await pilot.press("ctrl+n")
    await until(pilot, lambda: isinstance(app.screen, ReviewPage), f"the review page; errors {app.errors}")


async def test_a_disk_with_data_needs_its_serial_and_a_refused_disk_is_never_taken(lab, tmp_path):
    blank = lab.disk("blank", 9 * GiB)
    data = lab.disk("data", 9 * GiB)
    small = lab.disk("small", 1 * GiB)
    subprocess.run(["mkfs.ext4", "-q", data], check=True)
    app = create_install_app(backend(lab, tmp_path, tmp_path))

    async with app.run_test(size=SIZE) as pilot:
        await to_disk_page(pilot, app, "all-in-one")
        table = app.screen.query_one(DataTable)
        assert table.row_count == 3
        marks = {str(table.get_row(p)[1]): str(table.get_row(p)[0]) for p in (blank, data, small)}
        assert marks == {blank[5:]: "+", data[5:]: "?", small[5:]: "-"}
        # The refused disk is shown, with why, and not taken.
        await pick_disk(pilot, app, small)
        assert isinstance(app.screen, DiskPage)
        err = text_of(app, "#e-disk-target")
        assert "never installs onto this disk" in err and "allowed:" in err
        # The disk with data: Enter asks for its serial; a wrong one is the core's error, under the field.
        await pick_disk(pilot, app, data)
        assert isinstance(app.focused, Input) and app.focused.id == "f-disk-confirm-serial"
        assert "ext4" in text_of(app, "#disk-why")
        await pilot.press(*"wrong", "enter")
        await pilot.pause()
        assert isinstance(app.screen, DiskPage)
        err = text_of(app, "#e-disk-confirm-serial")
        assert "does not match the serial" in err and "allowed: 'data.img'" in err
        app.focused.value = ""
        await pilot.press(*"data.img", "enter")
        await until(pilot, lambda: isinstance(app.screen, NodePage), "the node page")
        assert app.data["disk"] == {"target": lab.link("data"), "confirm_serial": "data.img"}


async def test_bad_hostname_and_mtu_show_the_cores_problems_next_to_the_fields(lab, nic, tmp_path):
    blank = lab.disk("blank", 9 * GiB)
    app = create_install_app(backend(lab, tmp_path, tmp_path))
    esp = _fake_esp(tmp_path / "esp")
    app.backend.sources = lambda m: Sources(root="/", esp=str(esp))

    async with app.run_test(size=SIZE) as pilot:
        await to_disk_page(pilot, app, "back-end")
        await pick_disk(pilot, app, blank)
        await until(pilot, lambda: isinstance(app.screen, NodePage), "the node page")
        app.screen.query_one("#f-hostname", Input).value = "Bad_Name"
        app.screen.query_one("#f-network-private-mtu", Input).value = "12000"
        app.screen.query_one("#f-network-frontend", Input).value = "127.0.0.1"
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert isinstance(app.screen, NodePage)
        host = text_of(app, "#e-hostname")
        assert "not in the allowed form (got 'Bad_Name')" in host and "allowed: lowercase letters" in host
        mtu = text_of(app, "#e-network-private-mtu")
        assert "out of range (got 12000); allowed: an integer 1500..9000" in mtu
        assert "loopback" in text_of(app, "#e-network-frontend")
        assert "3 problems" in text_of(app, "#page-error")
        assert app.focused is app.screen.query_one("#f-hostname")
        # Fixed, the same page goes on to the plan.
        app.screen.query_one("#f-hostname", Input).value = "node2"
        app.screen.query_one("#f-network-private-mtu", Input).value = "1500"
        app.screen.query_one("#f-network-frontend", Input).value = "discover"
        await pilot.press("ctrl+n")
        await until(pilot, lambda: isinstance(app.screen, ReviewPage), f"the review; errors {app.errors}")
        assert app.plan is not None and app.plan.resolved.answers.network.private_mtu == 1500


async def test_review_shows_the_plan_and_a_dry_run_writes_nothing(lab, tmp_path):
    data = lab.disk("target", 9 * GiB)
    subprocess.run(["mkfs.ext4", "-q", "-L", "old", data], check=True)
    subprocess.run(["blockdev", "--flushbufs", data], check=True)
    img = str(lab.dir / "target.img")
    esp = _fake_esp(tmp_path / "esp")
    before_disk, before_mounts = _sha(img), _mounts()
    app = create_install_app(backend(lab, esp, tmp_path), dry_run=True)

    async with app.run_test(size=SIZE) as pilot:
        await to_review(pilot, app, "all-in-one", data, "target.img")
        plan = text_of(app, "#plan-text")
        assert "ERASES what the disk holds: ext4 on whole disk (label 'old')" in plan
        assert "1. Partition table: GPT on " + data in plan and "grub-bios-setup" in plan
        assert "(dry run)" in text_of(app, "#install-steps")
        assert "dry run: nothing will be written" in text_of(app, "#confirm-hint")
        assert not app.screen.query("#f-confirm")
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert isinstance(app.screen, ReviewPage) and "dry run" in text_of(app, "#page-error")
        await pilot.press("ctrl+q")
    assert app.return_value == 1
    subprocess.run(["blockdev", "--flushbufs", data], check=True)
    assert _sha(img) == before_disk
    assert _mounts() == before_mounts


def _stand_in_apply(started: threading.Event, finish: bool, cleaned: list[str]):  # type: ignore[no-untyped-def]
    """Reports progress the way the core's apply does; with finish=False it copies until interrupted (the
    callback raises), then cleans up in `finally` as the core does."""

    def apply(plan: InstallPlan, progress) -> bool:  # type: ignore[no-untyped-def]
        total = len(STEPS)
        try:
            progress(ProgressEvent("partition", 1, total, "writing the partition table and copying", 0.0))
            started.set()
            if not finish:
                for i in range(2000):
                    time.sleep(0.01)
                    progress(ProgressEvent("partition", 1, total, f"copying: {i} of ~2000 MiB", i / 2000))
            for n, step in enumerate(STEPS[1:], 2):
                progress(ProgressEvent(step, n, total, f"{step} done"))
            progress(ProgressEvent("complete", total, total, "installed", 1.0))
            return True
        finally:
            cleaned.append("mounts removed")

    return apply


async def test_confirmation_then_progress_and_ctrl_c_stops_cleanly(lab, tmp_path):
    blank = lab.disk("blank", 9 * GiB)
    img = str(lab.dir / "blank.img")
    before = _sha(img)
    esp = _fake_esp(tmp_path / "esp")
    started, cleaned = threading.Event(), []  # type: ignore[var-annotated]
    app = create_install_app(backend(lab, esp, tmp_path, apply=_stand_in_apply(started, False, cleaned)))

    async with app.run_test(size=SIZE) as pilot:
        await to_review(pilot, app, "all-in-one", blank)
        await pilot.press(*"no", "enter")
        await pilot.pause()
        assert isinstance(app.screen, ReviewPage) and "not confirmed" in text_of(app, "#page-error")
        app.screen.query_one("#f-confirm", Input).value = ""
        await pilot.press(*"yes", "enter")
        await until(pilot, lambda: isinstance(app.screen, ProgressPage) and started.is_set(), "the install")
        await until(pilot, lambda: "copying: 5 of" in text_of(app, "#progress-log"), "progress in the log")
        assert 0 < app.screen.query_one(ProgressBar).progress < 0.85
        await pilot.press("ctrl+c")
        await until(pilot, lambda: isinstance(app.screen, DonePage), "the end page")
        msg = text_of(app, "#done-message")
        assert msg.startswith("NOT INSTALLED: interrupted; mounts removed")
        assert f"cloudbox install --answers {tmp_path / 'answers.toml'}" in msg
        await pilot.press("q")
    assert app.return_value == 130
    assert cleaned == ["mounts removed"]
    saved = load_answers(tmp_path / "answers.toml")
    assert app.plan is not None and saved.install_id == app.plan.install_id  # the same answers: it resumes
    assert (tmp_path / "answers.toml").stat().st_mode & 0o777 == 0o600
    assert _sha(img) == before


async def test_a_finished_install_ends_with_remove_the_boot_medium_and_reboot(lab, tmp_path):
    blank = lab.disk("blank", 9 * GiB)
    esp = _fake_esp(tmp_path / "esp")
    started, cleaned = threading.Event(), []  # type: ignore[var-annotated]
    app = create_install_app(backend(lab, esp, tmp_path, apply=_stand_in_apply(started, True, cleaned)))

    async with app.run_test(size=SIZE) as pilot:
        await to_review(pilot, app, "all-in-one", blank)
        await pilot.press(*"yes", "enter")
        await until(pilot, lambda: isinstance(app.screen, DonePage), "the end page")
        assert text_of(app, "#done-message").startswith("DONE: installed all-in-one cloudbox-all on " + blank)
        assert "Remove the boot medium" in text_of(app, "#done-next")
        await pilot.press("enter")
    assert app.return_value == 0 and app.after_done == "reboot"


def test_cloudbox_install_opens_the_tui_only_on_a_terminal_without_cli_flags(monkeypatch):
    parser = __import__("cloudbox.cli", fromlist=["build_parser"]).build_parser()

    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Tty())
    monkeypatch.setattr("sys.stdout", Tty())
    assert cli_install._wants_tui(parser.parse_args(["install"]))
    assert cli_install._wants_tui(parser.parse_args(["install", "--dry-run"]))
    for flags in (["--cli"], ["--answers", "x.toml"], ["--unattended"], ["--yes"]):
        assert not cli_install._wants_tui(parser.parse_args(["install", *flags])), flags
    monkeypatch.setattr("sys.stdout", object.__new__(type("NoTty", (), {"isatty": lambda self: False})))
    assert not cli_install._wants_tui(parser.parse_args(["install"]))
