"""Mounts a run makes on this host: taking one down, lazily when it is busy; and the ledger's record of one."""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from .. import ledger
from ..errors import CloudboxError

UMOUNT_TIMEOUT_S = 60.0  # an NFS server that stopped answering: then lazily


def umount(mnt: str, timeout: float | None = None) -> None:
    """Unmount `mnt` (a loop device mount detaches its loop device); lazily if something still holds it, or if the
    plain unmount takes over `timeout` seconds (an NFS server that stopped answering)."""
    try:
        done = subprocess.run(["umount", mnt], capture_output=True, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        done = False
    if not done:
        r = subprocess.run(["umount", "-l", mnt], capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise CloudboxError(f"cannot unmount {mnt}: {r.stderr.strip()[-200:]}")


def mounted(mnt: str, mounts: str = "/proc/self/mountinfo") -> bool:
    """Something is mounted on `mnt` (field 5 of mountinfo; its spaces escaped as the kernel writes them)."""
    want = mnt.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")
    try:
        return any(ln.split()[4:5] == [want] for ln in Path(mounts).read_text().splitlines())
    except OSError:
        return False


@ledger.kind
@dataclass(frozen=True)
class Mount(ledger.Held):
    """A mount the run made (an NFS export's on this host, Bonnie++'s file system): unmounted (lazily when busy or
    when its server is gone) and its mount point removed when empty. A loop device the mount made goes with it."""

    kind: ClassVar[str] = "mount"
    path: str = ""
    source: str = ""

    def release(self) -> str:
        what = ""
        if mounted(self.path):
            umount(self.path, timeout=UMOUNT_TIMEOUT_S)
            what = f"unmounted {self.source or 'the mount'} from {self.path}"
        with contextlib.suppress(OSError):
            os.rmdir(self.path)
        return what
