"""Bonnie++ (study B) as the storage test `bonnie`: its command lines, its CSV read from real runs' output (the
fixtures in data/ are what bonnie++ 2.00a printed here: on this host and in the TCG guest), the figures it could
not time left out rather than invented, and a bare-metal run on a file that leaves nothing mounted behind."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest

from cloudbox.core.bench import bonnie, iozone, runners
from cloudbox.core.errors import Aborted, CloudboxError, UsageError
from cloudbox.core.run.measure import measured
from cloudbox.core.spec import catalogue
from cloudbox.core.spec.runspec import RunSpec

DATA = Path(__file__).parent / "data"
MIB = 1 << 20


def fixture(name: str) -> str:
    return (DATA / name).read_text()


def test_bonnie_is_one_test_of_its_own_set_outside_full():
    t = catalogue.TESTS["bonnie"]
    assert (t.tool, t.program, t.writes, t.timed) == ("bonnie", "bonnie++", True, False)
    assert catalogue.TEST_SETS["bonnie"] == ["bonnie"] and "bonnie" not in catalogue.TEST_SETS["full"]
    assert not runners.needs_fill([t])  # it writes its own file before reading it
    # it leaves a quarter of the disk unwritten: a read after it still needs the disk laid down first
    assert runners.needs_fill(catalogue.resolve_tests("bonnie,seq-read-64k"))
    assert not runners.needs_fill(catalogue.resolve_tests("bonnie,seq-write-64k,seq-read-64k"))
    assert iozone.iozone_fills(catalogue.resolve_tests("iozone-write-1m,bonnie,iozone-read-1m")) == [
        False, False, True]
    assert catalogue.is_storage_test("bonnie") and not catalogue.is_network_test("bonnie")
    assert catalogue.test_title("bonnie").startswith("Bonnie++: sequential block write")


def test_bonnie_sizes_follow_the_runs_size():
    # quick (128 MiB disk): a 96 MiB file, 4 x 1024 files; study (2 GiB): 1.5 GiB, Bonnie++'s default 16 x 1024
    assert bonnie.bonnie_args("/mnt/x", 128 * MIB) == [
        "bonnie++", "-d", "/mnt/x", "-s", "96m", "-r", "48", "-n", "4", "-f", "-u", "root"]
    assert bonnie.bonnie_args("/mnt/x", 2 << 30)[3:8] == ["-s", "1536m", "-r", "768", "-n"]
    assert bonnie.bonnie_files(2 << 30) == 16 and bonnie.bonnie_files(1 << 40) == 16
    assert bonnie.bonnie_files(64 * MIB) == 2


def test_the_guest_script_makes_ext4_with_e2fsprogs_mounts_runs_and_unmounts():
    s = bonnie.bonnie_guest_script("/dev/vda", 128 * MIB)
    assert "modprobe ext4 || exit 3" in s
    # by path: the guest's busybox shell would otherwise run its own ext2-only mke2fs applet
    assert ("/usr/sbin/mke2fs -t ext4 -F -q -m 0 -E lazy_itable_init=0,lazy_journal_init=0 /dev/vda || exit 4"
            in s)
    assert "mount -t ext4 /dev/vda /mnt/cloudbox-bonnie || exit 5" in s
    assert s.index("bonnie++ -d /mnt/cloudbox-bonnie -s 96m") < s.index("umount /mnt/cloudbox-bonnie || rc=6")
    assert s.endswith("exit $rc")


def test_a_tcg_guests_run_is_read_from_its_csv_line():
    r = bonnie.parse_bonnie("bonnie", fixture("bonnie-guest-tcg-96m.txt"))
    assert r.mbps == pytest.approx(52160 * 1024 / 1e6)  # block write, KiB/s
    assert r.extra["write %CPU"] == 81
    assert r.extra["rewrite MB/s"] == pytest.approx(117740 * 1024 / 1e6) and r.extra["rewrite %CPU"] == 87
    assert r.extra["read MB/s"] is None and r.extra["read %CPU"] is None  # "+++++": under half a second
    assert r.extra["creates/s"] is None and r.extra["random deletes/s"] is None
    assert r.extra["seconds"] == pytest.approx(17.64 - 9.89)  # the guest script's elapsed line
    assert r.seconds == pytest.approx(7.75)
    assert bonnie.bonnie_version(r.raw) == "2.00a"
    assert [m for m, _ in measured(r)] == ["MB/s", "seconds", "write %CPU", "rewrite MB/s", "rewrite %CPU"]


def test_a_host_run_too_quick_for_bonnie_to_time_stores_only_its_seconds():
    r = bonnie.parse_bonnie("bonnie", fixture("bonnie-host-96m.txt"), seconds=3.4)
    assert math.isnan(r.mbps)
    assert [m for m, _ in measured(r)] == ["seconds"]
    r = bonnie.parse_bonnie("bonnie", fixture("bonnie-host-1g-f.txt"), seconds=7.6)
    assert r.mbps == pytest.approx(362303 * 1024 / 1e6) and r.extra["rewrite MB/s"] == pytest.approx(
        940707 * 1024 / 1e6)
    assert (r.extra["write %CPU"], r.extra["rewrite %CPU"], r.extra["read MB/s"]) == (38, 36, None)


def test_create_and_delete_rates_are_read_from_their_fields():
    # kvm-cache-none's guest (emulated IDE, TCG), quick size: 4 x 1024 files, slow enough for Bonnie++ to time
    r = bonnie.parse_bonnie("bonnie", fixture("bonnie-guest-tcg-ide-96m-n4.txt"))
    assert (r.extra["creates/s"], r.extra["deletes/s"], r.extra["random creates/s"],
            r.extra["random deletes/s"]) == (3943, 3679, 6027, 6229)
    assert r.mbps == pytest.approx(54880 * 1024 / 1e6) and r.extra["rewrite MB/s"] == pytest.approx(
        133628 * 1024 / 1e6)
    assert r.extra["seconds"] == pytest.approx(20.86 - 10.36)
    f = fixture("bonnie-guest-tcg-ide-96m-n4.txt").splitlines()[0]
    assert bonnie.parse_bonnie("bonnie", f).extra["seconds"] is None  # no elapsed line: not stored


def test_output_without_a_csv_line_is_refused_naming_the_test():
    with pytest.raises(CloudboxError, match=r"bonnie\+\+ \(bonnie\) printed no CSV line of format 1\.98: "
                                            r"Writing intelligently\.\.\.Can't write block"):
        bonnie.parse_bonnie("bonnie", "Writing intelligently...Can't write block.\n")
    with pytest.raises(CloudboxError, match=r"a CSV line of 5 fields, not 38 or more"):
        bonnie.parse_bonnie("bonnie", "1.98,2.00a,vm,1,2\n")


def test_bonnie_refuses_many_guests_and_a_disk_too_small():
    RunSpec(profile="virtio-disk", size="quick", storage_tests="bonnie").validate()
    RunSpec(profile="virtio-disk", size="64M", storage_tests="bonnie").validate()
    with pytest.raises(UsageError, match=r"--size '32M' is too small for bonnie .* allowed: a size of at least "
                                         r"64M, or --tests without bonnie"):
        RunSpec(profile="virtio-disk", size="32M", storage_tests="bonnie").validate()
    with pytest.raises(UsageError, match=r"--guests 2 with --tests 'seq-write-64k,bonnie': bonnie runs in one guest "
                                         r"at a time"):
        RunSpec(profile="virtio-file", suite="storage", size="quick", storage_tests="seq-write-64k,bonnie",
                guests=2).validate()


needs_bonnie = pytest.mark.skipif(shutil.which("bonnie++") is None or shutil.which("mke2fs") is None,
                                  reason="needs bonnie++ and mke2fs (Debian bonnie++, e2fsprogs: make deps)")


def mounted(what: str) -> list[str]:
    return [ln for ln in Path("/proc/mounts").read_text().splitlines() if what in ln]


def loops_over(path: Path) -> str:
    return subprocess.run(["losetup", "-j", str(path)], capture_output=True, text=True).stdout


@needs_bonnie
@pytest.mark.root
def test_bare_metal_bonnie_on_the_baselines_file_leaves_nothing_mounted(tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDBOX_RUN_DIR", str(tmp_path / "run"))
    target = tmp_path / "baseline.dat"
    r = runners.HostRunner(cancelled=lambda: False).run(catalogue.TESTS["bonnie"], str(target), 64 * MIB, 0,
                                                        lambda _p: None)
    assert bonnie.bonnie_version(r.raw) == "2.00a" and r.extra["seconds"] > 0
    assert "Delete files in random order...done." in r.raw  # its phases, which its progress was read from
    assert target.stat().st_size == 64 * MIB  # the baseline's file, pre-allocated to the run's size
    assert subprocess.run(["dumpe2fs", "-h", str(target)], capture_output=True, text=True).stdout.count(
        "has_journal")  # ext4, with its journal
    assert list((tmp_path / "run").iterdir()) == []  # the mount point went with the mount
    assert mounted(str(tmp_path / "run")) == [] and loops_over(target) == ""  # this test's own mount only


@needs_bonnie
@pytest.mark.root
def test_a_cancelled_bare_metal_bonnie_is_killed_and_unmounted(tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDBOX_RUN_DIR", str(tmp_path / "run"))
    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) > 1

    target = tmp_path / "baseline.dat"
    with pytest.raises(Aborted, match="cancelled during a bare-metal bonnie\\+\\+ run"):
        runners.HostRunner(cancelled=cancelled).run(catalogue.TESTS["bonnie"], str(target), 1 << 30, 0,
                                                    lambda _p: None)
    assert subprocess.run(["pgrep", "-f", f"bonnie\\+\\+ -d {tmp_path}"], capture_output=True).returncode == 1
    assert list((tmp_path / "run").iterdir()) == []
    assert mounted(str(tmp_path / "run")) == [] and loops_over(target) == ""  # this test's own mount only


def test_a_volume_over_nbd_is_refused():
    with pytest.raises(CloudboxError, match=r"bonnie: Bonnie\+\+ needs a file system on a local disk, not a volume "
                                            r"served over NBD"):
        runners.HostRunner(cancelled=lambda: False).run(catalogue.TESTS["bonnie"], "nbds://10.0.0.1:10809/ebs",
                                                        64 * MIB, 0, lambda _p: None)


def test_a_host_without_bonnie_is_told_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CloudboxError, match=r"bonnie: this host has no bonnie\+\+ or mke2fs; install Debian's "
                                            r"bonnie\+\+ and e2fsprogs"):
        runners.HostRunner(cancelled=lambda: False).run(catalogue.TESTS["bonnie"], str(tmp_path / "b.dat"), 64 * MIB,
                                                        0, lambda _p: None)
    assert not (tmp_path / "b.dat").exists()
