"""What a run needs that can be checked without a guest, checked before the run is recorded: the places it names
(each node enrolled and up), the device it names (there and safe to write), the hypervisor its profiles need (the
boot this host is on), the volumes they use (there, free, large enough), the space its work directory needs, and
the memory and CPUs its guests need. `cloudbox run` (foreground or detached), the TUI and every `--dry-run` call
`problems` or `check` first, so a refused command leaves no run behind.

Only this host's part is checked here; a node checks its own (device, hypervisor, space) when its run starts.
"""

from __future__ import annotations

from .. import inputs, paths
from ..cluster import health, registry
from ..disks import backing, pcidev
from ..disks.volumes import attach
from ..errors import CloudboxError, DeviceRefused, UsageError
from ..spec.catalogue import JOB_TOOLS, resolve_tests
from ..spec.profiles import Profile, xen_guest_type
from ..spec.runspec import LOCAL_PLACE, RunSpec, jobs_on_private_network, parse_size
from ..virt import accel
from .multi import run_profiles
from .repeated import repeat_problem


class Refused(CloudboxError):
    """A check a run failed before anything was made or recorded; `usage` when it was the command's input (an
    unknown node, a device that is not there) rather than the system's state (a node down, no space)."""

    def __init__(self, message: str, *, usage: bool = False):
        super().__init__(message)
        self.usage = usage


def _nodes(spec: RunSpec) -> list[str]:
    return [p for p in spec.places if p != LOCAL_PLACE]


def _here(spec: RunSpec) -> bool:
    """Whether a part of the run's guests runs on this host."""
    return not spec.places or LOCAL_PLACE in spec.places


def node_problems(spec: RunSpec, *, reachable: bool = True) -> list[Refused]:
    """Each node the run names: enrolled here, and (`reachable`) its libvirt answering over the pinned SSH."""
    names = _nodes(spec)
    if not names:
        return []
    out: list[Refused] = []
    with registry.Registry() as reg:
        known = {n.name: n for n in reg.nodes()}
    for name in names:
        node = known.get(name)
        if node is None:
            out.append(Refused(f"--node {name!r}: no such node{inputs.did_you_mean(name, known)}; allowed: "
                               f"{', '.join(sorted(known)) or 'none enrolled (cloudbox node code, then node join)'}"
                               + (f", or {LOCAL_PLACE} for this host" if spec.guests > 1 else ""), usage=True))
        elif reachable:
            h = health.check_node(node)
            if h.state != "up":
                out.append(Refused(f"node {name} is down: {h.reason}"))
    return out


def device_problem(spec: RunSpec) -> Refused | None:
    """The device the run names, on this host: a block device (or an NVMe controller's PCI address), not in use,
    confirmed when it holds data."""
    if not spec.device or not _here(spec) or spec.node and not spec.spread:
        return None
    try:
        if pcidev.is_pci_address(spec.device):  # a whole NVMe controller (disk.backing = nvme-pci)
            pcidev.check(spec.device, confirm=spec.destroy or None)
            return None
        backing.check_device(spec.device, confirm=spec.destroy or None)
    except DeviceRefused as e:
        return Refused(str(e), usage="no such device" in str(e) or "not a block device" in str(e))
    return None


def profile_problems(spec: RunSpec, mix: list[Profile]) -> list[Refused]:
    """Each profile of the run on this host: its hypervisor is the one this host booted, its Xen guest type runs
    here, its volume is there and free; then the work directory's free space for the stores."""
    if not _here(spec) or (spec.node and not spec.spread):
        return []
    out: list[Refused] = []
    on_xen = accel.booted_into_xen()
    size, _ = parse_size(spec.size, max(p.guest.memory_mib for p in mix))
    for prof in dict.fromkeys(mix):
        why = accel.hypervisor_mismatch(prof.name, prof.guest.hypervisor, on_xen)
        if not why and on_xen and xen_guest_type(prof) in accel.HVM_CLASS:
            why = accel.xen_type_refusal(prof.name, xen_guest_type(prof), accel.xen_hvm())
        if why:
            out.append(Refused(why))
            continue
        if spec.repeated and (why := repeat_problem(prof)):
            out.append(Refused(why, usage=True))
            continue
        d = prof.disk
        if d.backing == "network-volume" and spec.wants_storage and not spec.volume_uri and not spec.nfs_host:
            try:
                attach.preflight(d.volume, d.attach, size, hypervisor=prof.guest.hypervisor)
            except CloudboxError as e:
                out.append(Refused(str(e), usage=isinstance(e, UsageError)))
        elif d.backing != "network-volume" and spec.wants_storage and not spec.propagation:
            need, what = backing.space_needed(d.backing, size, device=spec.device or None, count=d.count)
            need *= spec.guests if not spec.spread else 1
            where, free = backing.free_bytes_at(paths.work_base(spec.work_dir))
            if need and free < need + backing.MARGIN:
                out.append(Refused(
                    f"{where}: not enough free space for the {what} of profile {prof.name}: need "
                    f"{backing.human_size(need + backing.MARGIN)} ({backing.human_size(need)} + "
                    f"{backing.human_size(backing.MARGIN)} margin), {backing.human_size(free)} free; allowed: a "
                    "smaller --size, or a --work-dir with more free space"))
    return out


def private_network_problem(spec: RunSpec, mix: list[Profile]) -> Refused | None:
    """A job across guests (MPI, fio's client/server) on a node whose guests would sit on the private network:
    refused here, before the run is recorded (the node refuses the request too)."""
    if not spec.node or spec.spread or not spec.wants_links:
        return None
    if spec.wants_network or any(p.disk.backing == "network-volume" for p in mix):
        jobs = [t.id for t in resolve_tests(spec.storage_tests) if t.tool in JOB_TOOLS]
        return Refused(jobs_on_private_network(jobs), usage=True)
    return None


def problems(spec: RunSpec, *, reachable: bool = True) -> list[Refused]:
    """Every reason the run cannot start here, without making anything: the spec's own checks and the guests' fit
    first (a UsageError is raised as it always was), then the places, the device and the profiles."""
    spec.validate()
    mix = run_profiles(spec)
    out = node_problems(spec, reachable=reachable)
    if (jobs := private_network_problem(spec, mix)) is not None:
        out.append(jobs)
    if (dev := device_problem(spec)) is not None:
        out.append(dev)
    out += profile_problems(spec, mix)
    return out


def check(spec: RunSpec) -> None:
    """Raise the first reason the run cannot start (a UsageError for bad input), before it is recorded."""
    found = problems(spec)
    if found:
        first = found[0]
        raise UsageError(str(first)) if first.usage else first
