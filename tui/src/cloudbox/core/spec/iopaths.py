"""The knobs of today's I/O paths: where the guest runs on the host ([placement]: pinning, NUMA-local memory, huge
pages, the guest's own NUMA nodes), the newer disk paths (vhost-user-blk, the host's NVMe controller handed
over whole, a virtiofs share), and the NIC's (macvtap, an SR-IOV virtual function), with their rules.

`Placement` is the table (a profile holds one, core.spec.profiles); `PATH_RULES` are the rules between these knobs
and the others, one small function each, in the style of core.spec.knobs.RULES, every one naming the key it
refuses, the value, why and what is allowed; `path_problems` applies them all, after knobs.cross_field_problems.
`shared_memory` is what a disk path implies for the guest's RAM.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Literal, Protocol

from pydantic import AfterValidator, Field

from cloudbox.core.errors import ProfileProblem

from .knobs import (
    MAPPED_BUS,
    NVME_BUS,
    NVME_PCI,
    VHOST_USER,
    VIRTIOFS,
    Backing,
    Bus,
    Disk,
    NicModel,
    Tables,
    _cpu_list,
    _default,
    _most,
    _values,
    cpu_sequence,
)
from .schema import Strict

# Huge pages backing the guest's RAM (placement.hugepages): none (the host's 4 KiB pages), 2 MiB or 1 GiB pages, which
# the run reserves on the host for itself and releases after.
HugePages = Literal["none", "2M", "1G"]


# How the guest's RAM is bound to the host's NUMA nodes (placement.memory_mode): only those nodes (strict), those
# first (preferred), or spread over them page by page (interleave).
MemoryMode = Literal["strict", "preferred", "interleave"]


AUTO = "auto"  # a placement chosen on the host at run time: one NUMA node's CPUs, or the node the vCPUs run on


HUGEPAGE_MIB: dict[str, int] = {"2M": 2, "1G": 1024}


MAX_GUEST_NODES = 8


def _pin(v: str) -> str:
    """A pinning: empty (the scheduler places it), auto (chosen at run time) or a list of host CPUs."""
    return v if v == AUTO else _cpu_list(v)


def _nodes(v: str) -> str:
    """Host NUMA nodes: empty (the kernel places the RAM), auto (the vCPUs' node) or a list of nodes."""
    return v if v == AUTO else _cpu_list(v, "NUMA node")


class Placement(Strict):
    """Where the guest runs on the host (QEMU/KVM): its vCPUs, QEMU's own threads and its iothreads pinned to host
    CPUs, its RAM bound to host NUMA nodes and backed by huge pages, and the NUMA nodes the guest itself sees."""

    vcpu_pin: Annotated[str, Field(max_length=200), AfterValidator(_pin)] = ""  # vCPU i on the i-th CPU
    emulator_pin: Annotated[str, Field(max_length=200), AfterValidator(_pin)] = ""  # QEMU's main loop and I/O
    iothread_pin: Annotated[str, Field(max_length=200), AfterValidator(_pin)] = ""  # the disk's iothreads
    memory_nodes: Annotated[str, Field(max_length=200), AfterValidator(_nodes)] = ""  # host NUMA nodes for the RAM
    memory_mode: MemoryMode = "strict"
    hugepages: HugePages = "none"
    guest_nodes: Annotated[int, Field(ge=1, le=MAX_GUEST_NODES)] = 1  # the guest's NUMA nodes, its vCPUs spread


def shared_memory(disk: Disk) -> bool:
    """The guest's RAM must be shared memory another process maps: a vhost-user device's daemon, or virtiofsd."""
    return disk.backing in (VHOST_USER, VIRTIOFS)


# disk.cache -> virtiofsd's cache policy for a virtiofs share (libvirt's <binary><cache mode>): none keeps the
# guest's page cache off the host's files (every read goes to virtiofsd), auto revalidates on open, always trusts it.
VIRTIOFS_CACHE: dict[str, str] = {"none": "none", "directsync": "none", "writethrough": "auto", "writeback": "always",
                                  "unsafe": "always"}


def _qemu_backing(backing: str, why: str, *not_on_xen: str) -> Callable[[PathRule], PathRule]:
    """A rule of disk.backing = `backing` alone, a path of QEMU's (`why`): nothing for another backing; under Xen,
    the backing refused (the allowed ones less `not_on_xen`); else the rule's own problem."""
    def wrap(rule: PathRule) -> PathRule:
        @functools.wraps(rule)
        def checked(p: PathTables) -> ProfileProblem | None:
            if p.disk.backing != backing:
                return None
            if p.guest.hypervisor != "kvm":
                return ProfileProblem("disk.backing", backing, why,
                                      f"{_values(Backing, *not_on_xen)} (with guest.hypervisor = xen)")
            return rule(p)
        return checked
    return wrap


@_qemu_backing(VHOST_USER, "a vhost-user device is QEMU's: libxl (Xen) has none", VHOST_USER, "network-volume")
def _vhost_user(p: PathTables) -> ProfileProblem | None:
    d = p.disk
    if d.bus != MAPPED_BUS:
        return ProfileProblem("disk.bus", d.bus, "qemu-storage-daemon serves the disk as vhost-user-blk, which the "
                              f"guest sees as a {MAPPED_BUS} device", f"{MAPPED_BUS} (with disk.backing = "
                              f"{VHOST_USER})")
    if d.count > 1 or d.raid != "none":
        return ProfileProblem("disk.count", d.count, "one qemu-storage-daemon export serves the one disk",
                              f"1 (with disk.backing = {VHOST_USER})")
    if d.iothreads > 1:
        return ProfileProblem("disk.iothreads", d.iothreads, "the disk's requests are served by qemu-storage-daemon: "
                              "this is its iothread (0: its main loop)", f"0..1 (with disk.backing = {VHOST_USER})")
    return None


def _nvme_pci(p: PathTables) -> ProfileProblem | None:
    d = p.disk
    if d.bus == NVME_BUS and d.backing != NVME_PCI:
        return ProfileProblem("disk.bus", d.bus, "QEMU's emulated NVMe controller is a libvirt disk bus from libvirt "
                              "11.5 on, newer than the appliance's 11.3: cloudbox gives bus nvme only to the host's "
                              "own controller", f"{_values(Bus, NVME_BUS)} (with disk.backing = {d.backing}); nvme "
                              f"needs disk.backing = {NVME_PCI}")
    if d.backing != NVME_PCI:
        return None
    if d.bus != NVME_BUS:
        return ProfileProblem("disk.bus", d.bus, "the guest gets the host's NVMe controller itself, which it sees "
                              "as an NVMe disk", f"{NVME_BUS} (with disk.backing = {NVME_PCI})")
    if d.cache != "none":
        return ProfileProblem("disk.cache", d.cache, "the controller does DMA straight into the guest's memory: no "
                              "host cache is in the path, and the profile must say so",
                              f"none (with disk.backing = {NVME_PCI})")
    if d.count > 1 or d.raid != "none":
        return ProfileProblem("disk.count", d.count, "one controller is named (--device)",
                              f"1 (with disk.backing = {NVME_PCI})")
    return None


@_qemu_backing(VIRTIOFS, "virtiofs is QEMU's (virtiofsd); libxl (Xen) has none", VIRTIOFS, VHOST_USER, NVME_PCI)
def _virtiofs(p: PathTables) -> ProfileProblem | None:
    d = p.disk
    if d.count > 1 or d.raid != "none":
        return ProfileProblem("disk.count", d.count, "the guest mounts one share and its tests run on a file in it",
                              f"1 (with disk.backing = {VIRTIOFS})")
    if d.bus != MAPPED_BUS:
        return ProfileProblem("disk.bus", d.bus, "a virtiofs share is no disk; profiles keep virtio-blk there, unused",
                              f"{MAPPED_BUS} (with disk.backing = {VIRTIOFS})")
    for key in ("iothreads", "queues"):
        if getattr(d, key) != _default(Disk, key):
            return ProfileProblem(f"disk.{key}", getattr(d, key), f"a virtiofs share is served by virtiofsd, with no "
                                  f"disk {key} of QEMU's", f"{_default(Disk, key)} (with disk.backing = {VIRTIOFS})")
    return None


def _placement_on_xen(p: PathTables) -> ProfileProblem | None:
    if p.guest.hypervisor != "xen" or p.placement == Placement():
        return None
    key = next(k for k in Placement.model_fields if getattr(p.placement, k) != _default(Placement, k))
    return ProfileProblem(f"placement.{key}", getattr(p.placement, key), "the [placement] table is applied through "
                          "libvirt's QEMU/KVM driver; under Xen, dom0's CPUs and memory are the [dom0] table's",
                          f"{_default(Placement, key)!r} (leave [placement] out with guest.hypervisor = xen)")


def _vcpu_pin_count(p: PathTables) -> ProfileProblem | None:
    pin, vcpus = p.placement.vcpu_pin, p.guest.vcpus
    if pin in ("", AUTO) or len(cpu_sequence(pin)) >= vcpus:
        return None
    return ProfileProblem("placement.vcpu_pin", pin, f"each vCPU is pinned to a host CPU of its own, in order: "
                          f"{vcpus} vCPUs need {vcpus} CPUs and the list names {len(cpu_sequence(pin))}",
                          f"a list of at least {vcpus} host CPUs (guest.vcpus = {vcpus}), auto, or empty")


def _iothread_pin_without_iothreads(p: PathTables) -> ProfileProblem | None:
    pin = p.placement.iothread_pin
    if not pin or p.disk.iothreads > 0:
        return None
    return ProfileProblem("placement.iothread_pin", pin, "the guest has no iothreads to pin (disk.iothreads = 0)",
                          "empty (with disk.iothreads = 0); a pinning needs disk.iothreads 1.."
                          f"{_most(Disk, 'iothreads')}")


def _memory_nodes(p: PathTables) -> ProfileProblem | None:
    pl = p.placement
    if pl.memory_nodes == AUTO and not pl.vcpu_pin:
        return ProfileProblem("placement.memory_nodes", pl.memory_nodes, "auto binds the RAM to the NUMA node the "
                              "vCPUs are pinned to, and they are not pinned (placement.vcpu_pin is empty)",
                              "host NUMA nodes as a list, e.g. 0 or 0-1, or empty; auto needs placement.vcpu_pin")
    if pl.memory_mode != _default(Placement, "memory_mode") and not pl.memory_nodes:
        return ProfileProblem("placement.memory_mode", pl.memory_mode, "a memory mode binds the RAM to "
                              "placement.memory_nodes, and none are named", f"{_default(Placement, 'memory_mode')} "
                              "(with placement.memory_nodes empty); set memory_nodes to auto or a list of nodes")
    return None


def _guest_nodes(p: PathTables) -> ProfileProblem | None:
    n, vcpus = p.placement.guest_nodes, p.guest.vcpus
    if n > 1 and vcpus % n:
        return ProfileProblem("placement.guest_nodes", n, f"the guest's vCPUs are spread evenly over its NUMA nodes: "
                              f"{vcpus} vCPUs do not divide into {n} nodes",
                              f"1 or a divisor of guest.vcpus = {vcpus}, at most {MAX_GUEST_NODES}")
    return None


def _hugepage_multiple(p: PathTables) -> ProfileProblem | None:
    pl, mib = p.placement, p.guest.memory_mib
    page = HUGEPAGE_MIB.get(pl.hugepages, 0)
    unit = max(page, 1) * pl.guest_nodes  # each guest node's share of the RAM is whole pages
    if mib % unit == 0:
        return None
    per_node = f" in {pl.guest_nodes} guest nodes of whole pages" if pl.guest_nodes > 1 else ""
    if not page:  # 4 KiB pages: only the guest nodes' split must come out in whole MiB
        return ProfileProblem("guest.memory_mib", mib, f"the guest's RAM is split evenly over its "
                              f"{pl.guest_nodes} NUMA nodes in whole MiB", f"a multiple of {unit} MiB "
                              f"(placement.guest_nodes = {pl.guest_nodes})")
    return ProfileProblem("guest.memory_mib", mib, f"the guest's RAM is backed by {pl.hugepages} huge pages"
                          f"{per_node}: {mib} MiB is not a multiple of {unit} MiB",
                          f"a multiple of {unit} MiB (placement.hugepages = {pl.hugepages}"
                          + (f", guest_nodes = {pl.guest_nodes})" if pl.guest_nodes > 1 else ")"))


SRIOV_MODEL = "vf"  # network.model of an SR-IOV NIC's virtual function: the guest drives the VF itself


def _nic_attach(p: PathTables) -> ProfileProblem | None:
    n, g = p.network, p.guest
    if n.attach != "bridge" and g.hypervisor != "kvm":
        return ProfileProblem("network.attach", n.attach, "a macvtap or a VF is handed to the guest through "
                              "libvirt's QEMU/KVM driver here", f"bridge (with guest.hypervisor = {g.hypervisor})")
    if n.attach == "sriov" and n.model != SRIOV_MODEL:
        return ProfileProblem("network.model", n.model, "with SR-IOV the guest drives the NIC's virtual function "
                              "itself: no emulated or paravirtual model is in the path, and the profile must say so",
                              f"{SRIOV_MODEL} (with network.attach = sriov)")
    if n.model == SRIOV_MODEL and n.attach != "sriov":
        return ProfileProblem("network.model", n.model, "a virtual function is an SR-IOV NIC's",
                              f"{_values(NicModel, SRIOV_MODEL, 'xen-netfront')} (with network.attach = {n.attach}); "
                              "vf needs network.attach = sriov")
    if n.attach == "sriov" and (n.vhost or n.queues > 1):
        key, value = ("network.vhost", n.vhost) if n.vhost else ("network.queues", n.queues)
        return ProfileProblem(key, value, "vhost-net and virtio queues are virtio-net's; the VF has its own queues",
                              f"{_default(type(n), key.split('.')[1])!r} (with network.attach = sriov)")
    return None


class PathTables(Tables, Protocol):
    """What these rules read: a profile's tables, [placement] included (core.spec.profiles.Profile is one)."""

    @property
    def placement(self) -> Placement: ...


PathRule = Callable[[PathTables], ProfileProblem | None]

# After core.spec.knobs.RULES: the disk paths, the NIC's, then the placement.
PATH_RULES: tuple[PathRule, ...] = (
    _vhost_user, _nvme_pci, _virtiofs, _nic_attach, _placement_on_xen, _vcpu_pin_count, _iothread_pin_without_iothreads,
    _memory_nodes, _guest_nodes, _hugepage_multiple,
)


def path_problems(p: PathTables) -> list[ProfileProblem]:
    """The newer paths' and the placement's impossible combinations, one problem per offending key (PATH_RULES in
    order)."""
    return [problem for rule in PATH_RULES if (problem := rule(p)) is not None]
