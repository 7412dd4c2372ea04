"""Domain XML rendering: every preset and variant passes libvirt's schema (virt-xml-validate) and, for
KVM/QEMU, is accepted by libvirt's test driver with the cache mode and bus asked for."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from pydantic import ValidationError

from cloudbox.core.spec.iopaths import Placement
from cloudbox.core.spec.knobs import guest_disks
from cloudbox.core.spec.profiles import Profile, load_profile, parse_profile
from cloudbox.core.virt.domain import CLOUDBOX_XMLNS, DomainPlan, queue_map, read_domain, render_domain
from cloudbox.core.virt.placement import Topology, resolve

PRESETS = sorted((Path(__file__).resolve().parents[2] / "profiles").glob("*.toml"))

BASE_KVM = """
name = "v"
description = "variant"
[guest]
hypervisor = "kvm"
vcpus = 2
[disk]
bus = "virtio-blk"
cache = "none"
backing = "prealloc-file"
[network]
model = "virtio"
"""


def kvm_variant(**changes: dict) -> Profile:
    base = parse_profile(BASE_KVM)
    data = base.model_dump()
    data["disk"].update(changes.get("disk", {}))
    data["network"].update(changes.get("network", {}))
    return Profile.model_validate(data)  # variants must themselves be valid profiles


def xen_profile(bus: str, backing: str, model: str) -> Profile:
    cache = "none" if bus == "xen-vbd" and backing == "block-device" else "writeback"
    return parse_profile(f"""
name = "x"
description = "xen variant"
[guest]
hypervisor = "xen"
[disk]
bus = "{bus}"
cache = "{cache}"
backing = "{backing}"
[network]
model = "{model}"
""")


VARIANTS: list[tuple[str, Profile]] = (
    [
        (f"bus-{b}", kvm_variant(disk={"bus": b}))
        for b in ("virtio-blk", "virtio-scsi", "scsi-lsi", "sata", "ide")
    ]
    + [(f"nic-{m}", kvm_variant(network={"model": m})) for m in ("e1000", "rtl8139", "virtio")]
    + [
        (f"cache-{c}", kvm_variant(disk={"cache": c}))
        for c in ("none", "writethrough", "writeback", "directsync", "unsafe")
    ]
    + [
        ("io-native", kvm_variant(disk={"io": "native", "cache": "directsync"})),
        ("io-uring", kvm_variant(disk={"io": "io_uring"})),
        ("virtio-blk-iothread-queues", kvm_variant(disk={"iothreads": 1, "queues": 2})),
        ("virtio-blk-iothread-mapping", kvm_variant(disk={"iothreads": 2, "queues": 2})),
        (
            "virtio-scsi-iothread-queues",
            kvm_variant(disk={"bus": "virtio-scsi", "iothreads": 1, "queues": 2}),
        ),
        ("qcow2", kvm_variant(disk={"backing": "qcow2", "format": "qcow2"})),
        ("vhost-multiqueue", kvm_variant(network={"vhost": True, "queues": 2, "mtu": 9000})),
        ("xen-hvm-ide", xen_profile("ide", "prealloc-file", "rtl8139")),
        ("xen-hvm-scsi-netfront", xen_profile("scsi-lsi", "block-device", "xen-netfront")),
        ("xen-pv-file", xen_profile("xen-vbd", "prealloc-file", "xen-netfront")),
    ]
    # RAID 0 over as many disks as each bus takes on its controller.
    + [(f"raid0-{b}-{n}", kvm_variant(disk={"bus": b, "count": n, "raid": "0", "chunk_kib": 64}))
       for b, n in (("virtio-blk", 8), ("virtio-scsi", 8), ("scsi-lsi", 7), ("sata", 6), ("ide", 4))]
    + [("raid0-block", kvm_variant(disk={"backing": "block-device", "count": 3, "raid": "0", "chunk_kib": 4}))]
)

CASES: list[tuple[str, Profile]] = [(p.stem, load_profile(p)) for p in PRESETS] + VARIANTS


def render(
    prof: Profile,
    *,
    name: str = "cbtest",
    domain_type: str | None = None,
    bridge: str | None = "cbbr0",
    mac: str | None = "52:54:00:ab:cd:ef",
    **kw,
) -> str:
    if domain_type is None:
        domain_type = "xen" if prof.guest.hypervisor == "xen" else "kvm"
    if domain_type == "xen":
        kw.setdefault("agent_socket", f"/run/cloudbox/{name}.agent")
    if prof.placement != Placement():  # resolved on a host of one node of four CPUs (tests/test_placement.py)
        kw.setdefault("placement", resolve(prof.placement, prof.guest.vcpus, Topology({0: (0, 1, 2, 3)})))
    if bridge == "cbbr0":  # the NIC's end on the host as the run names it: a link of its own or a VF's address
        bridge = {"macvtap": "cbmv0", "sriov": "0000:03:10.0"}.get(prof.network.attach, bridge)
    block = prof.disk.backing in ("block-device", "network-volume", "nvme-pci")
    if guest_disks(prof.disk) > 1 and "more_disk_paths" not in kw:
        kw["more_disk_paths"] = [f"/dev/sdz{i}" if block else f"/var/tmp/cloudbox/disk{i}.img"
                                 for i in range(2, guest_disks(prof.disk) + 1)]
    return render_domain(DomainPlan(
        prof,
        name=name,
        domain_type=domain_type,
        kernel="/var/lib/cloudbox/guest/vmlinuz",
        initrd="/var/lib/cloudbox/guest/initrd.img",
        cmdline="console=ttyS0 quiet",
        disk_path="" if _guest_attaches(prof) else "0000:01:00.0" if prof.disk.backing == "nvme-pci" else "/dev/sdz"
        if block else "/var/tmp/cloudbox/disk.img",
        disk_is_block=block,
        bridge=bridge,
        mac=mac,
        **kw,
    ))


def _guest_attaches(prof: Profile) -> bool:
    """The guest attaches its network volume itself: no disk in the domain (tests/test_volume_aoe.py)."""
    return prof.disk.backing == "network-volume" and prof.disk.attach == "guest"


def skip_unless_this_libvirt_takes(prof: Profile) -> None:
    """A profile whose XML needs a newer libvirt than this host's (IOThread virtqueue mapping: 10.0) is validated
    where that libvirt is (the appliance's 11.3); here the run refuses it (core.virt.requirements)."""
    from cloudbox.core.virt import requirements

    if prof.guest.hypervisor == "kvm" and (why := requirements.version_problem(prof)):
        pytest.skip(f"this host's libvirt would refuse it: {why}")


def _validator_works() -> bool:
    return shutil.which("virt-xml-validate") is not None and shutil.which("xmllint") is not None


needs_validator = pytest.mark.skipif(
    not _validator_works(),
    reason="virt-xml-validate needs libvirt-clients and xmllint (Debian: libxml2-utils)",
)


@needs_validator
@pytest.mark.parametrize("prof", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_schema_valid(prof: Profile, tmp_path):
    skip_unless_this_libvirt_takes(prof)
    f = tmp_path / "domain.xml"
    f.write_text(render(prof))
    r = subprocess.run(["virt-xml-validate", str(f), "domain"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr + f.read_text()


@pytest.fixture(scope="module")
def test_conn():
    libvirt = pytest.importorskip("libvirt")
    libvirt.registerErrorHandler(lambda *_: None, None)  # errors arrive as exceptions; keep stderr clean
    conn = libvirt.open("test:///default")
    yield conn
    conn.close()


KVM_CASES = [c for c in CASES if c[1].guest.hypervisor == "kvm" and not _guest_attaches(c[1])]
LIBVIRT_BUS = {
    "virtio-blk": "virtio",
    "virtio-scsi": "scsi",
    "scsi-lsi": "scsi",
    "sata": "sata",
    "ide": "ide",
}


@pytest.mark.parametrize("domain_type", ["kvm", "qemu"])
@pytest.mark.parametrize("prof", [c[1] for c in KVM_CASES], ids=[c[0] for c in KVM_CASES])
def test_test_driver_accepts(prof: Profile, domain_type: str, test_conn):
    skip_unless_this_libvirt_takes(prof)
    name = f"cbtest-{prof.name}-{domain_type}"
    dom = test_conn.defineXML(render(prof, name=name, domain_type=domain_type))
    try:
        desc = dom.XMLDesc(0)
    finally:
        dom.undefine()
    root = ET.fromstring(desc)
    assert root.get("type") == domain_type
    if prof.disk.backing == "vhost-user":  # the cache and AIO mode are qemu-storage-daemon's (test_vhost_user.py)
        assert root.find("devices/disk").get("type") == "vhostuser"
        return
    if prof.disk.backing == "nvme-pci":  # the host's controller itself (test_passthrough.py)
        assert root.find("devices/disk") is None and root.find("devices/hostdev").get("type") == "pci"
        return
    drv = root.find("devices/disk/driver")
    assert drv is not None and drv.get("cache") == prof.disk.cache and drv.get("io") == prof.disk.io
    assert root.find("devices/disk/target").get("bus") == LIBVIRT_BUS[prof.disk.bus]
    disks = root.findall("devices/disk")
    assert len(disks) == guest_disks(prof.disk)  # the host's RAID is one disk
    assert len({d.find("target").get("dev") for d in disks}) == len(disks)
    assert all(d.find("driver").get("cache") == prof.disk.cache for d in disks)
    meta = read_domain(desc).metadata
    assert meta is not None and meta.hash == prof.hash  # libvirt keeps cloudbox's tag


def _tree(prof: Profile, **kw) -> ET.Element:
    return ET.fromstring(render(prof, **kw))


def test_deterministic():
    prof = load_profile(PRESETS[0])
    assert render(prof) == render(prof)
    assert render(prof).endswith("</domain>\n")


def test_common_elements():
    root = _tree(kvm_variant(), uuid="c7a5fdbd-cdaf-9455-926a-d65c16db1809")
    assert root.findtext("uuid") == "c7a5fdbd-cdaf-9455-926a-d65c16db1809"
    assert root.find("os/type").attrib == {"arch": "x86_64", "machine": "pc"}
    assert root.findtext("os/type") == "hvm"
    assert root.findtext("os/kernel").endswith("vmlinuz") and root.findtext("os/initrd").endswith(
        "initrd.img"
    )
    assert root.findtext("os/cmdline").startswith("console=ttyS0 quiet cloudbox.drivers=")
    assert root.find("memory").attrib == {"unit": "MiB"} and root.findtext("memory") == "1024"
    assert root.findtext("vcpu") == "2"
    assert root.findtext("on_poweroff") == "destroy" and root.findtext("on_crash") == "destroy"
    assert root.find("devices/memballoon").get("model") == "none"
    assert root.find("devices/controller[@type='virtio-serial']") is not None
    chan = root.find("devices/channel[@type='unix']/target")
    assert chan.attrib == {"type": "virtio", "name": "org.qemu.guest_agent.0"}
    assert root.find("devices/serial[@type='pty']") is not None
    assert root.find("devices/console/target").get("type") == "serial"
    assert len(root.findall("devices/disk")) == 1


def test_metadata_recognisable():
    prof = kvm_variant()
    xml = render(prof, run_uuid="0123abcd")
    meta = read_domain(xml).metadata
    assert meta is not None and (meta.name, meta.hash, meta.run) == ("v", prof.hash, "0123abcd")
    assert read_domain(render(prof)).metadata.run is None  # type: ignore[union-attr]
    assert f'xmlns:cloudbox="{CLOUDBOX_XMLNS}"' in xml
    assert read_domain("<domain type='kvm'><name>x</name></domain>").metadata is None
    assert read_domain("<not xml").metadata is None


@pytest.mark.parametrize("prof", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_the_reader_reads_what_the_writer_wrote(prof: Profile):
    dom = read_domain(render(prof, run_uuid="0123abcd"))
    meta, iface = dom.metadata, dom.interface
    assert meta is not None and (meta.name, meta.hash, meta.run) == (prof.name, prof.hash, "0123abcd")
    assert iface is not None and iface.mac == "52:54:00:ab:cd:ef" and iface.tap is None
    assert (iface.bridge, iface.lower) == {"bridge": ("cbbr0", None), "macvtap": (None, "cbmv0"),
                                           "sriov": (None, None)}[prof.network.attach]
    xen = prof.guest.hypervisor == "xen"
    assert dom.agent_socket == ("/run/cloudbox/cbtest.agent" if xen else None)  # QEMU/KVM's: through libvirt
    if not _guest_attaches(prof):  # a guest that attaches its volume needs its NIC
        assert read_domain(render(prof, bridge=None, mac=None)).interface is None


def test_the_reader_reads_libvirts_tap_and_sets_the_link():
    live = render(kvm_variant()).replace("<source bridge=\"cbbr0\" />",
                                         "<source bridge=\"cbbr0\" />\n      <target dev=\"vnet7\" />")
    iface = read_domain(live).interface
    assert iface is not None and iface.tap == "vnet7" and iface.link is None
    iface.link = "down"
    assert '<link state="down" />' in iface.xml() and read_domain(iface.xml().join(
        ("<domain><devices>", "</devices></domain>"))).interface.link == "down"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("bus", "dev", "lvbus", "controller"),
    [
        ("virtio-blk", "vda", "virtio", None),
        ("virtio-scsi", "sda", "scsi", "virtio-scsi"),
        ("scsi-lsi", "sda", "scsi", "lsilogic"),
        ("sata", "sda", "sata", None),
        ("ide", "hda", "ide", None),
    ],
)
def test_bus_mapping(bus, dev, lvbus, controller):
    root = _tree(kvm_variant(disk={"bus": bus}))
    assert root.find("devices/disk/target").attrib == {"dev": dev, "bus": lvbus}
    scsi = root.find("devices/controller[@type='scsi']")
    assert (scsi.get("model") if scsi is not None else None) == controller


def test_virtio_knobs():
    root = _tree(
        kvm_variant(disk={"iothreads": 1, "queues": 2}, network={"vhost": True, "queues": 2, "mtu": 9000})
    )
    assert root.findtext("iothreads") == "1"
    drv = root.find("devices/disk/driver")
    assert (drv.get("iothread"), drv.get("queues")) == ("1", "2")
    assert root.find("devices/interface/driver").attrib == {"name": "vhost", "queues": "2"}
    assert root.find("devices/interface/mtu").get("size") == "9000"
    root = _tree(kvm_variant(disk={"bus": "virtio-scsi", "iothreads": 1, "queues": 2}))
    assert root.find("devices/controller[@type='scsi']/driver").attrib == {"queues": "2", "iothread": "1"}
    assert root.find("devices/disk/driver").get("iothread") is None


def test_iothread_virtqueue_mapping_deals_the_queues_round():
    assert queue_map(2, 4) == {1: [0, 2], 2: [1, 3]} and queue_map(3, 3) == {1: [0], 2: [1], 3: [2]}
    root = _tree(kvm_variant(disk={"iothreads": 2, "queues": 2}))
    assert root.findtext("iothreads") == "2"
    drv = root.find("devices/disk/driver")
    assert drv.get("iothread") is None and drv.get("queues") == "2"  # the mapping replaces the one iothread
    got = {t.get("id"): [q.get("id") for q in t.findall("queue")] for t in drv.findall("iothreads/iothread")}
    assert got == {"1": ["0"], "2": ["1"]}
    for disk, allowed in (({"iothreads": 2, "queues": 1}, "0..1 (with disk.queues = 1)"),
                          ({"bus": "virtio-scsi", "iothreads": 2, "queues": 2}, "needs bus virtio-blk")):
        with pytest.raises(ValidationError) as e:
            kvm_variant(disk=disk)
        assert allowed in str(e.value)


def test_iothread_mapping_refused_where_libvirt_or_qemu_is_older():
    from cloudbox.core.virt import requirements

    why = requirements.needs_versions("the mapping", requirements.MAPPING_NEEDS,
                                      {"libvirt": (9, 0, 0), "qemu": (7, 2, 22)})
    assert why == ("the mapping needs libvirt 10.0 and QEMU 9.0; this host has libvirt 9.0.0 and QEMU 7.2.22 "
                   "(the appliance: libvirt 11.3, QEMU 10.0)")
    assert requirements.needs_versions("x", requirements.MAPPING_NEEDS,
                                       {"libvirt": (11, 3, 0), "qemu": (10, 0, 0)}) is None


def test_nic_mapping():
    root = _tree(kvm_variant(network={"model": "e1000"}))
    iface = root.find("devices/interface")
    assert iface.get("type") == "bridge"
    assert iface.find("source").get("bridge") == "cbbr0"
    assert iface.find("mac").get("address") == "52:54:00:ab:cd:ef"
    assert iface.find("model").get("type") == "e1000"
    assert iface.find("driver") is None
    assert _tree(kvm_variant()).find("devices/interface/driver").get("name") == "qemu"


@pytest.mark.parametrize(
    ("bus", "model", "bridge", "drivers"),
    [
        ("virtio-blk", "virtio", "cbbr0", "virtio_blk,virtio_net,button,evdev pci=noacpi"),
        ("virtio-blk", "e1000", "cbbr0", "virtio_blk,e1000,button,evdev"),
        ("virtio-blk", "e1000", None, "virtio_blk,button,evdev pci=noacpi"),
        ("scsi-lsi", "e1000", "cbbr0", "sym53c8xx,crct10dif_generic,sd_mod,e1000,button,evdev"),
        ("scsi-lsi", "virtio", "cbbr0", "sym53c8xx,crct10dif_generic,sd_mod,virtio_net,button,evdev"),
        ("ide", "rtl8139", "cbbr0", "ata_piix,crct10dif_generic,sd_mod,8139cp,8139too,button,evdev"),
        ("sata", "e1000", None, "ahci,crct10dif_generic,sd_mod,button,evdev"),
        ("virtio-scsi", "virtio", None, "virtio_scsi,crct10dif_generic,sd_mod,button,evdev pci=noacpi"),
        ("virtio-blk+raid0", "virtio", None, "virtio_blk,md_mod,raid0,button,evdev pci=noacpi"),
    ],
)
def test_guest_loads_only_the_profiles_drivers(bus, model, bridge, drivers):
    """Only the profile's drivers; and ACPI's interrupt links skipped only when every PCI device uses MSI (an LSI
    disk or an e1000 without pci=noacpi would get no interrupts)."""
    bus, _, raid = bus.partition("+raid")
    disk = {"bus": bus, "count": 2, "raid": raid} if raid else {"bus": bus}
    more = {"more_disk_paths": ["/var/tmp/cloudbox/d1.raw"]} if raid else {}
    root = _tree(kvm_variant(disk=disk, network={"model": model}), bridge=bridge, **more)
    assert root.findtext("os/cmdline") == f"console=ttyS0 quiet cloudbox.drivers={drivers}"


def test_boot_args_left_out_for_an_older_guest_image():
    xml = render_domain(DomainPlan(kvm_variant(), name="cloudbox-x", domain_type="kvm", kernel="/k", initrd="/i",
                                   cmdline="console=ttyS0", disk_path="/dev/sdz", disk_is_block=True, bridge=None,
                                   boot_args=False))
    assert ET.fromstring(xml).findtext("os/cmdline") == "console=ttyS0"


def test_drivers_kept_when_named_and_not_for_xen():
    assert "cloudbox.drivers=" not in _tree(xen_profile("scsi-lsi", "prealloc-file", "e1000")).findtext("os/cmdline")
    prof = kvm_variant()
    xml = render_domain(DomainPlan(prof, name="cloudbox-x", domain_type="kvm", kernel="/k", initrd="/i",
                                   cmdline="console=ttyS0 cloudbox.drivers=e1000", disk_path="/dev/sdz",
                                   disk_is_block=True, bridge=None))
    assert ET.fromstring(xml).findtext("os/cmdline") == "console=ttyS0 cloudbox.drivers=e1000"


def test_no_interface_without_bridge():
    assert _tree(kvm_variant(), bridge=None).find("devices/interface") is None


def test_block_vs_file_source():
    prof = kvm_variant()
    root = ET.fromstring(
        render_domain(DomainPlan(
            prof,
            name="b",
            domain_type="kvm",
            kernel="/k",
            initrd="/i",
            cmdline="",
            disk_path="/dev/sdq",
            disk_is_block=True,
            bridge=None,
            emulator="/usr/bin/qemu-system-x86_64",
        ))
    )
    assert root.find("devices/disk").get("type") == "block"
    assert root.find("devices/disk/source").attrib == {"dev": "/dev/sdq"}
    assert root.findtext("devices/emulator") == "/usr/bin/qemu-system-x86_64"


def test_xen_pv_and_hvm():
    pv = _tree(xen_profile("xen-vbd", "block-device", "xen-netfront"))
    assert pv.get("type") == "xen"
    assert pv.findtext("os/type") == "xen" and pv.find("os/type").get("machine") == "xenpv"
    assert pv.find("devices/disk/driver").attrib == {"name": "phy", "type": "raw"}
    assert pv.find("devices/disk/target").attrib == {"dev": "xvda", "bus": "xen"}
    assert pv.find("devices/interface/model").get("type") == "netfront"
    assert pv.find("devices/console/target").get("type") == "xen"
    assert pv.find("devices/serial") is None
    assert pv.find("devices/channel/target").attrib == {"type": "xen", "name": "org.qemu.guest_agent.0"}
    assert pv.find("devices/channel/source").attrib == {"mode": "bind", "path": "/run/cloudbox/cbtest.agent"}
    # hvc0 the console, hvc1 (the first extra PV console: the channel) the agent's tty
    assert pv.findtext("os/cmdline") == ("console=ttyS0 quiet cloudbox.drivers=xen_blkfront,xen_netfront,button,evdev "
                                         "console=hvc0 cloudbox.agent=/dev/hvc1 cloudbox.agent_method=isa-serial")
    assert pv.find("devices/memballoon").get("model") == "xen"
    assert pv.find("devices/controller[@type='virtio-serial']") is None
    hvm = _tree(xen_profile("scsi-lsi", "prealloc-file", "e1000"))
    assert hvm.findtext("os/type") == "hvm" and hvm.find("os/type").get("machine") == "xenfv"
    assert hvm.find("devices/disk/driver").attrib == {"name": "qemu", "type": "raw"}
    assert hvm.find("devices/disk/target").attrib == {"dev": "sda", "bus": "scsi"}


def test_xen_pvh():
    """PVH: libvirt's libxl os type xenpvh, and otherwise the PV guest's devices, console, channel and drivers."""
    pvh_prof = load_profile(Path(PRESETS[0]).with_name("xen-pvh-phy.toml"))
    pvh, pv = _tree(pvh_prof), _tree(load_profile(Path(PRESETS[0]).with_name("xen-xvd-phy.toml")))
    assert pvh.get("type") == "xen"
    assert pvh.find("os/type").attrib == {"arch": "x86_64", "machine": "xenpvh"} and pvh.findtext("os/type") == "xenpvh"
    assert pvh.find("features") is None  # libxl gives a PVH guest its ACPI tables itself
    assert pvh.find("devices/disk/driver").attrib == {"name": "phy", "type": "raw"}
    assert pvh.find("devices/disk/target").attrib == {"dev": "xvda", "bus": "xen"}
    assert pvh.find("devices/interface/model").get("type") == "netfront"
    assert pvh.find("devices/console/target").get("type") == "xen" and pvh.find("devices/serial") is None
    assert pvh.find("devices/channel/target").attrib == {"type": "xen", "name": "org.qemu.guest_agent.0"}
    # everything but the guest type (and the profile's name and hash) is the PV guest's
    for tree in (pvh, pv):
        tree.remove(tree.find("metadata"))
        tree.find("os").remove(tree.find("os/type"))
    assert ET.tostring(pvh) == ET.tostring(pv)


@pytest.mark.parametrize("preset", [p.stem for p in PRESETS])
def test_xen_type_stated_renders_as_implied(preset):
    """Every preset renders the same XML with its guest type stated as with the type its bus implies (auto): old
    profiles, which have no guest.xen_type, keep their domains byte for byte."""
    from cloudbox.core.spec.profiles import xen_guest_type

    prof = load_profile(Path(PRESETS[0]).with_name(f"{preset}.toml"))
    auto = prof.model_copy(update={"guest": prof.guest.model_copy(update={"xen_type": "auto"})})
    if prof.guest.hypervisor != "xen":
        assert prof.guest.xen_type == "auto"
        return
    stated = prof.model_copy(update={"guest": prof.guest.model_copy(update={"xen_type": xen_guest_type(prof)})})
    assert render(stated) == render(prof)
    if prof.guest.xen_type == "auto":
        machine = _tree(auto).find("os/type").get("machine")
        assert machine == ("xenpv" if prof.disk.bus == "xen-vbd" else "xenfv")


@pytest.mark.parametrize(("preset", "driver", "source"), [
    ("xen-xvd-phy", "phy", {"dev": "/dev/sdz"}),  # blkback on the block device
    ("xen-xvd-file", "qemu", {"file": "/var/tmp/cloudbox/disk.img"}),  # qdisk, QEMU in dom0, on the file
    ("xen-default", "qemu", {"file": "/var/tmp/cloudbox/disk.img"}),
])
def test_xen_disk_backend(preset, driver, source):
    dom = _tree(load_profile(Path(PRESETS[0]).with_name(f"{preset}.toml")))
    assert dom.find("devices/disk/driver").attrib == {"name": driver, "type": "raw"}
    assert dom.find("devices/disk/source").attrib == source


def test_xen_phy_refuses_a_file():
    with pytest.raises(ValueError, match="xen_backend = phy .* is a file"):
        render_domain(DomainPlan(load_profile(Path(PRESETS[0]).with_name("xen-xvd-phy.toml")), name="x",
                                 domain_type="xen", kernel="/k", initrd="/i", cmdline="", disk_path="/var/tmp/disk.img",
                                 disk_is_block=False, bridge=None, agent_socket="/run/cloudbox/x.agent"))


@pytest.mark.parametrize(
    ("prof_name", "domain_type"), [("kvm", "xen"), ("xen", "kvm"), ("xen", "qemu"), ("kvm", "lxc")]
)
def test_domain_type_must_fit_hypervisor(prof_name, domain_type):
    prof = kvm_variant() if prof_name == "kvm" else xen_profile("ide", "prealloc-file", "e1000")
    with pytest.raises(ValueError):
        render(prof, domain_type=domain_type)


@pytest.mark.parametrize(
    "kw", [{"name": "a/b"}, {"name": ""}, {"mac": "52:54:00:zz:00:00"}, {"uuid": "nope"}, {"run_uuid": "x y"}]
)
def test_bad_arguments(kw):
    with pytest.raises(ValueError):
        render(kvm_variant(), **kw)


@needs_validator
def test_console_log_schema_valid(tmp_path):
    """The serial console's <log> (virtlogd writes the guest's console to a file) passes libvirt's schema."""
    f = tmp_path / "domain.xml"
    f.write_text(render(kvm_variant(), console_log="/var/lib/cloudbox/work/run-0123/console.log"))
    r = subprocess.run(["virt-xml-validate", str(f), "domain"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr + f.read_text()


def test_console_log_on_the_serial_port(test_conn):
    root = _tree(kvm_variant(), console_log="/var/tmp/run-1/console.log")
    log = root.find("devices/serial[@type='pty']/log")
    assert log is not None and log.attrib == {"file": "/var/tmp/run-1/console.log", "append": "off"}
    assert _tree(kvm_variant()).find("devices/serial/log") is None  # no log unless asked for
    # libvirt keeps it (and its console alias of serial 0 shows the same log)
    dom = test_conn.defineXML(render(kvm_variant(), name="cbtest-log", console_log="/var/tmp/run-1/console.log"))
    try:
        desc = ET.fromstring(dom.XMLDesc(0))
    finally:
        dom.undefine()
    assert desc.find("devices/serial/log").get("file") == "/var/tmp/run-1/console.log"
    assert desc.find("devices/console/log").get("file") == "/var/tmp/run-1/console.log"


@pytest.mark.parametrize("path", ["console.log", "run/console.log", "/var/tmp/a\nb.log", ""])
def test_console_log_must_be_absolute(path):
    with pytest.raises(ValueError, match="console_log"):
        render(kvm_variant(), console_log=path)


@pytest.mark.parametrize(("domain_type", "path", "message"), [
    ("xen", None, "needs an absolute path"),
    ("xen", "run/x.agent", "needs an absolute path"),
    ("xen", "/run/" + "x" * 110, "longer than a unix socket path"),
    ("kvm", "/run/x.agent", "only Xen domains"),
])
def test_agent_socket_only_and_always_for_xen(domain_type, path, message):
    prof = xen_profile("xen-vbd", "block-device", "xen-netfront") if domain_type == "xen" else kvm_variant()
    with pytest.raises(ValueError, match=message):
        render(prof, domain_type=domain_type, agent_socket=path)


def test_console_log_not_for_xen():
    with pytest.raises(ValueError, match="Xen"):
        render(xen_profile("ide", "prealloc-file", "e1000"), console_log="/var/tmp/console.log")


@pytest.mark.parametrize(
    ("bus", "count", "devs"),
    [
        ("virtio-blk", 3, ["vda", "vdb", "vdc"]),
        ("virtio-scsi", 2, ["sda", "sdb"]),
        ("scsi-lsi", 7, ["sda", "sdb", "sdc", "sdd", "sde", "sdf", "sdg"]),
        ("sata", 6, ["sda", "sdb", "sdc", "sdd", "sde", "sdf"]),
        ("ide", 4, ["hda", "hdb", "hdc", "hdd"]),
    ],
)
def test_several_disks_each_on_its_own_store(bus, count, devs):
    prof = kvm_variant(disk={"bus": bus, "count": count, "raid": "0"})
    paths = [f"/var/tmp/cloudbox/d{i}.raw" for i in range(count)]
    root = _tree(prof, more_disk_paths=paths[1:])
    disks = root.findall("devices/disk")
    assert [d.find("target").get("dev") for d in disks] == devs
    assert {d.find("target").get("bus") for d in disks} == {LIBVIRT_BUS[bus]}
    assert [d.find("source").get("file") for d in disks] == ["/var/tmp/cloudbox/disk.img", *paths[1:]]
    assert len(root.findall("devices/controller[@type='scsi']")) == (1 if bus in ("virtio-scsi", "scsi-lsi") else 0)


def test_xen_pv_several_disks():
    prof = xen_profile("xen-vbd", "prealloc-file", "xen-netfront").model_dump()
    prof["disk"].update(count=3, raid="0")
    root = _tree(Profile.model_validate(prof))
    assert [d.find("target").get("dev") for d in root.findall("devices/disk")] == ["xvda", "xvdb", "xvdc"]


@pytest.mark.parametrize(
    ("count", "more", "message"),
    [
        (3, ["/var/tmp/b.raw"], "gives the guest 3 disk\\(s\\); got 2 disk path"),
        (1, ["/var/tmp/b.raw"], "gives the guest 1 disk\\(s\\); got 2 disk path"),
        (2, ["/var/tmp/cloudbox/disk.img"], "two disk paths are the same"),
        (2, [""], "more_disk_paths must not be empty"),
    ],
)
def test_disk_paths_must_fit_the_count(count, more, message):
    prof = kvm_variant(disk={"count": count, "raid": "0" if count > 1 else "none"})
    with pytest.raises(ValueError, match=message):
        render(prof, more_disk_paths=more)


def test_nbd_volume_attached_by_qemu(tmp_path):
    from cloudbox.core.disks.backing import NetworkSource

    prof = kvm_variant(disk={"bus": "virtio-blk", "cache": "writethrough", "backing": "network-volume",
                             "volume": "nbd:ebs", "attach": "qemu"})
    xml = render(prof, network_source=NetworkSource("nbd", "ebs", "127.0.0.1", 10809))
    disk = ET.fromstring(xml).find("devices/disk")
    assert disk is not None and disk.get("type") == "network"
    src = disk.find("source")
    assert src is not None and (src.get("protocol"), src.get("name"), src.get("tls")) == ("nbd", "ebs", "yes")
    assert src.find("host").attrib == {"name": "127.0.0.1", "port": "10809"}
    if _validator_works():
        f = tmp_path / "domain.xml"
        f.write_text(xml)
        r = subprocess.run(["virt-xml-validate", str(f), "domain"], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    with pytest.raises(ValueError, match="disk.attach = qemu"):
        render(kvm_variant(), network_source=NetworkSource("nbd", "ebs", "127.0.0.1", 10809))
