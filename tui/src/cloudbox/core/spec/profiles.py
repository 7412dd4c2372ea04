"""Tuning profiles as validated data.

A profile is a TOML file (profiles/*.toml for shipped presets, the state directory's
profiles/ for the user's own) holding every knob the studies varied: hypervisor, guest
size, disk bus, cache mode, AIO mode, iothreads, queues, backing store and format, NIC
model, vhost, queues and MTU. This module provides:

- the pydantic models (`Profile`, `Guest`, `Disk`, `Network`), strict and closed
  (unknown keys and str->int coercion are errors);
- `parse_profile` / `load_profile`, which turn any problem (TOML syntax, a wrong type, a
  value out of range, an impossible combination of knobs) into a `ProfileError` with one
  `ProfileProblem` per problem, each naming the dotted key, the value and what is allowed;
- lookup (`find_profile`, `resolve_profile`, `resolve_mix`, `list_profiles`), comparison
  (`diff_profiles`, `mix_problem`), persistence (`save_user_profile`) and canonical forms
  (`Profile.hash`, `Profile.to_toml()`, `Profile.knobs()`, `Profile.describe()`).

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

import hashlib
import json
import os
import posixpath
import re
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, ValidationError, model_validator

from cloudbox.core import inputs, paths
from cloudbox.core.errors import NotFound, ProfileError, ProfileProblem, UsageError

from . import schema
from .schema import CrossFieldProblems, NoControls, OneLine, Strict

Hypervisor = Literal["kvm", "xen"]
# How Xen runs the guest: "pv" (paravirtualized, no hardware virtualization), "pvh" (PV devices in a hardware-
# virtualized container, no emulated devices), "hvm" (emulated PC by Xen's QEMU); "auto" is what the disk bus
# implies (xen-vbd: pv, else hvm), the only value KVM takes.
XenType = Literal["auto", "pv", "pvh", "hvm"]
Bus = Literal["virtio-blk", "virtio-scsi", "scsi-lsi", "sata", "ide", "xen-vbd"]
CacheMode = Literal["none", "writethrough", "writeback", "directsync", "unsafe"]
IoMode = Literal["native", "threads", "io_uring"]
Backing = Literal["sparse-file", "prealloc-file", "qcow2", "qcow2-prealloc", "block-device", "network-volume"]
DiskFormat = Literal["raw", "qcow2"]
NicModel = Literal["e1000", "rtl8139", "virtio", "xen-netfront"]
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

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
VIRTIO_BUSES: tuple[str, ...] = ("virtio-blk", "virtio-scsi")
XEN_HVM_BUSES: tuple[str, ...] = ("ide", "scsi-lsi")  # emulated by Xen's QEMU: HVM guests only
XEN_BUSES: tuple[str, ...] = ("xen-vbd", "ide", "scsi-lsi")
KVM_BUSES: tuple[str, ...] = ("virtio-blk", "virtio-scsi", "scsi-lsi", "sata", "ide")
QCOW2_BACKINGS: tuple[str, ...] = ("qcow2", "qcow2-prealloc")
VOLUME_SCHEMES: tuple[str, ...] = ("aoe", "iscsi", "nbd", "nfs", "nvme-tcp")
# Schemes QEMU itself can be the initiator of (its nbd and libiscsi block drivers); it has none for AoE or NVMe/TCP.
QEMU_SCHEMES: tuple[str, ...] = ("nbd", "iscsi")
PAGE_CACHE_FREE: tuple[str, ...] = ("none", "directsync")
MAX_DISKS = 8
# Disks a bus takes on one controller (the pc machine's IDE has two channels of two; ich9-ahci six ports; the LSI
# 53C895A seven targets); the rest take MAX_DISKS.
BUS_MAX_DISKS: dict[str, int] = {"ide": 4, "sata": 6, "scsi-lsi": 7}
RAID_CHUNK_DEFAULT_KIB = 512  # mdadm's own default
# Knobs added after profiles were first hashed, with the value that leaves a profile's hash as it was.
_HASH_NEUTRAL: dict[str, dict[str, object]] = {"guest": {"xen_type": "auto"},
                                                "disk": {"count": 1, "raid": "none", "chunk_kib": 0, "attach": "host",
                                                         "xen_backend": "auto", "raid_on": "guest"},
                                                "dom0": {"vcpu_pin": "", "memory_mib": 0}}
SECTIONS: tuple[str, ...] = ("guest", "disk", "network", "dom0", "nfs")
DOM0_MIN_MIB = 512  # below this a Debian dom0 with libvirtd, QEMU and the tests risks the OOM killer
BLOCK_BACKINGS: tuple[str, ...] = ("block-device", "network-volume")  # the host hands the guest a block device

# Human wording for string fields whose rule is not a list of values or a range.
_TEXT_RULES: dict[str, str] = {
    "name": "lowercase letters, digits and '-', starting with a letter or digit, at most 63 characters",
    "description": "one line of text, 1..200 characters",
    "reproduces": "one line of text, at most 200 characters",
    "disk.raid": 'none, "0" (a string: RAID 0 in the guest over the disk.count disks)',
    "disk.volume": (
        "empty; for backing = block-device an absolute /dev/ path; for backing = network-volume "
        + ", ".join(f"{s}:<target>" for s in VOLUME_SCHEMES)
    ),
    "dom0.vcpu_pin": "empty (leave dom0's vCPUs as they are) or physical CPUs as a list, e.g. 0, 0-1, 0,2",
    "dom0.memory_mib": f"0 (leave dom0's memory as it is) or {DOM0_MIN_MIB}..262144 (MiB)",
    "disk.chunk_kib": (
        "0 (no RAID) or, with disk.raid = 0, a power of two 4..1024 (KiB; left out or 0: mdadm's "
        f"{RAID_CHUNK_DEFAULT_KIB})"
    ),
    "nfs.rsize_kib": "0 (what client and server agree) or a power of two 4..1024 (KiB)",
    "nfs.wsize_kib": "0 (what client and server agree) or a power of two 4..1024 (KiB)",
}


def _volume(v: str) -> str:
    bad = inputs.control_chars(v)
    if bad:
        raise ValueError(f"contains {bad}")
    if v.startswith("/") and inputs.path_problem(v):
        raise ValueError(str(inputs.path_problem(v)))
    return v


def _chunk(v: int) -> int:
    if v != 0 and (v < 4 or v > 1024 or v & (v - 1)):
        raise ValueError("must be 0 or a power of two from 4 to 1024")
    return v


def _cpu_list(v: str) -> str:
    if v and not re.fullmatch(r"\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?)*", v):
        raise ValueError("must be empty or a list of CPU numbers and ranges, e.g. 0, 0-1, 0,2")
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
    """The guest's NIC on the private bridge."""

    model: NicModel
    vhost: bool = False
    queues: int = Field(1, ge=1, le=16)
    mtu: int = Field(1500, ge=1500, le=9000)


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


class Profile(Strict):
    """A complete, validated tuning profile. Construct with parse_profile/load_profile."""

    name: str = Field(pattern=NAME_PATTERN)
    description: OneLine
    reproduces: Annotated[str, Field(max_length=200, pattern=r"^[^\n\r]*$"), NoControls] | None = None
    guest: Guest
    disk: Disk
    network: Network
    dom0: Dom0 = Dom0()
    nfs: Nfs = Nfs()

    @model_validator(mode="after")
    def _cross_checks(self) -> Profile:
        problems = cross_field_problems(self)
        if problems:
            raise CrossFieldProblems(problems)
        return self

    # -- canonical forms -------------------------------------------------------------

    def canonical_json(self) -> str:
        """Sorted-key, compact JSON of the whole validated model (what `hash` digests). Knobs added later are left
        out at their neutral value, so a profile that does not use them keeps the hash its stored runs carry."""
        data = self.model_dump(mode="json")
        for section, neutral in _HASH_NEUTRAL.items():
            for key, value in neutral.items():
                if data[section].get(key) == value:
                    del data[section][key]
        if data["guest"].get("xen_type") == _implied_xen_type(self.disk.bus):
            del data["guest"]["xen_type"]  # the type the bus implies: the same guest as "auto"
        if not data["dom0"]:
            del data["dom0"]
        if not is_nfs(self.disk):
            del data["nfs"]  # a profile without an NFS export keeps the hash it had before [nfs] existed
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> str:
        """sha256 (hex) of canonical_json(): equal profiles hash equal, whatever the file's layout."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def sections(self) -> tuple[str, ...]:
        """The profile's tables: [dom0] only for Xen, [nfs] only with an NFS export (or when set, which validation
        then refuses)."""
        out = list(SECTIONS[:3])
        if self.guest.hypervisor == "xen" or self.dom0 != Dom0():
            out.append("dom0")
        if is_nfs(self.disk) or self.nfs != Nfs():
            out.append("nfs")
        return tuple(out)

    def _fields(self, section: str, every: bool = False) -> list[str]:
        """The keys of a table shown for this profile: Xen's guest type only for Xen (or when set), unless `every`."""
        fields = list(type(getattr(self, section)).model_fields)
        if not every and section == "guest" and self.guest.hypervisor != "xen" and self.guest.xen_type == "auto":
            fields.remove("xen_type")
        return fields

    def knobs(self, every: bool = False, sections: tuple[str, ...] | None = None) -> dict[str, object]:
        """The tuning knobs as a flat, ordered dict: "guest.hypervisor" ... "network.mtu" (and "guest.xen_type",
        "dom0.*" for Xen, "nfs.*" with an NFS export, or with `every`); `sections` names the tables instead."""
        out: dict[str, object] = {}
        for section in sections or (SECTIONS if every else self.sections()):
            sub: BaseModel = getattr(self, section)
            for field in self._fields(section, every):
                out[f"{section}.{field}"] = getattr(sub, field)
        return out

    def to_toml(self) -> str:
        """Canonical TOML text: every key, in schema order; parse_profile() gives back an equal profile."""
        lines = [f"name = {_toml_value(self.name)}", f"description = {_toml_value(self.description)}"]
        if self.reproduces is not None:
            lines.append(f"reproduces = {_toml_value(self.reproduces)}")
        for section in self.sections():
            sub: BaseModel = getattr(self, section)
            lines += ["", f"[{section}]"]
            for field in self._fields(section):
                lines.append(f"{field} = {_toml_value(getattr(sub, field))}")
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        """One line for humans, e.g. "KVM, 1 vCPU, 1024 MiB; disk: emulated LSI SCSI on a sparse file ..."."""
        g, d, n = self.guest, self.disk, self.network
        disk = f"{_BUS_WORDS[d.bus]} on {_BACKING_WORDS[d.backing]} ({d.format})"
        if d.volume:
            disk += f" {d.volume}"
        if d.backing == "network-volume":
            disk += f" attached by {_ATTACH_WORDS[d.attach]}"
        if g.hypervisor == "xen":
            disk += f", backend {_XEN_BACKEND_WORDS[xen_backend(d)]}"
        disk += f", cache={d.cache}, io={d.io}"
        if d.iothreads:
            disk += f", {d.iothreads} iothread{'s' if d.iothreads > 1 else ''}"
        if d.queues > 1:
            disk += f", {d.queues} queues"
        if d.raid == "0" and d.raid_on == "host":
            disk = f"{disk}, on the host's RAID 0 ({d.chunk_kib} KiB chunks) over {d.count} loop devices"
        elif d.raid == "0":
            disk = f"RAID 0 ({d.chunk_kib} KiB chunks) over {d.count} disks, each {disk}"
        if is_nfs(d):  # a file system the guest mounts: no disk bus, cache or AIO mode of QEMU's
            f = self.nfs
            sizes = "".join(f", {k} {v} KiB" for k, v in (("rsize", f.rsize_kib), ("wsize", f.wsize_kib)) if v)
            disk = (f"NFSv{f.vers} export {d.volume.partition(':')[2]} mounted by {_ATTACH_WORDS[d.attach]} over "
                    f"{f.proto} ({f.writes}, nconnect {f.nconnect}{sizes})")
        net = _NIC_WORDS[n.model]
        if n.model == "virtio":
            net += " (vhost)" if n.vhost else " (userspace)"
        if n.queues > 1:
            net += f", {n.queues} queues"
        net += f", MTU {n.mtu}"
        vcpu = f"{g.vcpus} vCPU{'s' if g.vcpus > 1 else ''}"
        dom0 = [f"vCPUs pinned to {self.dom0.vcpu_pin}"] if self.dom0.vcpu_pin else []
        dom0 += [f"{self.dom0.memory_mib} MiB"] if self.dom0.memory_mib else []
        more = f"; dom0: {', '.join(dom0)}" if dom0 else ""
        hv = g.hypervisor.upper() + (f" {g.xen_type.upper()}" if g.xen_type != "auto" else "")
        return f"{hv}, {vcpu}, {g.memory_mib} MiB; disk: {disk}; net: {net}{more}"


_BUS_WORDS = {
    "virtio-blk": "virtio-blk",
    "virtio-scsi": "virtio-scsi",
    "scsi-lsi": "emulated LSI SCSI",
    "sata": "emulated SATA (AHCI)",
    "ide": "emulated IDE",
    "xen-vbd": "Xen PV block (xvd)",
}
_BACKING_WORDS = {
    "sparse-file": "a sparse file",
    "prealloc-file": "a pre-allocated file",
    "qcow2": "a qcow2 image",
    "qcow2-prealloc": "a pre-allocated qcow2 image",
    "block-device": "a whole block device",
    "network-volume": "a network volume",
}
_ATTACH_WORDS = {"host": "the host's kernel", "guest": "the guest's kernel", "qemu": "QEMU's own initiator"}
_XEN_BACKEND_WORDS = {"phy": "blkback (phy)", "qdisk": "qdisk (QEMU in dom0)"}
_NIC_WORDS = {"e1000": "e1000", "rtl8139": "rtl8139", "virtio": "virtio-net", "xen-netfront": "Xen netfront"}


def _implied_xen_type(bus: str) -> str:
    return "pv" if bus == "xen-vbd" else "hvm"


def guest_disks(disk: Disk) -> int:
    """The benchmark disks the guest sees: disk.count, or one (the host's md array) with disk.raid_on = host."""
    return 1 if disk.raid_on == "host" else disk.count


def is_nfs(disk: Disk) -> bool:
    """The disk is an NFS export the guest mounts (disk.volume = nfs:<name>), not a block device."""
    return disk.backing == "network-volume" and disk.volume.startswith("nfs:")


def xen_guest_type(profile: Profile) -> str:
    """How Xen runs the profile's guest: "pv", "pvh" or "hvm" (guest.xen_type, "auto" resolved from the bus);
    "" for a KVM profile."""
    if profile.guest.hypervisor != "xen":
        return ""
    t = profile.guest.xen_type
    return _implied_xen_type(profile.disk.bus) if t == "auto" else t


def xen_backend(disk: Disk) -> str:
    """The backend dom0 serves a Xen guest's disk with: "phy" (blkback) or "qdisk" (QEMU); "auto" resolved."""
    if disk.xen_backend != "auto":
        return disk.xen_backend
    return "phy" if disk.backing in BLOCK_BACKINGS else "qdisk"


def xen_cache_mode(bus: str, backing: str, backend: str = "auto") -> str:
    """The host cache mode libxl really uses for a Xen disk (it offers no choice)."""
    if backend == "auto":
        backend = "phy" if backing in BLOCK_BACKINGS else "qdisk"
    if bus == "xen-vbd" and backend == "phy":
        return "none"  # blkback ("phy") submits bios straight to the device: no dom0 page cache
    return "writeback"  # emulated disks (libxl passes cache=writeback) and qdisk (QEMU's default, no O_DIRECT)


def cross_field_problems(p: Profile) -> list[ProfileProblem]:
    """Impossible combinations of otherwise valid values, one problem per offending key."""
    g, d, n = p.guest, p.disk, p.network
    out: list[ProfileProblem] = []

    def bad(key: str, value: object, message: str, allowed: str) -> None:
        out.append(ProfileProblem(key, value, message, allowed))

    # hypervisor <-> bus
    if g.hypervisor == "kvm" and d.bus not in KVM_BUSES:
        bad(
            "disk.bus",
            d.bus,
            "xen-vbd is Xen's PV block device; KVM cannot provide it",
            f"{', '.join(KVM_BUSES)} (with guest.hypervisor = kvm)",
        )
    if g.hypervisor == "xen" and d.bus not in XEN_BUSES:
        bad(
            "disk.bus",
            d.bus,
            "libxl (Xen) does not offer this disk bus",
            f"{', '.join(XEN_BUSES)} (with guest.hypervisor = xen)",
        )

    # Xen's guest type
    xen_type = xen_guest_type(p)
    if g.hypervisor != "xen" and g.xen_type != "auto":
        bad("guest.xen_type", g.xen_type, "the guest type (PV, PVH, HVM) is Xen's; a KVM guest is always QEMU's "
            "hardware-virtualized PC", "auto (with guest.hypervisor = kvm)")
    elif xen_type in ("pv", "pvh") and d.bus in XEN_HVM_BUSES:
        bad("disk.bus", d.bus, f"a Xen {xen_type.upper()} guest has no emulated devices; {d.bus} is emulated by "
            "Xen's QEMU for HVM guests only", f"xen-vbd (with guest.xen_type = {g.xen_type}); {d.bus} needs "
            "guest.xen_type = hvm or auto")
    elif g.xen_type == "hvm" and d.bus == "xen-vbd":
        bad("guest.xen_type", g.xen_type, "an HVM guest's disk is emulated (PV drivers on HVM are not offered)",
            "auto, pv, pvh (with disk.bus = xen-vbd); hvm needs disk.bus ide or scsi-lsi")

    # Xen's disk backend
    if g.hypervisor != "xen" and d.xen_backend != "auto":
        bad("disk.xen_backend", d.xen_backend, "the disk backend is Xen's (blkback or qdisk in dom0); KVM's disks "
            "are QEMU's, set by disk.bus, cache and io", "auto (with guest.hypervisor = kvm)")
    elif g.hypervisor == "xen" and d.xen_backend == "phy" and d.backing not in BLOCK_BACKINGS:
        bad("disk.xen_backend", d.xen_backend, f"blkback (phy) serves block devices only; libxl refuses it on "
            f"backing {d.backing}, a file", f"qdisk, auto (with disk.backing = {d.backing}); phy needs backing "
            + " or ".join(BLOCK_BACKINGS))

    # cache/io
    if g.hypervisor == "xen":
        backend = xen_backend(d)
        want = xen_cache_mode(d.bus, d.backing, backend)
        if d.cache != want:
            bad(
                "disk.cache",
                d.cache,
                f"libxl has no cache setting; with bus {d.bus} on {d.backing} through {backend} it always uses "
                f"{want}",
                f"{want} (with guest.hypervisor = xen, disk.bus = {d.bus}, disk.backing = {d.backing}, "
                f"disk.xen_backend = {d.xen_backend})",
            )
        if d.io != "threads":
            bad(
                "disk.io",
                d.io,
                "libxl has no AIO setting; Xen's disk backends are not configurable here",
                "threads (with guest.hypervisor = xen)",
            )
    elif d.io == "native" and d.cache not in PAGE_CACHE_FREE:
        bad(
            "disk.io",
            d.io,
            f"io = native needs O_DIRECT, i.e. cache none or directsync; cache {d.cache} goes through "
            "the host page cache, which Linux native AIO cannot use",
            f"threads, io_uring (with disk.cache = {d.cache}); or set disk.cache to none or directsync",
        )

    # backing <-> format / volume
    if d.backing in QCOW2_BACKINGS and d.format != "qcow2":
        bad(
            "disk.format",
            d.format,
            f"backing {d.backing} is a qcow2 image",
            f"qcow2 (with disk.backing = {d.backing})",
        )
    if d.backing not in QCOW2_BACKINGS and d.format != "raw":
        bad(
            "disk.format",
            d.format,
            f"backing {d.backing} holds raw data",
            f"raw (with disk.backing = {d.backing}); use backing qcow2 or qcow2-prealloc for qcow2",
        )
    if d.backing == "network-volume":
        scheme, sep, rest = d.volume.partition(":")
        if not sep or scheme not in VOLUME_SCHEMES or not rest.strip():
            bad(
                "disk.volume",
                d.volume,
                "a network volume needs a target with a known scheme",
                ", ".join(f"{s}:<target>" for s in VOLUME_SCHEMES),
            )
    elif d.backing == "block-device":
        if d.volume and not _is_dev_path(d.volume):
            bad(
                "disk.volume",
                d.volume,
                "a block device must be named by an absolute path under /dev/",
                "empty (cloudbox picks the device) or an absolute /dev/ path, e.g. /dev/sdb",
            )
    elif d.volume:
        bad(
            "disk.volume",
            d.volume,
            f"backing {d.backing} takes no volume (cloudbox creates the file)",
            f"empty (with disk.backing = {d.backing})",
        )

    # virtio-only disk knobs
    if d.iothreads > 0 and d.bus not in VIRTIO_BUSES:
        bad(
            "disk.iothreads",
            d.iothreads,
            f"iothreads serve virtio devices only, not {d.bus}",
            f"0 (with disk.bus = {d.bus}); 1..16 needs bus virtio-blk or virtio-scsi",
        )
    if d.queues > 1 and d.bus not in VIRTIO_BUSES:
        bad(
            "disk.queues",
            d.queues,
            f"multiple queues are a virtio feature, {d.bus} has one",
            f"1 (with disk.bus = {d.bus}); more needs bus virtio-blk or virtio-scsi",
        )
    elif d.queues > g.vcpus:
        bad("disk.queues", d.queues, "more disk queues than vCPUs", f"1..{g.vcpus} (guest.vcpus = {g.vcpus})")

    # several disks <-> RAID
    if d.raid == "0" and d.count < 2:
        bad("disk.raid", d.raid, f"a RAID 0 over {d.count} disk stripes nothing",
            f"none (with disk.count = {d.count}); 0 needs disk.count 2..{MAX_DISKS}")
    if d.raid == "none" and d.count > 1:
        bad("disk.count", d.count, "the tests run on one device: several disks need a RAID to join them",
            f"1 (with disk.raid = none); 2..{MAX_DISKS} needs disk.raid = 0")
    if d.raid == "none" and d.chunk_kib != 0:
        bad("disk.chunk_kib", d.chunk_kib, "a chunk size is a RAID's; this profile has none",
            "0 (with disk.raid = none); a power of two 4..1024 needs disk.raid = 0")
    if d.raid_on == "host" and d.raid == "none":
        bad("disk.raid_on", d.raid_on, "there is no RAID to build", "guest (with disk.raid = none); host needs "
            "disk.raid = 0")
    elif d.raid_on == "host" and d.backing != "block-device":
        bad("disk.raid_on", d.raid_on, f"the host builds its md array over block devices, and backing {d.backing} "
            "gives the guest files", f"guest (with disk.backing = {d.backing}); host needs disk.backing = "
            "block-device (a loop device per disk)")
    if d.raid_on == "guest" and d.count > BUS_MAX_DISKS.get(d.bus, MAX_DISKS):
        bad("disk.count", d.count, f"bus {d.bus} takes at most {BUS_MAX_DISKS[d.bus]} disks on its controller",
            f"1..{BUS_MAX_DISKS[d.bus]} (with disk.bus = {d.bus})")
    if d.attach != "host" and d.backing != "network-volume":
        bad("disk.attach", d.attach, f"only a network volume is attached by someone else; backing {d.backing} is "
            "opened by the host", f"host (with disk.backing = {d.backing}); guest or qemu need network-volume")
    elif d.attach == "qemu" and d.volume.partition(":")[0] not in QEMU_SCHEMES:
        bad("disk.attach", d.attach, f"QEMU has no initiator for {d.volume.partition(':')[0] or 'this'} volumes",
            f"host, guest (with disk.volume = {d.volume!r}); qemu needs "
            + " or ".join(f"{s}:<target>" for s in QEMU_SCHEMES))
    elif d.attach == "qemu" and g.hypervisor == "xen":
        bad("disk.attach", d.attach, "libxl (Xen) does not hand QEMU's network block drivers to a guest",
            "host, guest (with guest.hypervisor = xen)")
    if d.count > 1 and (d.backing == "network-volume" or d.volume):
        bad("disk.count", d.count, f"disk.volume names one volume; {d.count} disks would need {d.count}",
            f"1 (with disk.volume = {d.volume!r}); several disks need backing files or loop devices")

    # NFS export
    if is_nfs(d):
        if d.attach != "guest":
            bad("disk.attach", d.attach, "an NFS export is a file system, not a block device: the guest's kernel "
                "mounts it and the tests run on a file in it", "guest (with disk.volume = nfs:<name>)")
        if p.nfs.proto == "udp":
            bad("nfs.proto", p.nfs.proto, "NFSv4 runs over TCP only (RFC 7530: a transport with congestion "
                "control); UDP was NFSv3's, and the benchmark guest's kernel (Debian's 6.1, built with "
                "CONFIG_NFS_DISABLE_UDP_SUPPORT) no longer offers it", "tcp")
        if p.nfs.nconnect > 1 and p.nfs.vers == "4.0":
            bad("nfs.nconnect", p.nfs.nconnect, "the Linux client opens several connections from NFSv4.1 on "
                "(4.0 has no sessions to share them)", "1 (with nfs.vers = 4.0); 2..16 needs nfs.vers 4.1 or 4.2")
    elif p.nfs != Nfs():
        changed = [k for k in Nfs.model_fields if getattr(p.nfs, k) != getattr(Nfs(), k)]
        bad(f"nfs.{changed[0]}", getattr(p.nfs, changed[0]), "the [nfs] table sets how the guest mounts an NFS "
            "export; this profile has none", f"{getattr(Nfs(), changed[0])} (leave [nfs] out); an export needs "
            "disk.backing = network-volume, disk.volume = nfs:<name>, disk.attach = guest")

    # dom0
    if g.hypervisor != "xen":
        for key, value, neutral in (("vcpu_pin", p.dom0.vcpu_pin, ""), ("memory_mib", p.dom0.memory_mib, 0)):
            if value != neutral:
                bad(f"dom0.{key}", value, "dom0 is Xen's control domain; a KVM host has none",
                    f"{neutral!r} (with guest.hypervisor = kvm)" if key == "vcpu_pin" else
                    f"{neutral} (with guest.hypervisor = kvm)")

    # NIC
    if n.model == "xen-netfront" and g.hypervisor != "xen":
        bad(
            "network.model",
            n.model,
            "netfront is Xen's PV NIC; KVM cannot provide it",
            "e1000, rtl8139, virtio (with guest.hypervisor = kvm)",
        )
    if g.hypervisor == "xen" and g.xen_type == "auto" and d.bus == "xen-vbd" and n.model != "xen-netfront":
        bad(
            "network.model",
            n.model,
            "bus xen-vbd makes this a Xen PV guest, which has no emulated NIC",
            "xen-netfront (with disk.bus = xen-vbd)",
        )
    elif xen_type in ("pv", "pvh") and g.xen_type != "auto" and n.model != "xen-netfront":
        bad("network.model", n.model, f"a Xen {xen_type.upper()} guest has no emulated NIC",
            f"xen-netfront (with guest.xen_type = {xen_type})")
    elif g.hypervisor == "xen" and n.model == "virtio":
        bad(
            "network.model",
            n.model,
            "libxl (Xen) does not offer virtio-net",
            "e1000, rtl8139, xen-netfront (with guest.hypervisor = xen)",
        )
    if n.vhost and n.model != "virtio":
        bad(
            "network.vhost",
            n.vhost,
            "vhost-net accelerates virtio-net only",
            f"false (with network.model = {n.model}); true needs model virtio",
        )
    if n.queues > 1 and n.model != "virtio":
        bad(
            "network.queues",
            n.queues,
            f"multiqueue is a virtio-net feature, {n.model} has one queue",
            f"1 (with network.model = {n.model}); more needs model virtio",
        )
    elif n.queues > g.vcpus:
        bad(
            "network.queues",
            n.queues,
            "more NIC queues than vCPUs",
            f"1..{g.vcpus} (guest.vcpus = {g.vcpus})",
        )
    return out


def _is_dev_path(s: str) -> bool:
    return s.startswith("/dev/") and posixpath.normpath(s) == s and len(s) > len("/dev/")


# -- TOML output ---------------------------------------------------------------------


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        # JSON string escapes are valid TOML basic-string escapes (no surrogate pairs: ensure_ascii off).
        # DEL is the one control character JSON leaves raw and TOML forbids.
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    raise TypeError(f"no TOML form for {type(v).__name__}")


# -- pydantic errors -> ProfileProblem -------------------------------------------------


def allowed_for(key: str) -> str | None:
    """What a key accepts, spelled out: "none, writethrough, ..." or "1..64" or a rule in words."""
    if key in _TEXT_RULES:
        return _TEXT_RULES[key]
    parts = key.split(".")
    model = schema.model_at(Profile, parts)
    if model is None or parts[-1] not in model.model_fields:
        return None
    return schema.field_allowed(model, parts[-1], key)


def knob_kind(key: str) -> tuple[str, list[str]]:
    """How a form should ask for knob `key` ("disk.cache"): ("choice", values) for a fixed set,
    ("bool", ["true", "false"]), ("int", []) or ("str", [])."""
    parts = key.split(".")
    model = schema.model_at(Profile, parts)
    if model is None or parts[-1] not in model.model_fields:
        raise KeyError(key)
    ann = model.model_fields[parts[-1]].annotation
    if typing.get_origin(ann) is Literal:
        return "choice", [str(a) for a in typing.get_args(ann)]
    if ann is bool:
        return "bool", ["true", "false"]
    if ann is int:
        return "int", []
    return "str", []


def _key(loc: schema.Loc) -> str:
    return inputs.key_text(loc) or "(profile)"


def _allowed(loc: schema.Loc, key: str, etype: str) -> str | None:
    if etype == "extra_forbidden":
        owner = schema.model_at(Profile, [str(p) for p in loc])
        return f"known keys: {schema.keys_text(owner)}" if owner else None
    if key == "(profile)":
        return f"a TOML document with keys: {schema.keys_text(Profile)}"
    return allowed_for(key)


def _reword(key: str, err: dict[str, Any], message: str) -> str:
    return "must be one line of text" if err["type"] == "string_pattern_mismatch" and key == "description" else message


# -- parsing and loading ----------------------------------------------------------------

def validate_data(data: object, source: str, *, expect_name: str | None = None) -> Profile:
    """Validate already-parsed data (a dict) into a Profile, or raise ProfileError."""
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(source, schema.problems_from(exc, key=_key, allowed=_allowed, reword=_reword)) from None
    if expect_name is not None and profile.name != expect_name:
        raise ProfileError(
            source,
            [
                ProfileProblem(
                    "name",
                    profile.name,
                    "must equal the file name without .toml",
                    f"{expect_name} (this file is {expect_name}.toml)",
                )
            ],
        )
    return profile


def parse_profile(text: str, source: str = "<profile>", *, expect_name: str | None = None) -> Profile:
    """Parse TOML text into a Profile. `source` names the text in errors; `expect_name`, when
    given, is the name the profile must carry (load_profile passes the file's stem)."""
    return validate_data(schema.parse_toml(text, source, ProfileError), source, expect_name=expect_name)


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Load and validate one profile file (a regular file of at most inputs.MAX_FILE_BYTES); its `name` must
    equal the file's stem."""
    return schema.load_file(path, lambda text, source, stem: parse_profile(text, source, expect_name=stem),
                            error=ProfileError, missing=_missing, kept=_LOADED)


def _missing(path: str | os.PathLike[str]) -> NotFound:
    return NotFound(f"{inputs.shown(os.fspath(path))}: no such profile file")


_LOADED: schema.Parsed[Profile] = schema.Parsed(256)  # Profile is immutable


# -- lookup ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileEntry:
    """One profile file found on the profile path. `problem` is set (and `description`
    empty) when the file does not validate; the list still shows it."""

    name: str
    path: Path
    kind: Literal["preset", "user"]
    description: str
    problem: str | None = None
    hypervisor: str = ""  # guest.hypervisor of a valid profile: which boot of the box runs it
    xen_type: str = ""  # a valid Xen profile's guest type (pv, pvh, hvm): whether that Xen must have VT-x/AMD-V
    raid_on: str = "guest"  # a valid profile's disk.raid_on: a host RAID needs the host's md and mdadm


def _kind(directory: Path) -> Literal["preset", "user"]:
    presets = {d.resolve() for d in paths.preset_dirs()}
    return "preset" if directory.resolve() in presets else "user"


def _candidates() -> Iterable[tuple[str, Path]]:
    """(name, path) for every *.toml on the profile path, first directory first, shadowed names skipped."""
    seen: set[str] = set()
    for d in paths.profile_path():
        if not d.is_dir():
            continue
        for f in sorted(d.glob("*.toml")):
            if f.stem in seen or not f.is_file():
                continue
            seen.add(f.stem)
            yield f.stem, f


def list_profiles() -> list[ProfileEntry]:
    """Every profile on paths.profile_path(), sorted by name (presets and user profiles alike)."""
    out: list[ProfileEntry] = []
    for name, f in _candidates():
        try:
            prof = load_profile(f)
            out.append(ProfileEntry(name, f, _kind(f.parent), prof.description, hypervisor=prof.guest.hypervisor,
                                    xen_type=xen_guest_type(prof), raid_on=prof.disk.raid_on))
        except (ProfileError, NotFound) as exc:
            out.append(ProfileEntry(name, f, _kind(f.parent), "", str(exc)))
    return sorted(out, key=lambda e: e.name)


def find_profile_path(name: str) -> Path:
    """The file that defines profile `name` (first match on the profile path), or NotFound."""
    if re.fullmatch(NAME_PATTERN.strip("^$"), name):
        for d in paths.profile_path():
            f = d / f"{name}.toml"
            if f.is_file():
                return f
    known = sorted(n for n, _ in _candidates())
    raise NotFound(f"no profile named {inputs.shown(name)}; known profiles: {', '.join(known) or '(none)'}")


def find_profile(name: str) -> Profile:
    """Load the profile called `name` from the profile path (NotFound lists the known names)."""
    return load_profile(find_profile_path(name))


def resolve_profile(ref: str) -> Profile:
    """A profile by name, or by file when `ref` looks like a path (contains '/' or ends in .toml)."""
    if "/" in ref or ref.endswith(".toml"):
        return load_profile(ref)
    return find_profile(ref)


MIX = "+"  # joins the profiles of a mixed run, one per guest in turn: "virtio-file+kvm-cache-none"
# What a mixed run's profiles may differ in: each guest's own hardware. The rest (the backing store, the host's
# bridge and MTU, the hypervisor, an export's mount) is the run's, set up once for every guest.
GUEST_SIDE_KNOBS = ("guest.vcpus", "guest.memory_mib", "disk.bus", "disk.cache", "disk.io", "disk.iothreads",
                    "disk.queues", "network.model", "network.vhost", "network.queues")


def split_mix(ref: str) -> list[str]:
    """The profile references in `ref`: several joined by MIX, or one (a name, or a file even with MIX in its path).
    A file whose path holds MIX stays whole inside a list too: at each place the longest run of pieces that names
    an existing file is one reference."""
    if MIX not in ref or Path(ref).is_file():
        return [ref]
    pieces, out, i = ref.split(MIX), [], 0
    while i < len(pieces):
        j = next((j for j in range(len(pieces), i + 1, -1) if Path(MIX.join(pieces[i:j]).strip()).is_file()), i + 1)
        out.append(MIX.join(pieces[i:j]).strip())
        i = j
    return out


def resolve_mix(ref: str) -> list[Profile]:
    """The profiles of `ref`: one (a name or a file), or several joined by MIX for a mixed run of N guests."""
    parts = split_mix(ref)
    if not all(parts):
        raise UsageError(f"--profile {inputs.shown(ref)}: an empty name in the list; allowed: NAME or "
                         f"NAME{MIX}NAME[{MIX}...] (one profile per guest in turn)")
    return [resolve_profile(p) for p in parts]


def mix_problem(profiles: list[Profile], *, link_unused: bool = False) -> str | None:
    """Why these profiles cannot share one run (a knob outside GUEST_SIDE_KNOBS that differs, named with both
    values), else None. `link_unused`: the run sends nothing over the guests' NICs (storage tests on their own
    disks), so network.mtu may differ too."""
    free = (*GUEST_SIDE_KNOBS, "network.mtu") if link_unused else GUEST_SIDE_KNOBS
    first = profiles[0]
    for other in profiles[1:]:
        for key, a, b in diff_profiles(first, other):
            if key not in free:
                why = (" (the run's network tests, NFS mount or MPI job use the guests' link)"
                       if key == "network.mtu" else "")
                return (f"profiles {first.name} and {other.name} differ in {key} ({a!r} / {b!r}), which the run sets "
                        f"up once for every guest{why}; allowed to differ: {', '.join(free)}")
    return None


def mix_hash(profiles: list[Profile]) -> str:
    """One profile's hash, or for a mixed run the hash of its profiles' hashes in guest order."""
    if len(profiles) == 1:
        return profiles[0].hash
    return hashlib.sha256(MIX.join(p.hash for p in profiles).encode()).hexdigest()


def diff_profiles(a: Profile, b: Profile) -> list[tuple[str, object, object]]:
    """(key, a_value, b_value) for every tuning knob that differs, in schema order.
    Names and descriptions are not knobs and are not compared."""
    ka, kb = a.knobs(every=True), b.knobs(every=True)
    return [(k, ka[k], kb[k]) for k in ka if ka[k] != kb[k]]


def preset_names() -> list[str]:
    """Names of the shipped presets (profiles/*.toml in the preset directories)."""
    return sorted({f.stem for d in paths.preset_dirs() for f in d.glob("*.toml")})


def save_user_profile(profile: Profile) -> Path:
    """Validate `profile` and write it (canonical TOML) to the user profiles directory.
    Refuses a name used by a shipped preset; overwrites the user's own profile of that name."""
    source = f"user profile {profile.name!r}"
    validated = validate_data(profile.model_dump(), source)
    presets = preset_names()
    if validated.name in presets:
        raise ProfileError(
            source,
            [
                ProfileProblem(
                    "name",
                    validated.name,
                    "is the name of a shipped preset; presets cannot be overwritten",
                    "any valid name not used by a preset (presets: " + ", ".join(presets) + ")",
                )
            ],
        )
    d = paths.user_profiles_dir()
    d.mkdir(parents=True, exist_ok=True)
    target = d / f"{validated.name}.toml"
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    tmp.write_text(validated.to_toml(), encoding="utf-8")
    os.replace(tmp, target)
    return target


# -- the active profile -----------------------------------------------------------------

DEFAULT_ACTIVE = "virtio-disk"


def _active_file() -> Path:
    return paths.state_dir() / "active-profile"


def active_profile_name() -> str:
    """The profile new runs and guests use unless told otherwise (set with set_active_profile()).
    Falls back to DEFAULT_ACTIVE when none was chosen or the chosen one no longer exists."""
    try:
        name = _active_file().read_text().strip()
    except OSError:
        name = ""
    if name:
        try:
            find_profile_path(name)
            return name
        except NotFound:
            pass
    return DEFAULT_ACTIVE


def set_active_profile(name: str) -> Profile:
    """Make `name` the active profile; it must exist and validate (errors name the file and keys)."""
    prof = find_profile(name)
    f = _active_file()
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f".{f.name}.tmp{os.getpid()}")
    tmp.write_text(prof.name + "\n")
    os.replace(tmp, f)
    return prof
