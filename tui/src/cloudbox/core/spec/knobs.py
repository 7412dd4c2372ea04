"""The tuning knobs a profile sets: their values, the tables that hold them, what they imply, and the rules between
them.

The tables are pydantic models on schema.Strict (`Guest`, `Disk`, `Network`, `Dom0`, `Nfs`; a profile is one of
each with core.spec.iopaths' `Placement`, core.spec.profiles). `RULES` are the rules between knobs, one small
function each, every one naming
the key it refuses, the value, why, and what is allowed, spelled from the constants below; `cross_field_problems`
applies them all. `implied_xen_type`, `guest_type`, `guest_disks`, `is_nfs`, `xen_backend` and `xen_cache_mode` are what
a table's knobs imply.

Decisions worth knowing (see also the presets' comments):
- Xen (libxl) supports the disk buses xen-vbd (PV blkfront: the guest is a PV guest),
  ide and scsi-lsi (HVM, emulated by Xen's QEMU, which libxl starts with if=ide /
  if=scsi, the latter an LSI 53C895A). libvirt's libxl driver lists only ide, scsi and
  xen as disk buses, so virtio-blk, virtio-scsi and sata are refused with xen.
- libxl cannot choose the host cache or AIO mode: it hard-codes cache=writeback for
  emulated disks, blkback ("phy") bypasses dom0's page cache, and the qdisk backend
  for files uses QEMU's default (writeback). A Xen profile must state the mode libxl
  will really use, and io must be "threads", so results never claim a mode that was not
  in effect.
- guest.xen_type says how Xen runs the guest: pv, pvh (PV devices only, in a hardware-virtualized container: it
  needs VT-x/AMD-V, like hvm) or hvm; left at "auto" it follows the bus (xen-vbd: pv, ide/scsi-lsi: hvm), which
  is what every profile without the key meant. pv and pvh take bus xen-vbd and NIC xen-netfront only.
- Xen PV guests have no emulated NIC; libvirt's libxl driver accepts only the model
  netfront there. The schema therefore has one more NIC model than the studies'
  three: "xen-netfront" (Xen only; required with bus xen-vbd). virtio-net is refused
  with xen.
"""

from __future__ import annotations

import posixpath
import re
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal, Protocol

import annotated_types
from pydantic import AfterValidator, Field, model_validator

from cloudbox.core import inputs
from cloudbox.core.errors import ProfileProblem

from .schema import Strict, no_controls
from .schemes import SCHEMES, attached_by

Hypervisor = Literal["kvm", "xen"]
# How Xen runs the guest: "pv" (paravirtualized, no hardware virtualization), "pvh" (PV devices in a hardware-
# virtualized container, no emulated devices), "hvm" (emulated PC by Xen's QEMU); "auto" is what the disk bus
# implies (xen-vbd: pv, else hvm), the only value KVM takes.
XenType = Literal["auto", "pv", "pvh", "hvm"]
Bus = Literal["virtio-blk", "virtio-scsi", "scsi-lsi", "sata", "ide", "xen-vbd", "nvme"]
CacheMode = Literal["none", "writethrough", "writeback", "directsync", "unsafe"]
IoMode = Literal["native", "threads", "io_uring"]
Backing = Literal["sparse-file", "prealloc-file", "qcow2", "qcow2-prealloc", "block-device", "network-volume",
                  "vhost-user", "nvme-pci", "virtiofs"]
DiskFormat = Literal["raw", "qcow2"]
NicModel = Literal["e1000", "rtl8139", "virtio", "xen-netfront", "vf"]
# How the guest's NIC reaches the host (network.attach): a tap on the run's bridge, a macvtap on a link of the
# run's (libvirt's <interface type='direct'>), or a virtual function of the host's SR-IOV NIC handed over whole.
NicAttach = Literal["bridge", "macvtap", "sriov"]
RaidLevel = Literal["none", "0"]
RaidOn = Literal["guest", "host"]
Attach = Literal["host", "guest", "qemu"]
# Xen's backend for a guest's disk in dom0: blkback ("phy", the kernel's, on a block device) or qdisk (QEMU's, on a
# file or a device); "auto" picks phy for a block device and qdisk for a file, and is the only value KVM takes.
XenBackend = Literal["auto", "phy", "qdisk"]
# How the guest mounts an NFS export (disk.volume = nfs:<name>): the protocol version, the transport and whether the
# client writes through (mount -o sync: every WRITE stable on the server's disk before it returns) or not (async:
# unstable WRITEs, then COMMIT).
NfsVersion = Literal["4.0", "4.1", "4.2"]
NfsProto = Literal["tcp", "udp"]
NfsWrites = Literal["async", "sync"]

XEN_PV_BUS = "xen-vbd"  # Xen's PV block device: a PV guest's only bus
XEN_PV_NIC = "xen-netfront"  # Xen's PV NIC: a PV or PVH guest's only NIC
VIRTIO_BUSES: tuple[str, ...] = ("virtio-blk", "virtio-scsi")
MAPPED_BUS = "virtio-blk"  # the bus whose queues several iothreads share (IOThread virtqueue mapping)
VHOST_USER = "vhost-user"  # the backing qemu-storage-daemon serves as a vhost-user-blk device (a virtio-blk disk)
NVME_BUS = "nvme"  # the host's own NVMe controller handed over (NVME_PCI); QEMU's emulated one is not offered
NVME_PCI = "nvme-pci"  # the backing that is a whole NVMe controller of the host, passed through by VFIO
VIRTIOFS = "virtiofs"  # the backing that is a directory of the host the guest mounts (virtiofsd), not a disk
XEN_HVM_BUSES: tuple[str, ...] = ("ide", "scsi-lsi")  # emulated by Xen's QEMU: HVM guests only
XEN_BUSES: tuple[str, ...] = (XEN_PV_BUS, *XEN_HVM_BUSES)
KVM_BUSES: tuple[str, ...] = ("virtio-blk", "virtio-scsi", "scsi-lsi", "sata", "ide", "nvme")
QCOW2_BACKINGS: tuple[str, ...] = ("qcow2", "qcow2-prealloc")
VOLUME_SCHEMES: tuple[str, ...] = tuple(sorted(SCHEMES))
# Schemes QEMU itself can be the initiator of (its nbd and libiscsi block drivers); it has none for AoE or NVMe/TCP.
QEMU_SCHEMES: tuple[str, ...] = tuple(s.name for s in attached_by("qemu"))
PAGE_CACHE_FREE: tuple[str, ...] = ("none", "directsync")
MAX_DISKS = 8
# Disks a bus takes on one controller (the pc machine's IDE has two channels of two; ich9-ahci six ports; the LSI
# 53C895A seven targets); the rest take MAX_DISKS.
BUS_MAX_DISKS: dict[str, int] = {"ide": 4, "sata": 6, "scsi-lsi": 7}
RAID_CHUNK_DEFAULT_KIB = 512  # mdadm's own default
CHUNK_KIB = (4, 1024)  # a RAID chunk and an NFS read or write size: a power of two in this range (KiB)
DOM0_MIN_MIB = 512  # below this a Debian dom0 with libvirtd, QEMU and the tests risks the OOM killer
BLOCK_BACKINGS: tuple[str, ...] = ("block-device", "network-volume")  # the host hands the guest a block device


def volume_targets(schemes: Iterable[str], sep: str = ", ") -> str:
    """The volume forms of `schemes` as a problem lists them: "aoe:<target>, iscsi:<target>, ..."."""
    return sep.join(f"{s}:<target>" for s in schemes)


def _volume(v: str) -> str:
    no_controls(v)
    if v.startswith("/") and inputs.path_problem(v):
        raise ValueError(str(inputs.path_problem(v)))
    return v


def _chunk(v: int) -> int:
    lo, hi = CHUNK_KIB
    if v != 0 and (v < lo or v > hi or v & (v - 1)):
        raise ValueError(f"must be 0 or a power of two from {lo} to {hi}")
    return v


def _cpu_list(v: str, what: str = "CPU") -> str:
    if v and not re.fullmatch(r"\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?)*", v):
        raise ValueError(f"must be empty or a list of {what} numbers and ranges, e.g. 0, 0-1, 0,2")
    for part in filter(None, v.split(",")):
        lo, _, hi = part.partition("-")
        if hi and int(hi) < int(lo):
            raise ValueError(f"the range {part} runs backwards")
    return v


def cpu_list(v: str) -> list[int]:
    """The CPUs of a validated list such as "0,2-3": [0, 2, 3]."""
    out: list[int] = []
    for part in filter(None, v.split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return sorted(set(out))


def cpu_sequence(v: str) -> list[int]:
    """The CPUs of a validated list in the order written, each once: "3,1-2,1" -> [3, 1, 2]."""
    out: list[int] = []
    for part in filter(None, v.split(",")):
        lo, _, hi = part.partition("-")
        out += [c for c in range(int(lo), int(hi or lo) + 1) if c not in out]
    return out


def _dom0_memory(v: int) -> int:
    if v != 0 and not DOM0_MIN_MIB <= v <= 262144:
        raise ValueError(f"must be 0 or {DOM0_MIN_MIB}..262144")
    return v


class Guest(Strict):
    """The guest machine: which hypervisor runs it and how big it is."""

    hypervisor: Hypervisor
    xen_type: XenType = "auto"  # Xen only: pv, pvh or hvm; auto follows disk.bus
    vcpus: int = Field(1, ge=1, le=64)
    memory_mib: int = Field(1024, ge=256, le=262144)


class Disk(Strict):
    """The benchmark disk: how the guest sees it and what stores it on the host."""

    bus: Bus
    cache: CacheMode
    io: IoMode = "threads"
    iothreads: int = Field(0, ge=0, le=16)
    queues: int = Field(1, ge=1, le=16)
    backing: Backing
    format: DiskFormat = "raw"
    volume: Annotated[str, Field(max_length=4096, pattern=r"^[^\n\r]*$"), AfterValidator(_volume)] = ""
    count: int = Field(1, ge=1, le=MAX_DISKS)  # benchmark disks, each on its own backing store
    raid: RaidLevel = "none"  # "0": the disks striped with mdadm, the tests run on the array
    raid_on: RaidOn = "guest"  # who builds the RAID: the guest over its disks, or the host over its loop devices
    chunk_kib: Annotated[int, AfterValidator(_chunk)] = 0
    attach: Attach = "host"  # who attaches a network volume: the host's kernel, the guest's, or QEMU itself
    xen_backend: XenBackend = "auto"  # Xen only: blkback (phy) or QEMU's qdisk in dom0

    @model_validator(mode="before")
    @classmethod
    def _default_format(cls, data: Any) -> Any:
        # A qcow2 backing without an explicit format means format qcow2; an explicit
        # mismatch is still reported by the profile's cross-field checks.
        if isinstance(data, dict) and "format" not in data and data.get("backing") in QCOW2_BACKINGS:
            data = {**data, "format": "qcow2"}
        # A RAID without a chunk size (or 0) gets mdadm's default, so the stored profile says the chunk used.
        if isinstance(data, dict) and data.get("raid") == "0" and data.get("chunk_kib", 0) == 0:
            data = {**data, "chunk_kib": RAID_CHUNK_DEFAULT_KIB}
        return data


class Network(Strict):
    """The guest's NIC on the private bridge (or a macvtap, or a VF of the host's NIC: attach)."""

    model: NicModel
    vhost: bool = False
    queues: int = Field(1, ge=1, le=16)
    mtu: int = Field(1500, ge=1500, le=9000)
    attach: NicAttach = "bridge"


class Dom0(Strict):
    """Xen's control domain while the run lasts (Xen profiles only; restored after the run)."""

    vcpu_pin: Annotated[str, Field(max_length=200), AfterValidator(_cpu_list)] = ""  # xl vcpu-pin Domain-0 all
    memory_mib: Annotated[int, AfterValidator(_dom0_memory)] = 0  # xl mem-set Domain-0


class Nfs(Strict):
    """How the guest mounts the run's NFS export (disk.volume = nfs:<name>): its kernel client's mount options."""

    vers: NfsVersion = "4.2"
    proto: NfsProto = "tcp"
    writes: NfsWrites = "async"  # mount -o async|sync
    nconnect: Annotated[int, Field(ge=1, le=16)] = 1  # TCP connections to the server
    rsize_kib: Annotated[int, AfterValidator(_chunk)] = 0  # 0: what client and server agree on
    wsize_kib: Annotated[int, AfterValidator(_chunk)] = 0


def implied_xen_type(bus: str) -> str:
    """The Xen guest type a disk bus implies (guest.xen_type = auto): pv on Xen's PV bus, else hvm."""
    return "pv" if bus == XEN_PV_BUS else "hvm"


def guest_type(guest: Guest, disk: Disk) -> str:
    """How Xen runs a guest: "pv", "pvh" or "hvm" (guest.xen_type, "auto" resolved from the bus); "" under KVM."""
    if guest.hypervisor != "xen":
        return ""
    return implied_xen_type(disk.bus) if guest.xen_type == "auto" else guest.xen_type


def guest_disks(disk: Disk) -> int:
    """The benchmark disks the guest sees: disk.count, or one (the host's md array) with disk.raid_on = host."""
    return 1 if disk.raid_on == "host" else disk.count


def is_nfs(disk: Disk) -> bool:
    """The disk is an NFS export the guest mounts (disk.volume = nfs:<name>), not a block device."""
    return disk.backing == "network-volume" and disk.volume.startswith("nfs:")


def is_share(disk: Disk) -> bool:
    """The guest mounts a file system and its tests run on a file in it: an NFS export or a virtiofs share."""
    return is_nfs(disk) or disk.backing == VIRTIOFS


def xen_backend(disk: Disk) -> str:
    """The backend dom0 serves a Xen guest's disk with: "phy" (blkback) or "qdisk" (QEMU); "auto" resolved."""
    if disk.xen_backend != "auto":
        return disk.xen_backend
    return "phy" if disk.backing in BLOCK_BACKINGS else "qdisk"


def xen_cache_mode(bus: str, backing: str, backend: str = "auto") -> str:
    """The host cache mode libxl really uses for a Xen disk (it offers no choice)."""
    if backend == "auto":
        backend = "phy" if backing in BLOCK_BACKINGS else "qdisk"
    if bus == XEN_PV_BUS and backend == "phy":
        return "none"  # blkback ("phy") submits bios straight to the device: no dom0 page cache
    return "writeback"  # emulated disks (libxl passes cache=writeback) and qdisk (QEMU's default, no O_DIRECT)


# -- the rules between knobs -------------------------------------------------------------------------------------
class Tables(Protocol):
    """What the rules read: a profile's tables (core.spec.profiles.Profile is one)."""

    @property
    def guest(self) -> Guest: ...
    @property
    def disk(self) -> Disk: ...
    @property
    def network(self) -> Network: ...
    @property
    def dom0(self) -> Dom0: ...
    @property
    def nfs(self) -> Nfs: ...


Rule = Callable[[Tables], ProfileProblem | None]


def _values(kind: Any, *but: str, sep: str = ", ") -> str:
    """A Literal's values but some, as a problem lists them: "e1000, rtl8139, virtio"."""
    return sep.join(v for v in typing.get_args(kind) if v not in but)


def _either(values: Iterable[str]) -> str:
    return " or ".join(values)


def _default(table: type[Strict], key: str) -> Any:
    return table.model_fields[key].default


def _most(table: type[Strict], key: str) -> int:
    """The largest value a table's integer knob takes (its le bound)."""
    most: Any = next(m.le for m in table.model_fields[key].metadata if isinstance(m, annotated_types.Le))
    return int(most)


def _bus_of_hypervisor(p: Tables) -> ProfileProblem | None:
    g, d = p.guest, p.disk
    if g.hypervisor == "kvm" and d.bus not in KVM_BUSES:
        return ProfileProblem("disk.bus", d.bus, f"{XEN_PV_BUS} is Xen's PV block device; KVM cannot provide it",
                              f"{', '.join(KVM_BUSES)} (with guest.hypervisor = kvm)")
    if g.hypervisor == "xen" and d.bus not in XEN_BUSES:
        return ProfileProblem("disk.bus", d.bus, "libxl (Xen) does not offer this disk bus",
                              f"{', '.join(XEN_BUSES)} (with guest.hypervisor = xen)")
    return None


def _xen_type(p: Tables) -> ProfileProblem | None:
    g, d = p.guest, p.disk
    xen_type, auto = guest_type(g, d), _default(Guest, "xen_type")
    if g.hypervisor != "xen" and g.xen_type != auto:
        return ProfileProblem("guest.xen_type", g.xen_type, "the guest type (PV, PVH, HVM) is Xen's; a KVM guest is "
                              "always QEMU's hardware-virtualized PC", f"{auto} (with guest.hypervisor = kvm)")
    if xen_type in ("pv", "pvh") and d.bus in XEN_HVM_BUSES:
        return ProfileProblem("disk.bus", d.bus, f"a Xen {xen_type.upper()} guest has no emulated devices; {d.bus} is "
                              "emulated by Xen's QEMU for HVM guests only", f"{XEN_PV_BUS} (with guest.xen_type = "
                              f"{g.xen_type}); {d.bus} needs guest.xen_type = hvm or {auto}")
    if g.xen_type == "hvm" and d.bus == XEN_PV_BUS:
        return ProfileProblem("guest.xen_type", g.xen_type, "an HVM guest's disk is emulated (PV drivers on HVM are "
                              "not offered)", f"{_values(XenType, 'hvm')} (with disk.bus = {XEN_PV_BUS}); hvm needs "
                              f"disk.bus {_either(XEN_HVM_BUSES)}")
    return None


def _xen_backend(p: Tables) -> ProfileProblem | None:
    g, d = p.guest, p.disk
    auto = _default(Disk, "xen_backend")
    if g.hypervisor != "xen" and d.xen_backend != auto:
        return ProfileProblem("disk.xen_backend", d.xen_backend, "the disk backend is Xen's (blkback or qdisk in "
                              "dom0); KVM's disks are QEMU's, set by disk.bus, cache and io",
                              f"{auto} (with guest.hypervisor = kvm)")
    if g.hypervisor == "xen" and d.xen_backend == "phy" and d.backing not in BLOCK_BACKINGS:
        return ProfileProblem("disk.xen_backend", d.xen_backend, "blkback (phy) serves block devices only; libxl "
                              f"refuses it on backing {d.backing}, a file", f"qdisk, {auto} (with disk.backing = "
                              f"{d.backing}); phy needs backing {_either(BLOCK_BACKINGS)}")
    return None


def _xen_cache(p: Tables) -> ProfileProblem | None:
    d = p.disk
    if p.guest.hypervisor != "xen":
        return None
    backend = xen_backend(d)
    want = xen_cache_mode(d.bus, d.backing, backend)
    if d.cache == want:
        return None
    return ProfileProblem("disk.cache", d.cache, f"libxl has no cache setting; with bus {d.bus} on {d.backing} "
                          f"through {backend} it always uses {want}", f"{want} (with guest.hypervisor = xen, disk.bus "
                          f"= {d.bus}, disk.backing = {d.backing}, disk.xen_backend = {d.xen_backend})")


def _io(p: Tables) -> ProfileProblem | None:
    d = p.disk
    threads = _default(Disk, "io")
    if p.guest.hypervisor == "xen":
        if d.io == threads:
            return None
        return ProfileProblem("disk.io", d.io, "libxl has no AIO setting; Xen's disk backends are not configurable "
                              "here", f"{threads} (with guest.hypervisor = xen)")
    if d.io == "native" and d.cache not in PAGE_CACHE_FREE:
        return ProfileProblem("disk.io", d.io, f"io = native needs O_DIRECT, i.e. cache {_either(PAGE_CACHE_FREE)}; "
                              f"cache {d.cache} goes through the host page cache, which Linux native AIO cannot use",
                              f"{_values(IoMode, 'native')} (with disk.cache = {d.cache}); or set disk.cache to "
                              f"{_either(PAGE_CACHE_FREE)}")
    return None


def _format(p: Tables) -> ProfileProblem | None:
    d = p.disk
    if d.backing in QCOW2_BACKINGS and d.format != "qcow2":
        return ProfileProblem("disk.format", d.format, f"backing {d.backing} is a qcow2 image",
                              f"qcow2 (with disk.backing = {d.backing})")
    if d.backing not in QCOW2_BACKINGS and d.format != "raw":
        return ProfileProblem("disk.format", d.format, f"backing {d.backing} holds raw data",
                              f"raw (with disk.backing = {d.backing}); use backing {_either(QCOW2_BACKINGS)} for qcow2")
    return None


def _volume_of_backing(p: Tables) -> ProfileProblem | None:
    d = p.disk
    if d.backing == "network-volume":
        scheme, sep, rest = d.volume.partition(":")
        if not sep or scheme not in VOLUME_SCHEMES or not rest.strip():
            return ProfileProblem("disk.volume", d.volume, "a network volume needs a target with a known scheme",
                                  volume_targets(VOLUME_SCHEMES))
    elif d.backing == "block-device":
        if d.volume and not _is_dev_path(d.volume):
            return ProfileProblem("disk.volume", d.volume, "a block device must be named by an absolute path under "
                                  "/dev/", "empty (cloudbox picks the device) or an absolute /dev/ path, e.g. /dev/sdb")
    elif d.volume and d.backing == NVME_PCI:
        return ProfileProblem("disk.volume", d.volume, "the controller is this host's: the run names it, by its PCI "
                              "address (--device 0000:01:00.0)", f"empty (with disk.backing = {d.backing})")
    elif d.volume:
        return ProfileProblem("disk.volume", d.volume, f"backing {d.backing} takes no volume (cloudbox creates the "
                              "file)", f"empty (with disk.backing = {d.backing})")
    return None


def _is_dev_path(s: str) -> bool:
    return s.startswith("/dev/") and posixpath.normpath(s) == s and len(s) > len("/dev/")


def _iothreads(p: Tables) -> ProfileProblem | None:
    d = p.disk
    if d.iothreads > 0 and d.bus not in VIRTIO_BUSES:
        return ProfileProblem("disk.iothreads", d.iothreads, f"iothreads serve virtio devices only, not {d.bus}",
                              f"0 (with disk.bus = {d.bus}); 1..{_most(Disk, 'iothreads')} needs bus "
                              f"{_either(VIRTIO_BUSES)}")
    if d.iothreads > 1 and d.bus != MAPPED_BUS:
        return ProfileProblem("disk.iothreads", d.iothreads, f"several iothreads serve one disk by taking its queues "
                              f"between them (IOThread virtqueue mapping), which cloudbox gives {MAPPED_BUS}",
                              f"0..1 (with disk.bus = {d.bus}); 2..{_most(Disk, 'iothreads')} needs bus {MAPPED_BUS}")
    if d.iothreads > 1 and d.queues < d.iothreads:
        return ProfileProblem("disk.iothreads", d.iothreads, f"the disk's queues are spread over its iothreads, each "
                              f"taking at least one: {d.queues} queue{'s' if d.queues > 1 else ''} for "
                              f"{d.iothreads} iothreads leaves some idle", f"0..{d.queues} (with disk.queues = "
                              f"{d.queues}); more iothreads need as many disk.queues")
    return None


def _disk_queues(p: Tables) -> ProfileProblem | None:
    g, d = p.guest, p.disk
    if d.queues > 1 and d.bus not in VIRTIO_BUSES:
        return ProfileProblem("disk.queues", d.queues, f"multiple queues are a virtio feature, {d.bus} has one",
                              f"1 (with disk.bus = {d.bus}); more needs bus {_either(VIRTIO_BUSES)}")
    if d.queues > g.vcpus:
        return ProfileProblem("disk.queues", d.queues, "more disk queues than vCPUs",
                              f"1..{g.vcpus} (guest.vcpus = {g.vcpus})")
    return None


def _raid_of_one(p: Tables) -> ProfileProblem | None:
    d = p.disk
    if d.raid == "0" and d.count < 2:
        return ProfileProblem("disk.raid", d.raid, f"a RAID 0 over {d.count} disk stripes nothing",
                              f"none (with disk.count = {d.count}); 0 needs disk.count 2..{MAX_DISKS}")
    return None


def _disks_without_raid(p: Tables) -> ProfileProblem | None:
    d = p.disk
    if d.raid == "none" and d.count > 1:
        return ProfileProblem("disk.count", d.count, "the tests run on one device: several disks need a RAID to join "
                              "them", f"1 (with disk.raid = none); 2..{MAX_DISKS} needs disk.raid = 0")
    return None


def _chunk_without_raid(p: Tables) -> ProfileProblem | None:
    d = p.disk
    if d.raid == "none" and d.chunk_kib != 0:
        lo, hi = CHUNK_KIB
        return ProfileProblem("disk.chunk_kib", d.chunk_kib, "a chunk size is a RAID's; this profile has none",
                              f"0 (with disk.raid = none); a power of two {lo}..{hi} needs disk.raid = 0")
    return None


def _raid_on(p: Tables) -> ProfileProblem | None:
    d = p.disk
    if d.raid_on == "host" and d.raid == "none":
        return ProfileProblem("disk.raid_on", d.raid_on, "there is no RAID to build", "guest (with disk.raid = none); "
                              "host needs disk.raid = 0")
    if d.raid_on == "host" and d.backing != "block-device":
        return ProfileProblem("disk.raid_on", d.raid_on, f"the host builds its md array over block devices, and "
                              f"backing {d.backing} gives the guest files", f"guest (with disk.backing = {d.backing}); "
                              "host needs disk.backing = block-device (a loop device per disk)")
    return None


def _disks_on_bus(p: Tables) -> ProfileProblem | None:
    d = p.disk
    if d.raid_on == "guest" and d.count > BUS_MAX_DISKS.get(d.bus, MAX_DISKS):
        return ProfileProblem("disk.count", d.count, f"bus {d.bus} takes at most {BUS_MAX_DISKS[d.bus]} disks on its "
                              f"controller", f"1..{BUS_MAX_DISKS[d.bus]} (with disk.bus = {d.bus})")
    return None


def _attach(p: Tables) -> ProfileProblem | None:
    d = p.disk
    host = _default(Disk, "attach")
    scheme = d.volume.partition(":")[0]
    if d.attach != host and d.backing != "network-volume":
        return ProfileProblem("disk.attach", d.attach, f"only a network volume is attached by someone else; backing "
                              f"{d.backing} is opened by the host", f"{host} (with disk.backing = {d.backing}); "
                              f"{_values(Attach, host, sep=' or ')} need network-volume")
    if d.attach == "qemu" and scheme not in QEMU_SCHEMES:
        return ProfileProblem("disk.attach", d.attach, f"QEMU has no initiator for {scheme or 'this'} volumes",
                              f"{_values(Attach, 'qemu')} (with disk.volume = {d.volume!r}); qemu needs "
                              + volume_targets(QEMU_SCHEMES, " or "))
    if d.attach == "qemu" and p.guest.hypervisor == "xen":
        return ProfileProblem("disk.attach", d.attach, "libxl (Xen) does not hand QEMU's network block drivers to a "
                              "guest", f"{_values(Attach, 'qemu')} (with guest.hypervisor = xen)")
    return None


def _disks_of_one_volume(p: Tables) -> ProfileProblem | None:
    d = p.disk
    if d.count > 1 and (d.backing == "network-volume" or d.volume):
        return ProfileProblem("disk.count", d.count, f"disk.volume names one volume; {d.count} disks would need "
                              f"{d.count}", f"1 (with disk.volume = {d.volume!r}); several disks need backing files "
                              "or loop devices")
    return None


def _nfs_attach(p: Tables) -> ProfileProblem | None:
    if is_nfs(p.disk) and p.disk.attach != "guest":
        return ProfileProblem("disk.attach", p.disk.attach, "an NFS export is a file system, not a block device: the "
                              "guest's kernel mounts it and the tests run on a file in it",
                              "guest (with disk.volume = nfs:<name>)")
    return None


def _nfs_proto(p: Tables) -> ProfileProblem | None:
    if is_nfs(p.disk) and p.nfs.proto == "udp":
        return ProfileProblem("nfs.proto", p.nfs.proto, "NFSv4 runs over TCP only (RFC 7530: a transport with "
                              "congestion control); UDP was NFSv3's, and the benchmark guest's kernel (Debian's 6.1, "
                              "built with CONFIG_NFS_DISABLE_UDP_SUPPORT) no longer offers it",
                              _values(NfsProto, "udp"))
    return None


def _nfs_nconnect(p: Tables) -> ProfileProblem | None:
    if is_nfs(p.disk) and p.nfs.nconnect > 1 and p.nfs.vers == "4.0":
        return ProfileProblem("nfs.nconnect", p.nfs.nconnect, "the Linux client opens several connections from "
                              "NFSv4.1 on (4.0 has no sessions to share them)", f"1 (with nfs.vers = 4.0); "
                              f"2..{_most(Nfs, 'nconnect')} needs nfs.vers {_values(NfsVersion, '4.0', sep=' or ')}")
    return None


def _nfs_unused(p: Tables) -> ProfileProblem | None:
    if is_nfs(p.disk) or p.nfs == Nfs():
        return None
    key = next(k for k in Nfs.model_fields if getattr(p.nfs, k) != _default(Nfs, k))
    return ProfileProblem(f"nfs.{key}", getattr(p.nfs, key), "the [nfs] table sets how the guest mounts an NFS export; "
                          "this profile has none", f"{_default(Nfs, key)} (leave [nfs] out); an export needs "
                          "disk.backing = network-volume, disk.volume = nfs:<name>, disk.attach = guest")


def _dom0_unused(key: str) -> Rule:
    """dom0.<key> left as it is on KVM, which has no dom0."""
    def rule(p: Tables) -> ProfileProblem | None:
        neutral = _default(Dom0, key)
        if p.guest.hypervisor == "xen" or getattr(p.dom0, key) == neutral:
            return None
        return ProfileProblem(f"dom0.{key}", getattr(p.dom0, key), "dom0 is Xen's control domain; a KVM host has "
                              "none", f"{neutral!r} (with guest.hypervisor = kvm)")
    return rule


def _netfront_on_kvm(p: Tables) -> ProfileProblem | None:
    if p.network.model == XEN_PV_NIC and p.guest.hypervisor != "xen":
        return ProfileProblem("network.model", p.network.model, "netfront is Xen's PV NIC; KVM cannot provide it",
                              f"{_values(NicModel, XEN_PV_NIC)} (with guest.hypervisor = kvm)")
    return None


def _nic_of_xen_guest(p: Tables) -> ProfileProblem | None:
    g, n = p.guest, p.network
    xen_type = guest_type(g, p.disk)
    if g.hypervisor == "xen" and g.xen_type == "auto" and p.disk.bus == XEN_PV_BUS and n.model != XEN_PV_NIC:
        return ProfileProblem("network.model", n.model, f"bus {XEN_PV_BUS} makes this a Xen PV guest, which has no "
                              f"emulated NIC", f"{XEN_PV_NIC} (with disk.bus = {XEN_PV_BUS})")
    if xen_type in ("pv", "pvh") and g.xen_type != "auto" and n.model != XEN_PV_NIC:
        return ProfileProblem("network.model", n.model, f"a Xen {xen_type.upper()} guest has no emulated NIC",
                              f"{XEN_PV_NIC} (with guest.xen_type = {xen_type})")
    if g.hypervisor == "xen" and n.model == "virtio":
        return ProfileProblem("network.model", n.model, "libxl (Xen) does not offer virtio-net",
                              f"{_values(NicModel, 'virtio')} (with guest.hypervisor = xen)")
    return None


def _vhost(p: Tables) -> ProfileProblem | None:
    n = p.network
    if n.vhost and n.model != "virtio":
        return ProfileProblem("network.vhost", n.vhost, "vhost-net accelerates virtio-net only",
                              f"false (with network.model = {n.model}); true needs model virtio")
    return None


def _nic_queues(p: Tables) -> ProfileProblem | None:
    g, n = p.guest, p.network
    if n.queues > 1 and n.model != "virtio":
        return ProfileProblem("network.queues", n.queues, f"multiqueue is a virtio-net feature, {n.model} has one "
                              "queue", f"1 (with network.model = {n.model}); more needs model virtio")
    if n.queues > g.vcpus:
        return ProfileProblem("network.queues", n.queues, "more NIC queues than vCPUs",
                              f"1..{g.vcpus} (guest.vcpus = {g.vcpus})")
    return None


# In the order a profile's problems are listed: hypervisor and Xen first, then the disk, NFS, dom0 and the NIC (the
# newer paths' and the placement's follow: core.spec.iopaths).
RULES: tuple[Rule, ...] = (
    _bus_of_hypervisor, _xen_type, _xen_backend, _xen_cache, _io, _format, _volume_of_backing, _iothreads,
    _disk_queues, _raid_of_one, _disks_without_raid, _chunk_without_raid, _raid_on, _disks_on_bus, _attach,
    _disks_of_one_volume, _nfs_attach, _nfs_proto, _nfs_nconnect, _nfs_unused, _dom0_unused("vcpu_pin"),
    _dom0_unused("memory_mib"), _netfront_on_kvm, _nic_of_xen_guest, _vhost, _nic_queues,
)


def cross_field_problems(p: Tables) -> list[ProfileProblem]:
    """Impossible combinations of otherwise valid values, one problem per offending key (RULES in order)."""
    return [problem for rule in RULES if (problem := rule(p)) is not None]
