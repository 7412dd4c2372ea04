"""What this host must offer for a profile's newer paths, checked before a run makes anything and shown by a study
for a step it cannot run here: CPUs and NUMA nodes for its placement, huge pages for its RAM, and the programs that
serve a path (qemu-storage-daemon for vhost-user).

`host_problem(profile)` is the first reason this host cannot run `profile` on these grounds, or None; each check is
one small function of `CHECKS`, which a new path adds its own to.
"""

from __future__ import annotations

from collections.abc import Callable

from ..disks import vhostuser
from ..spec.iopaths import Placement
from ..spec.knobs import VHOST_USER
from ..spec.profiles import Profile
from . import placement

Check = Callable[[Profile], str | None]

def _placement(profile: Profile) -> str | None:
    if profile.placement == Placement():
        return None
    return placement.host_problem(profile.placement, profile.guest.vcpus, profile.guest.memory_mib)


def _vhost_user(profile: Profile) -> str | None:
    return vhostuser.problem() if profile.disk.backing == VHOST_USER else None


CHECKS: tuple[Check, ...] = (_placement, _vhost_user)


def host_problem(profile: Profile) -> str | None:
    """Why this host cannot run `profile`'s guest (a CPU, node, huge page or program it lacks), or None."""
    for check in CHECKS:
        why = check(profile)
        if why:
            return why
    return None
