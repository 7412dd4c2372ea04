"""RAID 0 on the host (disk.raid_on = host): the profile's rules, the refusal where the host has no md or mdadm,
the array's device and per-member counts, and the reaping of a dead run's arrays. The real array is built in the
appliance (tests/image/volumes.bats): this host's kernel has no md."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudbox.core.disks import hostraid
from cloudbox.core.errors import UsageError
from cloudbox.core.run.multi import check_fits
from cloudbox.core.spec.knobs import guest_disks
from cloudbox.core.spec.profiles import ProfileError, find_profile, parse_profile
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.views import labels
from cloudbox.core.views.labels import knobs

BASE = """
name = "t"
description = "t"
[guest]
hypervisor = "kvm"
vcpus = 1
memory_mib = 1024
[disk]
bus = "virtio-blk"
cache = "none"
backing = "{backing}"
count = {count}
raid = "{raid}"
raid_on = "host"
[network]
model = "virtio"
"""


def test_the_preset_gives_the_guest_one_disk_on_the_hosts_array():
    p = find_profile("virtio-raid0-host")
    d = p.disk
    assert (d.count, d.raid, d.raid_on, d.chunk_kib, d.backing) == (3, "0", "host", 64, "block-device")
    assert guest_disks(d) == 1 and guest_disks(find_profile("virtio-raid0").disk) == 3
    assert "on the host's RAID 0 (64 KiB chunks) over 3 loop devices" in p.describe()


@pytest.mark.parametrize(("backing", "count", "raid", "message"), [
    ("block-device", 1, "none", r"disk.raid_on: .*there is no RAID to build.*allowed: guest \(with disk.raid = none\)"),
    ("prealloc-file", 3, "0", r"disk.raid_on: .*backing prealloc-file gives the guest files.*block-device"),
])
def test_a_host_raid_needs_a_raid_over_loop_devices(backing, count, raid, message):
    with pytest.raises(ProfileError, match=message):
        parse_profile(BASE.format(backing=backing, count=count, raid=raid))


def test_the_guests_raid_keeps_its_hash_and_the_hosts_has_its_own():
    text = (Path(__file__).resolve().parents[2] / "profiles" / "virtio-raid0.toml").read_text()
    assert "raid_on" not in text and text.count('raid = "0"\n') == 1
    before = parse_profile(text)
    explicit = parse_profile(text.replace('raid = "0"\n', 'raid = "0"\nraid_on = "guest"\n'))
    assert explicit.disk.raid_on == before.disk.raid_on == "guest"
    assert explicit.hash == before.hash  # stored runs of virtio-raid0 keep matching it
    host = text.replace('raid = "0"\n', 'raid = "0"\nraid_on = "host"\n').replace('"prealloc-file"',
                                                                                 '"block-device"')
    blocks = parse_profile(text.replace('"prealloc-file"', '"block-device"'))
    assert parse_profile(host).hash != blocks.hash


def test_without_md_or_mdadm_the_run_is_refused_before_it_starts(monkeypatch):
    monkeypatch.setattr(hostraid.shutil, "which", lambda _: "/sbin/mdadm")
    assert "has no raid0 module" in hostraid.problem(lambda m: m != "raid0")
    assert hostraid.problem(lambda m: True) == ""
    monkeypatch.setattr(hostraid.shutil, "which", lambda _: None)
    assert hostraid.problem(lambda m: True).startswith("mdadm is not installed")
    spec = RunSpec(profile="virtio-raid0-host", suite="storage", size="quick")
    with pytest.raises(UsageError, match=r"profile virtio-raid0-host: disk.raid_on = host: mdadm is not installed.*"
                                         r"allowed on this host: disk.raid_on = guest"):
        check_fits(spec, find_profile("virtio-raid0-host"), available_mib=64000, host_cpus=8)
    check_fits(RunSpec(profile="virtio-raid0-host", suite="storage", size="quick", node="be1"),
               find_profile("virtio-raid0-host"))  # the node checks its own kernel
    monkeypatch.setattr(hostraid.shutil, "which", lambda _: "/sbin/mdadm")
    monkeypatch.setattr(hostraid, "kernel_module_available", lambda _: True)
    with pytest.raises(UsageError, match=r"disk.raid_on = host builds one md array on the host for one guest; "
                                         r"--guests 2 needs a disk each"):
        check_fits(RunSpec(profile="virtio-raid0-host", suite="storage", size="quick", guests=2),
                   find_profile("virtio-raid0-host"), available_mib=64000, host_cpus=8)


def test_the_next_free_array_is_md100_up(tmp_path):
    assert hostraid.free_device(tmp_path) == "/dev/md100"
    for name in ("md0", "md127", "md100", "md101"):
        (tmp_path / name).mkdir()
    assert hostraid.free_device(tmp_path) == "/dev/md102"


def _loop(sys_block: Path, name: str, backing: str) -> None:
    (sys_block / name / "loop").mkdir(parents=True)
    (sys_block / name / "loop" / "backing_file").write_text(backing + "\n")


def test_each_member_counts_the_sectors_written_since_the_array_was_built(tmp_path):
    stats = tmp_path / "diskstats"
    line = "   7       {minor} {name} 10 0 80 5 3 0 {wsect} 7 0 12 12 0 0 0 0\n"
    stats.write_text(line.format(minor=3, name="loop3", wsect=612) + line.format(minor=4, name="loop4", wsect=50))
    array = hostraid.HostArray("/dev/md100", 64, ["loop3", "loop4"], "", {"loop3": 100, "loop4": 50})
    assert array.sectors_written(str(stats)) == {"loop3": 512, "loop4": 0}


def test_a_dead_runs_array_and_its_loops_are_reaped_a_live_ones_kept(tmp_path):
    base, sys_block = tmp_path / "work", tmp_path / "sys"
    dead, live = "dead0123456789ab", "live0123456789ab"
    _loop(sys_block, "loop5", f"{base}/run-{dead[:12]}/loopdisk1.raw (deleted)")
    _loop(sys_block, "loop6", f"{base}/run-{dead[:12]}/loopdisk2.raw (deleted)")
    _loop(sys_block, "loop7", f"{base}/run-{live[:12]}/loopdisk1.raw")
    _loop(sys_block, "loop8", "/home/lab/disk.img")
    for md, members in (("md100", ["loop5", "loop6"]), ("md101", ["loop7"]), ("md0", ["loop8"]),
                        ("md102", ["loop8"])):
        for m in members:
            (sys_block / md / "md" / f"dev-{m}").mkdir(parents=True)
    ran: list[list[str]] = []
    done = hostraid.reap(base, {live}, sys_block, run=ran.append)
    assert ran == [["mdadm", "--stop", "/dev/md100"], ["losetup", "-d", "/dev/loop5"], ["losetup", "-d", "/dev/loop6"]]
    assert done == ["md array /dev/md100", "loop device /dev/loop5", "loop device /dev/loop6"]


def test_the_comparison_names_the_hosts_raid():
    from types import SimpleNamespace

    from cloudbox.core.record.provenance import Provenance

    run = SimpleNamespace(profile_toml=find_profile("virtio-raid0-host").to_toml(), provenance=Provenance(),
                          accelerator="kvm", emulated=0)
    assert knobs(run).raid_on == "host"
    assert labels.driver_label(run) == "virtio-blk, the host's RAID 0 (64 KiB) over 3 loop devices"


def test_results_show_says_who_built_the_array(state, capsys):
    from cloudbox import cli
    from cloudbox.core.record.provenance import Provenance, RaidInfo
    from cloudbox.core.record.results import ResultStore

    host = RaidInfo(where="host", device="/dev/md100", level="0", chunk_kib=64, members=["loop0", "loop1"],
                    sectors_written={"loop0": 128, "loop1": 128})
    guest = RaidInfo(device="/dev/md0", level="0", chunk_kib=64, members=["vda", "vdb"])
    with ResultStore() as store:
        ids = [store.create_run(profile_name="p", provenance=Provenance(raid=r)) for r in (host, guest)]
    assert cli.main(["results", "show", str(ids[0])]) == 0
    assert ("  host RAID    /dev/md100: RAID 0, 64 KiB chunks, over loop0, loop1; sectors written loop0 128, "
            "loop1 128\n") in capsys.readouterr().out
    assert cli.main(["results", "show", str(ids[1])]) == 0
    assert "  guest RAID   /dev/md0: RAID 0, 64 KiB chunks, over vda, vdb\n" in capsys.readouterr().out


def test_the_profile_list_and_studies_know_a_host_raid_needs_md(monkeypatch):
    from cloudbox.core.spec import profiles
    from cloudbox.core.studies import loading

    entries = {e.name: e for e in profiles.list_profiles()}
    assert entries["virtio-raid0-host"].raid_on == "host" and entries["virtio-raid0"].raid_on == "guest"
    monkeypatch.setattr(hostraid.shutil, "which", lambda _: None)
    assert loading.cannot_run_here(find_profile("virtio-raid0-host")).startswith("mdadm is not installed")
    assert loading.cannot_run_here(find_profile("virtio-raid0")) is None
    monkeypatch.setattr(hostraid.shutil, "which", lambda _: "/sbin/mdadm")
    monkeypatch.setattr(hostraid, "kernel_module_available", lambda _: True)
    assert loading.cannot_run_here(find_profile("virtio-raid0-host")) is None
