"""What both installer front ends (the line-based `cloudbox install` and the full-screen one) do besides checking,
planning and writing: probe this machine as the test hooks say, hash a root password, reboot or power off at the end.

Test hooks (environment): CLOUDBOX_INSTALL_BY_ID_DIR replaces /dev/disk/by-id, CLOUDBOX_INSTALL_LOOP=1 lists loop
devices as disks.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from cloudbox.core.errors import InstallError
from cloudbox.core.install.disks import BY_ID_DIR
from cloudbox.core.install.machine import Machine


def probe_machine() -> Machine:
    """This machine's disks and NICs (Machine.probe), with the test hooks applied."""
    return Machine.probe(
        include_loop=os.environ.get("CLOUDBOX_INSTALL_LOOP") == "1",
        by_id_dir=os.environ.get("CLOUDBOX_INSTALL_BY_ID_DIR", BY_ID_DIR),
    )


def readiness_lines() -> list[str]:
    """What the readiness report says of this machine in a few lines (no disk is read): CPU virtualization, IOMMU,
    Secure Boot, memory, and each problem; `cloudbox host readiness` has the rest."""
    from cloudbox.core.views import readiness

    r = readiness.gather(fio_seconds=0, devices=[], link_seconds=None)  # no node before the install
    virt = {"vmx": "Intel VT-x", "svm": "AMD-V"}.get(r.virt_flag, "none shown")
    out = [f"this machine: {r.cpus} CPUs ({virt}), {r.memory_bytes / 1024**3:.1f} GiB, IOMMU {r.iommu}, "
           f"Secure Boot {r.secure_boot}"]
    out += [f"problem: {p}" for p in r.problems if not p.startswith("no such disk")]
    return out


def hash_password(password: str) -> str:
    """A root password as the answers' `root.password_hash` holds it (SHA-512 crypt, `openssl passwd -6`)."""
    r = subprocess.run(["openssl", "passwd", "-6", "-stdin"], input=password, capture_output=True, text=True)
    if r.returncode != 0:
        raise InstallError(f"openssl passwd failed: {r.stderr.strip()}")
    return r.stdout.strip()


def after_install(what: str, before: Callable[[], None] | None = None) -> str | None:
    """Reboot or power off as the answers' `after` says (`stay`: nothing), asking systemd without waiting; `before`
    runs right before it is asked. Returns why nothing was asked (not under systemd: the user does it by hand)."""
    if what == "stay":
        return None
    if Path("/proc/1/comm").read_text().strip() != "systemd":
        return f"not running under systemd; {what} by hand"
    if before is not None:
        before()
    subprocess.run(["systemctl", "--no-block", what], check=False)
    return None
