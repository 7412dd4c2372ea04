"""Render a validated tuning Profile into libvirt domain XML.

`render_domain()` produces a deterministic, pretty-printed <domain> for one benchmark
guest: direct kernel boot of the cloudbox guest (kernel + initramfs, no boot disk), the
benchmark disk (or disk.count of them) as the only disks, one bridged NIC, a serial console (logged to a file by
libvirt's virtlogd when `console_log` is given), a guest-agent channel, and a <metadata>
element in the cloudbox namespace (CLOUDBOX_XMLNS) carrying the profile's name and hash
(and the run's id) so cloudbox can recognise and clean up its own guests. What is read back (that tag, the NIC's
MAC and tap device, the agent's socket) is declared once, as a part's values (`ProfileTag`, `Interface`,
`Channel`) the writer sets and `read_domain()` reads, as virt-manager's virtinst binds its XML.

A profile with disk.count N > 1 gets N such disks, one per backing store, named on from the first target by
the bus's own sequence (vda, vdb, ...; sda, sdb, ...; hda..hdd; xvda, xvdb, ...).

Mappings (profile -> libvirt), KVM/QEMU (machine "pc": i440fx has IDE, q35 does not):
  virtio-blk   target vda bus virtio; <driver iothread=1 queues=N>; with disk.iothreads N > 1 the queues dealt
               over them (<driver><iothreads><iothread id><queue id>: libvirt 10.0, QEMU 9.0)
  virtio-scsi  controller scsi model virtio-scsi (<driver queues iothread>); target sda bus scsi
  scsi-lsi     controller scsi model lsilogic (QEMU device "lsi" = LSI 53C895A); target sda bus scsi
  sata         target sda bus sata (libvirt adds an ich9-ahci controller)
  ide          target hda bus ide
  nvme         backing nvme-pci only: no <disk> but <hostdev type=pci managed=yes><driver name=vfio>, the host's
               controller itself, which the guest sees as nvme0n1
  virtiofs     no disk: <filesystem type=mount><driver type=virtiofs/><binary><cache mode/></binary><source dir/>
               <target dir=cloudbox/>, the guest's RAM a shared memfd
  NIC          <model type=e1000|rtl8139|virtio>; virtio gets <driver name=vhost|qemu queues=N>; on the bridge
               (interface type bridge), a macvtap (type direct, source dev mode=bridge: network.attach = macvtap) or
               an SR-IOV VF (type hostdev managed, source address type=pci: attach = sriov, model vf)
Xen (libxl), the guest type from guest.xen_type (auto: PV on xen-vbd, HVM on ide/scsi-lsi):
  PV           os type xen (machine xenpv), direct kernel boot, target xvda bus xen, NIC netfront
  PVH          os type xenpvh (machine xenpvh), otherwise as PV: the same disks, NIC, console and channel
  HVM          machine xenfv, target hda bus ide / sda bus scsi (libxl has Xen's QEMU emulate them),
               NIC e1000|rtl8139|netfront
  Disk driver "phy" (blkback) or "qemu" (qdisk) as disk.xen_backend says (auto: phy for
  block devices, qdisk for files; phy on a file is refused); no cache/io attributes
  (libxl ignores them; profiles state the mode libxl uses). Console on the Xen PV
  console (PV, PVH) or the first serial port (HVM); the agent channel is a Xen PV channel;
  memballoon model xen (libxl rejects model none).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Self, TypeVar, overload

from cloudbox.core.disks import virtiofs
from cloudbox.core.disks.backing import NetworkSource
from cloudbox.core.disks.pcidev import address_parts
from cloudbox.core.spec.iopaths import VIRTIOFS_CACHE, Placement, shared_memory
from cloudbox.core.spec.knobs import NVME_PCI, VHOST_USER, VIRTIOFS, guest_disks, xen_backend
from cloudbox.core.spec.profiles import Profile, xen_guest_type

from .placement import HostPlacement

CLOUDBOX_XMLNS = "https://cloudbox.invalid/xmlns/1"
AGENT_CHANNEL = "org.qemu.guest_agent.0"

_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")

# bus -> (target dev, libvirt disk bus)
_TARGETS: dict[str, tuple[str, str]] = {
    "virtio-blk": ("vda", "virtio"),
    "virtio-scsi": ("sda", "scsi"),
    "scsi-lsi": ("sda", "scsi"),
    "sata": ("sda", "sata"),
    "ide": ("hda", "ide"),
    "xen-vbd": ("xvda", "xen"),
    "nvme": ("nvme0n1", "nvme"),
}
_SCSI_CONTROLLER = {"virtio-scsi": "virtio-scsi", "scsi-lsi": "lsilogic"}
_NIC_MODEL = {"e1000": "e1000", "rtl8139": "rtl8139", "virtio": "virtio", "xen-netfront": "netfront"}  # not vf
# The cloudbox guest's kernel modules for each bus and NIC (its /init loads only these, given cloudbox.drivers=):
# probing drivers for absent hardware (ata_piix on i440fx's own IDE, say) costs seconds under TCG.
_DISK_DRIVERS = {
    "virtio-blk": ("virtio_blk",),
    "virtio-scsi": ("virtio_scsi", "crct10dif_generic", "sd_mod"),
    "scsi-lsi": ("sym53c8xx", "crct10dif_generic", "sd_mod"),
    "sata": ("ahci", "crct10dif_generic", "sd_mod"),
    "ide": ("ata_piix", "crct10dif_generic", "sd_mod"),
    "xen-vbd": ("xen_blkfront",),
    "nvme": ("nvme",),
}
_NIC_DRIVERS = {"virtio": ("virtio_net",), "e1000": ("e1000",), "rtl8139": ("8139cp", "8139too"),
                "vf": ("igbvf", "ixgbevf", "iavf"),  # the VF drivers of Intel's SR-IOV NICs (QEMU's igb: igbvf)
                "xen-netfront": ("xen_netfront",)}
# A Xen PV guest's agent channel is its first extra PV console (hvc0 is its console), a tty for qemu-ga.
XEN_PV_AGENT_CMDLINE = "console=hvc0 cloudbox.agent=/dev/hvc1 cloudbox.agent_method=isa-serial"
_SHARE_DRIVERS = ("virtiofs",)  # a virtiofs share's (the guest image's on-demand module; fuse comes with it)
_ALWAYS_DRIVERS = ("button", "evdev")  # the ACPI power button, for the guest's acpid
_RAID_DRIVERS = {"none": (), "0": ("md_mod", "raid0")}
# Devices that take interrupts by MSI/MSI-X: a guest with nothing else on PCI skips ACPI's interrupt-link
# evaluation (pci=noacpi; 0.13-0.3 s per device under TCG). The LSI, IDE and AHCI disks, e1000 and RTL8139 need it.
_MSI_BUSES = ("virtio-blk", "virtio-scsi", "nvme")
_MSI_NICS = ("virtio",)


def guest_drivers(profile: Profile, *, nic: bool, disk: bool = True) -> list[str] | None:
    """The kernel modules the cloudbox guest needs under QEMU/KVM or Xen PV for `profile` (its agent's virtio
    modules are its /init's own); None for a bus or NIC model without an entry here (the guest then loads every
    module)."""
    d, n = profile.disk.bus, profile.network.model
    if d not in _DISK_DRIVERS or (nic and n not in _NIC_DRIVERS):
        return None
    raid = profile.disk.raid if profile.disk.raid_on == "guest" else "none"  # the host's array is one plain disk
    disks = _SHARE_DRIVERS if profile.disk.backing == VIRTIOFS else _DISK_DRIVERS[d]
    return [*(disks if disk else ()), *_RAID_DRIVERS[raid],
            *(_NIC_DRIVERS[n] if nic else ()), *_ALWAYS_DRIVERS]


def guest_boot_args(profile: Profile, *, nic: bool, disk: bool = True) -> list[str]:
    """The kernel parameters the cloudbox guest boots with under QEMU/KVM for `profile`, beside
    guestimage.CMDLINE: cloudbox.drivers= (guest_drivers()) and pci=noacpi when every PCI device it gets uses
    MSI (the virtio-serial agent channel does)."""
    drivers = guest_drivers(profile, nic=nic, disk=disk)
    msi = (not disk or profile.disk.bus in _MSI_BUSES) and (not nic or profile.network.model in _MSI_NICS)
    return [*([f"cloudbox.drivers={','.join(drivers)}"] if drivers else []), *(["pci=noacpi"] if msi else [])]


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrs)
    if text is not None:
        el.text = text
    return el


# -- the parts of a domain cloudbox reads back, each value declared once for the writer and the reader -----------
class _Value:
    """One value of a part: attribute `attr` of the element at `path` below the part's element ("." for the element
    itself). Read, it is None when absent; written, the elements on its path are made where missing (appended)."""

    def __init__(self, path: str, attr: str):
        self.path, self.attr = path, attr

    def _element(self, part: _Part) -> ET.Element | None:
        return part.el if self.path == "." else part.el.find(self.path)

    @overload
    def __get__(self, part: None, owner: type) -> _Value: ...
    @overload
    def __get__(self, part: _Part, owner: type) -> str | None: ...
    def __get__(self, part: _Part | None, owner: type) -> _Value | str | None:
        if part is None:
            return self
        el = self._element(part)
        return el.get(self.attr) if el is not None else None

    def __set__(self, part: _Part, value: str) -> None:
        el = self._element(part)
        if el is None:
            el = part.el
            for tag in self.path.split("/"):
                el = found if (found := el.find(tag)) is not None else ET.SubElement(el, tag)
        el.set(self.attr, value)


class _Part:
    """An element of a domain's XML: TAG as written below its parent, PATH where a reader finds it below
    <domain>."""

    TAG = ""
    PATH = ""

    def __init__(self, el: ET.Element):
        self.el = el

    @classmethod
    def new(cls, parent: ET.Element, **attrs: str) -> Self:
        return cls(_sub(parent, cls.TAG, **attrs))

    def xml(self) -> str:
        return ET.tostring(self.el, encoding="unicode")


class ProfileTag(_Part):
    """cloudbox's tag in the domain's <metadata>: the profile's name and hash, and the run's id."""

    # Written with a literal prefix so the xmlns declaration sits on the element itself
    # (ElementTree would hoist a registered namespace onto <domain>).
    TAG = "cloudbox:profile"
    PATH = f"metadata/{{{CLOUDBOX_XMLNS}}}profile"
    name = _Value(".", "name")
    hash = _Value(".", "hash")
    run = _Value(".", "run")

    @classmethod
    def new(cls, parent: ET.Element, **attrs: str) -> Self:
        return super().new(parent, **{"xmlns:cloudbox": CLOUDBOX_XMLNS}, **attrs)

    @classmethod
    def from_xml(cls, text: str) -> ProfileTag:
        """The tag as libvirt's metadata() call returns it (the element alone); ET.ParseError when it is not XML."""
        return cls(ET.fromstring(text))


class Interface(_Part):
    """The guest's NIC."""

    TAG = "interface"
    PATH = "devices/interface"
    mac = _Value("mac", "address")
    bridge = _Value("source", "bridge")
    lower = _Value("source", "dev")  # a macvtap's link (type direct)
    mode = _Value("source", "mode")
    tap = _Value("target", "dev")  # the host's tap device: libvirt writes it into the live XML
    link = _Value("link", "state")  # up or down: libvirt's link state, QEMU's set_link


class Channel(_Part):
    """A channel device: the guest agent's."""

    TAG = "channel"
    PATH = "devices/channel"
    type = _Value(".", "type")
    mode = _Value("source", "mode")
    socket = _Value("source", "path")
    target_type = _Value("target", "type")
    target_name = _Value("target", "name")


class VcpuPin(_Part):
    """One vCPU's pinning (<cputune><vcpupin>)."""

    TAG = "vcpupin"
    PATH = "cputune/vcpupin"
    vcpu = _Value(".", "vcpu")
    cpuset = _Value(".", "cpuset")


class MemoryBinding(_Part):
    """The guest RAM's binding to host NUMA nodes (<numatune><memory>)."""

    TAG = "memory"
    PATH = "numatune/memory"
    mode = _Value(".", "mode")
    nodeset = _Value(".", "nodeset")


class HugePage(_Part):
    """The huge page size backing the guest's RAM (<memoryBacking><hugepages><page>)."""

    TAG = "page"
    PATH = "memoryBacking/hugepages/page"
    size = _Value(".", "size")
    unit = _Value(".", "unit")


_P = TypeVar("_P", bound=_Part)


class DomainXML:
    """A domain's XML read back through the parts the writer declares: `read_domain()`."""

    def __init__(self, root: ET.Element | None):
        self.root = root  # None: not XML

    def _find(self, part: type[_P]) -> _P | None:
        el = self.root.find(part.PATH) if self.root is not None else None
        return part(el) if el is not None else None

    def _all(self, part: type[_Part]) -> list[ET.Element]:
        return list(self.root.iterfind(part.PATH)) if self.root is not None else []

    @property
    def name(self) -> str:
        """The domain's name ("" when it has none)."""
        return (self.root.findtext("name") or "").strip() if self.root is not None else ""

    @property
    def type(self) -> str:
        """The domain's type: kvm, qemu (TCG) or xen ("" when not XML)."""
        return self.root.get("type", "") if self.root is not None else ""

    @property
    def metadata(self) -> ProfileTag | None:
        """cloudbox's tag, if cloudbox made the domain."""
        return self._find(ProfileTag)

    @property
    def interface(self) -> Interface | None:
        """The (first) NIC."""
        return self._find(Interface)

    @property
    def vcpu_pins(self) -> dict[str, str]:
        """vCPU -> the host CPUs it is pinned to, as <cputune> says; empty when nothing is pinned."""
        pins = [VcpuPin(el) for el in self._all(VcpuPin)]
        return {pin.vcpu or "": pin.cpuset or "" for pin in pins}

    @property
    def memory_binding(self) -> MemoryBinding | None:
        return self._find(MemoryBinding)

    @property
    def hugepage(self) -> HugePage | None:
        return self._find(HugePage)

    @property
    def agent_socket(self) -> str | None:
        """The unix socket of the Xen agent channel (a unix channel whose target is Xen's AGENT_CHANNEL)."""
        for el in self.root.iterfind(Channel.PATH) if self.root is not None else ():
            chan = Channel(el)
            if (chan.type == "unix" and chan.target_type == "xen" and chan.target_name == AGENT_CHANNEL
                    and chan.socket):
                return chan.socket
        return None


def read_domain(domain_xml: str) -> DomainXML:
    """`domain_xml` read back; text that is not XML reads as a domain without any part."""
    try:
        return DomainXML(ET.fromstring(domain_xml))
    except ET.ParseError:
        return DomainXML(None)


@dataclass(frozen=True)
class DomainPlan:
    """One guest's domain beside its profile: what `render_domain()` turns into XML.

    domain_type is "kvm" or "qemu" (TCG) for hypervisor kvm, "xen" for hypervisor xen.
    disk_path is the prepared backing store (a file, or a block device when disk_is_block); more_disk_paths, the
    other disks' stores (of the same kind) when the profile has disk.count > 1, one per further disk.
    network_source, when given, is what QEMU opens instead (disk.attach = qemu: <disk type='network'>, with TLS
    through libvirt's nbd_tls_x509_cert_dir). A profile whose guest attaches its network volume itself (disk.attach
    = guest) has no disk here: disk_path is "" and the bridge is required (the volume reaches the guest through its
    NIC). No <interface> when bridge is None. run_uuid, when given, is written to the metadata (attribute "run") so
    orphans of dead runs can be found. console_log, an absolute path, makes libvirt copy everything the guest
    writes to its serial console into that file (<log append='off'>, written by virtlogd as root; QEMU/KVM only).
    Unless cmdline names cloudbox.drivers= itself or boot_args is False (a guest image older than these
    parameters), it gains guest_boot_args() under QEMU/KVM and cloudbox.drivers= (guest_drivers()) under Xen PV;
    under Xen PV also the console and agent of XEN_PV_AGENT_CMDLINE. agent_socket (Xen only, required there): the
    absolute path of the unix socket libxl's QEMU in dom0 serves the agent's channel on (core.virt.qga talks to
    it). placement: the profile's [placement] resolved on the host (core.virt.placement.resolve), required when the
    profile has one: pinning, NUMA binding, huge pages and the guest's NUMA nodes (QEMU/KVM only)."""

    profile: Profile
    _: KW_ONLY
    name: str
    domain_type: str
    kernel: str
    initrd: str
    cmdline: str
    disk_path: str
    disk_is_block: bool
    bridge: str | None
    mac: str | None = None
    emulator: str | None = None
    uuid: str | None = None
    run_uuid: str | None = None
    console_log: str | None = None
    more_disk_paths: Sequence[str] = ()
    network_source: NetworkSource | None = None
    agent_socket: str | None = None
    boot_args: bool = True
    placement: HostPlacement | None = None


def render_domain(plan: DomainPlan) -> str:
    """The libvirt domain XML (a str, ending in a newline) for `plan`. Raises ValueError on a plan that does not
    fit its profile or libvirt."""
    profile, name, domain_type, cmdline = plan.profile, plan.name, plan.domain_type, plan.cmdline
    disk_path, disk_is_block, bridge = plan.disk_path, plan.disk_is_block, plan.bridge
    network_source = plan.network_source
    _check_arguments(profile, name=name, domain_type=domain_type, mac=plan.mac, uuid=plan.uuid,
                     run_uuid=plan.run_uuid, console_log=plan.console_log, kernel=plan.kernel, initrd=plan.initrd,
                     disk_path=disk_path, more_disk_paths=plan.more_disk_paths, agent_socket=plan.agent_socket)
    xen = domain_type == "xen"
    if xen and xen_backend(profile.disk) == "phy" and not disk_is_block:
        raise ValueError(f"profile {profile.name!r} has disk.xen_backend = phy (blkback), which serves block devices "
                         f"only; disk_path {disk_path!r} is a file")
    guest_attach = profile.disk.backing == "network-volume" and profile.disk.attach == "guest"
    if guest_attach and bridge is None:
        raise ValueError(f"profile {profile.name!r} has disk.attach = guest: the guest reaches its volume through "
                         "its NIC, so it needs a bridge")
    if profile.placement != Placement() and plan.placement is None:
        raise ValueError(f"profile {profile.name!r} has a [placement] table: resolve it on the host "
                         "(core.virt.placement.resolve) and pass it as placement")
    if plan.placement is not None and xen:
        raise ValueError("placement: libvirt's Xen (libxl) domains take no [placement]; dom0's is [dom0]")
    if network_source is not None and (xen or profile.disk.attach != "qemu"):
        raise ValueError("a network disk source is QEMU's own initiator: it needs disk.attach = qemu under KVM/QEMU")
    xen_type = xen_guest_type(profile) if xen else ""
    pv = xen_type in ("pv", "pvh")  # PV devices, PV console and agent channel alike
    if plan.boot_args and "cloudbox.drivers=" not in cmdline:
        if not xen:
            cmdline = " ".join([cmdline, *guest_boot_args(profile, nic=bridge is not None, disk=not guest_attach)])
        elif pv and (drivers := guest_drivers(profile, nic=bridge is not None, disk=not guest_attach)):
            cmdline = f"{cmdline} cloudbox.drivers={','.join(drivers)}"
        cmdline = cmdline.strip()
    if pv and "cloudbox.agent=" not in cmdline:
        cmdline = f"{cmdline} {XEN_PV_AGENT_CMDLINE}".strip()

    root = ET.Element("domain", {"type": domain_type})
    _sub(root, "name", name)
    if plan.uuid is not None:
        _sub(root, "uuid", plan.uuid)
    _metadata(root, profile, plan.run_uuid)
    _resources(root, profile, xen, plan.placement)
    _boot(root, profile, xen=xen, xen_type=xen_type, kernel=plan.kernel, initrd=plan.initrd, cmdline=cmdline)
    if plan.placement is not None and plan.placement.guest_nodes > 1:
        _guest_numa(root, profile.guest.vcpus, profile.guest.memory_mib, plan.placement.guest_nodes)

    devices = _sub(root, "devices")
    if plan.emulator is not None:
        _sub(devices, "emulator", plan.emulator)
    _controllers(devices, profile, xen)
    if profile.disk.backing == VIRTIOFS:
        _share(devices, profile, disk_path)
    for i, path in enumerate([] if guest_attach or profile.disk.backing == VIRTIOFS
                             else [disk_path, *plan.more_disk_paths]):
        _disk(devices, profile, xen, disk_path=path, disk_is_block=disk_is_block, index=i, network=network_source)
    if bridge is not None:
        _interface(devices, profile, bridge, plan.mac)
    _console_and_agent(devices, xen=xen, pv=pv, console_log=plan.console_log, agent_socket=plan.agent_socket)
    _sub(devices, "memballoon", model="xen" if xen else "none")

    ET.indent(root, space="  ")
    return ET.tostring(root, encoding="unicode") + "\n"


def _check_arguments(profile: Profile, *, name: str, domain_type: str, mac: str | None, uuid: str | None,
                     run_uuid: str | None, console_log: str | None, kernel: str, initrd: str, disk_path: str,
                     more_disk_paths: Sequence[str] = (), agent_socket: str | None = None) -> None:
    hv = profile.guest.hypervisor
    if domain_type not in ("kvm", "qemu", "xen"):
        raise ValueError(f"domain_type must be kvm, qemu or xen, not {domain_type!r}")
    if (hv == "xen") != (domain_type == "xen"):
        raise ValueError(
            f"profile {profile.name!r} is for hypervisor {hv}; domain type {domain_type!r} "
            f"does not run it (use {'xen' if hv == 'xen' else 'kvm or qemu'})"
        )
    if not name or "/" in name or len(name) > 200 or any(c.isspace() for c in name):
        raise ValueError(f"invalid domain name {name!r}: 1..200 characters, no '/' or whitespace")
    if mac is not None and not _MAC.match(mac):
        raise ValueError(f"invalid MAC address {mac!r} (expected six colon-separated hex bytes)")
    if uuid is not None and not _UUID.match(uuid):
        raise ValueError(f"invalid UUID {uuid!r}")
    if run_uuid is not None and not re.fullmatch(r"[0-9A-Za-z-]{1,64}", run_uuid):
        raise ValueError(f"invalid run id {run_uuid!r}")
    if console_log is not None:
        if domain_type == "xen":
            raise ValueError("console_log: libvirt's Xen (libxl) driver does not log consoles to a file")
        if not console_log.startswith("/") or any(c in console_log for c in "\n\r\0"):
            raise ValueError(f"console_log must be an absolute path without control characters, not {console_log!r}")
    if domain_type == "xen":
        if not agent_socket or not agent_socket.startswith("/") or any(c in agent_socket for c in "\n\r\0"):
            raise ValueError(f"agent_socket: a Xen domain needs an absolute path for its agent's channel, not "
                             f"{agent_socket!r}")
        if len(agent_socket.encode()) > 107:
            raise ValueError(f"agent_socket: {agent_socket!r} is longer than a unix socket path may be (107 bytes)")
    elif agent_socket is not None:
        raise ValueError("agent_socket: only Xen domains take one (QEMU/KVM's agent is reached through libvirt)")
    if profile.disk.backing == "network-volume" and profile.disk.attach == "guest":
        if disk_path or more_disk_paths:
            raise ValueError(f"profile {profile.name!r} has disk.attach = guest: the guest attaches its volume "
                             "itself, so disk_path must be empty")
        disk_path, more_disk_paths = "-", ()  # no disk: the checks below are the files'
    for what, value in (("kernel", kernel), ("initrd", initrd), ("disk_path", disk_path),
                        *(("more_disk_paths", p) for p in more_disk_paths)):
        if not value:
            raise ValueError(f"{what} must not be empty")
    if 1 + len(more_disk_paths) != guest_disks(profile.disk):
        raise ValueError(f"profile {profile.name!r} gives the guest {guest_disks(profile.disk)} disk(s); got "
                         f"{1 + len(more_disk_paths)} disk path(s)")
    if profile.disk.backing == NVME_PCI:
        address_parts(disk_path)  # a ValueError naming the form unless a PCI address
    if len({disk_path, *more_disk_paths}) != 1 + len(more_disk_paths):
        raise ValueError("each disk needs its own backing store; two disk paths are the same")


def _metadata(root: ET.Element, profile: Profile, run_uuid: str | None) -> None:
    tag = ProfileTag.new(_sub(root, "metadata"))
    tag.name, tag.hash = profile.name, profile.hash
    if run_uuid is not None:
        tag.run = run_uuid


def _resources(root: ET.Element, profile: Profile, xen: bool, placement: HostPlacement | None) -> None:
    g, d = profile.guest, profile.disk
    _sub(root, "memory", str(g.memory_mib), unit="MiB")
    _sub(root, "currentMemory", str(g.memory_mib), unit="MiB")
    pages = placement.hugepage_kib if placement is not None else 0
    shared = shared_memory(d)  # a vhost-user device's daemon maps the guest's RAM
    if pages or shared:
        # memfd, not a hugetlbfs mount: libvirt reads those once at its start, and memfd needs none
        backing = _sub(root, "memoryBacking")
        if pages:
            page = HugePage.new(_sub(backing, "hugepages"))
            page.size, page.unit = str(pages), "KiB"
        _sub(backing, "source", type="memfd")
        if shared:
            _sub(backing, "access", mode="shared")
    _sub(root, "vcpu", str(g.vcpus), placement="static")
    if d.iothreads > 0 and not xen and d.backing != VHOST_USER:  # a vhost-user disk's iothread is its daemon's
        _sub(root, "iothreads", str(d.iothreads))
    if placement is not None:
        _placement(root, placement, 0 if d.backing == VHOST_USER else d.iothreads)


def _placement(root: ET.Element, placement: HostPlacement, iothreads: int) -> None:
    """<cputune> (vCPUs, QEMU's threads, the iothreads) and <numatune> (the RAM's host nodes)."""
    if placement.pinned:
        tune = _sub(root, "cputune")
        for i, cpus in enumerate(placement.vcpus):
            if cpus:
                pin = VcpuPin.new(tune)
                pin.vcpu, pin.cpuset = str(i), cpus
        if placement.emulator:
            _sub(tune, "emulatorpin", cpuset=placement.emulator)
        for k in range(1, iothreads + 1) if placement.iothreads else ():
            _sub(tune, "iothreadpin", iothread=str(k), cpuset=placement.iothreads)
    if placement.memory_nodes:
        binding = MemoryBinding.new(_sub(root, "numatune"))
        binding.mode, binding.nodeset = placement.memory_mode, placement.memory_nodes


def _guest_numa(root: ET.Element, vcpus: int, memory_mib: int, nodes: int) -> None:
    """The guest's own NUMA nodes: its vCPUs and RAM split evenly over them (validation made both divide)."""
    numa = _sub(_sub(root, "cpu"), "numa")
    per = vcpus // nodes
    for i in range(nodes):
        first, last = i * per, (i + 1) * per - 1
        _sub(numa, "cell", id=str(i), cpus=str(first) if first == last else f"{first}-{last}",
             memory=str(memory_mib // nodes), unit="MiB")


def _boot(root: ET.Element, profile: Profile, *, xen: bool, xen_type: str, kernel: str, initrd: str,
          cmdline: str) -> None:
    """Direct kernel boot, the machine's features, and a guest that is destroyed whenever it stops."""
    os_el = _sub(root, "os")
    pv = xen_type in ("pv", "pvh")
    if xen_type == "pv":
        _sub(os_el, "type", "xen", arch="x86_64", machine="xenpv")
    elif xen_type == "pvh":
        # libxl gives a PVH guest its ACPI tables itself; libvirt passes no <features> for it
        _sub(os_el, "type", "xenpvh", arch="x86_64", machine="xenpvh")
    else:
        _sub(os_el, "type", "hvm", arch="x86_64", machine="xenfv" if xen else "pc")
    _sub(os_el, "kernel", kernel)
    _sub(os_el, "initrd", initrd)
    _sub(os_el, "cmdline", cmdline)
    if not pv:
        features = _sub(root, "features")
        _sub(features, "acpi")
        _sub(features, "apic")
        if xen:
            _sub(features, "pae")
    _sub(root, "clock", offset="utc")
    _sub(root, "on_poweroff", "destroy")
    _sub(root, "on_reboot", "destroy")
    _sub(root, "on_crash", "destroy")


def _controllers(devices: ET.Element, profile: Profile, xen: bool) -> None:
    d = profile.disk
    if not xen and d.bus in _SCSI_CONTROLLER:
        ctrl = _sub(devices, "controller", type="scsi", index="0", model=_SCSI_CONTROLLER[d.bus])
        if d.bus == "virtio-scsi" and (d.queues > 1 or d.iothreads > 0):
            drv = _sub(ctrl, "driver")
            if d.queues > 1:
                drv.set("queues", str(d.queues))
            if d.iothreads > 0:
                drv.set("iothread", "1")
    if not xen:
        _sub(devices, "controller", type="virtio-serial", index="0")
        # No USB: libvirt would otherwise add a PIIX3 UHCI controller nobody uses.
        _sub(devices, "controller", type="usb", index="0", model="none")


def target_dev(bus: str, index: int) -> str:
    """The guest-visible name of benchmark disk `index` (0-based) on profile bus `bus`: vda, vdb, ...; sda, ..."""
    first = _TARGETS[bus][0]
    return first[:-1] + chr(ord(first[-1]) + index)


def _disk(devices: ET.Element, profile: Profile, xen: bool, *, disk_path: str, disk_is_block: bool,
          index: int = 0, network: NetworkSource | None = None) -> None:
    """Benchmark disk `index`: the profile's bus, cache and I/O mode (QEMU), or phy/qdisk (Xen); over the network
    when `network` is given."""
    d = profile.disk
    if d.backing == VHOST_USER:
        _vhost_user_disk(devices, profile, disk_path)
        return
    if d.backing == NVME_PCI:
        _nvme_controller(devices, disk_path)
        return
    kind = "network" if network is not None else "block" if disk_is_block else "file"
    disk = _sub(devices, "disk", type=kind, device="disk")
    if xen:
        # libvirt's libxl driver: name phy is blkback, qemu is qdisk (QEMU in dom0)
        _sub(disk, "driver", name="phy" if xen_backend(d) == "phy" else "qemu", type=d.format)
    else:
        drv = _sub(disk, "driver", name="qemu", type=d.format, cache=d.cache, io=d.io)
        if d.bus == "virtio-blk":
            if d.iothreads == 1:
                drv.set("iothread", "1")
            if d.queues > 1:
                drv.set("queues", str(d.queues))
            if d.iothreads > 1:
                _queue_map(drv, d.iothreads, d.queues)
    if network is not None:
        src = _sub(disk, "source", protocol=network.protocol, name=network.name)
        if network.tls:
            src.set("tls", "yes")
        _sub(src, "host", name=network.host, port=str(network.port))
        if network.initiator:
            _sub(_sub(src, "initiator"), "iqn", name=network.initiator)
        if network.auth_user:
            _sub(_sub(src, "auth", username=network.auth_user), "secret", type=network.protocol,
                 usage=network.auth_usage)
    elif disk_is_block:
        _sub(disk, "source", dev=disk_path)
    else:
        _sub(disk, "source", file=disk_path)
    _sub(disk, "target", dev=target_dev(d.bus, index), bus=_TARGETS[d.bus][1])


def _vhost_user_disk(devices: ET.Element, profile: Profile, socket: str) -> None:
    """The disk as a vhost-user-blk device on qemu-storage-daemon's socket: the cache, AIO mode and iothread are the
    daemon's (core.disks.vhostuser), QEMU only moves the queues' notifications; its queues stay the profile's."""
    d = profile.disk
    disk = _sub(devices, "disk", type="vhostuser", device="disk")
    drv = _sub(disk, "driver", name="qemu", type="raw")
    if d.queues > 1:
        drv.set("queues", str(d.queues))
    src = _sub(disk, "source", type="unix", path=socket)
    _sub(src, "reconnect", enabled="yes", timeout="10")
    _sub(disk, "target", dev=target_dev(d.bus, 0), bus=_TARGETS[d.bus][1])


def _share(devices: ET.Element, profile: Profile, directory: str) -> None:
    """The run's directory as a virtiofs share: libvirt starts virtiofsd on it (the cache policy disk.cache asks,
    core.spec.iopaths.VIRTIOFS_CACHE) and the guest mounts it by its tag (core.disks.virtiofs.TAG)."""
    fs = _sub(devices, "filesystem", type="mount", accessmode="passthrough")
    _sub(fs, "driver", type="virtiofs", queue="1024")
    _sub(_sub(fs, "binary", xattr="off"), "cache", mode=VIRTIOFS_CACHE[profile.disk.cache])
    _sub(fs, "source", dir=directory)
    _sub(fs, "target", dir=virtiofs.TAG)


def _nvme_controller(devices: ET.Element, address: str) -> None:
    """The host's NVMe controller at PCI `address` handed to the guest whole (VFIO): libvirt unbinds it from the
    host's nvme driver when the guest starts (managed) and binds it back when the guest is gone."""
    dev = _sub(devices, "hostdev", mode="subsystem", type="pci", managed="yes")
    _sub(dev, "driver", name="vfio")
    _sub(_sub(dev, "source"), "address", **address_parts(address))


def queue_map(iothreads: int, queues: int) -> dict[int, list[int]]:
    """IOThread virtqueue mapping: iothread k (1-based) -> the disk's queues it serves, dealt round: with 2
    iothreads and 4 queues, 1 -> [0, 2] and 2 -> [1, 3]."""
    return {k: list(range(k - 1, queues, iothreads)) for k in range(1, iothreads + 1)}


def _queue_map(drv: ET.Element, iothreads: int, queues: int) -> None:
    """<driver><iothreads><iothread id='k'><queue id='q'/>...: libvirt 10.0 and QEMU 9.0 on (iothread-vq-mapping)."""
    threads = _sub(drv, "iothreads")
    for k, qs in queue_map(iothreads, queues).items():
        thread = _sub(threads, "iothread", id=str(k))
        for q in qs:
            _sub(thread, "queue", id=str(q))


def _interface(devices: ET.Element, profile: Profile, bridge: str, mac: str | None) -> None:
    """The NIC on `bridge` (network.attach = bridge), a macvtap on link `bridge` (macvtap: libvirt's direct type,
    bridge mode), or the SR-IOV virtual function at PCI address `bridge` (sriov: handed over whole, libvirt's
    hostdev type); the profile's model, vhost and queues (virtio), and MTU."""
    n = profile.network
    if n.attach == "sriov":
        iface = Interface.new(devices, type="hostdev", managed="yes")
        if mac is not None:
            iface.mac = mac.lower()
        _sub(_sub(iface.el, "source"), "address", type="pci", **address_parts(bridge))
        return  # the VF's MTU is the host side's (core.virt.sriov sets it)
    iface = Interface.new(devices, type="direct" if n.attach == "macvtap" else "bridge")
    if mac is not None:
        iface.mac = mac.lower()
    if n.attach == "macvtap":
        iface.lower, iface.mode = bridge, "bridge"
    else:
        iface.bridge = bridge
    _sub(iface.el, "model", type=_NIC_MODEL[n.model])
    if n.model == "virtio":
        drv = _sub(iface.el, "driver", name="vhost" if n.vhost else "qemu")
        if n.queues > 1:
            drv.set("queues", str(n.queues))
    if n.attach == "bridge":  # libvirt (9.0) refuses an MTU on a direct NIC: the macvtap takes its link's, the run's
        _sub(iface.el, "mtu", size=str(n.mtu))


def _console_and_agent(devices: ET.Element, *, xen: bool, pv: bool, console_log: str | None,
                       agent_socket: str | None) -> None:
    if pv:
        con = _sub(devices, "console", type="pty")
        _sub(con, "target", type="xen", port="0")
    else:
        serial = _sub(devices, "serial", type="pty")
        if console_log is not None:
            # append='off': a fresh file per guest start; libvirt's console alias of serial 0 shares it.
            _sub(serial, "log", file=console_log, append="off")
        _sub(serial, "target", port="0")
        con = _sub(devices, "console", type="pty")
        _sub(con, "target", type="serial", port="0")
    chan = Channel.new(devices)
    chan.type, chan.mode = "unix", "bind"
    if agent_socket is not None:
        chan.socket = agent_socket
    chan.target_type, chan.target_name = "xen" if xen else "virtio", AGENT_CHANNEL

