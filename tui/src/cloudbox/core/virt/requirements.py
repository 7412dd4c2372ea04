"""What this host must offer for a profile's newer paths, checked before a run makes anything and shown by a study
for a step it cannot run here: CPUs and NUMA nodes for its placement, huge pages for its RAM, and the programs and
devices that serve a path (qemu-storage-daemon for vhost-user, /dev/vhost-net).

`host_problem(profile)` is the first reason this host cannot run `profile` on these grounds, or None; each check is
one small function of `CHECKS`, which a new path adds its own to.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..disks import vhostuser
from ..spec.iopaths import Placement
from ..spec.knobs import VHOST_USER
from ..spec.profiles import Profile
from . import placement

Check = Callable[[Profile], str | None]

VHOST_NET = "/dev/vhost-net"


def _placement(profile: Profile) -> str | None:
    if profile.placement == Placement():
        return None
    return placement.host_problem(profile.placement, profile.guest.vcpus, profile.guest.memory_mib)


def _vhost_user(profile: Profile) -> str | None:
    return vhostuser.problem() if profile.disk.backing == VHOST_USER else None


def _vhost_net(profile: Profile) -> str | None:
    n = profile.network
    if not n.vhost or profile.guest.hypervisor != "kvm" or os.path.exists(VHOST_NET):
        return None
    return (f"network.vhost = true moves the NIC's data path into the host kernel's vhost-net, and this host has "
            f"no {VHOST_NET} (module vhost_net, CONFIG_VHOST_NET)")


CHECKS: tuple[Check, ...] = (_placement, _vhost_user, _vhost_net)


def host_problem(profile: Profile) -> str | None:
    """Why this host cannot run `profile`'s guest (a CPU, node, huge page or device it lacks), or None."""
    for check in CHECKS:
        why = check(profile)
        if why:
            return why
    return None
