"""disk.backing = virtiofs: a directory of the run's shared with the guest by libvirt's virtiofsd, beside the NFS
profiles for the file-level tests: the profile's rules, the share's store, the domain XML (virt-xml-validate and
libvirt's test driver), and in make test-full a real run whose guest mounts the share and writes and reads a file
in it."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from cloudbox.core.disks import backing
from cloudbox.core.errors import ProfileError
from cloudbox.core.spec.profiles import Profile, parse_profile
from cloudbox.core.spec.runspec import RunSpec
from cloudbox.core.virt.domain import DomainPlan, guest_boot_args, render_domain

BASE = """
name = "share"
description = "virtiofs variant"
[guest]
hypervisor = "kvm"
[disk]
bus = "virtio-blk"
cache = "{cache}"
backing = "virtiofs"
{more}
[network]
model = "virtio"
"""


def profile(cache: str = "none", more: str = "") -> Profile:
    return parse_profile(BASE.format(cache=cache, more=more))


@pytest.mark.parametrize(("more", "key", "allowed"), [
    ("count = 2\nraid = \"0\"", "disk.count", "1 (with disk.backing = virtiofs)"),
    ("iothreads = 1", "disk.iothreads", "0 (with disk.backing = virtiofs)"),
    ("queues = 2", "disk.queues", "1 (with disk.backing = virtiofs)"),
])
def test_refusals(more, key, allowed):
    with pytest.raises(ProfileError) as e:
        profile(more=more)
    assert any(p.key == key and allowed in (p.allowed or "") for p in e.value.problems), e.value


def test_described_as_a_share():
    assert "disk: a directory of the host shared by virtiofsd (virtiofs), virtiofsd cache none;" in profile().describe()
    assert "virtiofsd cache always" in profile("writeback").describe()


def test_the_store_is_a_directory_with_the_baselines_file_in_it(state):
    store = backing.prepare("virtiofs", work_dir=state / "w", size_bytes=8 << 20, fmt="raw")
    try:
        assert store.kind == "virtiofs" and store.path.endswith("/share")
        assert store.baseline_target == store.path + "/baseline.dat"
    finally:
        store.remove()
    assert not (state / "w").exists()
    assert backing.space_needed("virtiofs", 8 << 20) == (16 << 20, "virtiofs share's test files (the guest's and "
                                                                   "the bare-metal baseline's)")


def rendered(prof: Profile, domain_type: str = "kvm") -> str:
    return render_domain(DomainPlan(prof, name="cbtest-share", domain_type=domain_type, kernel="/k", initrd="/i",
                                    cmdline="", disk_path="/var/tmp/w/share", disk_is_block=False, bridge="cbbr0"))


def test_the_share_is_a_virtiofs_filesystem_on_shared_memory():
    root = ET.fromstring(rendered(profile("writethrough")))
    assert root.find("devices/disk") is None
    fs = root.find("devices/filesystem")
    assert fs.attrib == {"type": "mount", "accessmode": "passthrough"}
    assert fs.find("driver").get("type") == "virtiofs"
    assert fs.find("binary/cache").get("mode") == "auto"
    assert (fs.find("source").get("dir"), fs.find("target").get("dir")) == ("/var/tmp/w/share", "cloudbox")
    assert root.find("memoryBacking/access").get("mode") == "shared"
    assert "cloudbox.drivers=virtiofs,virtio_net," in " ".join(guest_boot_args(profile(), nic=True))


@pytest.mark.skipif(shutil.which("virt-xml-validate") is None, reason="virt-xml-validate (libvirt-clients)")
@pytest.mark.parametrize("cache", ["none", "writeback"])
def test_schema_valid(cache, tmp_path):
    f = tmp_path / "d.xml"
    f.write_text(rendered(profile(cache)))
    r = subprocess.run(["virt-xml-validate", str(f), "domain"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr + f.read_text()


def test_test_driver_accepts():
    libvirt = pytest.importorskip("libvirt")
    libvirt.registerErrorHandler(lambda *_: None, None)
    conn = libvirt.open("test:///default")
    try:
        dom = conn.defineXML(rendered(profile(), domain_type="qemu"))
        desc = dom.XMLDesc(0)
        dom.undefine()
    finally:
        conn.close()
    assert ET.fromstring(desc).find("devices/filesystem/driver").get("type") == "virtiofs"


def test_a_host_without_virtiofsd_says_so(tmp_path):
    from cloudbox.core.disks import virtiofs
    from cloudbox.core.virt import requirements

    d = tmp_path / "vhost-user"
    d.mkdir()
    (d / "50-qemu-gpu.json").write_text('{"type": "gpu", "binary": "/usr/libexec/vhost-user-gpu"}')
    why = virtiofs.problem((d,))
    assert why is not None and "virtiofsd" in why and "Debian: package virtiofsd" in why
    (d / "50-virtiofsd.json").write_text(f'{{"type": "fs", "binary": "{d}/virtiofsd"}}')
    assert virtiofs.problem((d,)) is not None  # its binary is missing
    (d / "virtiofsd").write_text("")
    assert virtiofs.problem((d,)) is None
    if virtiofs.problem() is not None:
        assert requirements.host_problem(profile()) == virtiofs.problem()


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.full
def test_a_guest_writes_and_reads_a_file_in_the_share(state, libvirt_conn, tmp_path):
    from real_runs import completed_run, leftovers

    from cloudbox.core.disks import virtiofs

    if (why := virtiofs.problem()) is not None:
        pytest.skip(why)

    path = tmp_path / "virtiofs-share.toml"
    path.write_text(BASE.format(cache="none", more="").replace('name = "share"', 'name = "virtiofs-share"'))
    run = completed_run(RunSpec(profile=str(path), suite="storage", size="16M",
                                storage_tests="seq-write-64k,seq-read-64k", runtime=3))
    for side in ("guest", "baseline"):
        for test in ("seq-write-64k", "seq-read-64k"):
            assert run.measurement(side, test, "MB/s").value > 0, (side, test)
    assert run.provenance.backing is not None and run.provenance.backing.kind == "virtiofs"
    assert "virtiofs" in (run.provenance.domain_xml or "")
    assert leftovers(libvirt_conn, state)["guests"] == []
