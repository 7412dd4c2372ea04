"""The Volumes screen (key 7) over a real VolumeStore in a temporary state dir: real pre-allocated files of 4 MiB,
made, refused and deleted through the keys, the form and the confirmation, with nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_tui_pilot import facts, rows, text, until

from cloudbox.core.disks.volumes import store as vstore
from cloudbox.core.disks.volumes.attach import Export
from cloudbox.core.disks.volumes.store import VolumeStore
from cloudbox.core.record.results import ResultStore
from cloudbox.tui import create_app
from cloudbox.tui.backend import Backend
from cloudbox.tui.screens.volumes import VolumeDialog
from cloudbox.tui.widgets.dialogs import ConfirmDialog
from cloudbox.tui.widgets.keybar import KeyBar

MIB = 1024 * 1024
SIZE = (80, 24)
EXPORTS = [Export("nbd", "qemu-nbd", ("guest", "qemu")),
           Export("aoe", "vblade", ("guest",), "vblade is not installed (Debian package vblade): run 'make deps'")]


@pytest.fixture
def backend(state):
    b = Backend(facts=facts(), libvirt_uri="test:///default", exports=EXPORTS)
    yield b
    b.close()
    files = sorted(vstore.volumes_dir().glob("*")) if vstore.volumes_dir().exists() else []
    assert not files, f"volume files left behind: {files}"


def label(app, selector: str) -> str:
    return text(app.screen.query_one(selector))


async def open_form(app, pilot) -> None:
    await pilot.press("n")
    await until(pilot, lambda: isinstance(app.screen, VolumeDialog), what="the new-volume form")


async def fill(app, pilot, name: str, size: str) -> None:
    app.screen.query_one("#v-name").value = name
    app.screen.query_one("#v-size").value = size
    app.screen.query_one("#v-name").focus()
    await pilot.press("enter")


async def test_list_create_and_delete_a_volume(backend):
    app = create_app(backend, mode="volumes")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "No volumes yet: n makes one" in label(app, "#volume-detail"),
                    what="the empty list's hint")
        assert "NBD by qemu-nbd with TLS, disk.attach = guest or qemu" in label(app, "#volume-exports")
        assert "AoE: not here, vblade is not installed" in label(app, "#volume-exports")
        assert not vstore.volumes_db().exists()  # listing made no registry
        bar = app.screen.query_one(KeyBar)
        await until(pilot, lambda: {"new", "delete", "reload"} <= {a for *_, a in bar.spans}, what="the keys")

        await open_form(app, pilot)
        await fill(app, pilot, "ebs", "4M")
        await until(pilot, lambda: app.current_mode == "volumes" and not isinstance(app.screen, VolumeDialog)
                    and rows(app.screen.query_one("#volumes")) != [], what="the new volume's row")
        assert rows(app.screen.query_one("#volumes")) == [["ebs", "4.0 MiB", "file", "none", "NBD", rows(
            app.screen.query_one("#volumes"))[0][5]]]
        path = Path(vstore.volumes_dir() / "ebs.img")
        assert path.stat().st_size == 4 * MIB and path.stat().st_blocks * 512 >= 4 * MIB  # pre-allocated
        assert f"ebs: 4.0 MiB pre-allocated at {path}" in label(app, "#volume-detail")
        assert 'disk.volume = "nbd:ebs"' in label(app, "#volume-detail")  # AoE is not usable here

        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the confirmation")
        await pilot.press("n")  # no: nothing happens
        await until(pilot, lambda: not isinstance(app.screen, ConfirmDialog))
        assert path.exists()
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: rows(app.screen.query_one("#volumes")) == [], what="the row gone")
        assert not path.exists() and app.errors == []
        with VolumeStore() as vs:
            assert vs.list() == []


async def test_bad_name_and_size_are_shown_under_their_fields_and_nothing_is_made(backend):
    app = create_app(backend, mode="volumes")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "No volumes yet" in label(app, "#volume-detail"))
        await open_form(app, pilot)
        await fill(app, pilot, "Bad_Name", "1.5G")
        await until(pilot, lambda: label(app, "#e-size") != "", what="the size error")
        assert label(app, "#e-name").startswith("volume name 'Bad_Name' is not allowed; allowed: lowercase "
                                                "letters, digits and '-'")
        assert label(app, "#e-size").startswith("size '1.5G' not understood; allowed: a size like 512M, 4G")
        await fill(app, pilot, "ebs", "3M")
        await until(pilot, lambda: label(app, "#e-name") == "", what="the name accepted")
        assert label(app, "#e-size") == ("size '3M' (3.0 MiB) is out of range; allowed: a size like 512M, 4G or "
                                         "1TiB (powers of 1024), from 4M to 64T, in whole MiB")
        assert isinstance(app.screen, VolumeDialog) and not vstore.volumes_db().exists()

        # larger than the free space: refused by the registry before a file or a record exists
        await fill(app, pilot, "huge", "64T")
        await until(pilot, lambda: "does not fit" in label(app, "#volume-form-error"), what="no space")
        assert label(app, "#volume-form-error").startswith("size 64.0 TiB does not fit in ")
        assert not (vstore.volumes_dir() / "huge.img").exists()

        # a volume group this box lacks: named by the form's field, with the groups it has (none here)
        app.screen.query_one("#v-vg").value = "cb-no-such-vg"
        await fill(app, pilot, "lv", "8M")
        await until(pilot, lambda: "no such volume group" in label(app, "#volume-form-error"), what="no VG")
        assert label(app, "#volume-form-error").startswith("volume group 'cb-no-such-vg': no such volume group "
                                                           "on this box; allowed: ")
        with VolumeStore() as vs:
            assert vs.list() == []
        app.screen.query_one("#v-vg").value = ""

        # core's own refusal (the name is taken) shows in the form, which stays open
        with VolumeStore() as vs:
            vs.create("ebs", 4 * MIB)
        await fill(app, pilot, "ebs", "4M")
        await until(pilot, lambda: "exists already" in label(app, "#volume-form-error"), what="core's refusal")
        assert label(app, "#volume-form-error") == ("volume 'ebs' exists already; allowed: a new name (cloudbox "
                                                    "volume list)")
        assert isinstance(app.screen, VolumeDialog)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, VolumeDialog))
        await until(pilot, lambda: [r[0] for r in rows(app.screen.query_one("#volumes"))] == ["ebs"])
        assert sorted(p.name for p in vstore.volumes_dir().iterdir()) == ["ebs.img"]
    with VolumeStore() as vs:
        vs.delete("ebs")


async def test_a_volume_attached_to_a_live_run_is_not_deleted(backend):
    store = ResultStore()
    uuid = "c0ffee0d1a2b4c3d8e9f00aa11bb22cc"
    rid = store.create_run(profile_name="kvm-ebs-nbd", profile_hash="0" * 64, profile_toml="", suite="storage",
                           uuid=uuid)  # this process is its pid: a live run
    store.close()
    with VolumeStore() as vs:
        vs.create("ebs", 4 * MIB)
        vs.attach("ebs", uuid, os.getpid())

    app = create_app(backend, mode="volumes")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: rows(app.screen.query_one("#volumes")) != [], what="the volume")
        assert rows(app.screen.query_one("#volumes"))[0][3] == f"run {rid} kvm-ebs-nbd"
        assert "deleting it is refused until that run ends" in label(app, "#volume-detail")
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: app.errors, what="the refusal")
        assert app.errors == [f"volume 'ebs' is attached by run {uuid}; cancel that run first (cloudbox "
                              "cancel) or wait for it to end"]
        assert (vstore.volumes_dir() / "ebs.img").exists()

        with VolumeStore() as vs:  # the run ends: its mark is cleared, as the run's cleanup does
            vs.detach("ebs", uuid)
        await pilot.press("r")
        await until(pilot, lambda: rows(app.screen.query_one("#volumes"))[0][3] == "none", what="free")
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: rows(app.screen.query_one("#volumes")) == [], what="the row gone")
        assert len(app.errors) == 1


async def test_key_7_help_and_palette_reach_the_volumes_screen(backend):
    app = create_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.current_mode == "overview")
        assert "7 Volumes" in app.screen.query_one("NavBar").render_bar(80).plain
        await pilot.press("7")
        await until(pilot, lambda: app.current_mode == "volumes", what="the volumes screen")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert {"Go to Volumes", "New volume", "Delete", "Refresh"} <= set(titles), titles
        await pilot.press("question_mark")
        await until(pilot, lambda: app.screen.__class__.__name__ == "HelpScreen")
        md = app.screen.query_one("#help-text").source
        assert "**1**–**7** switch screens" in md and "## Volumes (this screen)" in md
        assert "**n** New volume" in md and "**D** Delete" in md


def test_the_backend_asks_core_how_this_host_exports(state):
    from cloudbox.core.disks.volumes import attach

    b = Backend(facts=facts(), libvirt_uri="test:///default")
    try:
        got = b.volumes()
    finally:
        b.close()
    assert got.volumes == [] and got.exports == attach.exports_here(hypervisor="kvm")
    assert not vstore.volumes_db().exists()


def test_the_exports_are_looked_at_again_only_on_refresh(state, tmp_path, monkeypatch):
    b = Backend(facts=facts(), libvirt_uri="test:///default")
    try:
        first = {e.scheme: e.problem for e in b.volumes().exports}
        monkeypatch.setenv("PATH", str(tmp_path))  # no qemu-nbd, no vblade from here on
        assert {e.scheme: e.problem for e in b.volumes().exports} == first
        b.forget_exports()
        again = {e.scheme: e.problem for e in b.volumes().exports}
    finally:
        b.close()
    assert "qemu-nbd is not installed" in again["nbd"] and "vblade is not installed" in again["aoe"]
    assert again != first


def test_cloudbox_tui_screen_opens_every_screen_of_the_bar():
    import argparse

    from cloudbox.cli import build_parser
    from cloudbox.tui.widgets.navbar import SCREENS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    screen = next(a for a in sub.choices["tui"]._actions if a.dest == "screen")
    assert list(screen.choices) == [mode for mode, _key, _title in SCREENS]
