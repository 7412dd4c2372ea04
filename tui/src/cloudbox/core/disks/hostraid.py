"""RAID 0 on the host (disk.raid_on = "host"): mdadm builds one md array over a run's loop devices, the guest is
handed the array as its one disk and the bare-metal baseline runs on the same array, so the comparison is the
host's md array against itself. The array is built without superblocks (mdadm --build): nothing of it stays on the
members, and it is stopped before they are detached (the store's cleanup), after a failure or Ctrl-C too."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from .. import ledger
from ..errors import CloudboxError
from .backing import BackingStore
from .diskstats import read_counters
from .volumes.attach import kernel_module_available

MODULES = ("md_mod", "raid0")
FIRST_MINOR = 100  # cloudbox's arrays from md100 up: clear of the md0.. and md127.. that distributions assemble
MDSTAT = Path("/proc/mdstat")
SYS_BLOCK = Path("/sys/block")
DISKSTATS = "/proc/diskstats"


@dataclass
class HostArray:
    """The host's md array as built: its device, chunk, members (/dev/loopN) and /proc/mdstat then, and each
    member's sectors written when it was built (to count what went to each after)."""

    device: str
    chunk_kib: int
    members: list[str]
    mdstat: str
    sectors_at_build: dict[str, int]

    def sectors_written(self, diskstats: str = DISKSTATS) -> dict[str, int]:
        """Sectors written to each member since the array was built."""
        return {m: read_counters(m, diskstats).wsect - self.sectors_at_build.get(m, 0) for m in self.members}


def problem(has_module: Callable[[str], bool] | None = None) -> str:
    """Why this host cannot build a RAID 0 of its own ("" when it can)."""
    if shutil.which("mdadm") is None:
        return "mdadm is not installed (Debian package mdadm; the cloudbox appliance has it)"
    missing = [m for m in MODULES if not (has_module or kernel_module_available)(m)]
    if missing:
        return f"this kernel ({platform.release()}) has no {' or '.join(missing)} module (software RAID)"
    return ""


def free_device(sys_block: Path = SYS_BLOCK) -> str:
    """The first /dev/mdN from md100 up that no array uses."""
    taken = {int(m.group(1)) for p in sys_block.glob("md*") if (m := re.fullmatch(r"md(\d+)", p.name))}
    n = FIRST_MINOR
    while n in taken:
        n += 1
    return f"/dev/md{n}"


def build(store: BackingStore, chunk_kib: int) -> HostArray:
    """RAID 0 over the store's loop devices (its path and more_paths), checked in /proc/mdstat; the store then
    points at the array alone (the guest's one disk, the baseline's target) and stops it before its loops go."""
    members = [store.path, *store.more_paths]
    if not store.is_block or len(members) < 2 or not all(m.startswith("/dev/loop") for m in members):
        raise CloudboxError(f"a host RAID 0 is built over two or more loop devices of the run's; got {members}")
    device = free_device()
    # popped before the loops' entries: stopped first
    store._cleanup.append(ledger.hold(MdArray(device, tuple(Path(m).name for m in members))))
    argv = ["mdadm", "--build", device, "--level=0", f"--chunk={chunk_kib}", f"--raid-devices={len(members)}",
            *members]
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise CloudboxError(f"{' '.join(argv)} exited {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}")
    name = Path(device).name
    mdstat = MDSTAT.read_text()
    loops = [Path(m).name for m in members]
    found = mdstat_array(mdstat, name)
    if found != ("raid0", loops):
        raise CloudboxError(f"mdadm built {device}, but /proc/mdstat does not show it as raid0 over "
                            f"{', '.join(loops)}: {mdstat.strip()[-300:]}")
    store.path = store.baseline_target = device
    store.more_paths = []
    store.host_device = name
    store.model = f"{device}: the host's md RAID 0 ({chunk_kib} KiB chunks) over {store.model}"
    store.labels.append("host-raid0")
    return HostArray(device, chunk_kib, loops, mdstat, {m: read_counters(m).wsect for m in loops})


@ledger.kind
@dataclass(frozen=True)
class MdArray(ledger.Held):
    """The host's md array the run built over its loop devices: stopped when it is there over those same members."""

    kind: ClassVar[str] = "md-array"
    device: str = ""
    members: tuple[str, ...] = ()  # loopN names

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", tuple(self.members))  # a ledger's JSON gives a list

    def release(self) -> str:
        name = Path(self.device).name
        have = sorted(p.name.removeprefix("dev-") for p in (SYS_BLOCK / name / "md").glob("dev-*"))
        if not (SYS_BLOCK / name).exists() or have != sorted(self.members):
            return ""  # gone, or another array by now
        stop_md(self.device)
        if (SYS_BLOCK / name / "md" / "level").exists() and _active(name):
            raise CloudboxError(f"md array {self.device} could not be stopped (still open)")
        return f"stopped md array {self.device} ({', '.join(self.members)})"


def _active(name: str) -> bool:
    try:
        return (SYS_BLOCK / name / "md" / "array_state").read_text().strip() not in ("clear", "inactive")
    except OSError:
        return False


def stop_md(device: str, tries: int = 10) -> None:
    """Stop the md array `device`, again for a few seconds while something (udev's probe, a QEMU going away) still
    holds it open; its loops cannot be detached before."""
    for _ in range(tries):
        r = subprocess.run(["mdadm", "--stop", device], check=False, capture_output=True)
        if r.returncode == 0 or not Path("/sys/block", Path(device).name).exists():
            return
        time.sleep(0.5)


def _quiet(argv: list[str]) -> None:
    try:
        subprocess.run(argv, capture_output=True, check=False)
    except OSError:  # no mdadm: the loops are still detached
        pass


def reap(work_base: Path, live: set[str], sys_block: Path = SYS_BLOCK,
         run: Callable[[list[str]], None] = _quiet) -> list[str]:
    """Stop cloudbox's md arrays (md100 up) whose members are loop devices over files of a run that is not live
    (killed outright), and detach those loops; what was stopped or detached, for the log."""
    done = []
    for md in sorted(sys_block.glob("md*")):
        m = re.fullmatch(r"md(\d+)", md.name)
        if not m or int(m.group(1)) < FIRST_MINOR:
            continue
        loops = [p.name.removeprefix("dev-") for p in (md / "md").glob("dev-loop*")]
        files = [_backing_file(sys_block, loop) for loop in loops]
        if not loops or not all(_dead_runs(f, work_base, live) for f in files):
            continue
        run(["mdadm", "--stop", f"/dev/{md.name}"])
        done.append(f"md array /dev/{md.name}")
        for loop in sorted(loops):
            run(["losetup", "-d", f"/dev/{loop}"])
            done.append(f"loop device /dev/{loop}")
    return done


def _backing_file(sys_block: Path, loop: str) -> str:
    try:
        return (sys_block / loop / "loop" / "backing_file").read_text().strip().removesuffix(" (deleted)")
    except OSError:
        return ""


def _dead_runs(path: str, work_base: Path, live: set[str]) -> bool:
    """`path` is in a run's work directory (work_base/run-<uuid[:12]>/...) of a run not in `live`."""
    try:
        rel = Path(path).relative_to(work_base)
    except ValueError:
        return False
    run = rel.parts[0] if rel.parts else ""
    return run.startswith("run-") and not any(run == f"run-{u[:12]}" for u in live)


def mdstat_array(text: str, device: str = "/dev/md0") -> tuple[str, list[str]] | None:
    """(personality, member names) of `device` in /proc/mdstat text ("md0 : active raid0 vdc[2] vdb[1] vda[0]"),
    members in role order; None when the array is not there or not active."""
    name = device.rsplit("/", 1)[-1]
    m = re.search(rf"^{re.escape(name)} : active (\S+) (.*)$", text, re.M)
    if not m:
        return None
    members = sorted(((int(r), n) for n, r in re.findall(r"(\w+)\[(\d+)\]", m[2])))
    return m[1], [n for _, n in members]
