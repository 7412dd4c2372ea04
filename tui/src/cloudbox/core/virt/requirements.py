"""What this host must offer for a profile's newer paths, checked before a run makes anything and shown by a study
for a step it cannot run here: CPUs and NUMA nodes for its placement, huge pages for its RAM, the libvirt and QEMU
versions a path needs, the programs and devices that serve it (qemu-storage-daemon for vhost-user, virtiofsd,
/dev/vhost-net), and the IOMMU, spare NVMe controller or SR-IOV NIC a passthrough needs.

`host_problem(profile)` is the first reason this host cannot run `profile` on these grounds, or None; each check is
one small function of `CHECKS`, which a new path adds its own to. `host_versions()` is this host's libvirt and
QEMU, read once.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Callable

from ..disks import pcidev, vhostuser, virtiofs
from ..spec.iopaths import Placement
from ..spec.knobs import MAPPED_BUS, NVME_PCI, VHOST_USER, VIRTIOFS
from ..spec.profiles import Profile
from . import placement, sriov

Check = Callable[[Profile], str | None]
Version = tuple[int, int, int]

VHOST_NET = "/dev/vhost-net"
# What the appliance carries (docs/image.md), named in refusals so a lab knows where the path does run.
APPLIANCE = "the appliance: libvirt 11.3, QEMU 10.0"
# IOThread virtqueue mapping of a virtio-blk disk: QEMU 9.0's iothread-vq-mapping, libvirt 10.0's
# <driver><iothreads>.
MAPPING_NEEDS: dict[str, Version] = {"libvirt": (10, 0, 0), "qemu": (9, 0, 0)}


def _version(text: str) -> Version | None:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


@functools.cache
def host_versions() -> dict[str, Version | None]:
    """This host's libvirt (the library's version, which its daemon shares) and QEMU (qemu-system-x86_64
    --version); None for one that is missing."""
    out: dict[str, Version | None] = {}
    try:
        import libvirt

        n = libvirt.getVersion()
        out["libvirt"] = (n // 1000000, n // 1000 % 1000, n % 1000)
    except Exception:  # noqa: BLE001 - no binding, or a library that does not answer: unknown
        out["libvirt"] = None
    try:
        r = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True, timeout=10)
        out["qemu"] = _version(r.stdout.split("version", 1)[-1])
    except (OSError, subprocess.TimeoutExpired):
        out["qemu"] = None
    return out


def _shown(v: Version | None) -> str:
    return ".".join(map(str, v)) if v else "none"


def needs_versions(what: str, needs: dict[str, Version], have: dict[str, Version | None] | None = None) -> str | None:
    """Why `what` cannot run on this host's libvirt and QEMU (`have`, else host_versions()), or None."""
    have = host_versions() if have is None else have
    short = [k for k, v in needs.items() if have.get(k) is None or have[k] < v]  # type: ignore[operator]
    if not short:
        return None
    need = " and ".join(f"{k if k == 'libvirt' else 'QEMU'} {v[0]}.{v[1]}" for k, v in needs.items())
    got = " and ".join(f"{k if k == 'libvirt' else 'QEMU'} {_shown(have.get(k))}" for k in needs)
    return f"{what} needs {need}; this host has {got} ({APPLIANCE})"


def _placement(profile: Profile) -> str | None:
    if profile.placement == Placement():
        return None
    return placement.host_problem(profile.placement, profile.guest.vcpus, profile.guest.memory_mib)


def _iothread_mapping(profile: Profile) -> str | None:
    d = profile.disk
    if d.bus != MAPPED_BUS or d.iothreads < 2 or profile.guest.hypervisor != "kvm":
        return None
    return needs_versions(f"disk.iothreads = {d.iothreads} spreads the disk's {d.queues} queues over "
                          f"{d.iothreads} iothreads (IOThread virtqueue mapping), which", MAPPING_NEEDS)


def _vhost_user(profile: Profile) -> str | None:
    return vhostuser.problem() if profile.disk.backing == VHOST_USER else None


def _virtiofs(profile: Profile) -> str | None:
    return virtiofs.problem() if profile.disk.backing == VIRTIOFS else None


def _nvme_passthrough(profile: Profile) -> str | None:
    if profile.disk.backing != NVME_PCI:
        return None
    why = pcidev.iommu_problem()
    if why:
        return why
    if not pcidev.spare_controllers():
        return ("this host has no spare NVMe controller (none, or each one holds the running system, a mount or "
                "swap) to hand to the guest")
    return None


def _vhost_net(profile: Profile) -> str | None:
    n = profile.network
    if not n.vhost or profile.guest.hypervisor != "kvm" or os.path.exists(VHOST_NET):
        return None
    return (f"network.vhost = true moves the NIC's data path into the host kernel's vhost-net, and this host has "
            f"no {VHOST_NET} (module vhost_net, CONFIG_VHOST_NET)")


def _sriov(profile: Profile) -> str | None:
    if profile.network.attach != "sriov":
        return None
    why = pcidev.iommu_problem()
    if why:
        return f"a virtual function is handed to the guest by VFIO, and {why}"
    if not sriov.sriov_nics():
        return "this host has no NIC with SR-IOV virtual functions (sriov_totalvfs) to give the guest one of"
    return None


CHECKS: tuple[Check, ...] = (_placement, _iothread_mapping, _vhost_user, _virtiofs, _nvme_passthrough,
                             _vhost_net, _sriov)


def version_problem(profile: Profile) -> str | None:
    """Why this host's libvirt or QEMU cannot take `profile`'s domain XML (a path newer than they are), or None."""
    return _iothread_mapping(profile)


def host_problem(profile: Profile) -> str | None:
    """Why this host cannot run `profile`'s guest (a CPU, node, huge page, device or version it lacks), or None."""
    for check in CHECKS:
        why = check(profile)
        if why:
            return why
    return None
