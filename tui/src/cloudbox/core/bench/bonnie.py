"""Bonnie++'s storage test: ext4 made on the benchmark disk (the same mke2fs in the guest and on bare metal),
Bonnie++'s command line and the guest's script around it, and the parser of its CSV line."""

from __future__ import annotations

import math
import re
import shlex

from ..errors import CloudboxError
from .result import MB, FioResult, elapsed, timed_script

# Bonnie++ (study B) runs on a file system it is given: ext4 made with e2fsprogs' mke2fs on the benchmark disk, the same
# command in the guest and on bare metal. The inode tables and journal are written at once (no lazy init), so no
# kernel thread writes them behind the measurement; no blocks are reserved for root.
MKFS_EXT4 = ("mke2fs", "-t", "ext4", "-F", "-q", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0")
# The guest's shell runs its busybox applets before $PATH, and busybox has an ext2-only mke2fs of its own.
GUEST_MKE2FS = "/usr/sbin/mke2fs"
GUEST_BONNIE_DIR = "/mnt/cloudbox-bonnie"
GUEST_BONNIE_LOG = "/tmp/cloudbox-bonnie.log"  # its messages as it goes, which the runner reads for progress
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
    requires a file twice the RAM it is told. Its table and CSV line go to stdout, the phase it starts and ends to
    stderr as it goes (core.bench.progress reads them)."""
    mib = bonnie_file_mib(size)
    return ["bonnie++", "-d", directory, "-s", f"{mib}m", "-r", str(mib // 2), "-n", str(bonnie_files(size)), "-f",
            "-u", "root"]


def bonnie_guest_script(device: str, size: int) -> str:
    """The guest's run: ext4 (its driver and crc32c loaded on demand) on `device`, mounted, Bonnie++ (its messages
    kept in GUEST_BONNIE_LOG while it runs, then on stderr), unmounted."""
    q = shlex.quote
    mkfs = " ".join(q(a) for a in (GUEST_MKE2FS, *MKFS_EXT4[1:], device))
    return (f": > {GUEST_BONNIE_LOG}; "
            f"modprobe crc32c_generic 2>/dev/null; modprobe ext4 || exit 3; {mkfs} || exit 4; "
            f"mkdir -p {GUEST_BONNIE_DIR} && mount -t ext4 {q(device)} {GUEST_BONNIE_DIR} || exit 5; "
            + timed_script(" ".join(q(a) for a in bonnie_args(GUEST_BONNIE_DIR, size)) + f" 2>{GUEST_BONNIE_LOG}")
            + f"cat {GUEST_BONNIE_LOG} >&2; umount {GUEST_BONNIE_DIR} || rc=6; exit $rc")


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
        seconds = elapsed(text)
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
