"""LV-backed volumes: the refusals made before anything is created (a group this box lacks, a name lvm2 would not
take, no lvm2), the registry of an earlier version read as files, and a block device's size and diskstats name.
This host's kernel has no device-mapper, so making a real LV is tests/image/volumes.bats's (the appliance's kernel)."""

from __future__ import annotations

import sqlite3
import subprocess

import pytest

from cloudbox.cli import main
from cloudbox.core.disks import backing
from cloudbox.core.disks.volumes import lvm
from cloudbox.core.disks.volumes import store as vstore
from cloudbox.core.disks.volumes.store import VolumeStore
from cloudbox.core.errors import UsageError

MIB = 1024 * 1024


def _nothing_made() -> None:
    with VolumeStore() as vs:
        assert vs.list() == []
    assert not vstore.volumes_dir().exists() or not any(vstore.volumes_dir().iterdir())


def test_a_group_this_box_lacks_is_refused_naming_those_it_has(state, capsys):
    have = lvm.groups()  # the real vgs; none on the build machines
    assert "cb-no-such-vg" not in have
    assert main(["volume", "create", "ebs", "--size", "8M", "--vg", "cb-no-such-vg"]) == 2
    err = capsys.readouterr().err
    assert "--vg 'cb-no-such-vg': no such volume group on this box; allowed: " in err
    assert (", ".join(sorted(have)) if have else "none here (make one on a disk you choose") in err
    _nothing_made()


@pytest.mark.parametrize("vg", ["", "-vg", "a/b", "..", "v g", "x" * 128])
def test_a_name_lvm2_would_not_take_is_refused(state, vg):
    with VolumeStore() as vs, pytest.raises(UsageError) as e:
        vs.create("ebs", 8 * MIB, vg=vg)
    assert str(e.value).startswith(f"--vg {vg!r} is not a volume group name; allowed: letters, digits")
    _nothing_made()


def test_without_lvm2_the_error_says_what_to_install(state, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with VolumeStore() as vs, pytest.raises(UsageError) as e:
        vs.create("ebs", 8 * MIB, vg="data", vg_field="volume group")
    assert "vgs not found; LV-backed volumes need lvm2 (apt install lvm2)" in str(e.value)
    assert "without --vg" in str(e.value)
    _nothing_made()


def test_a_registry_from_before_lvs_reads_its_volumes_as_files(state):
    path = vstore.volumes_db()
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute(vstore._SCHEMA)
    conn.execute("INSERT INTO volumes (name, size_bytes, path, created) VALUES ('old', ?, '/x/old.img', 1.0)",
                 (8 * MIB,))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with VolumeStore() as vs:
        v = vs.get("old")
    assert (v.vg, v.backing, v.as_dict()["backing"]) == (None, "file", "file")
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == vstore.VolumeStore.SCHEMA_VERSION


def test_a_volumes_listing_names_its_backing(state, capsys):
    assert main(["volume", "create", "ebs", "--size", "4M"]) == 0
    capsys.readouterr()
    assert main(["volume", "list"]) == 0
    head, row = capsys.readouterr().out.splitlines()[:2]
    assert head.split()[:3] == ["NAME", "SIZE", "BACKING"] and row.split()[3] == "file"  # after "4.0 MiB"
    main(["volume", "delete", "ebs"])


@pytest.mark.root
def test_a_block_devices_size_and_diskstats_name(tmp_path):
    f = tmp_path / "disk.img"
    f.write_bytes(b"\0" * (3 * MIB))
    dev = subprocess.run(["losetup", "--find", "--show", str(f)], capture_output=True, text=True, check=True)
    loop = dev.stdout.strip()
    try:
        assert backing.byte_size(loop) == 3 * MIB  # st_size of a device node is 0
        assert backing.byte_size(f) == 3 * MIB
        assert backing.dev_name_for_path(loop) == loop.removeprefix("/dev/")  # the device, not devtmpfs's
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)
