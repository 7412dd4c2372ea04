"""The storage tests' runners: HostRunner on bare metal, GuestRunner in the guest through its agent (its disks, md
RAID and clock too), each running fio, dd, IOzone or Bonnie++ as the test says; the host's page-cache drop, the
data laid down before reads, and how long a guest's test may take.

The same job runs twice: on the host against the backing device/file system (the baseline) and in the
guest against its benchmark disk. Writes come before reads so reads never hit sparse holes; page
caches are dropped (host and guest) before every read so numbers are cold-cache unless labelled.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import ledger, procs
from ..disks.hostraid import mdstat_array
from ..disks.mounts import Mount, umount
from ..errors import Aborted, CloudboxError, GuestError
from ..spec.catalogue import FS_TOOLS, IOZONE_FS, IOZONE_GRID, IOZONE_TOOLS, MPI_TOOL, TESTS, StorageTest, block_bytes
from .barrier import barrier_script, read_start_stamp
from .bonnie import GUEST_BONNIE_LOG, MKFS_EXT4, bonnie_args, bonnie_guest_script, parse_bonnie
from .dd import dd_args, parse_dd, timed_dd_script
from .diskwatch import watched_sh
from .fio import fio_args, is_nbd_uri, parse_eta, parse_fio
from .iozone import (
    MKFS_EXT3,
    iozone_fs_args,
    iozone_fs_guest_script,
    iozone_grid_records,
    iozone_test_args,
    iozone_writer,
    parse_iozone_test,
)
from .progress import (
    Done,
    Pace,
    bonnie_done,
    dd_done,
    dd_fd,
    dd_pos_script,
    dd_total,
    fdinfo_pos,
    iozone_done,
    iozone_plan,
)
from .result import FioResult

GUEST_TIMEOUT = 3600.0  # seconds a guest's test may run before it counts as hung
SLOW_REQUEST_S = 0.02  # one request waiting for a hard disk's flush: the slowest a one-at-a-time pass may go
SLOW_STREAM = 10 * 1_000_000  # bytes/s: under a sixth of a hard disk's ~100 MB/s, study B's write-through KVM


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
        if t.rw == "write" or t.tool in ("iozone", IOZONE_FS):
            return False
        if "read" in t.rw:
            return True
    return False


ProgressFn = Callable[[dict], None]
# How often a guest test's output (or dd's position) is read for its progress, through the agent: a shell in the
# guest each time, so less often than the host's own reads (every half second).
GUEST_PROGRESS_S = 2.0
GUEST_IOZONE_OUT = "/tmp/cloudbox-iozone.out"  # IOzone's output while it runs in the guest
GUEST_DD_PID = "/tmp/cloudbox-dd.pid"


def _no_progress(_p: dict) -> None:
    pass


def _file_text(fh) -> str:
    """All a child process has written so far to the temporary file `fh` (read without moving the offset it
    shares)."""
    fd = fh.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")


def _fd_pos(pid: int, fd: int) -> int | None:
    try:
        return fdinfo_pos(Path(f"/proc/{pid}/fdinfo/{fd}").read_text())
    except OSError:
        return None


def drop_host_caches() -> bool:
    """Flush and drop this host's page cache; False where it cannot (not root: the read is then warm-cache)."""
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
        self._iozone(iozone_writer(t), target, size, _no_progress)

    def run(self, t: StorageTest, target: str, size: int, runtime: int, progress: ProgressFn) -> FioResult:
        if t.dd and not is_nbd_uri(target):  # dd cannot open a volume over NBD: fio's nbd engine does its pattern
            return self._dd(t, target, size, progress)
        if t.tool in IOZONE_TOOLS:
            return self._iozone(t, target, size, progress)
        if t.tool in FS_TOOLS:
            return self._on_fs(t, target, size, progress)
        return self._fio(t, fio_args(t, target, size, runtime), progress)

    def _on_fs(self, t: StorageTest, target: str, size: int, progress: ProgressFn) -> FioResult:
        """A test on a file system made on `target` (the baseline's device, or its file through a loop device): ext4
        for Bonnie++, ext3 for IOzone's write (its read mounts the one the write left), mounted on a directory of its
        own under the run directory, the tool there, then unmounted and the directory removed."""
        import shutil
        import tempfile

        from .. import paths

        if is_nbd_uri(target):
            tool = "Bonnie++" if t.tool == "bonnie" else "IOzone"
            raise CloudboxError(f"{t.id}: {tool} needs a file system on a local disk, not a volume served over NBD "
                                f"({target}); the fio tests can measure it")
        bonnie = t.tool == "bonnie"
        mkfs = MKFS_EXT4 if bonnie else MKFS_EXT3
        missing = [p for p in (t.program, "mke2fs") if shutil.which(p) is None]
        if missing:
            raise CloudboxError(f"{t.id}: this host has no {' or '.join(missing)}; install Debian's "
                                f"{'bonnie++' if bonnie else 'iozone3'} and e2fsprogs (scripts/install-deps core)")
        block = Path(target).is_block_device()
        if t.writes:
            if not block:  # the baseline's file, pre-allocated like the guest's backing file
                with open(target, "ab") as fh:
                    os.posix_fallocate(fh.fileno(), 0, size)
            r = subprocess.run([*mkfs, target], capture_output=True, text=True)
            if r.returncode != 0:
                raise CloudboxError(f"bare-metal mke2fs for {t.id} on {target} exited {r.returncode}: "
                                    f"{(r.stderr or r.stdout).strip()[-300:]}")
        base = paths.run_dir()
        base.mkdir(parents=True, exist_ok=True)
        mnt = tempfile.mkdtemp(prefix=f"cloudbox-{t.program.rstrip('+')}-", dir=base)
        mounted = ledger.hold(Mount(mnt, target))  # a run killed here: its clean-up unmounts it (and its loop)
        try:
            r = subprocess.run(["mount", "-t", mkfs[2], *([] if block else ["-o", "loop"]), target, mnt],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise CloudboxError(f"bare-metal mount of {target} for {t.id} exited {r.returncode}: "
                                    f"{r.stderr.strip()[-300:]}")
            try:
                t0, pace = time.monotonic(), Pace()
                argv = bonnie_args(mnt, size) if bonnie else iozone_fs_args(t, mnt, size)
                with tempfile.TemporaryFile() as log:
                    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True,
                                            preexec_fn=procs.die_with_parent())  # noqa: PLW1509 - only prctl: a killed executor's tool dies with it
                    every = (lambda: progress(pace.payload(bonnie_done(_file_text(log), size)))) if bonnie else None
                    out, _ = procs.wait_cancellable(proc, self.cancelled, f"a bare-metal {t.program} run", every=every)
                    secs = time.monotonic() - t0
                    err = _file_text(log)
            finally:
                umount(mnt)
        finally:
            os.rmdir(mnt)
            mounted.done()
        if proc.returncode != 0:
            raise CloudboxError(f"bare-metal {t.program} ({t.id}) exited {proc.returncode}: "
                                f"{(err.strip() or out.strip())[-400:]}")  # IOzone complains on stdout
        return parse_bonnie(t.id, out + "\n" + err, secs) if bonnie else parse_iozone_test(t, out)

    def _iozone(self, t: StorageTest, target: str, size: int, progress: ProgressFn) -> FioResult:
        """IOzone, its output read as it goes for the cells and passes done (core.bench.progress)."""
        import tempfile

        if is_nbd_uri(target):
            raise CloudboxError(f"{t.id}: IOzone cannot open a volume served over NBD ({target}); the fio tests can")
        plan, pace = iozone_plan(t, size), Pace()
        with tempfile.TemporaryFile() as fh:
            proc = subprocess.Popen(iozone_test_args(t, target, size), stdout=fh, stderr=subprocess.STDOUT,
                                    preexec_fn=procs.die_with_parent())  # noqa: PLW1509 - only prctl: a killed executor's tool dies with it
            procs.wait_cancellable(proc, self.cancelled, "a bare-metal iozone run",
                                   every=lambda: progress(pace.payload(iozone_done(plan, _file_text(fh)))))
            out = _file_text(fh)
        if proc.returncode != 0:
            raise CloudboxError(f"bare-metal iozone ({t.id}) exited {proc.returncode}: {out.strip()[-400:]}")
        return parse_iozone_test(t, out)

    def _fio(self, t: StorageTest, args: list[str], progress: ProgressFn) -> FioResult:
        import tempfile

        with tempfile.NamedTemporaryFile(prefix="cloudbox-fio-", suffix=".json") as out:
            proc = subprocess.Popen([*args, f"--output={out.name}"], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1,
                                    preexec_fn=procs.die_with_parent())  # noqa: PLW1509 - only prctl: a killed executor's tool dies with it
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

    def _dd(self, t: StorageTest, target: str, size: int, progress: ProgressFn) -> FioResult:
        """dd, the position of its file read as it goes for the bytes done (core.bench.progress)."""
        total, fd, pace = dd_total(t, target, size), dd_fd(t), Pace()
        proc = subprocess.Popen(dd_args(t, target, size), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _, err = procs.wait_cancellable(proc, self.cancelled, "a bare-metal dd run",
                                        every=lambda: progress(pace.payload(dd_done(total, _fd_pos(proc.pid, fd)))))
        if proc.returncode != 0:
            raise CloudboxError(f"bare-metal dd ({t.id}) failed: {err.strip()[-300:]}")
        return parse_dd(t.id, err)


RAID_DEVICE = "/dev/md0"
# nvme*c*n*: a namespace's hidden path under native NVMe multipath (nvme0c0n1); its disk is the head, nvme0n1.
_DISKS_SH = ("for d in /sys/block/*; do n=${d##*/}; case $n in ram*|loop*|sr*|zram*|md*|nvme*c*n*) ;; "
             "*) echo $n;; esac; done")


@dataclass(frozen=True)
class RaidArray:
    """The guest's md array, as assembled: its device, level, chunk, members and /proc/mdstat then."""

    device: str
    level: str
    chunk_kib: int
    members: list[str]
    mdstat: str


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

    def drop_caches(self) -> bool:
        """Flush and drop the guest's page cache; False where it could not (the read is then warm-cache)."""
        return self.guest.sh("sync; echo 3 > /proc/sys/vm/drop_caches", timeout=60).exitcode == 0

    def fill(self, target: str, size: int) -> None:
        t = TESTS["seq-write-1m"]
        self._fio(t, fio_args(t, target, size, 0, fill=True), lambda _p: None, timeout=GUEST_TIMEOUT)

    def fill_iozone(self, t: StorageTest, target: str, size: int, timeout: float = GUEST_TIMEOUT) -> None:
        """IOzone's write pass with `t`'s record size, untimed, so that `t` (a read) finds IOzone's own data."""
        self.run(iozone_writer(t), target, size, 0, _no_progress, timeout=timeout)

    def run(self, t: StorageTest, target: str, size: int, runtime: int, progress: ProgressFn,
            timeout: float = GUEST_TIMEOUT, start_uptime: float | None = None) -> FioResult:
        """`t` against `target`; with `start_uptime`, held until the guest's uptime reaches it (barrier_script)."""
        hold = "" if start_uptime is None else barrier_script(start_uptime)
        if t.dd:
            total = dd_total(t, target, size)
            read = dd_pos_script(GUEST_DD_PID, dd_fd(t))
            r = self._test_sh(t, f"rm -f {GUEST_DD_PID}; " + hold
                              + timed_dd_script(dd_args(t, target, size), GUEST_DD_PID), timeout=timeout,
                              poll=self._tool_poll(read, lambda out: dd_done(total, fdinfo_pos(out)), progress))
            if r.exitcode != 0:
                raise GuestError(f"dd ({t.id}) in the guest exited {r.exitcode}: {r.stderr.strip()[-300:]}")
            res = parse_dd(t.id, r.stderr)
        elif t.tool in IOZONE_TOOLS:
            # its output kept in a file while it runs, read for the cells done, then printed whole
            plan, out = iozone_plan(t, size), GUEST_IOZONE_OUT
            r = self._test_sh(t, f": > {out}; " + hold + shlex.join(iozone_test_args(t, target, size))
                              + f" > {out}; rc=$?; cat {out}; exit $rc", timeout=timeout,
                              poll=self._tool_poll(f"tail -c 1200 {out}",
                                                   lambda text: iozone_done(plan, text, tail=True), progress))
            if r.exitcode != 0:
                raise GuestError(f"iozone ({t.id}) in the guest exited {r.exitcode}: "
                                 f"{(r.stdout + r.stderr).strip()[-400:]}")
            res = parse_iozone_test(t, r.stdout)
        elif t.tool == IOZONE_FS:
            r = self._test_sh(t, hold + iozone_fs_guest_script(t, target, size), timeout=timeout,
                              poll=self._check_cancel)
            if r.exitcode != 0:
                raise GuestError(f"iozone ({t.id}) on ext3 in the guest exited {r.exitcode} (3: no ext4 module, 4: "
                                 f"mke2fs, 5: mount, 6: umount): {(r.stdout + r.stderr).strip()[-400:]}")
            res = parse_iozone_test(t, r.stdout)
        elif t.tool == "bonnie":
            r = self._test_sh(t, hold + bonnie_guest_script(target, size), timeout=timeout,
                              poll=self._tool_poll(f"cat {GUEST_BONNIE_LOG} 2>/dev/null",
                                                   lambda text: bonnie_done(text, size), progress))
            if r.exitcode != 0:
                raise GuestError(f"bonnie++ ({t.id}) in the guest exited {r.exitcode} (3: no ext4 module, 4: mke2fs, "
                                 f"5: mount, 6: umount): {(r.stdout + r.stderr).strip()[-400:]}")
            res = parse_bonnie(t.id, r.stdout + "\n" + r.stderr)
        else:
            res = self._fio(t, fio_args(t, target, size, runtime), progress, timeout=timeout, hold=hold)
        if start_uptime is not None:
            res.started_uptime = read_start_stamp(self.guest)
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
        """`script` (test `t`) in the guest, watched over the benchmark disks (watched_sh: DiskStalled when they stop
        completing requests)."""
        if self._watched_disks is None:
            self._watched_disks = self.disks()
        return watched_sh(self.guest, self._watched_disks, t, script, **kw)

    def _check_cancel(self) -> None:
        if self.cancelled():
            raise Aborted("cancelled during a guest test")

    def _tool_poll(self, read: str, done: Callable[[str], Done | None], progress: ProgressFn) -> Callable[[], None]:
        """The poll of a guest test whose tool reports no progress of its own: cancellation at every call, and every
        GUEST_PROGRESS_S the shell `read` run in the guest and its output turned into the test's progress by
        `done` (core.bench.progress), the seconds elapsed counted from here."""
        pace, last = Pace(), [time.monotonic()]

        def poll() -> None:
            self._check_cancel()
            now = time.monotonic()
            if progress is _no_progress or now - last[0] < GUEST_PROGRESS_S:
                return
            last[0] = now
            progress(pace.payload(done(self.guest.sh(read, timeout=10).stdout)))

        return poll

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
