"""The guest's NIC beside the bridge: a macvtap on a link of the run's (network.attach = macvtap) and a virtual
function of the host's SR-IOV NIC (attach = sriov, model vf): the profile's rules, the VFs made and removed on a
stand-in sysfs with every refusal (no SR-IOV, no IOMMU, someone else's VFs), what this host lacks said, and the
domain XML accepted by virt-xml-validate and libvirt's test driver."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cloudbox.core.errors import ProfileError
from cloudbox.core.spec.profiles import Profile, parse_profile
from cloudbox.core.virt import requirements, sriov
from cloudbox.core.virt.domain import DomainPlan, read_domain, render_domain

BASE = """
name = "nic"
description = "NIC path variant"
[guest]
hypervisor = "kvm"
vcpus = 2
[disk]
bus = "virtio-blk"
cache = "none"
backing = "prealloc-file"
[network]
model = "{model}"
attach = "{attach}"
{more}
"""


def profile(attach: str = "macvtap", model: str = "virtio", more: str = "") -> Profile:
    return parse_profile(BASE.format(attach=attach, model=model, more=more))


def test_bridge_is_the_default_and_keeps_the_hash():
    plain = parse_profile(BASE.format(attach="bridge", model="virtio", more=""))
    unsaid = parse_profile(BASE.format(attach="bridge", model="virtio", more="").replace('attach = "bridge"', ""))
    assert plain.hash == unsaid.hash and '"attach"' not in plain.canonical_json().split('"network"')[1]
    assert profile().hash != plain.hash and "macvtap" in profile().describe()


@pytest.mark.parametrize(("attach", "model", "more", "key", "allowed"), [
    ("sriov", "virtio", "", "network.model", "vf (with network.attach = sriov)"),
    ("bridge", "vf", "", "network.model", "vf needs network.attach = sriov"),
    ("sriov", "vf", "vhost = true", "network.vhost", "False (with network.attach = sriov)"),
    ("sriov", "vf", "queues = 2", "network.queues", "1 (with network.attach = sriov)"),
    ("macvtap", "virtio", "vhost = 1", "network.vhost", "true, false"),
])
def test_refusals(attach, model, more, key, allowed):
    with pytest.raises(ProfileError) as e:
        profile(attach, model, more)
    assert any(p.key == key and allowed in (p.allowed or "") for p in e.value.problems), e.value


def test_xen_keeps_the_bridge():
    text = BASE.format(attach="macvtap", model="xen-netfront", more="").replace('"kvm"', '"xen"').replace(
        '"virtio-blk"', '"xen-vbd"').replace('cache = "none"', 'cache = "writeback"')
    with pytest.raises(ProfileError) as e:
        parse_profile(text)
    assert [p.key for p in e.value.problems] == ["network.attach"]


# -- SR-IOV on a stand-in sysfs --------------------------------------------------------------------------------------
def nic(root: Path, name: str = "eth9", total: str = "8", now: str = "0", iommu: bool = True) -> tuple[Path, Path]:
    net, sysfs = root / "class" / "net", root
    dev = net / name / "device"
    dev.mkdir(parents=True)
    if total:
        (dev / "sriov_totalvfs").write_text(total + "\n")
        (dev / "sriov_numvfs").write_text(now + "\n")
    (sysfs / "kernel" / "iommu_groups" / ("1" if iommu else "")).mkdir(parents=True, exist_ok=True)
    (sysfs / "module" / "vfio_pci").mkdir(parents=True)
    return net, sysfs


def test_vfs_are_made_for_the_run_and_removed(tmp_path, monkeypatch):
    net, sysfs = nic(tmp_path)
    vfs = sriov.VirtualFunctions("eth9", net=net, sysfs=sysfs)
    dev = net / "eth9" / "device"

    def appear(count: int) -> None:  # what the NIC's driver does on a write of sriov_numvfs
        for i in range(count):
            pci = tmp_path / "pci" / f"0000:03:10.{i}"
            (pci / "net" / f"eth9v{i}").mkdir(parents=True)
            (dev / f"virtfn{i}").symlink_to(pci)

    monkeypatch.setattr(sriov, "VF_WAIT_S", 1.0)
    appear(2)
    made = vfs.create(2)
    assert (dev / "sriov_numvfs").read_text() == "2\n"
    assert made == [sriov.VF("0000:03:10.0", "eth9v0"), sriov.VF("0000:03:10.1", "eth9v1")]
    vfs.remove()
    assert (dev / "sriov_numvfs").read_text() == "0\n"
    vfs.remove()  # twice is harmless


@pytest.mark.parametrize(("kw", "message"), [
    ({"total": ""}, r"--nic eth9: it offers no SR-IOV virtual functions \(sriov_totalvfs absent\)"),
    ({"total": "0"}, r"sriov_totalvfs 0\); NICs with SR-IOV here: none"),
    ({"now": "4"}, r"it has 4 virtual functions already, which cloudbox did not make"),
    ({"iommu": False}, r"handed to the guest by VFIO, and this host has no IOMMU"),
])
def test_refused_nics(tmp_path, kw, message):
    net, sysfs = nic(tmp_path, **kw)
    with pytest.raises(sriov.SriovRefused, match=message):
        sriov.VirtualFunctions("eth9", net=net, sysfs=sysfs)
    with pytest.raises(sriov.SriovRefused, match=r"--nic eth7: no such network interface"):
        sriov.VirtualFunctions("eth7", net=net, sysfs=sysfs)


def test_this_host_says_why_not(monkeypatch):
    monkeypatch.setattr(requirements.pcidev, "iommu_problem", lambda: None)
    monkeypatch.setattr(sriov, "sriov_nics", lambda: [])
    assert "no NIC with SR-IOV" in requirements.host_problem(profile("sriov", "vf"))
    monkeypatch.setattr(requirements.os.path, "exists", lambda p: p != requirements.VHOST_NET)
    assert "no /dev/vhost-net" in requirements.host_problem(profile("bridge", "virtio", "vhost = true"))


# -- the domain XML ---------------------------------------------------------------------------------------------------
def rendered(prof: Profile, link: str, domain_type: str = "kvm") -> str:
    return render_domain(DomainPlan(prof, name="cbtest-nic", domain_type=domain_type, kernel="/k", initrd="/i",
                                    cmdline="", disk_path="/var/tmp/d.img", disk_is_block=False, bridge=link,
                                    mac="52:54:00:ab:cd:ef"))


CASES = {"macvtap": (profile(), "cbmv0"), "macvtap-e1000": (profile(model="e1000"), "cbmv0"),
         "sriov": (profile("sriov", "vf"), "0000:03:10.1")}


def test_macvtap_is_a_direct_interface_on_the_runs_link():
    iface = ET.fromstring(rendered(profile(), "cbmv0")).find("devices/interface")
    assert iface.get("type") == "direct"
    assert iface.find("source").attrib == {"dev": "cbmv0", "mode": "bridge"}
    assert iface.find("model").get("type") == "virtio"
    assert iface.find("mtu") is None  # the link's (libvirt's QEMU driver refuses an MTU on a direct NIC)
    read = read_domain(rendered(profile(), "cbmv0")).interface
    assert (read.lower, read.mode, read.mac) == ("cbmv0", "bridge", "52:54:00:ab:cd:ef")


def test_sriov_is_a_managed_hostdev_interface():
    root = ET.fromstring(rendered(profile("sriov", "vf"), "0000:03:10.1"))
    iface = root.find("devices/interface")
    assert iface.attrib == {"type": "hostdev", "managed": "yes"}
    assert iface.find("source/address").attrib == {"type": "pci", "domain": "0x0000", "bus": "0x03",
                                                   "slot": "0x10", "function": "0x1"}
    assert iface.find("model") is None
    assert "igbvf,ixgbevf,iavf" in root.findtext("os/cmdline")  # the VF drivers of Intel's NICs (QEMU's igb)


@pytest.mark.skipif(shutil.which("virt-xml-validate") is None, reason="virt-xml-validate (libvirt-clients)")
@pytest.mark.parametrize("case", CASES)
def test_schema_valid(case, tmp_path):
    f = tmp_path / "d.xml"
    f.write_text(rendered(*CASES[case]))
    r = subprocess.run(["virt-xml-validate", str(f), "domain"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr + f.read_text()


@pytest.mark.parametrize("case", CASES)
def test_test_driver_accepts(case):
    libvirt = pytest.importorskip("libvirt")
    libvirt.registerErrorHandler(lambda *_: None, None)
    conn = libvirt.open("test:///default")
    try:
        dom = conn.defineXML(rendered(*CASES[case], domain_type="qemu"))
        desc = dom.XMLDesc(0)
        dom.undefine()
    finally:
        conn.close()
    assert ET.fromstring(desc).find("devices/interface").get("type") in ("direct", "hostdev")
