"""A virtiofs share's guest side (disk.backing = virtiofs): the run's directory, which libvirt's virtiofsd serves
(core.virt.domain writes the <filesystem>), mounted in the benchmark guest by its tag, its tests run on a file in
it, then unmounted. `problem()` says why this host cannot serve one."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import CloudboxError

TAG = "cloudbox"  # the share's tag in the domain, which the guest mounts
MOUNT_POINT = "/mnt/cloudbox-share"
TEST_FILE = "cloudbox-test.dat"
MOUNT_TIMEOUT_S = 60.0
# Where libvirt finds virtiofsd: the vhost-user descriptors QEMU's packaging installs (type "fs"), as for firmware.
DESCRIPTOR_DIRS = (Path("/etc/qemu/vhost-user"), Path("/usr/share/qemu/vhost-user"))


def _serves_fs(descriptor: Path) -> bool:
    """The descriptor names a virtiofsd (type fs) that is installed."""
    try:
        d = json.loads(descriptor.read_text())
        return d.get("type") == "fs" and Path(d.get("binary", "")).is_file()
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def problem(dirs: tuple[Path, ...] = DESCRIPTOR_DIRS) -> str | None:
    """Why this host cannot serve a virtiofs share (libvirt finds no virtiofsd), or None."""
    if any(_serves_fs(f) for d in dirs if d.is_dir() for f in sorted(d.glob("*.json"))):
        return None
    return ("disk.backing = virtiofs is served by virtiofsd, which libvirt finds by its vhost-user descriptor "
            f"(type fs, in {' or '.join(map(str, dirs))}), and this host has none (Debian: package virtiofsd)")


def test_file() -> str:
    """The file the guest's tests run on, in the share."""
    return f"{MOUNT_POINT}/{TEST_FILE}"


def mount_in_guest(guest) -> str:  # type: ignore[no-untyped-def]
    """The share mounted in the guest (its virtiofs module loaded); returns its /proc/mounts line."""
    p = guest.sh(f"modprobe virtiofs; mkdir -p {MOUNT_POINT} && mount -t virtiofs {TAG} {MOUNT_POINT} </dev/null 2>&1",
                 timeout=MOUNT_TIMEOUT_S)
    if p.exitcode != 0:
        said = guest.sh("dmesg | grep -i -E 'virtio|fuse' | tail -n 4", timeout=30).stdout.strip()
        raise CloudboxError(f"the guest could not mount the virtiofs share {TAG} (exit {p.exitcode}): "
                            f"{(p.stdout + p.stderr).strip()[-300:]}" + (f"; its kernel said: {said}" if said else ""))
    return guest.sh(f"grep ' {MOUNT_POINT} ' /proc/mounts", timeout=30).stdout.strip()


def unmount_in_guest(guest) -> None:  # type: ignore[no-untyped-def]
    """The guest's test file removed and the share unmounted."""
    guest.sh(f"rm -f {test_file()}; umount {MOUNT_POINT}", timeout=MOUNT_TIMEOUT_S, check=True)
