"""Study C's record-size sweep as storage tests: each record size a sequential O_DIRECT write and read, one request
at a time, named alike wherever storage tests are named (catalogue, sets, the run option, compare's titles and
order), and fio really issuing records of that size (a bare-metal run of the sweep on a small file)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cloudbox.core import paths
from cloudbox.core.bench import fio, iozone, runners
from cloudbox.core.errors import Aborted, CloudboxError, UsageError
from cloudbox.core.spec import catalogue
from cloudbox.core.spec.runspec import RunSpec, option
from cloudbox.core.studies import schema

SIZES = ("4k", "16k", "64k", "256k", "1m", "4m", "16m")
SWEEP = [f"rec-{rw}-{bs}" for bs in SIZES for rw in ("write", "read")]


def fio_options(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args[1:] if a.startswith("--") and "=" in a)


def test_each_record_test_is_one_direct_request_at_a_time_of_its_size():
    assert catalogue.RECORD_SIZES == SIZES and list(catalogue.RECORD_TESTS) == SWEEP
    for tid in SWEEP:
        t = catalogue.TESTS[tid]
        rw, bs = tid.split("-")[1:]
        opts = fio_options(fio.fio_args(t, "/dev/vdb", 128 << 20, 5))
        assert opts["name"] == tid and opts["filename"] == "/dev/vdb" and opts["size"] == str(128 << 20)
        assert (opts["rw"], opts["bs"], opts["direct"], opts["iodepth"]) == (rw, bs, "1", "1")
        assert opts["ioengine"] == "psync"  # one pread/pwrite call at a time, as IOzone issues them
        assert "runtime" not in opts  # the whole file at every size, as IOzone
        assert "end_fsync" not in opts  # O_DIRECT: nothing is left in the guest's page cache to flush
        assert t.labels == [] and not t.timed and not t.dd
    # The other direct tests keep libaio; the fill that lays data down for a lone read stays 1 MB direct writes.
    seq = fio_options(fio.fio_args(catalogue.TESTS["seq-write-64k"], "/dev/vdb", 1 << 20, 5))
    assert seq["ioengine"] == "libaio"
    fill = fio_options(fio.fio_args(catalogue.TESTS["rec-read-4k"], "/dev/vdb", 1 << 20, 5, fill=True))
    assert (fill["rw"], fill["bs"], fill["ioengine"], fill["direct"]) == ("write", "1m", "libaio", "1")
    assert catalogue.block_bytes("4k") == 4096 and catalogue.block_bytes("16m") == 16 * 2**20


def test_a_guest_pass_one_request_at_a_time_may_take_as_long_as_its_requests_at_their_slowest():
    two_gib = 2 << 30
    # 524,288 requests of 4 kB at 20 ms each (a hard disk flushing every write): 10,486 s, not the usual hour
    assert runners.guest_timeout(catalogue.TESTS["rec-write-4k"], two_gib) == pytest.approx(524_288 * 0.02)
    assert runners.guest_timeout(catalogue.TESTS["rec-read-16m"], two_gib) == runners.GUEST_TIMEOUT == 3600.0
    assert runners.guest_timeout(catalogue.TESTS["seq-write-64k"], two_gib) == runners.GUEST_TIMEOUT
    assert runners.guest_timeout(catalogue.TESTS["randread-4k-qd1"], two_gib) == runners.GUEST_TIMEOUT  # time-capped


def test_the_records_set_and_full():
    assert catalogue.TEST_SETS["records"] == SWEEP
    assert not runners.needs_fill(catalogue.resolve_tests("records"))  # each size writes before it reads
    assert runners.needs_fill(catalogue.resolve_tests("rec-read-64k"))
    assert not set(SWEEP) & set(catalogue.TEST_SETS["full"])  # full leaves the sweep out
    assert (set(catalogue.TEST_SETS["full"]) | set(SWEEP) | set(catalogue.IOZONE_TESTS)
            | set(catalogue.IOZONE_FILE_TESTS) | {"bonnie", *catalogue.IOZONE_GRIDS}
            | set(catalogue.JOB_TESTS) | set(catalogue.IOZONE_FS_TESTS) | set(catalogue.TRANSFER_2M_TESTS)
            ) == set(catalogue.TESTS)
    # the run option's choices and help come from the same table
    assert [v for _, v in option("storage_tests").offered()] == list(catalogue.TEST_SETS)
    assert "records" in option("storage_tests").help
    assert [t.id for t in catalogue.resolve_tests("rec-write-4k,rec-read-16m")] == ["rec-write-4k", "rec-read-16m"]


def test_a_custom_size_must_hold_the_largest_record():
    RunSpec(profile="virtio-disk", size="16M", storage_tests="records").validate()
    RunSpec(profile="virtio-disk", size="quick", storage_tests="records").validate()
    RunSpec(profile="virtio-disk", size="4M", storage_tests="rec-write-4m").validate()
    RunSpec(profile="virtio-disk", size="4M", suite="network", storage_tests="records").validate()  # no storage
    with pytest.raises(UsageError, match=r"--size '8M' is smaller than one 16m record of rec-write-16m; allowed: "
                                         r"a size of at least 16M, or --tests without rec-write-16m"):
        RunSpec(profile="virtio-disk", size="8M", storage_tests="records").validate()


def test_results_and_compare_name_the_sweep():
    for tid in SWEEP:
        assert catalogue.is_storage_test(tid) and not catalogue.is_network_test(tid)
        assert catalogue.primary_metric(tid, ["MB/s"]) == "MB/s"
    assert catalogue.test_title("rec-write-4k") == (
        "Write: sequential write, 4 kB records, one at a time (fio, as IOzone), O_DIRECT [rec-write-4k]")
    assert catalogue.test_title("rec-read-16m") == (
        "Read: sequential read, 16 MB records, one at a time (fio, as IOzone), O_DIRECT [rec-read-16m]")
    # writes then reads; within each, after the general tests, by record size (not alphabetically: 16k after 4k)
    shuffled = ["rec-read-1m", "seq-read-64k", "rec-write-16m", "rec-write-4k", "rec-read-4k", "rec-write-16k",
                "randwrite-4k-qd32", "rec-write-256k"]
    assert sorted(shuffled, key=catalogue.test_sort_key) == [
        "randwrite-4k-qd32", "rec-write-4k", "rec-write-16k", "rec-write-256k", "rec-write-16m", "seq-read-64k",
        "rec-read-4k", "rec-read-1m"]


@pytest.mark.skipif(shutil.which("fio") is None, reason="needs fio")
def test_fio_issues_records_of_each_size_on_bare_metal(tmp_path):
    size = 16 << 20
    target = str(tmp_path / "file")
    runner = runners.HostRunner(lambda: False)
    for tid in SWEEP:
        t = catalogue.TESTS[tid]
        try:
            res = runner.run(t, target, size, 5, lambda _p: None)
        except Exception as e:  # a file system without O_DIRECT (tmpfs before Linux 6.6)
            pytest.skip(f"fio with O_DIRECT in {tmp_path}: {e}")
        job = json.loads(res.raw)["jobs"][0]
        side = job[t.rw]
        assert job["job options"]["bs"] == t.bs and job["job options"]["direct"] == "1"
        assert side["io_bytes"] == size and side["total_ios"] == size // catalogue.block_bytes(t.bs), tid
        assert res.mbps > 0


# ---------------------------------------------------------------------------------------------- IOzone itself
IOZONE_ROW = """\
              kB  reclen    write  rewrite    read    reread    read     write     read   rewrite      read   fwrite
           16384      64   573107   781606
"""


def test_iozone_tests_run_iozone_direct_with_its_record_and_keep_the_target():
    assert list(catalogue.IOZONE_TESTS) == [f"iozone-{rw}-{bs}" for bs in SIZES for rw in ("write", "read")]
    w = catalogue.TESTS["iozone-write-1m"]
    assert (w.program, w.rw, w.bs, w.dd, w.sync) == ("iozone", "write", "1m", False, True)
    assert iozone.iozone_args(w, "/dev/vdb", 32 << 20) == [
        "iozone", "-i", "0", "-r", "1m", "-s", "32768k", "-I", "-e", "-w", "-f", "/dev/vdb"]
    assert iozone.iozone_args(catalogue.TESTS["iozone-read-16m"], "/dev/vdb", 32 << 20)[1:3] == ["-i", "1"]
    assert catalogue.TEST_SETS["iozone"] == ["iozone-write-64k", "iozone-read-64k", "iozone-write-1m",
                                           "iozone-read-1m", "iozone-write-16m", "iozone-read-16m"]
    assert not set(catalogue.IOZONE_TESTS) & set(catalogue.TEST_SETS["full"])
    assert catalogue.test_title("iozone-read-16m") == (
        "Read: sequential read, 16 MB records (IOzone; re-read stored beside it), O_DIRECT [iozone-read-16m]")
    assert catalogue.is_storage_test("iozone-write-4k")


def test_iozone_row_is_read_as_kib_per_second_with_the_second_pass_beside_it():
    r = iozone.parse_iozone("iozone-write-64k", IOZONE_ROW, "write")
    assert r.mbps == pytest.approx(573107 * 1024 / 1e6)
    assert r.extra == {"re-write MB/s": pytest.approx(781606 * 1024 / 1e6)}
    assert r.seconds == pytest.approx(16384 * 1024 / 1e6 / r.mbps)
    assert iozone.parse_iozone("iozone-read-64k", IOZONE_ROW, "read").extra.keys() == {"re-read MB/s"}
    with pytest.raises(CloudboxError, match=r"iozone \(iozone-read-1m\) printed no result row: Can not open"):
        iozone.parse_iozone("iozone-read-1m", "Can not open temporary file /x for read\n", "read")
    assert iozone.iozone_version("        Version $Revision: 3.489 $\n") == "3.489"


needs_iozone = pytest.mark.skipif(shutil.which("iozone") is None,
                                  reason="needs iozone (Debian iozone3, installed by make deps-test)")


@needs_iozone
def test_iozone_writes_and_reads_a_file_on_bare_metal(tmp_path):
    target = tmp_path / "disk.img"
    host = runners.HostRunner(cancelled=lambda: False)
    w = host.run(catalogue.TESTS["iozone-write-64k"], str(target), 8 << 20, 0, lambda _p: None)
    assert target.stat().st_size == 8 << 20  # -w: IOzone keeps the file it wrote
    assert w.mbps > 0 and w.extra["re-write MB/s"] > 0
    assert "O_DIRECT feature enabled" in w.raw and "Include fsync in write timing" in w.raw
    r = host.run(catalogue.TESTS["iozone-read-64k"], str(target), 8 << 20, 0, lambda _p: None)
    assert r.mbps > 0 and r.extra["re-read MB/s"] > 0
    with pytest.raises(CloudboxError, match=r"iozone-read-64k: IOzone cannot open a volume served over NBD"):
        host.run(catalogue.TESTS["iozone-read-64k"], "nbds://10.0.0.1:10809/ebs", 8 << 20, 0, lambda _p: None)


def test_an_iozone_read_lays_down_iozones_own_data_unless_its_write_pass_is_the_last_write():
    def fills(ids: str) -> list[bool]:
        return iozone.iozone_fills(catalogue.resolve_tests(ids))

    assert fills("iozone-write-1m,iozone-read-1m") == [False, False]
    assert fills("iozone-read-1m,iozone-read-64k") == [True, False]  # the first lays it down for both
    assert fills("iozone-write-16m,dd-write-64k,iozone-read-16m,dd-read-64k") == [False, False, True, False]
    assert fills("iozone-write-1m,seq-read-64k,iozone-read-1m") == [False, False, False]  # reads keep it
    assert fills("seq-write-64k,rec-read-4k,iozone-read-4k") == [False, False, True]
    assert not runners.needs_fill(catalogue.resolve_tests("iozone-read-1m,seq-read-64k"))  # its lay-down fills


@needs_iozone
def test_after_another_write_iozones_read_needs_its_data_laid_down_again(tmp_path):
    """IOzone's read pass checks the data against its own pattern: after dd's zeros it fails, naming the error,
    and the untimed lay-down pass makes it read."""
    target = str(tmp_path / "disk.img")
    host = runners.HostRunner(cancelled=lambda: False)
    size = 8 << 20
    host.run(catalogue.TESTS["iozone-write-1m"], target, size, 0, lambda _p: None)
    host.run(catalogue.TESTS["dd-write-64k"], target, size, 0, lambda _p: None)
    read = catalogue.TESTS["iozone-read-1m"]
    with pytest.raises(CloudboxError, match=r"(?s)bare-metal iozone \(iozone-read-1m\) exited .*Error in file"):
        host.run(read, target, size, 0, lambda _p: None)
    host.fill_iozone(read, target, size)
    assert host.run(read, target, size, 0, lambda _p: None).mbps > 0


@needs_iozone
def test_a_cancelled_bare_metal_iozone_is_killed(tmp_path):
    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) > 1

    host = runners.HostRunner(cancelled=cancelled)
    with pytest.raises(Aborted, match="cancelled during a bare-metal iozone run"):
        # 4 kB records over 1 GiB, synchronous: far longer than the half second before the cancel is seen
        host.run(catalogue.TESTS["iozone-write-4k"], str(tmp_path / "big.img"), 1 << 30, 0, lambda _p: None)
    assert subprocess.run(["pgrep", "-f", f"iozone .*{tmp_path}"], capture_output=True).returncode == 1


def test_iozones_file_size_sweep_runs_automatic_mode_from_one_record_up_to_the_runs_size():
    t = catalogue.TESTS["iozone-files-16m"]
    assert catalogue.TEST_SETS["iozone-files"] == ["iozone-files-16m"]
    assert list(catalogue.IOZONE_FILE_TESTS) == [f"iozone-files-{bs}" for bs in SIZES]
    assert not set(catalogue.IOZONE_FILE_TESTS) & set(catalogue.TEST_SETS["full"])
    assert (t.program, t.writes) == ("iozone", True)
    assert iozone.iozone_files_args(t, "/dev/vda", 128 << 20) == [
        "iozone", "-a", "-i", "0", "-i", "1", "-r", "16m", "-n", "16384k", "-g", "131072k", "-I", "-e", "-w",
        "-f", "/dev/vda"]
    # files of twice the run's size in all, each written twice: four times a one-file pass's requests
    assert runners.guest_timeout(catalogue.TESTS["iozone-files-4k"], 2 << 30) == pytest.approx(4 * 524_288 * 0.02)
    assert catalogue.test_title("iozone-files-1m").startswith("IOzone's file-size sweep, 1 MB records")
    assert catalogue.is_storage_test("iozone-files-16m")


def test_the_sweeps_rows_are_read_per_file_size():
    """A real `iozone -a -i 0 -i 1 -r 16m -n 16m -g 64m -I -e -w` on this host (tests/data)."""
    text = (Path(__file__).parent / "data" / "iozone-auto-host-16m.txt").read_text()
    r = iozone.parse_iozone_files("iozone-files-16m", text)
    assert r.mbps == pytest.approx(1446034 * 1024 / 1e6)  # the largest file's write
    assert iozone.iozone_file_sizes(r.extra) == [16384, 32768, 65536]
    assert r.extra["re-read MB/s, 16 MiB file"] == pytest.approx(1190879 * 1024 / 1e6)
    assert r.extra["re-write MB/s, 64 MiB file"] == pytest.approx(2140230 * 1024 / 1e6)
    assert len(r.extra) == 12 and iozone.iozone_file_metric("read", 512) == "read MB/s, 512 KiB file"
    with pytest.raises(CloudboxError, match=r"iozone \(iozone-files-16m\) printed no automatic-mode rows"):
        iozone.parse_iozone_files("iozone-files-16m", "Error writing block 0\n")


@needs_iozone
def test_the_sweep_on_bare_metal(tmp_path):
    target = tmp_path / "disk.img"
    r = runners.HostRunner(cancelled=lambda: False).run(catalogue.TESTS["iozone-files-16m"], str(target), 64 << 20, 0,
                                                        lambda _p: None)
    assert iozone.iozone_file_sizes(r.extra) == [16384, 32768, 65536] and r.mbps > 0
    assert all(v > 0 for v in r.extra.values()) and "Auto Mode" in r.raw


GRID_RECORDS_KIB = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def test_the_grid_runs_automatic_mode_over_every_record_and_every_file_size():
    t = catalogue.TESTS["iozone-grid"]
    assert (t.program, t.writes, t.bs) == ("iozone", True, "16m")  # the run's size must hold its largest record
    assert "iozone-grid" not in catalogue.TEST_SETS["full"] and catalogue.is_storage_test("iozone-grid")
    assert not runners.needs_fill([t])
    assert iozone.iozone_fills([t, catalogue.TESTS["iozone-read-16m"]]) == [False, True]
    assert [r >> 10 for r in iozone.iozone_grid_records(t)] == GRID_RECORDS_KIB
    assert iozone.iozone_files_args(t, "/dev/sda", 128 << 20) == [
        "iozone", "-a", "-i", "0", "-i", "1", "-y", "64k", "-q", "16m", "-n", "64k", "-g", "131072k", "-I", "-e", "-w",
        "-f", "/dev/sda"]
    assert catalogue.test_title("iozone-grid").startswith("IOzone's automatic mode over record and file sizes")
    # quick size: the hour (23 s measured in a TCG guest); study size: each record's file sweep, its writes' 4 x 2 GiB
    # in requests of a flush each (5,233 s over the nine records) and at 10 MB/s (859 s each)
    assert runners.guest_timeout(t, 128 << 20) == runners.GUEST_TIMEOUT
    assert runners.guest_timeout(t, 2 << 30) == pytest.approx(2621.44 * (2 - 2**-8) + 9 * 4 * 2**31 / 10e6)
    with pytest.raises(UsageError, match=r"smaller than one 16m record of iozone-grid"):
        RunSpec(profile="virtio-disk", suite="storage", size="8M", storage_tests="iozone-grid").validate()


def test_the_4k_grid_starts_at_iozones_own_smallest_record_and_waits_for_it():
    t = catalogue.TESTS["iozone-grid-4k"]
    assert (t.program, t.bs, t.min_bs) == ("iozone", "16m", "4k")
    assert [r >> 10 for r in iozone.iozone_grid_records(t)] == [4, 8, 16, 32, *GRID_RECORDS_KIB]
    assert iozone.iozone_files_args(t, "/dev/vdb", 128 << 20)[6:12] == ["-y", "4k", "-q", "16m", "-n", "4k"]
    assert all("iozone-grid-4k" not in v for v in catalogue.TEST_SETS.values())  # by name only
    assert catalogue.test_title("iozone-grid-4k").startswith(
        "IOzone's automatic mode over record and file sizes, 4 kB to 16 MB records")
    assert "64 kB to 16 MB records" in catalogue.test_title("iozone-grid")
    # quick size: 4 x 128 MiB in 4 kB requests of 20 ms each, halving per record, and each record's bytes at 10 MB/s
    want = 0.02 * 4 * (128 << 20) / 4096 * (2 - 2**-12) + 13 * 4 * (128 << 20) / 10e6
    assert runners.guest_timeout(t, 128 << 20) == pytest.approx(want) and want > runners.GUEST_TIMEOUT
    assert catalogue.is_storage_test("iozone-grid-4k") and schema.is_iozone_sweep("iozone-grid-4k")


def test_the_grids_metrics_name_file_and_record_size():
    assert iozone.iozone_file_metric("write", 131072, 16384) == "write MB/s, 128 MiB file, 16 MiB records"
    assert iozone.iozone_file_metric("re-read", 512, 64) == "re-read MB/s, 512 KiB file, 64 KiB records"
    assert iozone.iozone_file_metric("read", 16384) == "read MB/s, 16 MiB file"  # a file sweep's, as before
    mixed = {"MB/s": 1.0, "write MB/s, 16 MiB file": 1.0, "read MB/s, 32 MiB file": 1.0,
             "write MB/s, 64 KiB file, 64 KiB records": 1.0, "write MB/s, 1 MiB file, 512 KiB records": 1.0,
             "write MB/s, 1 MiB file, 64 KiB records": 1.0, "write MB/s, 1 MiB filez": 1.0}
    assert iozone.iozone_sweep_cells(mixed) == [(64, 64), (1024, 64), (1024, 512), (16384, None)]
    assert iozone.iozone_file_sizes(mixed) == [64, 1024, 16384]


def test_the_grids_rows_are_read_per_file_and_record_size():
    """A real `iozone -a -i 0 -i 1 -y 64k -q 16m -n 64k -g 131072k -I -e -w` on this host (tests/data)."""
    text = (Path(__file__).parent / "data" / "iozone-grid-host-128m.txt").read_text()
    r = iozone.parse_iozone_files("iozone-grid", text, grid=True)
    cells = iozone.iozone_sweep_cells(r.extra)
    # files of 64 KiB to 128 MiB; IOzone takes each record up to the file's size: 1 + 2 + ... + 8, then 9 per file
    assert iozone.iozone_file_sizes(r.extra) == [64 << i for i in range(12)]
    assert len(cells) == 36 + 4 * 9 and len(r.extra) == 4 * len(cells) and all(rec <= kib for kib, rec in cells)
    assert sorted({rec for _, rec in cells}) == GRID_RECORDS_KIB
    assert r.mbps == pytest.approx(1252157 * 1024 / 1e6)  # the largest file's write with the largest records
    assert r.extra["write MB/s, 128 MiB file, 16 MiB records"] == pytest.approx(r.mbps)
    assert r.extra["write MB/s, 64 KiB file, 64 KiB records"] == pytest.approx(320021 * 1024 / 1e6)
    assert r.extra["re-read MB/s, 16 MiB file, 64 KiB records"] == pytest.approx(923775 * 1024 / 1e6)
    assert r.extra["re-write MB/s, 128 MiB file, 1 MiB records"] == pytest.approx(2719506 * 1024 / 1e6)
    assert r.seconds == pytest.approx(128 * 2**20 / (r.mbps * 1e6))


@needs_iozone
def test_the_grid_on_bare_metal(tmp_path):
    target = tmp_path / "disk.img"
    r = runners.HostRunner(cancelled=lambda: False).run(catalogue.TESTS["iozone-grid"], str(target), 16 << 20, 0,
                                                        lambda _p: None)
    cells = iozone.iozone_sweep_cells(r.extra)
    assert len(cells) == sum(range(1, 10)) and cells[-1] == (16384, 16384)  # files 64 KiB to 16 MiB
    assert r.mbps == r.extra["write MB/s, 16 MiB file, 16 MiB records"] and all(v > 0 for v in r.extra.values())
    assert "-y 64k -q 16m -n 64k -g 16384k" in r.raw


# ------------------------------------------------------------------------------------- IOzone on ext3 (study B)
def test_iozone_on_ext3_is_study_bs_way_one_pass_per_test_through_the_page_cache():
    w, r = (catalogue.TESTS[t] for t in catalogue.IOZONE_FS_TESTS)
    assert (w.tool, w.bs, w.direct, w.makes_fs, w.program, w.labels) == ("iozone-fs", "16m", False, True, "iozone",
                                                                          ["buffered"])
    assert catalogue.TEST_SETS["iozone-fs"] == ["iozone-fs-write-16m", "iozone-fs-read-16m"]
    assert not set(catalogue.IOZONE_FS_TESTS) & set(catalogue.TEST_SETS["full"])  # it makes a file system
    # the file: the disk less a sixteenth, at least 32 MiB, in 16 MiB records: 3840 MiB of 4 GiB, 96 of 128 MiB
    assert [iozone.iozone_fs_file(n << 20) // (1 << 20) for n in (4096, 2048, 128, 64)] == [3840, 1920, 96, 32]
    assert iozone.iozone_fs_args(w, "/mnt/x", 128 << 20) == [
        "iozone", "-i", "0", "-r", "16m", "-s", "98304k", "-e", "-w", "-f", "/mnt/x/iozone.tmp"]  # no -I
    assert iozone.iozone_fs_args(r, "/mnt/x", 128 << 20)[1:3] == ["-i", "1"]
    script = iozone.iozone_fs_guest_script(w, "/dev/vdb", 128 << 20)
    assert ("/usr/sbin/mke2fs -t ext3 -F -q -b 4096 -T largefile -m 0 -E lazy_itable_init=0,lazy_journal_init=0 "
            "/dev/vdb || exit 4; ") in script
    assert "mount -t ext3 /dev/vdb /mnt/cloudbox-iozone || exit 5; iozone -i 0 " in script
    assert script.endswith("; rc=$?; umount /mnt/cloudbox-iozone || rc=6; exit $rc")
    assert "mke2fs" not in iozone.iozone_fs_guest_script(r, "/dev/vdb", 128 << 20)  # the read mounts the write's
    assert catalogue.test_title("iozone-fs-read-16m") == (
        "Read: sequential read, 16 MB records, IOzone on a file in ext3 made on the disk, through the page cache "
        "(re-read stored beside it) [iozone-fs-read-16m]")
    # the read finds the write's file system unless another write came between; its lay-down is that write
    fills = [iozone.iozone_fills(catalogue.resolve_tests(ids)) for ids in (
        "iozone-fs-write-16m,iozone-fs-read-16m", "iozone-fs-read-16m", "iozone-fs-write-16m,dd-write-64k,"
        "iozone-fs-read-16m", "iozone-write-16m,iozone-fs-read-16m,iozone-read-16m")]
    assert fills == [[False, False], [True], [False, False, True], [False, True, True]]
    assert iozone.iozone_writer(r).id == "iozone-fs-write-16m"
    assert not runners.needs_fill(catalogue.resolve_tests("iozone-fs-read-16m"))


@needs_iozone
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mounts the baseline's file through a loop device")
def test_iozone_on_ext3_on_bare_metal_writes_then_mounts_the_file_system_again_to_read(tmp_path):
    target = str(tmp_path / "disk.img")
    host = runners.HostRunner(cancelled=lambda: False)
    size = 64 << 20
    w = host.run(catalogue.TESTS["iozone-fs-write-16m"], target, size, 0, lambda _p: None)
    assert w.mbps > 0 and w.extra["re-write MB/s"] > 0 and "O_DIRECT" not in w.raw
    r = host.run(catalogue.TESTS["iozone-fs-read-16m"], target, size, 0, lambda _p: None)
    assert r.mbps > 0 and r.extra["re-read MB/s"] > 0
    assert list(paths.run_dir().glob("cloudbox-iozone-*")) == []  # its mount point went with it
    with pytest.raises(CloudboxError, match=r"iozone-fs-read-16m: IOzone needs a file system on a local disk, not a "
                                            r"volume served over NBD"):
        host.run(catalogue.TESTS["iozone-fs-read-16m"], "nbds://10.0.0.1:10809/ebs", size, 0, lambda _p: None)


def test_study_ds_transfers_are_two_megabytes_one_at_a_time_direct_and_buffered():
    tests = catalogue.resolve_tests("2m")
    assert [(t.id, t.bs, t.iodepth, t.direct) for t in tests] == [
        ("seq-write-2m", "2m", 1, True), ("seq-read-2m", "2m", 1, True), ("seq-write-2m-buffered", "2m", 1, False),
        ("seq-read-2m-buffered", "2m", 1, False)]
    assert catalogue.test_title("seq-write-2m-buffered") == (
        "Write: sequential write, 2 MB requests, one at a time (fio, as IOR's transfers), through the page cache "
        "[seq-write-2m-buffered]")
    assert sorted(["seq-read-2m", "seq-write-1m", "seq-write-2m", "seq-write-2m-buffered"],
                  key=catalogue.test_sort_key) == ["seq-write-1m", "seq-write-2m", "seq-write-2m-buffered",
                                                   "seq-read-2m"]
    assert "--bs=2m" in fio.fio_args(tests[0], "/dev/vdb", 64 << 20, 0)
