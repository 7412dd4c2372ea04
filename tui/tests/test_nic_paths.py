"""The guest's NIC beside the bridge: a macvtap on a link of the run's (network.attach = macvtap): the profile's
rules, what this host lacks said (vhost-net), and the domain XML accepted by virt-xml-validate and libvirt's test
driver."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from cloudbox.core.errors import ProfileError
from cloudbox.core.spec.profiles import Profile, parse_profile
from cloudbox.core.virt import requirements
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
    ("sriov", "virtio", "", "network.attach", "bridge, macvtap"),
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


def test_this_host_says_why_not(monkeypatch):
    monkeypatch.setattr(requirements.os.path, "exists", lambda p: p != requirements.VHOST_NET)
    assert "no /dev/vhost-net" in requirements.host_problem(profile("bridge", "virtio", "vhost = true"))


# -- the domain XML ---------------------------------------------------------------------------------------------------
def rendered(prof: Profile, link: str, domain_type: str = "kvm") -> str:
    return render_domain(DomainPlan(prof, name="cbtest-nic", domain_type=domain_type, kernel="/k", initrd="/i",
                                    cmdline="", disk_path="/var/tmp/d.img", disk_is_block=False, bridge=link,
                                    mac="52:54:00:ab:cd:ef"))


CASES = {"macvtap": (profile(), "cbmv0"), "macvtap-e1000": (profile(model="e1000"), "cbmv0")}


def test_macvtap_is_a_direct_interface_on_the_runs_link():
    iface = ET.fromstring(rendered(profile(), "cbmv0")).find("devices/interface")
    assert iface.get("type") == "direct"
    assert iface.find("source").attrib == {"dev": "cbmv0", "mode": "bridge"}
    assert iface.find("model").get("type") == "virtio"
    assert iface.find("mtu") is None  # the link's (libvirt's QEMU driver refuses an MTU on a direct NIC)
    read = read_domain(rendered(profile(), "cbmv0")).interface
    assert (read.lower, read.mode, read.mac) == ("cbmv0", "bridge", "52:54:00:ab:cd:ef")


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
    assert ET.fromstring(desc).find("devices/interface").get("type") == "direct"
