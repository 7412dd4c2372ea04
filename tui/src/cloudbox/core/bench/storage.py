"""Storage tests: fio jobs (and literal dd, IOzone and Bonnie++ modes) run identically in the guest and on bare metal.

The same job runs twice: on the host against the backing device/file system (the baseline) and in the
guest against its benchmark disk. Writes come before reads so reads never hit sparse holes; page
caches are dropped (host and guest) before every read so numbers are cold-cache unless labelled.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import procs
from ..disks.hostraid import mdstat_array
from ..disks.mounts import umount
from ..errors import Aborted, CloudboxError, DiskStalled, GuestError, GuestTimeout
from ..spec.catalogue import IOZONE_GRID, IOZONE_SWEEPS, IOZONE_TOOLS, MPI_TOOL, TESTS, StorageTest, block_bytes

MB = 1_000_000
GUEST_TIMEOUT = 3600.0  # seconds a guest's test may run before it counts as hung
SLOW_REQUEST_S = 0.02  # one request waiting for a hard disk's flush: the slowest a one-at-a-time pass may go
SLOW_STREAM = 10 * 1_000_000  # bytes/s: under a sixth of a hard disk's ~100 MB/s, study B's write-through KVM
# Requests in flight on a guest's disk and none completed for this long: the disk has stopped (the kernel's own
# hung-task warning waits as long), not a slow one; the test is killed instead of waiting out guest_timeout.
DISK_STALL_S = 120.0
DISK_WATCH_EVERY_S = 5.0  # how often the guest's disk counters are read while a test runs


def guest_timeout(t: StorageTest, size: int) -> float:
    """How long the guest's run of `t` over `size` bytes may take: an hour, or for a test issuing one request at a time
    over the whole file (the record sweep) as long as its requests take at the slowest (SLOW_REQUEST_S each)."""
    if t.tool == IOZONE_GRID:
        # a file sweep per record size, one after the other: their writes' requests, and their bytes at SLOW_STREAM
        return max(GUEST_TIMEOUT, sum(4 * size / r * SLOW_REQUEST_S + 4 * size / SLOW_STREAM
                                      for r in iozone_grid_records(t)))
    if t.sync:
        # IOzone's file sweep writes files of twice `size` in all, each twice
        passes = 4 if t.tool == "iozone-files" else 1
        return max(GUEST_TIMEOUT, passes * size / block_bytes(t.bs) * SLOW_REQUEST_S)
    return GUEST_TIMEOUT


def needs_fill(tests: list[StorageTest]) -> bool:
    """True when a read test comes before any full sequential write has laid down data (an IOzone read lays its own,
    see iozone_fills)."""
    for t in tests:
        if t.tool in ("bonnie", MPI_TOOL):  # Bonnie++ writes three quarters of the disk; MPI jobs files of their own
            continue
        if t.rw == "write" or t.tool == "iozone":
            return False
        if "read" in t.rw:
            return True
    return False


def iozone_fills(tests: list[StorageTest]) -> list[bool]:
    """For each test, whether IOzone must first write the file untimed: its read pass checks that the data is the
    pattern its own write pass left, which any other write in between (dd, fio) replaces."""
    out, ours = [], False
    for t in tests:
        lay = t.tool == "iozone" and not t.writes and not ours
        out.append(lay)
        if t.writes:
            ours = t.tool == "iozone"
        elif lay:
            ours = True
    return out


@dataclass
class FioResult:
    test: str
    mbps: float
    iops: float
    lat_us: float
    seconds: float
    raw: str
    extra: dict = field(default_factory=dict)
    started_uptime: float | None = None  # a guest test held at a barrier: the guest's uptime when it was let go


START_STAMP = "/tmp/cloudbox-start"


def barrier_script(start_uptime: float) -> str:
    """Shell that waits until the guest's uptime (/proc/uptime, 10 ms steps) reaches `start_uptime` seconds, writes
    the uptime it left at to START_STAMP, and goes on to what follows it (N guests' tests started at one instant).
    It sleeps until half a second before, then spins on shell builtins: under emulation a `sleep` process costs
    tens of milliseconds to start, more than the clock's step."""
    cs = int(-(-start_uptime * 100 // 1))
    return (f"t={cs}; while :; do read u _ < /proc/uptime; u=${{u%.*}}${{u#*.}}; [ \"$u\" -ge \"$t\" ] && break; "
            "[ $((t - u)) -gt 50 ] && sleep 0.2; done; "
            f"echo \"$u\" > {START_STAMP}; ")


def parse_start_stamp(text: str) -> float:
    """START_STAMP's centiseconds of uptime -> seconds."""
    try:
        return int(text.strip()) / 100
    except ValueError:
        raise CloudboxError(f"the guest's start stamp {START_STAMP} holds {text.strip()[:40]!r}, not centiseconds "
                            "of uptime") from None


def is_nbd_uri(target: str) -> bool:
    """A volume reached through fio's nbd engine (libnbd, user space) rather than a file or device."""
    return target.startswith(("nbd://", "nbds://", "nbd+unix://"))


def nbd_measures(t: StorageTest) -> str:
    """Why fio's nbd engine cannot run `t` on a volume ('' when it can: fio's tests, and dd's pattern)."""
    if t.tool in IOZONE_TOOLS or t.tool == "bonnie":
        return (f"{'IOzone' if t.tool in IOZONE_TOOLS else 'Bonnie++'} needs a file or a file system on a local disk, "
                "and the host domain reaches this volume through fio's nbd engine")
    return ""


def fio_args(t: StorageTest, target: str, size: int, runtime: int, *, fill: bool = False) -> list[str]:
    rw = "write" if fill else t.rw
    if is_nbd_uri(target):
        # No page cache between fio and the server: every request goes over the wire, as with O_DIRECT.
        where = ["--ioengine=nbd", f"--uri={target}"]
    else:
        where = [f"--filename={target}", f"--direct={1 if (fill or t.direct) else 0}",
                 f"--ioengine={'libaio' if fill else t.engine}"]
    args = [
        "fio", f"--name={'fill' if fill else t.id}", *where[:1], f"--size={size}",
        f"--rw={rw}", f"--bs={'1m' if fill else t.bs}", f"--iodepth={1 if fill else t.iodepth}",
        *where[1:],
        "--output-format=json", "--eta=always", "--eta-newline=1", "--eta-interval=1",
        "--group_reporting=1", "--randrepeat=0", "--norandommap=1",
    ]
    if not fill and t.writes and not t.direct:
        args.append("--end_fsync=1")  # like dd conv=fsync: the data must reach the disk
    if not fill and t.timed:
        args += [f"--runtime={runtime}"]
    return args


def dd_args(t: StorageTest, target: str, size: int) -> list[str]:
    count = max(1, size // (64 * 1024))
    if t.writes:
        # conv=fsync (not fdatasync): the guest's busybox dd knows only fsync; both flush the data to disk.
        return ["dd", "if=/dev/zero", f"of={target}", "bs=64k", f"count={count}", "conv=fsync"]
    return ["dd", f"if={target}", "of=/dev/null", "bs=64k", f"count={count}"]


_ETA = re.compile(
    r"\[(?P<pct>[\d.]+|-\.-)%\]"
    r"\[(?:[rw]=(?P<bw1>[\d.]+)(?P<u1>[KMG]i?B)/s)?(?:,?\s*[rw]=(?P<bw2>[\d.]+)(?P<u2>[KMG]i?B)/s)?\]"
    r".*?\[eta (?P<eta>[^\]]+)\]")
_UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1000, "MB": MB, "GB": 1000**3}


def parse_eta(line: str) -> dict | None:
    """fio's status line -> {'pct': 45.0, 'mbps': 120.3, 'eta': '00m:05s'} (None if not a status line)."""
    m = _ETA.search(line)
    if not m:
        return None
    mbps = 0.0
    for bw, unit in ((m["bw1"], m["u1"]), (m["bw2"], m["u2"])):
        if bw:
            mbps += float(bw) * _UNITS.get(unit, 1) / MB
    pct = 0.0 if m["pct"] == "-.-" else float(m["pct"])
    return {"pct": pct, "mbps": round(mbps, 2), "eta": m["eta"]}


def parse_fio(test_id: str, text: str) -> FioResult:
    start = text.find("{")
    if start < 0:
        raise CloudboxError(f"fio ({test_id}) printed no JSON: {text.strip()[:300]}")
    try:
        data = json.loads(text[start:])
    except ValueError as e:
        raise CloudboxError(f"fio ({test_id}) printed invalid JSON: {e}") from e
    return _job_result(test_id, data["jobs"][0], text[start:])


def _job_result(test_id: str, job: dict, raw: str, who: str = "") -> FioResult:
    """One job's (or one fio server's) figures from fio's JSON."""
    if job.get("error"):
        raise CloudboxError(f"fio ({test_id}{who}) failed with error {job['error']}")
    mbps = iops = lat = 0.0
    secs = 0.0
    for d in ("read", "write"):
        side = job.get(d, {})
        if side.get("io_bytes", 0) > 0:
            mbps += side["bw_bytes"] / MB
            iops += side["iops"]
            lat = max(lat, side.get("clat_ns", {}).get("mean", 0.0) / 1000)
            secs = max(secs, side.get("runtime", 0) / 1000)
    return FioResult(test_id, mbps, iops, lat, secs, raw)


FIO_CLIENT_TOTAL = "All clients"  # fio --client's own aggregate over its servers, in client_stats


def fio_job_file(t: StorageTest, target: str, size: int, runtime: int) -> str:
    """`t` as a fio job file (what fio --client sends a server): fio_args's job options, one per line."""
    skip = ("--name=", "--output-format=", "--eta")
    lines = [f"[{t.id}]"] + [a[2:] for a in fio_args(t, target, size, runtime)[1:] if not a.startswith(skip)]
    return "\n".join(lines) + "\n"


def parse_fio_clients(test_id: str, text: str, servers: list[str]) -> tuple[FioResult, list[FioResult]]:
    """fio --client's JSON over `servers` (their addresses, in order): fio's aggregate ("All clients"), and each
    server's own figures in the servers' order. Each server must have reported once."""
    start = 0 if text.startswith("{") else text.find("\n{") + 1  # after the servers' own lines; 0 when none
    try:
        data = json.loads(text[start:]) if text[start:start + 1] == "{" else None
    except ValueError as e:
        raise CloudboxError(f"fio --client ({test_id}) printed invalid JSON: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("client_stats"), list):
        raise CloudboxError(f"fio --client ({test_id}) printed no client_stats: {text.strip()[-300:]}")
    stats = data["client_stats"]
    raw = text[start:]
    each = {str(c.get("hostname")): c for c in stats if c.get("jobname") != FIO_CLIENT_TOTAL}
    if sorted(each) != sorted(servers):
        raise CloudboxError(f"fio --client ({test_id}) reported servers {', '.join(sorted(each)) or 'none'}; "
                            f"expected {', '.join(servers)}")
    results = [_job_result(test_id, each[ip], "", f" on {ip}") for ip in servers]
    total = next((c for c in stats if c.get("jobname") == FIO_CLIENT_TOTAL), None)
    if total is not None:
        return _job_result(test_id, total, raw), results
    # fio left its aggregate out (one run in three here, two TCG guests): the same sum, all bytes over the longest job
    sides = [c.get(d, {}) for c in each.values() for d in ("read", "write")]
    secs = max(x.get("runtime", 0) for x in sides) / 1000
    done = sum(x.get("io_bytes", 0) for x in sides)
    ios = sum(x.get("total_ios", 0) for x in sides)
    return (FioResult(test_id, done / MB / secs if secs else 0.0, ios / secs if secs else 0.0,
                      max(r.lat_us for r in results), secs, raw), results)


def iozone_args(t: StorageTest, target: str, size: int) -> list[str]:
    """IOzone over `target` (a device or a file): -w keeps it (IOzone unlinks its file otherwise), -I O_DIRECT,
    -e counts the closing fsync in the write's time."""
    return ["iozone", "-i", "0" if t.writes else "1", "-r", t.bs, "-s", f"{max(1, size // 1024)}k", "-I", "-e", "-w",
            "-f", target]


def iozone_grid_records(t: StorageTest) -> list[int]:
    """The grid's record sizes in bytes: its smallest (min_bs) doubling up to `t`'s, as IOzone's -a steps them."""
    lo = block_bytes(t.min_bs or t.bs)
    return [lo << i for i in range((block_bytes(t.bs) // lo).bit_length())]


def iozone_files_args(t: StorageTest, target: str, size: int) -> list[str]:
    """IOzone's automatic mode (-a) over `target`: write, re-write, read and re-read (-i 0 -i 1) with `t`'s records
    (the grid: every record from its min_bs up to `t`'s, -y/-q), for files from the smallest record (-n)
    doubling up to `size` (-g); O_DIRECT, the closing fsync timed, as iozone_args."""
    grid = t.tool == IOZONE_GRID
    smallest = (t.min_bs or t.bs) if grid else t.bs
    return ["iozone", "-a", "-i", "0", "-i", "1", *(["-y", smallest, "-q", t.bs] if grid else ["-r", t.bs]),
            "-n", f"{block_bytes(smallest) // 1024}k", "-g", f"{max(1, size // 1024)}k", "-I", "-e", "-w", "-f", target]


_IOZONE_AUTO_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", re.M)
IOZONE_FILE_PASSES = ("write", "re-write", "read", "re-read")


def kib_text(kib: int) -> str:
    """A power-of-two size in KiB as IOzone's sweeps are labelled: "512 KiB", "16 MiB"."""
    return f"{kib // 1024} MiB" if kib >= 1024 else f"{kib} KiB"


def iozone_file_metric(passname: str, kib: int, record_kib: int | None = None) -> str:
    """The stored metric of one pass over one file size: "write MB/s, 16 MiB file"; a grid's names its records too:
    "write MB/s, 128 MiB file, 64 KiB records"."""
    return f"{passname} MB/s, {kib_text(kib)} file" + (f", {kib_text(record_kib)} records" if record_kib else "")


def parse_iozone_files(test_id: str, text: str, *, grid: bool = False) -> FioResult:
    """IOzone's automatic-mode rows "kB reclen write rewrite read reread" (kB/s), one per file size and record size:
    the write MB/s of the largest file (a grid's: with its largest records) as the result, every pass of every row in
    `extra` (iozone_file_metric, naming the records when `grid`)."""
    rows = [tuple(int(x) for x in m.groups()) for m in _IOZONE_AUTO_ROW.finditer(text)]
    if not rows:
        raise CloudboxError(f"iozone ({test_id}) printed no automatic-mode rows: {text.strip()[-300:]}")
    extra: dict[str, float | None] = {}
    for kib, rec, *passes in rows:
        for name, kbs in zip(IOZONE_FILE_PASSES, passes, strict=True):
            extra[iozone_file_metric(name, kib, rec if grid else None)] = kbs * 1024 / MB
    big = max(rows)
    mbps = big[2] * 1024 / MB
    return FioResult(test_id, mbps, 0.0, 0.0, big[0] * 1024 / MB / mbps if mbps else 0.0, text, extra)


_SWEEP_METRIC = re.compile(r"write MB/s, (\d+) (MiB|KiB) file(?:, (\d+) (MiB|KiB) records)?")


def iozone_sweep_cells(extra: dict) -> list[tuple[int, int | None]]:
    """The (file KiB, record KiB) a sweep's stored metrics cover, in order: a file sweep's records are None."""
    out = set()
    for k in extra:
        m = _SWEEP_METRIC.fullmatch(k)
        if m:
            out.add((int(m[1]) * (1024 if m[2] == "MiB" else 1),
                     int(m[3]) * (1024 if m[4] == "MiB" else 1) if m[3] else None))
    return sorted(out, key=lambda c: (c[0], c[1] or 0))


def iozone_file_sizes(extra: dict) -> list[int]:
    """The file sizes (KiB) a sweep's stored metrics cover, smallest first."""
    return sorted({kib for kib, _ in iozone_sweep_cells(extra)})


def _iozone_writer(t: StorageTest) -> StorageTest:
    return TESTS[f"iozone-write-{t.bs}"]


_IOZONE_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", re.M)
RETEST_METRIC = {"write": "re-write MB/s", "read": "re-read MB/s"}


def parse_iozone(test_id: str, text: str, rw: str) -> FioResult:
    """IOzone's result row "kB reclen first second" (kB/s; write and re-write, or read and re-read): MB/s of the first
    pass, the second in `extra` under RETEST_METRIC."""
    m = _IOZONE_ROW.search(text)
    if not m:
        raise CloudboxError(f"iozone ({test_id}) printed no result row: {text.strip()[-300:]}")
    kib, first, second = int(m[1]), int(m[3]), int(m[4])
    mbps = first * 1024 / MB
    return FioResult(test_id, mbps, 0.0, 0.0, kib * 1024 / MB / mbps if mbps else 0.0, text,
                     {RETEST_METRIC[rw]: second * 1024 / MB})


def iozone_version(text: str) -> str:
    """"3.489" from `iozone -v`'s "Version $Revision: 3.489 $" line, "" when not there."""
    m = re.search(r"Version \$Revision: ([\d.]+)", text)
    return m[1] if m else ""


# Bonnie++ (study B) runs on a file system it is given: ext4 made with e2fsprogs' mke2fs on the benchmark disk, the same
# command in the guest and on bare metal. The inode tables and journal are written at once (no lazy init), so no
# kernel thread writes them behind the measurement; no blocks are reserved for root.
MKFS_EXT4 = ("mke2fs", "-t", "ext4", "-F", "-q", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0")
# The guest's shell runs its busybox applets before $PATH, and busybox has an ext2-only mke2fs of its own.
GUEST_MKE2FS = "/usr/sbin/mke2fs"
GUEST_BONNIE_DIR = "/mnt/cloudbox-bonnie"
MIB = 1024**2


def bonnie_file_mib(size: int) -> int:
    """Bonnie++'s file for a disk of `size` bytes: three quarters of it (the rest holds ext4's inode tables and
    journal), in whole MiB."""
    return max(8, size * 3 // 4 // MIB)


def bonnie_files(size: int) -> int:
    """Bonnie++'s -n (files to create and delete, in 1024s): one per 32 MiB of disk, at most its default 16."""
    return min(16, max(1, size // (32 * MIB)))


def bonnie_args(directory: str, size: int) -> list[str]:
    """Bonnie++ in `directory`: -f skips the per-character passes (block I/O only), -r half the file, as Bonnie++
    requires a file twice the RAM it is told, -q prints the CSV line alone on stdout."""
    mib = bonnie_file_mib(size)
    return ["bonnie++", "-d", directory, "-s", f"{mib}m", "-r", str(mib // 2), "-n", str(bonnie_files(size)), "-f",
            "-u", "root", "-q"]


def bonnie_guest_script(device: str, size: int) -> str:
    """The guest's run: ext4 (its driver and crc32c loaded on demand) on `device`, mounted, Bonnie++, unmounted."""
    q = shlex.quote
    mkfs = " ".join(q(a) for a in (GUEST_MKE2FS, *MKFS_EXT4[1:], device))
    return (f"modprobe crc32c_generic 2>/dev/null; modprobe ext4 || exit 3; {mkfs} || exit 4; "
            f"mkdir -p {GUEST_BONNIE_DIR} && mount -t ext4 {q(device)} {GUEST_BONNIE_DIR} || exit 5; "
            f"s=$(cat /proc/uptime); {' '.join(q(a) for a in bonnie_args(GUEST_BONNIE_DIR, size))}; rc=$?; "
            'e=$(cat /proc/uptime); echo "cloudbox-elapsed ${s%% *} ${e%% *}" >&2; '
            f"umount {GUEST_BONNIE_DIR} || rc=6; exit $rc")


# Bonnie++ 2.00a's CSV line (format 1.98): the field of each figure kept, and of its %CPU. Throughput is in KiB/s.
BONNIE_CSV_VERSION = "1.98"
_BONNIE_THROUGHPUT = {"MB/s": (11, 12), "rewrite MB/s": (13, 14), "read MB/s": (17, 18)}
_BONNIE_CPU = {"MB/s": "write %CPU", "rewrite MB/s": "rewrite %CPU", "read MB/s": "read %CPU"}
_BONNIE_RATES = {"creates/s": 26, "deletes/s": 30, "random creates/s": 32, "random deletes/s": 36}
BONNIE_METRICS = ("MB/s", "seconds", "write %CPU", "rewrite MB/s", "rewrite %CPU", "read MB/s", "read %CPU",
                  *_BONNIE_RATES)


def parse_bonnie(test_id: str, text: str, seconds: float | None = None) -> FioResult:
    """Bonnie++'s CSV line: block write MB/s as the result; in `extra` the seconds its whole run took (`seconds`, else
    the guest script's elapsed line), rewrite and read MB/s, each pass's %CPU and the file creations and deletions per
    second (sequential and random). A figure Bonnie++ could not time (it prints "+++++" for a pass shorter than half a
    second) is None in `extra`, NaN as the result: not measured."""
    line = next((ln for ln in reversed(text.splitlines()) if ln.startswith(BONNIE_CSV_VERSION + ",")), None)
    if line is None:
        raise CloudboxError(f"bonnie++ ({test_id}) printed no CSV line of format {BONNIE_CSV_VERSION}: "
                            f"{text.strip()[-300:]}")
    f = line.split(",")
    if len(f) < 38:
        raise CloudboxError(f"bonnie++ ({test_id}) printed a CSV line of {len(f)} fields, not 38 or more: {line}")

    def num(i: int) -> float | None:
        try:
            return float(f[i])
        except ValueError:  # "+++++": too quick to time; "": pass skipped
            return None

    if seconds is None:
        el = _ELAPSED.search(text)
        seconds = float(el[2]) - float(el[1]) if el else None
    extra: dict[str, float | None] = {"seconds": seconds}
    for metric, (bw, cpu) in _BONNIE_THROUGHPUT.items():
        kib = num(bw)
        extra[metric] = None if kib is None else kib * 1024 / MB
        extra[_BONNIE_CPU[metric]] = num(cpu)
    for metric, i in _BONNIE_RATES.items():
        extra[metric] = num(i)
    mbps = extra.pop("MB/s")
    return FioResult(test_id, math.nan if mbps is None else mbps, 0.0, 0.0, seconds or 0.0, text, extra)


def bonnie_version(text: str) -> str:
    """"2.00a" from Bonnie++'s CSV line (its second field), "" when there is none."""
    m = re.search(rf"^{re.escape(BONNIE_CSV_VERSION)},([^,]+),", text, re.M)
    return m[1] if m else ""


_DD = re.compile(r"(\d+) bytes.*copied,\s*([\d.]+)\s*s")
_RECORDS_OUT = re.compile(r"(\d+)\+(\d+) records out")
_ELAPSED = re.compile(r"cloudbox-elapsed ([\d.]+) ([\d.]+)")


def timed_dd_script(argv: list[str]) -> str:
    """dd wrapped so it reports its own elapsed time: busybox dd (in the guest) prints no rate line."""
    cmd = " ".join(shlex.quote(a) for a in argv)
    return (f"s=$(cat /proc/uptime); {cmd}; rc=$?; e=$(cat /proc/uptime); "
            'echo "cloudbox-elapsed ${s%% *} ${e%% *}" >&2; exit $rc')


def parse_dd(test_id: str, text: str, block: int = 64 * 1024) -> FioResult:
    """GNU dd's "N bytes ... copied, S s" line, or records out + the timed_dd_script's elapsed line."""
    m = _DD.search(text)
    if m:
        nbytes, secs = int(m[1]), float(m[2])
    else:
        rec, el = _RECORDS_OUT.search(text), _ELAPSED.search(text)
        if not (rec and el):
            raise CloudboxError(f"dd ({test_id}) output not understood: {text.strip()[-300:]}")
        nbytes = int(rec[1]) * block
        secs = float(el[2]) - float(el[1])
    return FioResult(test_id, nbytes / secs / MB if secs > 0 else 0.0, 0.0, 0.0, secs, text)


ProgressFn = Callable[[dict], None]


def drop_host_caches() -> bool:
    try:
        subprocess.run(["sync"], check=False)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


class HostRunner:
    """Runs storage tests on bare metal (this host)."""

    def __init__(self, cancelled: Callable[[], bool]):
        self.cancelled = cancelled

    def fill(self, target: str, size: int) -> None:
        t = TESTS["seq-write-1m"]
        self._fio(t, fio_args(t, target, size, 0, fill=True), lambda _p: None)

    def fill_iozone(self, t: StorageTest, target: str, size: int) -> None:
        """IOzone's write pass with `t`'s record size, untimed, so that `t` (a read) finds IOzone's own data."""
        self._iozone(_iozone_writer(t), target, size)

    def run(self, t: StorageTest, target: str, size: int, runtime: int, progress: ProgressFn) -> FioResult:
        if t.dd and not is_nbd_uri(target):  # dd cannot open a volume over NBD: fio's nbd engine does its pattern
            return self._dd(t, target, size)
        if t.tool in IOZONE_TOOLS:
            return self._iozone(t, target, size)
        if t.tool == "bonnie":
            return self._bonnie(t, target, size)
        return self._fio(t, fio_args(t, target, size, runtime), progress)

    def _bonnie(self, t: StorageTest, target: str, size: int) -> FioResult:
        """ext4 made on `target` (the baseline's device, or its file through a loop device), mounted on a directory
        of its own under the run directory, Bonnie++ there, then unmounted and the directory removed."""
        import tempfile

        from .. import paths

        if is_nbd_uri(target):
            raise CloudboxError(f"{t.id}: Bonnie++ needs a file system on a local disk, not a volume served over NBD "
                                f"({target}); the fio tests can measure it")
        import shutil

        missing = [p for p in ("bonnie++", "mke2fs") if shutil.which(p) is None]
        if missing:
            raise CloudboxError(f"{t.id}: this host has no {' or '.join(missing)}; install Debian's bonnie++ and "
                                "e2fsprogs (scripts/install-deps core)")
        block = Path(target).is_block_device()
        if not block:  # the baseline's file, pre-allocated like the guest's backing file
            with open(target, "ab") as fh:
                os.posix_fallocate(fh.fileno(), 0, size)
        r = subprocess.run([*MKFS_EXT4, target], capture_output=True, text=True)
        if r.returncode != 0:
            raise CloudboxError(f"bare-metal mke2fs for {t.id} on {target} exited {r.returncode}: "
                                f"{(r.stderr or r.stdout).strip()[-300:]}")
        base = paths.run_dir()
        base.mkdir(parents=True, exist_ok=True)
        mnt = tempfile.mkdtemp(prefix="cloudbox-bonnie-", dir=base)
        try:
            r = subprocess.run(["mount", "-t", "ext4", *([] if block else ["-o", "loop"]), target, mnt],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise CloudboxError(f"bare-metal mount of {target} for {t.id} exited {r.returncode}: "
                                    f"{r.stderr.strip()[-300:]}")
            try:
                t0 = time.monotonic()
                proc = subprocess.Popen(bonnie_args(mnt, size), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
                out, err = procs.wait_cancellable(proc, self.cancelled, "a bare-metal bonnie++ run")
                secs = time.monotonic() - t0
            finally:
                umount(mnt)
        finally:
            os.rmdir(mnt)
        if proc.returncode != 0:
            raise CloudboxError(f"bare-metal bonnie++ ({t.id}) exited {proc.returncode}: {err.strip()[-400:]}")
        return parse_bonnie(t.id, out + "\n" + err, secs)

    def _iozone(self, t: StorageTest, target: str, size: int) -> FioResult:
        if is_nbd_uri(target):
            raise CloudboxError(f"{t.id}: IOzone cannot open a volume served over NBD ({target}); the fio tests can")
        sweep = t.tool in IOZONE_SWEEPS
        proc = subprocess.Popen((iozone_files_args if sweep else iozone_args)(t, target, size),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = procs.wait_cancellable(proc, self.cancelled, "a bare-metal iozone run")
        if proc.returncode != 0:
            raise CloudboxError(f"bare-metal iozone ({t.id}) exited {proc.returncode}: {out.strip()[-400:]}")
        if sweep:
            return parse_iozone_files(t.id, out, grid=t.tool == IOZONE_GRID)
        return parse_iozone(t.id, out, "write" if t.writes else "read")

    def _fio(self, t: StorageTest, args: list[str], progress: ProgressFn) -> FioResult:
        import tempfile

        with tempfile.NamedTemporaryFile(prefix="cloudbox-fio-", suffix=".json") as out:
            proc = subprocess.Popen([*args, f"--output={out.name}"], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1)
            assert proc.stdout is not None
            tail: list[str] = []
            try:
                for line in proc.stdout:
                    if self.cancelled():
                        raise Aborted("cancelled during a bare-metal fio run")
                    eta = parse_eta(line)
                    if eta:
                        progress(eta)
                    else:
                        tail = (tail + [line])[-20:]
                rc = proc.wait()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            text = Path(out.name).read_text()
        if rc != 0:
            raise CloudboxError(f"bare-metal fio ({t.id}) exited {rc}: {''.join(tail).strip()[-400:]}")
        return parse_fio(t.id, text)

    def _dd(self, t: StorageTest, target: str, size: int) -> FioResult:
        r = subprocess.run(dd_args(t, target, size), capture_output=True, text=True)
        if r.returncode != 0:
            raise CloudboxError(f"bare-metal dd ({t.id}) failed: {r.stderr.strip()[-300:]}")
        return parse_dd(t.id, r.stderr)


RAID_DEVICE = "/dev/md0"
_DISKS_SH = ("for d in /sys/block/*; do n=${d##*/}; case $n in ram*|loop*|sr*|zram*|md*) ;; "
             "*) echo $n;; esac; done")


@dataclass(frozen=True)
class RaidArray:
    """The guest's md array, as assembled: its device, level, chunk, members and /proc/mdstat then."""

    device: str
    level: str
    chunk_kib: int
    members: list[str]
    mdstat: str


def parse_disk_stat(text: str) -> tuple[int, int]:
    """A /sys/block/<disk>/stat line -> (requests completed: reads, writes, discards and flushes; requests in
    flight). ValueError on anything else."""
    f = [int(x) for x in text.split()]
    if len(f) < 11:
        raise ValueError(f"not a block device's stat line: {text!r}")
    return f[0] + f[4] + sum(f[i] for i in (11, 15) if i < len(f)), f[8]


class DiskWatch:
    """Whether a guest's benchmark disks have stopped: requests in flight and not one completed for `stall_s`,
    read from /sys/block/<disk>/stat through the agent every `every` seconds. Called while a guest test runs
    (Guest.run's give_up): returns why it gave up, else None. A read that fails says nothing either way."""

    def __init__(self, guest, disks: list[str], stall_s: float | None = None, every: float = DISK_WATCH_EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self.guest = guest
        self.disks = disks
        self.stall_s = DISK_STALL_S if stall_s is None else stall_s
        self.every = every
        self.clock = clock
        self.since = clock()
        self.checked = -math.inf
        self.completed: int | None = None
        self.seen: dict[str, tuple[int, int]] = {}
        self.reason: str | None = None  # why it gave up, once it has
        self.counts = ""  # what showed it

    def read(self) -> dict[str, tuple[int, int]] | None:
        script = "; ".join(f"echo {shlex.quote(d)} $(cat /sys/block/{shlex.quote(d)}/stat)" for d in self.disks)
        try:
            out = self.guest.sh(script, timeout=20).stdout
            found = {name: parse_disk_stat(rest) for name, _, rest in
                     (line.partition(" ") for line in out.splitlines() if line.strip())}
        except (GuestError, ValueError):
            return None
        return found if set(found) == set(self.disks) else None

    def __call__(self) -> str | None:
        now = self.clock()
        if not self.disks or now - self.checked < self.every:
            return None
        self.checked = now
        found = self.read()
        if found is None:
            return None
        self.seen = found
        completed = sum(c for c, _ in found.values())
        if completed != self.completed or not any(n for _, n in found.values()):
            self.completed, self.since = completed, now
            return None
        if now - self.since < self.stall_s:
            return None
        busy = ", ".join(f"{n} on {d}" for d, (_, n) in found.items() if n)
        self.counts = f"in flight {busy}, none completed for {now - self.since:.0f} s"
        self.reason = f"its disk stopped completing requests: {self.counts}"
        return self.reason

    def queues(self) -> str:
        """QEMU's view of the virtio-blk queues (where the requests wait: not taken from the guest's ring, or
        answered and never noticed by it), for the error; "" where QEMU cannot tell."""
        try:
            qs = self.guest.virtio_blk_queues()
        except GuestError:
            return ""
        return "; ".join(f"QEMU's {path.split('/')[3] if path.count('/') > 3 else path} queue: took "
                         f"{q['last_avail_idx']} of the {q['shadow_avail_idx']} requests the guest queued, answered "
                         f"{q['used_idx']}, last interrupt at {q['signalled_used']}" for path, q in qs)


class GuestRunner:
    """Runs storage tests inside the guest through the guest agent."""

    def __init__(self, guest, cancelled: Callable[[], bool]):
        self.guest = guest
        self.cancelled = cancelled
        self._watched_disks: list[str] | None = None

    def check_tools(self, tests: list[StorageTest]) -> None:
        need = {t.program for t in tests}
        missing = [p for p in sorted(need) if not self.guest.has(p)]
        if missing:
            raise GuestError(
                f"the guest {self.guest.name} has no {', '.join(missing)}: the benchmark guest image is "
                "incomplete; rebuild it with 'make guest-image' (appliance/guest/build-guest-image --force)")

    def disk(self) -> str:
        """The guest's benchmark disk: the one non-ram, non-loop block device."""
        disks = self.disks()
        if len(disks) != 1:
            raise GuestError(f"expected exactly one benchmark disk in the guest, found: {disks or 'none'}")
        return f"/dev/{disks[0]}"

    def disks(self) -> list[str]:
        """The guest's benchmark disks (kernel names, in name order): every non-ram, non-loop, non-md block device."""
        return sorted(self.guest.sh(_DISKS_SH, timeout=30).check().stdout.split())

    def assemble_raid(self, count: int, chunk_kib: int) -> RaidArray:
        """RAID 0 over the guest's `count` disks as RAID_DEVICE: built without superblocks (mdadm --build), so the
        array is the members' whole size and nothing of it stays on the disks; checked in /proc/mdstat."""
        disks = self.disks()
        if len(disks) != count:
            raise GuestError(f"the profile has {count} disks (disk.count) but the guest sees {len(disks)}: "
                             f"{', '.join(disks) or 'none'}")
        if not self.guest.has("mdadm"):
            raise GuestError(f"the guest {self.guest.name} has no mdadm: the benchmark guest image is too old for a "
                             "RAID profile; rebuild it with 'make guest-image' (appliance/guest/build-guest-image)")
        argv = ["mdadm", "--build", RAID_DEVICE, "--level=0", f"--chunk={chunk_kib}", f"--raid-devices={count}",
                *(f"/dev/{d}" for d in disks)]
        r = self.guest.run(argv, timeout=120)
        if r.exitcode != 0:
            raise GuestError(f"mdadm --build in the guest exited {r.exitcode}: {(r.stderr or r.stdout).strip()[-300:]}")
        mdstat = self.guest.sh("cat /proc/mdstat", timeout=30).check().stdout
        found = mdstat_array(mdstat)
        if found != ("raid0", disks):
            raise GuestError(f"mdadm built {RAID_DEVICE}, but /proc/mdstat does not show it as raid0 over "
                             f"{', '.join(disks)}: {mdstat.strip()[-300:]}")
        return RaidArray(RAID_DEVICE, "0", chunk_kib, disks, mdstat)

    def sectors_written(self, disks: list[str]) -> dict[str, int]:
        """Sectors written to each of `disks` since the guest booted (/sys/block/<disk>/stat, field 7)."""
        out = {}
        for d in disks:
            fields = self.guest.sh(f"cat /sys/block/{shlex.quote(d)}/stat", timeout=30).check().stdout.split()
            out[d] = int(fields[6])
        return out

    def stop_raid(self) -> None:
        self.guest.run(["mdadm", "--stop", RAID_DEVICE], timeout=60, check=True)

    def drop_caches(self) -> None:
        self.guest.sh("sync; echo 3 > /proc/sys/vm/drop_caches", timeout=60)

    def fill(self, target: str, size: int) -> None:
        t = TESTS["seq-write-1m"]
        self._fio(t, fio_args(t, target, size, 0, fill=True), lambda _p: None, timeout=GUEST_TIMEOUT)

    def fill_iozone(self, t: StorageTest, target: str, size: int, timeout: float = GUEST_TIMEOUT) -> None:
        """IOzone's write pass with `t`'s record size, untimed, so that `t` (a read) finds IOzone's own data."""
        self.run(_iozone_writer(t), target, size, 0, lambda _p: None, timeout=timeout)

    def run(self, t: StorageTest, target: str, size: int, runtime: int, progress: ProgressFn,
            timeout: float = GUEST_TIMEOUT, start_uptime: float | None = None) -> FioResult:
        """`t` against `target`; with `start_uptime`, held until the guest's uptime reaches it (barrier_script)."""
        hold = "" if start_uptime is None else barrier_script(start_uptime)
        if t.dd:
            r = self._test_sh(t, hold + timed_dd_script(dd_args(t, target, size)), timeout=timeout,
                              poll=self._check_cancel)
            if r.exitcode != 0:
                raise GuestError(f"dd ({t.id}) in the guest exited {r.exitcode}: {r.stderr.strip()[-300:]}")
            res = parse_dd(t.id, r.stderr)
        elif t.tool == "iozone":
            r = self._test_sh(t, hold + " ".join(shlex.quote(a) for a in iozone_args(t, target, size)), timeout=timeout,
                              poll=self._check_cancel)
            if r.exitcode != 0:
                raise GuestError(f"iozone ({t.id}) in the guest exited {r.exitcode}: "
                                 f"{(r.stdout + r.stderr).strip()[-400:]}")
            res = parse_iozone(t.id, r.stdout, "write" if t.writes else "read")
        elif t.tool in IOZONE_SWEEPS:
            r = self._test_sh(t, hold + " ".join(shlex.quote(a) for a in iozone_files_args(t, target, size)),
                              timeout=timeout, poll=self._check_cancel)
            if r.exitcode != 0:
                raise GuestError(f"iozone ({t.id}) in the guest exited {r.exitcode}: "
                                 f"{(r.stdout + r.stderr).strip()[-400:]}")
            res = parse_iozone_files(t.id, r.stdout, grid=t.tool == IOZONE_GRID)
        elif t.tool == "bonnie":
            r = self._test_sh(t, hold + bonnie_guest_script(target, size), timeout=timeout, poll=self._check_cancel)
            if r.exitcode != 0:
                raise GuestError(f"bonnie++ ({t.id}) in the guest exited {r.exitcode} (3: no ext4 module, 4: mke2fs, "
                                 f"5: mount, 6: umount): {(r.stdout + r.stderr).strip()[-400:]}")
            res = parse_bonnie(t.id, r.stdout + "\n" + r.stderr)
        else:
            res = self._fio(t, fio_args(t, target, size, runtime), progress, timeout=timeout, hold=hold)
        if start_uptime is not None:
            res.started_uptime = parse_start_stamp(self.guest.sh(f"cat {START_STAMP}", timeout=30).check().stdout)
        return res

    def uptime_offset(self, tries: int = 5) -> tuple[float, float]:
        """(host time minus the guest's uptime, the agent round trip it was measured in): /proc/uptime read
        through the agent's file calls, one round trip each; the quickest of `tries` is kept."""
        import base64

        agent = self.guest.agent
        handle = agent("guest-file-open", {"path": "/proc/uptime", "mode": "r"})
        best: tuple[float, float] | None = None
        try:
            for _ in range(tries):
                agent("guest-file-seek", {"handle": handle, "offset": 0, "whence": "set"})
                t0 = time.time()
                ret = agent("guest-file-read", {"handle": handle, "count": 64})
                t1 = time.time()
                assert isinstance(ret, dict)
                up = float(base64.b64decode(ret.get("buf-b64", "")).split()[0])
                sample = ((t0 + t1) / 2 - up, t1 - t0)
                if best is None or sample[1] < best[1]:
                    best = sample
        finally:
            agent("guest-file-close", {"handle": handle})
        assert best is not None
        return best

    def _test_sh(self, t: StorageTest, script: str, **kw):
        """`script` (test `t`) in the guest, watched by a DiskWatch over the benchmark disks: one that stops
        completing requests has the script killed and DiskStalled raised, with the counters and QEMU's queues."""
        if self._watched_disks is None:
            self._watched_disks = self.disks()
        watch = DiskWatch(self.guest, self._watched_disks)
        try:
            return self.guest.sh(script, give_up=watch, **kw)
        except GuestTimeout as e:
            if e.why is None or e.why != watch.reason:
                raise
            queues = watch.queues()
            seen = watch.counts + (f"; {queues}" if queues else "")
            raise DiskStalled(f"{t.program} ({t.id}) was killed: its disk stopped completing requests ({seen})",
                              sorted(d for d, (_, n) in watch.seen.items() if n), seen) from e

    def _check_cancel(self) -> None:
        if self.cancelled():
            raise Aborted("cancelled during a guest test")

    def _fio(self, t: StorageTest, args: list[str], progress: ProgressFn, timeout: float, hold: str = "") -> FioResult:
        cmd = hold + " ".join(shlex.quote(a) for a in args) + " --output=/tmp/fio.json > /tmp/fio.eta 2>&1"
        last = [0.0]

        def poll() -> None:
            self._check_cancel()
            now = time.monotonic()
            if now - last[0] < 1.0:
                return
            last[0] = now
            r = self.guest.sh("tail -c 400 /tmp/fio.eta 2>/dev/null", timeout=10)
            for line in reversed(r.stdout.replace("\r", "\n").splitlines()):
                eta = parse_eta(line)
                if eta:
                    progress(eta)
                    break

        r = self._test_sh(t, cmd, timeout=timeout, poll=poll, interval=0.25)
        if r.exitcode != 0:
            log = self.guest.sh("tail -c 600 /tmp/fio.eta", timeout=10).stdout
            raise GuestError(f"fio ({t.id}) in the guest exited {r.exitcode}: {log.strip()[-400:]}")
        out = self.guest.sh("cat /tmp/fio.json", timeout=30).check().stdout
        return parse_fio(t.id, out)
