"""Several benchmark disks (disk.count, for a RAID 0 in the guest): a store of the profile's kind for each disk, all
removed afterwards, also when making one fails; /proc/mdstat read back; the RAID named in comparison tables."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cloudbox.core.disks import backing, hostraid
from cloudbox.core.errors import CloudboxError
from cloudbox.core.views import labels

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: loop devices")
MiB = 1 << 20


def _loops_under(d: Path) -> list[str]:
    out = subprocess.run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"], capture_output=True,
                         text=True).stdout
    return [ln for ln in out.splitlines() if str(d) in ln]


@pytest.mark.parametrize(("size", "count", "each"), [
    (16 * MiB, 3, 6 * MiB), (16 * MiB, 2, 8 * MiB), (16 * MiB, 1, 16 * MiB), (2 << 30, 3, 683 * MiB),
    (16 * MiB + 1, 2, 9 * MiB),
])
def test_each_disk_holds_its_share_in_whole_mib(size, count, each):
    assert backing.disk_bytes(size, count) == each
    assert count * each >= size


def test_space_counts_every_store_and_the_baseline():
    assert backing.space_needed("prealloc-file", 16 * MiB, count=3) == (
        3 * 6 * MiB + 16 * MiB, "3 backing files and the bare-metal baseline file")
    assert backing.space_needed("prealloc-file", 16 * MiB) == (
        32 * MiB, "backing file and the bare-metal baseline file")
    assert backing.space_needed("block-device", 16 * MiB, count=2)[0] == 2 * 8 * MiB + 16 * MiB
    assert backing.space_needed("block-device", 16 * MiB, device="/dev/sdb", count=2) == (0, "")


@pytest.mark.parametrize(("kind", "name", "fmt"), [
    ("sparse-file", "disk{}.raw", "raw"), ("prealloc-file", "disk{}.raw", "raw"),
    ("qcow2", "disk{}.qcow2", "qcow2"), ("qcow2-prealloc", "disk{}.qcow2", "qcow2"),
])
def test_a_file_store_per_disk_all_removed(state, kind, name, fmt):
    work = state / "work" / "run-x"
    store = backing.prepare(kind, work_dir=work, size_bytes=16 * MiB, fmt=fmt, count=3)
    try:
        files = [store.path, *store.more_paths]
        assert files == [str(work / name.format(i)) for i in (1, 2, 3)]
        assert all(Path(f).is_file() for f in files)
        assert store.baseline_target == str(work / "baseline.dat") and store.size_bytes == 6 * MiB
        if kind == "prealloc-file":  # real blocks, each its share
            assert all(os.stat(f).st_blocks * 512 >= 6 * MiB for f in files)
        if fmt == "qcow2":
            info = subprocess.run(["qemu-img", "info", files[2]], capture_output=True, text=True).stdout
            assert "virtual size: 6 MiB" in info
    finally:
        store.remove()
    assert not work.exists()


@root_only
def test_a_loop_device_per_disk_all_detached(state):
    work = state / "work" / "run-x"
    store = backing.prepare("block-device", work_dir=work, size_bytes=16 * MiB, fmt="raw", count=3)
    try:
        devs = [store.path, *store.more_paths]
        assert len(set(devs)) == 3 and all(d.startswith("/dev/loop") for d in devs) and store.is_block
        assert len(_loops_under(work)) == 3
        assert all(int(subprocess.run(["blockdev", "--getsize64", d], capture_output=True, text=True).stdout)
                   == 6 * MiB for d in devs)
        assert "loop-device" in store.labels and store.baseline_target == str(work / "baseline.dat")
        assert store.host_device == backing.dev_name_for_path(state)  # the disk under every loop's file
    finally:
        store.remove()
    assert _loops_under(work) == [] and not work.exists()


@root_only
def test_a_failure_part_way_removes_the_stores_made(state, monkeypatch):
    work = state / "work" / "run-x"
    real_run, calls = backing._run, []

    def third_loop_fails(cmd):
        if cmd[0] == "losetup":
            calls.append(cmd)
            if len(calls) == 3:
                raise CloudboxError("losetup: no free loop device")
        return real_run(cmd)

    monkeypatch.setattr(backing, "_run", third_loop_fails)
    with pytest.raises(CloudboxError, match="no free loop device"):
        backing.prepare("block-device", work_dir=work, size_bytes=16 * MiB, fmt="raw", count=3)
    assert _loops_under(work) == [] and not work.exists()


def test_one_named_device_cannot_back_several_disks(state):
    with pytest.raises(CloudboxError, match="3 disks .* /dev/sdz is one device"):
        backing.prepare("block-device", work_dir=state / "w", size_bytes=16 * MiB, fmt="raw", device="/dev/sdz",
                        count=3)
    assert not (state / "w").exists()


MDSTAT = """Personalities : [raid0]
md0 : active raid0 vdc[2] vdb[1] vda[0]
      18432 blocks super non-persistent 64k chunks

unused devices: <none>
"""


def test_mdstat_gives_the_array_and_its_members_in_order():
    assert hostraid.mdstat_array(MDSTAT) == ("raid0", ["vda", "vdb", "vdc"])
    assert hostraid.mdstat_array(MDSTAT, "/dev/md1") is None
    assert hostraid.mdstat_array("Personalities : [raid0]\nmd0 : inactive vda[0](S)\n") is None
    assert hostraid.mdstat_array("Personalities :\nunused devices: <none>\n") is None


def _run_of(profile_toml: str):
    from types import SimpleNamespace

    from cloudbox.core.record.provenance import Provenance

    return SimpleNamespace(profile_toml=profile_toml, provenance=Provenance(), accelerator="kvm", emulated=0)


def test_the_driver_column_names_the_raid():
    raid = labels.driver_label(_run_of(Path(__file__).resolve().parents[2].joinpath(
        "profiles/virtio-raid0.toml").read_text()))
    assert raid == "RAID 0 (64 KiB) over 3 x virtio-blk, pre-allocated file"
    single = labels.driver_label(_run_of(Path(__file__).resolve().parents[2].joinpath(
        "profiles/virtio-file.toml").read_text()))
    assert single == "virtio-blk, pre-allocated file"
