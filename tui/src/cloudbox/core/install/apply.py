"""Writing an install plan to its disk: `apply(plan, progress)`.

Steps, each reported through the progress callback and, once the installed root exists, recorded in its
journal (/var/lib/cloudbox/install/journal.jsonl):

1. partition  systemd-repart writes the GPT and fills the ESP and root partitions (copying from the read-only
              views of the running system and the boot medium's ESP). It writes the partition table last, so
              a disk with the table holds complete partitions: a re-run after an interruption keeps them.
2. mount      the installed root and ESP, in a private work directory under /run/cloudbox/install.
3. settings   node.toml, hostname, network, root's password and SSH keys, a fresh machine id (first boot).
4. boot-uefi  `bootctl install` on the node's ESP (and a firmware boot entry when started by UEFI); a boot medium
              that starts through shim (Secure Boot) gets its shim back on the removable-media path.
5. boot-bios  grub-mkimage + grub-bios-setup (core image in the BIOS boot partition, boot.img in the MBR).
6. verify     the boot files, the MBR and the settings are there; the root copy's rate is printed beside the
              disk's own sequential write rate (dd on the new root).
7. complete   the journal's last line says so; everything is synced and unmounted.

Every step after the first is idempotent, so a re-run of the same answers after a power loss or Ctrl-C
completes the install; a finished install is recognised (plan mode "done") and left alone. Right before
writing, the machine is probed again and the answers checked again. On any error or interruption the
mounts and the work directory are removed; what was written stays for the re-run.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from cloudbox.core import paths, procs
from cloudbox.core.disks.backing import dev_name_for_path
from cloudbox.core.errors import AnswerError, InstallError
from cloudbox.core.install.answers import check_answers
from cloudbox.core.install.disks import part_uuid_for
from cloudbox.core.install.plan import (
    GRUB_MODULES,
    JOURNAL,
    NODE_SETTINGS,
    InstallPlan,
    readonly_view,
    write_definitions,
)

STEPS = ("partition", "mount", "settings", "boot-uefi", "boot-bios", "verify", "complete")
GRUB_DIR = Path("/usr/lib/grub/i386-pc")


@dataclass(frozen=True)
class ProgressEvent:
    step: str
    number: int  # 1-based step number
    total: int
    message: str
    fraction: float | None = None  # of this step, when known

    def __str__(self) -> str:
        pct = f" {self.fraction * 100:5.1f}%" if self.fraction is not None else ""
        return f"[{self.number}/{self.total} {self.step}]{pct} {self.message}"


Progress = Callable[[ProgressEvent], None]


def work_dir() -> Path:
    return paths.run_dir() / "install"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _run(cmd: list[str], step: str, *, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise InstallError(f"step {step}: `{' '.join(cmd)}` failed (status {r.returncode}): "
                           f"{(r.stderr or r.stdout).strip()}")
    return r.stdout


@contextmanager
def _lock(work: Path):  # type: ignore[no-untyped-def]
    work.mkdir(parents=True, exist_ok=True)
    fd = os.open(work / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InstallError(f"another `cloudbox install` is running (lock {work / 'lock'})") from None
        yield
    finally:
        os.close(fd)


@contextmanager
def _mount(dev: str, where: Path, *opts: str):  # type: ignore[no-untyped-def]
    where.mkdir(parents=True, exist_ok=True)
    _run(["mount", *opts, dev, str(where)], "mount")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


@contextmanager
def _readonly_bind(src: str, where: Path):  # type: ignore[no-untyped-def]
    """A non-recursive, read-only bind mount: the file system at `src` alone, nothing mounted on top."""
    where.mkdir(parents=True, exist_ok=True)
    _run(["mount", "--bind", src, str(where)], "partition")
    try:
        _run(["mount", "-o", "remount,bind,ro", str(where)], "partition")
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


def _mountpoints_under(d: Path) -> list[str]:
    """Mount points at or below `d` (deepest first), from /proc/self/mountinfo."""
    prefix = str(d).rstrip("/")
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix + "/"):
                out.append(mp)
    return sorted(set(out), key=lambda m: m.count("/"), reverse=True)


def remove_work(d: Path) -> list[str]:
    """Unmount whatever is still mounted below `d`, then remove `d`, but only when nothing is mounted there any
    more: a busy mount of the installed root must never be emptied by a recursive delete. Returns the mount
    points that could not be unmounted (then `d` is left in place)."""
    for mp in _mountpoints_under(d):
        subprocess.run(["umount", mp], capture_output=True)
    left = _mountpoints_under(d)
    if not left:
        shutil.rmtree(d, ignore_errors=True)
    return left


def reap_stale(work: Path | None = None) -> list[str]:
    """Mounts and work directories of installer runs whose process is gone (killed with SIGKILL): unmounted and
    removed, so that they do not keep the target disk busy. Returns what could not be removed."""
    work = work or work_dir()
    left: list[str] = []
    for run in sorted(work.glob("run-*")) if work.is_dir() else []:
        pid = run.name.removeprefix("run-")
        if pid.isdigit() and Path(f"/proc/{pid}").exists():
            continue
        left += remove_work(run)
    return left


def _sectors_written(disk_name: str) -> int:
    try:
        return int(Path(f"/sys/block/{disk_name}/stat").read_text().split()[6])
    except (OSError, IndexError, ValueError):
        return 0


def _reader(stream: IO[str], q: queue.Queue[str | None]) -> None:
    for line in stream:
        q.put(line.rstrip("\n"))
    q.put(None)


def _stream(cmd: list[str], env: dict[str, str], on_line: Callable[[str], None], tick: Callable[[], None],
            step: str) -> None:
    """Run `cmd`, handing each line of its output to on_line and calling tick about once a second. On an
    interruption (Ctrl-C, SIGTERM turned into an exception) the child is stopped and waited for."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    q: queue.Queue[str | None] = queue.Queue()
    t = threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True)
    t.start()
    tail: list[str] = []
    try:
        while True:
            try:
                line = q.get(timeout=1.0)
            except queue.Empty:
                tick()
                continue
            if line is None:
                break
            tail = (tail + [line])[-15:]
            on_line(line)
        rc = proc.wait()
    except BaseException:
        procs.stop(proc, 30)
        raise
    if rc != 0:
        raise InstallError(f"step {step}: `{' '.join(cmd)}` failed (status {rc}):\n  " + "\n  ".join(tail))


def _partitions_of(disk_name: str) -> dict[str, str]:
    """{partition UUID: /dev path} of a disk, probed (not from udev's possibly stale database)."""
    out: dict[str, str] = {}
    base = Path(f"/sys/block/{disk_name}")
    for sub in sorted(base.iterdir()) if base.is_dir() else []:
        if not (sub / "partition").exists():
            continue
        r = subprocess.run(["blkid", "-p", "-o", "value", "-s", "PART_ENTRY_UUID", f"/dev/{sub.name}"],
                           capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip():
            out[r.stdout.strip().lower()] = f"/dev/{sub.name}"
    return out


def _wait_partitions(plan: InstallPlan, timeout: float = 30.0) -> dict[str, str]:
    """The disk's partitions once the kernel re-read the new table (systemd-repart asks it to; udev then
    recreates the nodes, so they can be missing for a moment)."""
    want = {part_uuid_for(plan.install_id, r) for r in ("esp", "bios-boot", "root")}
    deadline = time.monotonic() + timeout
    while True:
        if shutil.which("udevadm"):
            subprocess.run(["udevadm", "settle", "--timeout=10"], capture_output=True)
        parts = _partitions_of(plan.disk.name)
        if want <= parts.keys() and all(os.path.exists(p) for p in parts.values()):
            return parts
        if time.monotonic() > deadline:
            return parts
        time.sleep(1)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.cloudbox-new")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class _Journal:
    def __init__(self, root: Path, iid: str):
        self.path = root / JOURNAL
        self.iid = iid

    def add(self, event: str, **data: object) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rec = {"time": _now(), "event": event, "install_id": self.iid, **data}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _recheck(plan: InstallPlan) -> None:
    """Probe the machine again and check the answers again: the disk must still be the one planned."""
    r = plan.resolved
    try:
        again = check_answers(r.answers, r.machine.reprobe(), r.source)
    except AnswerError as e:
        raise InstallError(f"the machine changed since the plan was made; nothing was written:\n{e}") from None
    if again.disk.name != r.disk.name or again.disk.serial != r.disk.serial:
        raise InstallError(f"{r.answers.disk.target} now names /dev/{again.disk.name}, not /dev/{r.disk.name} "
                           "as planned; nothing was written")
    if again.resume != r.resume:
        raise InstallError(f"{r.disk.path} changed since the plan was made; nothing was written. Plan again.")


def apply(plan: InstallPlan, progress: Progress | None = None, *, work: Path | None = None) -> bool:
    """Write the plan to its disk. Returns False when there was nothing to do (a finished install of the same
    answers), True when the install completed. Raises InstallError (or KeyboardInterrupt) otherwise; what was
    written stays, and a re-run of the same answers resumes."""
    emit = progress or (lambda ev: None)
    total = len(STEPS)

    def say(step: str, message: str, fraction: float | None = None) -> None:
        emit(ProgressEvent(step, STEPS.index(step) + 1, total, message, fraction))

    if plan.mode == "done":
        say("complete", f"{plan.disk.path} already holds this install (id {plan.install_id}); nothing to do")
        return False
    work = work or work_dir()
    with _lock(work), ExitStack() as stack:
        left = reap_stale(work)
        if left:
            raise InstallError(f"an earlier install left mounts that cannot be unmounted: {', '.join(left)}; "
                               "unmount them and re-run")
        _recheck(plan)
        run = work / f"run-{os.getpid()}"
        if remove_work(run):
            raise InstallError(f"{run} has mounts that cannot be unmounted; unmount them and re-run")
        run.mkdir(parents=True)
        stack.callback(remove_work, run)
        src = run / "src"
        (src / "node-esp").mkdir(parents=True)
        for rel, text in plan.esp_overrides.items():
            _write(src / "node-esp" / rel, text)
        stack.enter_context(_readonly_bind(plan.sources.root, src / "live-root"))
        stack.enter_context(readonly_view(plan.sources.esp, src / "live-esp"))
        defs = run / "repart.d"
        write_definitions(plan.definitions, defs)
        (run / "tmp").mkdir()

        copied = _partition(plan, defs, src, run, say)

        parts = _wait_partitions(plan)
        dev = {}
        for role in ("esp", "bios-boot", "root"):
            want = part_uuid_for(plan.install_id, role)
            if want not in parts:
                raise InstallError(f"step partition: {plan.disk.path} has no partition with UUID {want} ({role}) "
                                   "after systemd-repart; re-run to resume")
            dev[role] = parts[want]

        say("mount", f"mounting {dev['root']} and {dev['esp']}")
        target = run / "target"
        stack.enter_context(_mount(dev["root"], target))
        stack.enter_context(_mount(dev["esp"], target / "efi", "-t", "vfat"))
        journal = _Journal(target, plan.install_id)
        journal.add("start", mode=plan.mode, disk=plan.disk.path, serial=plan.disk.serial,
                    role=plan.resolved.answers.role)
        journal.add("step-done", step="partition")

        say("settings", f"writing /{NODE_SETTINGS}, hostname, network, root access")
        _settings(plan, target)
        journal.add("step-done", step="settings")

        say("boot-uefi", "bootctl install (systemd-boot)")
        _boot_uefi(plan, target, src / "live-esp")
        journal.add("step-done", step="boot-uefi")

        say("boot-bios", f"grub-mkimage + grub-bios-setup on {plan.disk.path}")
        _boot_bios(plan, target, dev["esp"], run)
        journal.add("step-done", step="boot-bios")

        say("verify", "checking the boot files, the MBR and the settings")
        _verify(plan, target, src / "live-esp")
        if copied is not None:
            _copy_speed(copied, plan.sources.root, target, journal, say)
        journal.add("step-done", step="verify")

        journal.add("complete")
        say("complete", "syncing and unmounting")
        os.sync()
    say("complete", f"installed {plan.resolved.answers.role} {plan.resolved.answers.hostname} on {plan.disk.path}",
        1.0)
    return True


def _partition(plan: InstallPlan, defs: Path, src: Path, run: Path,
               say: Callable[..., None]) -> CopyRate | None:
    """systemd-repart; the rate of its root file system copy (None when it kept an interrupted install's)."""
    empty = "allow" if plan.mode == "resume" else "force"
    cmd = ["systemd-repart", "--dry-run=no", f"--empty={empty}", "--discard=no", f"--definitions={defs}",
           f"--copy-source={src}", f"--seed={plan.install_id}", "--no-pager", plan.disk.path]
    env = dict(os.environ, TMPDIR=str(run / "tmp"), SYSTEMD_LOG_LEVEL="info",
               # no discard by mkfs either: the new partition is written in full anyway
               SYSTEMD_REPART_MKFS_OPTIONS_EXT4="-E nodiscard")
    what = "keeping the partitions of the interrupted install" if plan.mode == "resume" else \
        f"writing the partition table and copying the system ({plan.root_used // 2**20} MiB)"
    say("partition", f"systemd-repart on {plan.disk.path}: {what}", 0.0)
    state: dict[str, object] = {"phase": "starting", "copy_start": None, "last": 0.0}
    root_bytes = max(plan.root_used, 1)
    copy: list[float] = []  # start time, start sectors, end time, end sectors of the root copy

    def on_line(line: str) -> None:
        low = line.lower()
        if len(copy) == 2:  # the line after the root copy's: it has ended
            copy.extend((time.monotonic(), _sectors_written(plan.disk.name)))
        if "populating ext4" in low:
            sectors = _sectors_written(plan.disk.name)
            state["copy_start"] = sectors
            copy[:] = [time.monotonic(), sectors]
            state["phase"] = "copying the root file system"
        elif "populating vfat" in low:
            state["phase"] = "copying the ESP"
        elif low.startswith("formatting future partition"):
            state["phase"] = "formatting " + line.split()[-1].rstrip(".")
        elif "writing new partition table" in low:
            state["phase"] = "writing the partition table"
        elif "syncing" in low:
            state["phase"] = "syncing to disk"
        else:
            return
        tick(force=True)

    def tick(force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - float(state["last"]) < 5:  # type: ignore[arg-type]
            return
        state["last"] = now
        frac = None
        start = state["copy_start"]
        if isinstance(start, int) and state["phase"] == "copying the root file system":
            done = (_sectors_written(plan.disk.name) - start) * 512
            frac = min(done / root_bytes, 0.99)
            # Bytes written include the file system's own metadata and journal: an estimate, capped.
            shown = min(done, root_bytes) // 2**20
            say("partition", f"copying the root file system: {shown} of ~{root_bytes // 2**20} MiB", frac)
        else:
            say("partition", str(state["phase"]), frac)

    _stream(cmd, env, on_line, tick, "partition")
    if len(copy) == 2:
        copy.extend((time.monotonic(), _sectors_written(plan.disk.name)))
    say("partition", "partition table written", 1.0)
    if len(copy) < 4 or copy[2] <= copy[0]:
        return None
    return CopyRate(int(copy[3] - copy[1]) * 512, copy[2] - copy[0])


@dataclass(frozen=True)
class CopyRate:
    bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6


DD_TEST_MIB = 256


def disk_write_rate(directory: Path, mib: int = DD_TEST_MIB) -> CopyRate | str:
    """The disk's own sequential write rate under `directory`: dd of `mib` MiB of zeros, O_DIRECT, 1 MiB blocks,
    into a file that is removed after. A reason (str) instead when it cannot be measured there."""
    st = os.statvfs(directory)
    if st.f_bavail * st.f_frsize < (mib + 64) * 2**20:
        return f"less than {mib + 64} MiB free on {directory}"
    probe = directory / f".cloudbox-dd-{os.getpid()}"
    cmd = ["dd", "if=/dev/zero", f"of={probe}", "bs=1M", f"count={mib}", "oflag=direct", "conv=fsync",
           "status=none"]
    try:
        start = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True)
        took = time.monotonic() - start
    finally:
        probe.unlink(missing_ok=True)
    if r.returncode != 0:
        return f"dd failed: {_last_line(r)}"
    return CopyRate(mib * 2**20, took)


def source_read_rate(root: str, mib: int = DD_TEST_MIB) -> CopyRate | str:
    """The sequential read rate of the block device holding `root` (the boot medium's root partition): dd of `mib`
    MiB to /dev/null, O_DIRECT, 1 MiB blocks; only read. A reason (str) instead when it cannot be measured."""
    name = dev_name_for_path(root)
    if not name:
        return f"{root} is not on a block device (an overlay or tmpfs)"
    cmd = ["dd", f"if=/dev/{name}", "of=/dev/null", "bs=1M", f"count={mib}", "iflag=direct", "status=none"]
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    took = time.monotonic() - start
    if r.returncode != 0:
        return f"dd of /dev/{name} failed: {_last_line(r)}"
    return CopyRate(mib * 2**20, took)


def _last_line(r: subprocess.CompletedProcess[str]) -> str:
    return (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]


def _copy_speed(copied: CopyRate, source: str, target: Path, journal: _Journal, say: Callable[..., None]) -> None:
    """The root copy's rate beside the target disk's own (dd on the new root; the copy should reach 80% of it) and
    the boot medium's read rate (the other bound: a slow stick caps the copy whatever the disk)."""
    say("verify", f"measuring the disk's own sequential write (dd, {DD_TEST_MIB} MiB, O_DIRECT, on the new root) "
                  "and the boot medium's read")
    disk, medium = disk_write_rate(target), source_read_rate(source)
    line = f"copied {copied.bytes / 2**20:.0f} MiB in {copied.seconds:.1f} s: {copied.mb_per_s:.1f} MB/s"
    read = (f"the boot medium reads {medium.mb_per_s:.1f} MB/s" if isinstance(medium, CopyRate)
            else f"the boot medium's read rate was not measured ({medium})")
    rec: dict[str, object] = {"copy_bytes": copied.bytes, "copy_seconds": round(copied.seconds, 2)}
    if isinstance(medium, CopyRate):
        rec.update(read_bytes=medium.bytes, read_seconds=round(medium.seconds, 2))
    if isinstance(disk, str):
        say("verify", f"{line}; the disk's own write rate was not measured ({disk}); {read}")
        journal.add("copy-speed", **rec, why=disk)
        return
    ratio = copied.mb_per_s / disk.mb_per_s
    say("verify", f"{line}; the disk writes {disk.mb_per_s:.1f} MB/s (dd, {DD_TEST_MIB} MiB, O_DIRECT): the copy "
                  f"ran at {100 * ratio:.0f}% of it; {read}")
    journal.add("copy-speed", **rec, disk_bytes=disk.bytes, disk_seconds=round(disk.seconds, 2),
                ratio=round(ratio, 3))


def _settings(plan: InstallPlan, target: Path) -> None:
    for path, text in plan.settings.items():
        mode = 0o600 if path.startswith("/root/.ssh/") else 0o644
        if path.startswith("/root/.ssh/"):
            (target / "root/.ssh").mkdir(parents=True, exist_ok=True)
            os.chmod(target / "root/.ssh", 0o700)
        _write(target / path.lstrip("/"), text, mode)
    if not plan.resolved.answers.root.ssh_authorized_keys:
        (target / "root/.ssh/authorized_keys").unlink(missing_ok=True)
    # Identities the live session made for itself (in case a resume copied them, or the excludes missed one).
    for key in (target / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    for p in ("var/lib/systemd/random-seed", "var/lib/systemd/credential.secret"):
        (target / p).unlink(missing_ok=True)
    _set_root_password(target / "etc/shadow", plan.resolved.password_hash or "!")


def _set_root_password(shadow: Path, field: str) -> None:
    st = shadow.stat()
    lines = shadow.read_text().splitlines()
    found = False
    for i, line in enumerate(lines):
        parts = line.split(":")
        if parts[0] == "root" and len(parts) >= 2:
            parts[1] = field
            if len(parts) >= 3:
                parts[2] = str(int(time.time() // 86400))  # last change: today
            lines[i] = ":".join(parts)
            found = True
    if not found:
        raise InstallError(f"step settings: {shadow} has no root entry")
    _write(shadow, "\n".join(lines) + "\n", st.st_mode & 0o7777)
    os.chown(shadow, st.st_uid, st.st_gid)


def _efi_boot_file(esp: Path, name: str) -> Path | None:
    """EFI/BOOT/<name> on an ESP, matched as the firmware does (FAT names ignore case), or None."""
    d = esp / "EFI" / "BOOT"
    found = [p for p in d.iterdir() if p.name.lower() == name.lower()] if d.is_dir() else []
    return found[0] if found else None


def _shim(live_esp: Path) -> Path | None:
    """The boot medium's shim: its EFI/BOOT/BOOTX64.EFI when shim's second stage (grubx64.efi: systemd-boot) is
    beside it, as on the cloudbox image (Secure Boot); None for a medium that starts systemd-boot directly."""
    if _efi_boot_file(live_esp, "grubx64.efi") is None:
        return None
    return _efi_boot_file(live_esp, "BOOTX64.EFI")


def _boot_uefi(plan: InstallPlan, target: Path, live_esp: Path) -> None:
    # --root: bootctl takes systemd-boot from the installed tree and writes the node's own random seed. No
    # firmware boot entry (EFI variables untouched): the node boots through the removable-media path
    # EFI/BOOT/BOOTX64.EFI, which also works when the disk moves to another machine.
    _run(["bootctl", "install", f"--root={target}", "--esp-path=/efi", "--no-variables", "--no-pager",
          "--make-entry-directory=no", "--entry-token=literal:cloudbox"], "boot-uefi")
    # bootctl puts systemd-boot on the removable-media path, which Secure Boot firmware holding only Microsoft's keys
    # refuses (Debian signs it). The medium's shim (Microsoft-signed) goes back there; systemd-boot stays beside it as
    # shim's second stage, EFI/BOOT/grubx64.efi, copied from the medium with the rest of its ESP.
    shim = _shim(live_esp)
    if shim is not None:
        dest = _efi_boot_file(target / "efi", "BOOTX64.EFI") or target / "efi/EFI/BOOT/BOOTX64.EFI"
        shutil.copyfile(shim, dest)


def _boot_bios(plan: InstallPlan, target: Path, esp_dev: str, run: Path) -> None:
    fs_uuid = _run(["blkid", "-p", "-o", "value", "-s", "UUID", esp_dev], "boot-bios").strip()
    if not fs_uuid:
        raise InstallError(f"step boot-bios: {esp_dev} has no file system UUID")
    early = run / "grub-early.cfg"
    early.write_text(f"search --no-floppy --fs-uuid --set=root {fs_uuid}\nset prefix=($root)/grub\n")
    out = target / "efi/grub/i386-pc"
    out.mkdir(parents=True, exist_ok=True)
    _run(["grub-mkimage", "--directory", str(GRUB_DIR), "--config", str(early), "--prefix", "/grub",
          "--output", str(out / "core.img"), "--format", "i386-pc", *GRUB_MODULES], "boot-bios")
    shutil.copyfile(GRUB_DIR / "boot.img", out / "boot.img")
    setup = shutil.which("grub-bios-setup") or str(GRUB_DIR / "grub-bios-setup")
    _run([setup, "--directory", str(out), plan.disk.path], "boot-bios")


def _verify(plan: InstallPlan, target: Path, live_esp: Path) -> None:
    missing = [p for p in ("efi/EFI/BOOT/BOOTX64.EFI", "efi/EFI/systemd/systemd-bootx64.efi",
                           "efi/grub/grub.cfg", NODE_SETTINGS, "etc/hostname")
               if not (target / p).is_file()]
    shim = _shim(live_esp)
    if shim is not None:
        boot = _efi_boot_file(target / "efi", "BOOTX64.EFI")
        if boot is None or boot.read_bytes() != shim.read_bytes():
            missing.append("efi/EFI/BOOT/BOOTX64.EFI (the boot medium's shim)")
        if _efi_boot_file(target / "efi", "grubx64.efi") is None:
            missing.append("efi/EFI/BOOT/grubx64.efi (systemd-boot, shim's second stage)")
    for rel in plan.esp_overrides:
        p = target / "efi" / rel
        if not p.is_file() or p.read_text() != plan.esp_overrides[rel]:
            missing.append(f"efi/{rel} (as planned)")
    if missing:
        raise InstallError(f"step verify: missing on {plan.disk.path}: {', '.join(missing)}")
    with open(plan.disk.path, "rb") as f:
        mbr = f.read(512)
    if mbr[510:512] != b"\x55\xaa" or b"GRUB" not in mbr:
        raise InstallError(f"step verify: {plan.disk.path}'s MBR holds no grub boot code")
