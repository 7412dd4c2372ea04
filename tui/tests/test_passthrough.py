"""NVMe for the guest: the host's own controller handed over whole by VFIO (disk.backing = nvme-pci; QEMU's emulated
one is refused): the profile's rules, the host checks on a stand-in sysfs (no IOMMU, not
NVMe, a group shared with host drivers, a namespace in use or holding data without --destroy naming the
controller), never a device the user did not name, and the domain XML."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cloudbox.core.disks import pcidev
from cloudbox.core.errors import DeviceRefused, ProfileError
from cloudbox.core.spec.profiles import Profile, parse_profile
from cloudbox.core.virt import requirements
from cloudbox.core.virt.domain import DomainPlan, render_domain

ADDR = "0000:01:00.0"
BASE = """
name = "nv"
description = "nvme variant"
[guest]
hypervisor = "kvm"
[disk]
bus = "nvme"
cache = "{cache}"
backing = "{backing}"
[network]
model = "virtio"
"""


def profile(backing: str = "nvme-pci", cache: str = "none") -> Profile:
    return parse_profile(BASE.format(backing=backing, cache=cache))


def test_passthrough_rules():
    for text, key, allowed in (
        (BASE.format(backing="nvme-pci", cache="writeback"), "disk.cache", "none (with disk.backing = nvme-pci)"),
        (BASE.format(backing="nvme-pci", cache="none").replace('"nvme"', '"virtio-blk"'), "disk.bus",
         "nvme (with disk.backing = nvme-pci)"),
        (BASE.format(backing="nvme-pci", cache="none").replace('[network]', 'volume = "/dev/x"\n[network]'),
         "disk.volume", "empty (with disk.backing = nvme-pci)"),
    ):
        with pytest.raises(ProfileError) as e:
            parse_profile(text)
        assert any(p.key == key and allowed in (p.allowed or "") for p in e.value.problems), e.value


def sysfs(root: Path, *, iommu: bool = True, cls: str = pcidev.NVME_CLASS, group: dict[str, str] | None = None,
          ns: tuple[str, ...] = ("nvme0n1",)) -> Path:
    """A stand-in /sys with the controller at ADDR, its namespaces, its IOMMU group (other address -> driver)."""
    dev = root / "bus" / "pci" / "devices" / ADDR
    dev.mkdir(parents=True)
    (dev / "class").write_text(cls + "\n")
    for n in ns:
        (dev / "nvme" / "nvme0" / n).mkdir(parents=True)
    (root / "kernel" / "iommu_groups").mkdir(parents=True)
    (root / "module" / "vfio_pci").mkdir(parents=True)
    if iommu:
        members = root / "kernel" / "iommu_groups" / "7" / "devices"
        members.mkdir(parents=True)
        (members / ADDR).mkdir()
        (dev / "iommu_group").symlink_to(root / "kernel" / "iommu_groups" / "7")
        for other, driver in (group or {}).items():
            (members / other).mkdir()
            o = root / "bus" / "pci" / "devices" / other
            o.mkdir(parents=True)
            if driver:
                (root / "bus" / "pci" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
                (o / "driver").symlink_to(root / "bus" / "pci" / "drivers" / driver)
    return root


def never(dev, *, confirm):  # a namespace check that must not be reached
    raise AssertionError(f"{dev} looked at")


def test_no_iommu_is_refused_with_what_would_give_one(tmp_path):
    root = sysfs(tmp_path, iommu=False)
    assert "no IOMMU" in pcidev.iommu_problem(root)
    with pytest.raises(DeviceRefused, match=r"0000:01:00.0: refused: this host has no IOMMU .*intel_iommu=on"):
        pcidev.check(ADDR, confirm=None, sysfs=root, check_namespace=never)


def test_only_an_nvme_controller_at_a_full_address(tmp_path):
    with pytest.raises(DeviceRefused, match=r"allowed: DDDD:BB:SS.F"):
        pcidev.check("01:00.0", confirm=None, sysfs=tmp_path, check_namespace=never)
    root = sysfs(tmp_path, cls="0x020000")
    with pytest.raises(DeviceRefused, match=r"not an NVMe controller \(PCI class 0x020000"):
        pcidev.check(ADDR, confirm=None, sysfs=root, check_namespace=never)
    with pytest.raises(DeviceRefused, match=r"0000:02:00.0: no such PCI device"):
        pcidev.check("0000:02:00.0", confirm=None, sysfs=root, check_namespace=never)


def test_a_group_shared_with_host_drivers_is_refused(tmp_path):
    root = sysfs(tmp_path, group={"0000:01:00.1": "ahci", "0000:00:1c.0": "pcieport"})
    with pytest.raises(DeviceRefused, match=r"its IOMMU group also holds 0000:01:00.1 \(ahci\)"):
        pcidev.check(ADDR, confirm=None, sysfs=root, check_namespace=never)



def test_namespaces_behind_native_multipath(tmp_path):
    # Debian's kernel (CONFIG_NVME_MULTIPATH): the controller shows its hidden paths, the disk is the subsystem's.
    root = sysfs(tmp_path, ns=("nvme0c0n1", "nvme0c0n2", "ng0n1"))
    assert pcidev.namespaces(ADDR, sysfs=root) == ["nvme0n1", "nvme0n2"]

def test_namespaces_are_checked_and_data_needs_the_controller_named(tmp_path):
    root = sysfs(tmp_path, ns=("nvme0n1", "nvme0n2"))
    seen = []

    def holds_data(dev, *, confirm):
        seen.append((dev, confirm))
        if confirm is None:
            raise DeviceRefused(f"{dev}: refused: it holds data (ext4). To destroy it anyway name it explicitly: "
                                f"--device {dev} --destroy nvme0n1")

    # The controller's advice only: not the block device's (--destroy naming the namespace, which would not do).
    with pytest.raises(DeviceRefused, match=r"namespace /dev/nvme0n1 holds data \(ext4\)\. To destroy it anyway name "
                                            r"the controller: --device 0000:01:00.0 --destroy 0000:01:00.0$"):
        pcidev.check(ADDR, confirm="nvme0n1", sysfs=root, check_namespace=holds_data)
    assert pcidev.check(ADDR, confirm=ADDR, sysfs=root, check_namespace=holds_data) == ["/dev/nvme0n1",
                                                                                       "/dev/nvme0n2"]
    assert seen[-2:] == [("/dev/nvme0n1", "nvme0n1"), ("/dev/nvme0n2", "nvme0n2")]

    def mounted(dev, *, confirm):
        raise DeviceRefused(f"{dev}: refused: /dev/nvme0n1 is mounted on /srv; cloudbox never writes to a device in "
                            "use")

    with pytest.raises(DeviceRefused, match=r"0000:01:00.0: /dev/nvme0n1: refused: .* mounted on /srv"):
        pcidev.check(ADDR, confirm=ADDR, sysfs=root, check_namespace=mounted)


def test_a_run_without_a_named_controller_is_refused(monkeypatch):
    from types import SimpleNamespace

    from cloudbox.core.errors import CloudboxError
    from cloudbox.core.run import local

    monkeypatch.setattr(pcidev, "spare_controllers", lambda: ["0000:05:00.0"])
    ctx = SimpleNamespace(spec=SimpleNamespace(device=""), profile=SimpleNamespace(name="ladder-passthrough"))
    with pytest.raises(CloudboxError, match=r"--device <PCI address> \(got none; NVMe controllers not in use here: "
                                            r"0000:05:00.0\)"):
        local.nvme_controller(ctx)  # type: ignore[arg-type]


def test_this_host_says_why_not(monkeypatch):
    monkeypatch.setattr(pcidev, "iommu_problem", lambda: "this host has no IOMMU (...)")
    assert requirements.host_problem(profile()) == "this host has no IOMMU (...)"
    monkeypatch.setattr(pcidev, "iommu_problem", lambda: None)
    monkeypatch.setattr(pcidev, "spare_controllers", lambda: [])
    assert "no spare NVMe controller" in requirements.host_problem(profile())


def rendered(prof: Profile, path: str, domain_type: str = "kvm") -> str:
    return render_domain(DomainPlan(prof, name="cbtest-nvme", domain_type=domain_type, kernel="/k", initrd="/i",
                                    cmdline="", disk_path=path, disk_is_block=prof.disk.backing == "nvme-pci",
                                    bridge="cbbr0"))


def test_the_controller_is_a_managed_vfio_hostdev(tmp_path):
    xml = rendered(profile(), ADDR)
    root = ET.fromstring(xml)
    assert root.find("devices/disk") is None
    dev = root.find("devices/hostdev")
    assert dev.attrib == {"mode": "subsystem", "type": "pci", "managed": "yes"}
    assert dev.find("driver").get("name") == "vfio"
    assert dev.find("source/address").attrib == {"domain": "0x0000", "bus": "0x01", "slot": "0x00",
                                                 "function": "0x0"}
    assert "cloudbox.drivers=nvme," in root.findtext("os/cmdline") and "pci=noacpi" in root.findtext("os/cmdline")
    with pytest.raises(ValueError, match="not a PCI address"):
        rendered(profile(), "/dev/nvme0n1")
    if shutil.which("virt-xml-validate"):
        f = tmp_path / "d.xml"
        f.write_text(xml)
        r = subprocess.run(["virt-xml-validate", str(f), "domain"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_the_emulated_controller_is_refused():
    with pytest.raises(ProfileError) as e:
        profile("prealloc-file")
    [p] = e.value.problems
    assert (p.key, p.value) == ("disk.bus", "nvme") and "libvirt 11.5" in p.message
    assert p.allowed == ("virtio-blk, virtio-scsi, scsi-lsi, sata, ide, xen-vbd (with disk.backing = prealloc-file); "
                         "nvme needs disk.backing = nvme-pci")


def test_host_sampler_ends_when_the_controller_goes(monkeypatch):
    # libvirt unbinds the controller when the guest starts: nvme0n1 leaves /proc/diskstats under the host's sampler.
    from cloudbox.core.disks import diskstats
    calls = []

    def read(device, path="/proc/diskstats"):
        calls.append(device)
        if len(calls) > 3:  # the constructor's check, the first reading, one sample
            raise KeyError(f"block device {device!r} not found in {path}")
        return diskstats.Counters(float(len(calls)), 0, 0, 0, 0, 0, 0)

    monkeypatch.setattr(diskstats, "read_counters", read)
    samples = []
    with diskstats.Sampler("nvme0n1", samples.append, interval=0.01) as s:
        s._thread.join(timeout=5)
        assert not s._thread.is_alive()
    assert len(samples) == 1 and s.count == 1


def test_guest_disks_leave_out_multipath_hidden_paths(tmp_path):
    # The guest's kernel (native NVMe multipath) shows the controller's path nvme0c0n1 beside the disk nvme0n1.
    from cloudbox.core.bench import runners
    for name in ("nvme0c0n1", "nvme0n1", "loop0", "ram0"):
        (tmp_path / name).mkdir()
    script = runners._DISKS_SH.replace("/sys/block", str(tmp_path))
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["nvme0n1"]
