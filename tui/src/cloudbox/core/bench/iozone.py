"""IOzone's storage tests: one pass over a device or file (write and re-write, or read and re-read), the same pass
over a file in an ext3 file system made on the disk (study B's way), the file sweep and the record grid of its
automatic mode; their command lines and scripts, parsers and stored metric names, and which reads must first have
IOzone lay down its own data."""

from __future__ import annotations

import re
import shlex

from ..errors import CloudboxError
from ..spec.catalogue import IOZONE_FS, IOZONE_GRID, IOZONE_SWEEPS, TESTS, StorageTest, block_bytes
from .result import MB, FioResult

MIB = 1024**2
# The ext3 file system study B's IOzone ran on (e2fsprogs' mke2fs, the same command in the guest and on bare metal):
# 4 KiB blocks, one inode per MiB (IOzone writes one large file), no blocks kept for root, the inode tables written
# at once so that no kernel thread writes them behind the measurement.
MKFS_EXT3 = ("mke2fs", "-t", "ext3", "-F", "-q", "-b", "4096", "-T", "largefile", "-m", "0", "-E",
             "lazy_itable_init=0,lazy_journal_init=0")
GUEST_MKE2FS = "/usr/sbin/mke2fs"  # not busybox's applet, which makes ext2 only
GUEST_IOZONE_DIR = "/mnt/cloudbox-iozone"
IOZONE_FS_FILE = "iozone.tmp"


def iozone_fills(tests: list[StorageTest]) -> list[bool]:
    """For each test, whether IOzone must first write the file untimed: its read pass checks that the data is the
    pattern its own write pass left, which any other write in between (dd, fio, the other IOzone kind: on the raw
    disk or on ext3) replaces."""
    out, last = [], ""  # the tool of the latest write
    for t in tests:
        lay = t.tool in ("iozone", IOZONE_FS) and not t.writes and last != t.tool
        out.append(lay)
        if t.writes or lay:
            last = t.tool
    return out


def iozone_fs_file(size: int) -> int:
    """IOzone's file on the ext3 made on a disk of `size` bytes: the disk less a sixteenth (at least 32 MiB) for
    ext3's journal (mke2fs gives a 128 MiB file system 16 MiB of it, 2 to 16 GiB 64 MiB), tables and bitmaps, in
    whole 16 MiB records: 3840 MiB of a 4 GiB disk, 96 MiB of quick size's 128 MiB."""
    return max(16 * MIB, (size - max(size // 16, 32 * MIB)) // (16 * MIB) * (16 * MIB))


def iozone_fs_args(t: StorageTest, directory: str, size: int) -> list[str]:
    """IOzone's pass of `t` on a file in `directory` (an ext3 mounted there), through the page cache (no -I): -e
    counts the closing fsync in the write's time, -w keeps the file for the read pass."""
    return ["iozone", "-i", "0" if t.writes else "1", "-r", t.bs, "-s", f"{iozone_fs_file(size) // 1024}k", "-e",
            "-w", "-f", f"{directory}/{IOZONE_FS_FILE}"]


def iozone_fs_guest_script(t: StorageTest, device: str, size: int) -> str:
    """The guest's run of `t`: the write makes ext3 on `device` (its driver loaded on demand); both mount it, run
    IOzone's pass and unmount it, which leaves the file for the read and empties the page cache of it."""
    q = shlex.quote
    mkfs = " ".join(q(a) for a in (GUEST_MKE2FS, *MKFS_EXT3[1:], device)) + " || exit 4; " if t.writes else ""
    return (f"modprobe ext4 || exit 3; {mkfs}mkdir -p {GUEST_IOZONE_DIR} && "
            f"mount -t ext3 {q(device)} {GUEST_IOZONE_DIR} || exit 5; "
            + " ".join(q(a) for a in iozone_fs_args(t, GUEST_IOZONE_DIR, size))
            + f"; rc=$?; umount {GUEST_IOZONE_DIR} || rc=6; exit $rc")


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


def iozone_writer(t: StorageTest) -> StorageTest:
    """IOzone's write test with `t`'s record size and kind (raw disk or ext3): the pass that lays down the data `t`
    (a read) checks."""
    return TESTS[f"iozone-fs-write-{t.bs}" if t.tool == IOZONE_FS else f"iozone-write-{t.bs}"]


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


def iozone_test_args(t: StorageTest, target: str, size: int) -> list[str]:
    """IOzone's command line for `t`: automatic mode for a sweep (iozone_files_args), else one pass (iozone_args)."""
    return (iozone_files_args if t.tool in IOZONE_SWEEPS else iozone_args)(t, target, size)


def parse_iozone_test(t: StorageTest, text: str) -> FioResult:
    """IOzone's output for `t`: a sweep's rows (parse_iozone_files), else one pass's row (parse_iozone, on the raw
    disk or on ext3 alike)."""
    if t.tool in IOZONE_SWEEPS:
        return parse_iozone_files(t.id, text, grid=t.tool == IOZONE_GRID)
    return parse_iozone(t.id, text, "write" if t.writes else "read")
