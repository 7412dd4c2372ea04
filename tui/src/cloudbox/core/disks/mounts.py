"""Mounts a run makes on this host: taking one down, lazily when it is busy."""

from __future__ import annotations

import subprocess

from ..errors import CloudboxError


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
