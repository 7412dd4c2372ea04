"""The volume registry and `cloudbox volume`: names and sizes checked with the allowed values named, free space
checked before anything is made, nothing left after a failed create, attachment by live runs only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cloudbox.cli import main
from cloudbox.core.disks.volumes import store as vstore
from cloudbox.core.disks.volumes.store import VolumeBusy, VolumeStore, parse_size
from cloudbox.core.errors import NoSpace, NotFound, UsageError

MIB = 1024 * 1024


@pytest.mark.parametrize(("text", "n"), [("4M", 4 * MIB), ("512m", 512 * MIB), ("1G", 1024 * MIB),
                                         ("1GiB", 1024 * MIB), ("2T", 2 * 1024**4), (str(8 * MIB), 8 * MIB)])
def test_sizes(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "1", "3M", "1.5G", "65T", "4MB5", "-4M", "4 X", str(5 * MIB + 1)])
def test_bad_sizes_name_the_option_and_what_is_allowed(text):
    with pytest.raises(UsageError) as e:
        parse_size(text)
    assert str(e.value).startswith(f"--size {text!r}") and "allowed: a size like 512M" in str(e.value)


@pytest.mark.parametrize("name", ["", "Ebs", "-ebs", "a/b", "x" * 64, "e b", "ebs\n"])
def test_bad_names(state, name):
    with VolumeStore() as vs, pytest.raises(UsageError) as e:
        vs.create(name, 4 * MIB)
    assert "allowed: lowercase letters, digits and '-'" in str(e.value)
    assert not vstore.volumes_dir().exists() or not any(vstore.volumes_dir().iterdir())


def test_create_list_delete(state):
    with VolumeStore() as vs:
        v = vs.create("ebs", 8 * MIB)
        assert Path(v.path).stat().st_size == 8 * MIB
        assert Path(v.path).stat().st_blocks * 512 >= 8 * MIB  # pre-allocated, not sparse
        assert [x.name for x in vs.list()] == ["ebs"] and vs.get("ebs").attached_run is None
        with pytest.raises(UsageError, match="exists already"):
            vs.create("ebs", 8 * MIB)
        vs.delete("ebs")
        assert vs.list() == [] and not Path(v.path).exists()
        with pytest.raises(NotFound, match="cloudbox volume create ebs"):
            vs.delete("ebs")


def test_larger_than_free_space_is_refused_before_anything_is_made(state, monkeypatch):
    real = os.statvfs

    class Small:
        f_bavail, f_frsize = 100, 4096

    monkeypatch.setattr(vstore.os, "statvfs", lambda p: Small() if "volumes" in str(p) else real(p))
    with VolumeStore() as vs, pytest.raises(NoSpace) as e:
        vs.create("big", 1024 * MIB)
    assert "--size 1.0 GiB does not fit" in str(e.value) and "allowed: at most" in str(e.value)
    with VolumeStore() as vs:
        assert vs.list() == []
    assert list(vstore.volumes_dir().iterdir()) == []


def test_a_failed_allocation_leaves_no_file_and_no_record(state, monkeypatch):
    def fail(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "fallocate: No space left on device")

    monkeypatch.setattr(vstore.subprocess, "run", fail)
    with VolumeStore() as vs, pytest.raises(NoSpace, match="cannot pre-allocate"):
        vs.create("ebs", 8 * MIB)
    with VolumeStore() as vs:
        assert vs.list() == []
    assert list(vstore.volumes_dir().iterdir()) == []


def test_attached_by_a_live_run_only(state):
    child = subprocess.Popen(["sleep", "30"])
    try:
        with VolumeStore() as vs:
            vs.create("ebs", 4 * MIB)
            vs.attach("ebs", "run-a", pid=child.pid)
            assert vs.get("ebs").attached_run == "run-a"
            with pytest.raises(VolumeBusy, match="attached by run run-a"):
                vs.attach("ebs", "run-b")
            with pytest.raises(VolumeBusy, match="cancel that run first"):
                vs.delete("ebs")
            vs.detach("ebs", "run-b")  # another run's mark stays
            assert vs.get("ebs").attached_run == "run-a"
    finally:
        child.kill()
        child.wait()
    with VolumeStore() as vs:  # its process is gone: the mark is stale, the volume free
        assert vs.get("ebs").attached_run is None
        vs.attach("ebs", "run-b")
        vs.detach("ebs", "run-b")
        vs.delete("ebs")


def test_cli(state, capsys):
    assert main(["volume", "create", "ebs", "--size", "4M"]) == 0
    assert "4.0 MiB pre-allocated" in capsys.readouterr().out
    assert main(["volume", "list"]) == 0
    assert "ebs" in capsys.readouterr().out
    assert main(["volume", "list", "--json"]) == 0
    assert [v["name"] for v in json.loads(capsys.readouterr().out)] == ["ebs"]
    assert main(["volume", "create", "x", "--size", "1.5G"]) == 2
    assert "--size '1.5G' not understood" in capsys.readouterr().err
    assert main(["volume", "delete", "nope"]) == 2
    assert "no volume 'nope'" in capsys.readouterr().err
    assert main(["volume", "delete", "ebs"]) == 0
    assert main(["volume", "list"]) == 0
    assert "no volumes" in capsys.readouterr().out


def test_a_form_names_its_own_field_in_size_errors():
    with pytest.raises(UsageError) as e:
        parse_size("1.5G", "size")
    assert str(e.value).startswith("size '1.5G' not understood; allowed: a size like 512M")


def test_exports_here_follow_check_attach_and_the_servers_on_path(tmp_path, monkeypatch):
    from cloudbox.core.disks.volumes import attach

    real = {s: shutil.which(s) for s in ("qemu-nbd", "vblade")}
    for server, found in real.items():
        if found:
            (tmp_path / server).symlink_to(found)
    monkeypatch.setenv("PATH", str(tmp_path))
    got = {e.scheme: e for e in attach.exports_here(has_module=lambda _m: False)}
    assert list(got) == ["nbd", "aoe", "iscsi", "nvme-tcp"]  # an NFS export is no stored volume: not listed
    assert got["nbd"].attach == ("guest", "qemu") and got["aoe"].attach == ("guest",)
    # NVMe/TCP is the kernel's own target: without nvmet it cannot be served, whatever the modes
    assert got["nvme-tcp"].attach == ("guest",) and "nvmet" in got["nvme-tcp"].problem
    withmods = {e.scheme: e for e in attach.exports_here(has_module=lambda _m: True)}
    assert withmods["aoe"].attach[0] == "host" and withmods["nvme-tcp"].problem == ""
    assert got["aoe"].usable == bool(real["vblade"]) and got["nbd"].usable == bool(real["qemu-nbd"])
    (tmp_path / "vblade").unlink(missing_ok=True)
    aoe = {e.scheme: e for e in attach.exports_here()}["aoe"]
    assert not aoe.usable and aoe.problem == "vblade is not installed (Debian package vblade): run 'make deps'"
    assert {e.scheme: e for e in attach.exports_here(hypervisor="xen")}["aoe"].attach == ()


def test_each_scheme_is_one_record_with_one_transport():
    from cloudbox.core.disks.volumes.transports import TRANSPORTS, BlockTransport
    from cloudbox.core.spec import knobs, remote
    from cloudbox.core.spec.schemes import SCHEMES, attached_by, scheme_of

    assert list(TRANSPORTS) == list(SCHEMES) and all(t.scheme is SCHEMES[n] for n, t in TRANSPORTS.items())
    assert all(isinstance(TRANSPORTS[n], BlockTransport) == s.block for n, s in SCHEMES.items())
    # the profile checks' lists are read from the registry
    assert knobs.VOLUME_SCHEMES == tuple(sorted(SCHEMES)) == ("aoe", "iscsi", "nbd", "nfs", "nvme-tcp")
    assert knobs.QEMU_SCHEMES == tuple(s.name for s in attached_by("qemu")) == ("nbd", "iscsi")
    # every block scheme a front-end serves has a URI form, and the refusal names each
    assert set(remote.FORMS) == {s for s in SCHEMES.values() if s.uri is not None} == {
        s for s in SCHEMES.values() if s.block}
    assert all(s.uri_form in remote.ALLOWED for s in remote.FORMS)
    assert scheme_of("nvme-tcp:ebs") is SCHEMES["nvme-tcp"] and scheme_of("ebs") is None
