"""disk.backing = vhost-user: the profile's rules, qemu-storage-daemon's command line from the cache and I/O modes,
the daemon really started on a file and stopped, and the domain XML (a vhostuser disk on shared memfd RAM)
accepted by virt-xml-validate and libvirt's test driver."""

from __future__ import annotations

import os
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from cloudbox.core.disks import backing, vhostuser
from cloudbox.core.errors import ProfileError
from cloudbox.core.spec.profiles import Profile, parse_profile
from cloudbox.core.virt.domain import DomainPlan, render_domain
from cloudbox.core.virt.placement import Topology, resolve

BASE = """
name = "vu"
description = "vhost-user variant"
[guest]
hypervisor = "kvm"
vcpus = 2
[disk]
bus = "{bus}"
cache = "none"
io = "io_uring"
iothreads = {iothreads}
queues = {queues}
backing = "vhost-user"
[network]
model = "virtio"
{more}
"""


def profile(bus: str = "virtio-blk", iothreads: int = 1, queues: int = 2, more: str = "") -> Profile:
    return parse_profile(BASE.format(bus=bus, iothreads=iothreads, queues=queues, more=more))


@pytest.mark.parametrize(("kw", "key", "allowed"), [
    ({"bus": "virtio-scsi", "iothreads": 0, "queues": 1}, "disk.bus", "virtio-blk (with disk.backing = vhost-user)"),
    ({"iothreads": 2}, "disk.iothreads", "0..1 (with disk.backing = vhost-user)"),
])
def test_refusals(kw, key, allowed):
    with pytest.raises(ProfileError) as e:
        profile(**kw)
    assert any(p.key == key and allowed in (p.allowed or "") for p in e.value.problems), e.value


def test_the_daemons_command_line_follows_cache_and_aio(tmp_path):
    store = backing.BackingStore("vhost-user", "/w/disk.raw", False, "raw", 1 << 20, None, "")
    cmd = vhostuser.argv(store, tmp_path / "s.sock", cache="none", io="io_uring", queues=2, iothread=True)
    assert cmd[0] == "qemu-storage-daemon"
    assert ("driver=file,node-name=proto0,filename=/w/disk.raw,cache.direct=on,cache.no-flush=off,aio=io_uring"
            in cmd)
    assert cmd[-1] == (f"type=vhost-user-blk,id=export0,node-name=disk0,addr.type=unix,addr.path={tmp_path}/s.sock,"
                       "writable=on,num-queues=2,writethrough=off,iothread=iothread0")
    assert "iothread,id=iothread0" in cmd
    dev = backing.BackingStore("vhost-user", "/dev/sdz", True, "raw", 1 << 20, "sdz", "")
    wt = vhostuser.argv(dev, tmp_path / "s.sock", cache="writethrough", io="threads", queues=1, iothread=False)
    assert wt[2].startswith("driver=host_device,") and "cache.direct=off" in wt[2] and "writethrough=on" in wt[-1]
    assert "iothread" not in wt[-1]
    assert "cache.no-flush=on" in vhostuser.block_options("/f", False, "unsafe", "threads")[1]


def test_a_served_kind_is_made_as_a_file_or_the_device():
    assert backing.served_store_kind("vhost-user", None) == "prealloc-file"
    assert backing.served_store_kind("vhost-user", "/dev/sdz") == "block-device"
    assert backing.space_needed("vhost-user", 1 << 20) == backing.space_needed("prealloc-file", 1 << 20)


@pytest.mark.skipif(shutil.which("qemu-storage-daemon") is None, reason="needs qemu-storage-daemon")
@pytest.mark.skipif(os.geteuid() != 0, reason="the socket is handed to libvirt's QEMU user: root")
def test_the_daemon_serves_a_file_and_goes(state):
    tmp_path = state  # a work directory QEMU's user can reach
    store = backing.prepare("vhost-user", work_dir=tmp_path / "w", size_bytes=8 << 20, fmt="raw")
    try:
        assert store.kind == "vhost-user" and store.path.endswith("disk.raw")
        export = vhostuser.serve(store, tmp_path / "w", cache="none", io="threads", queues=1, iothread=True)
        try:
            assert store.vhost_user == str(export.socket) and export.socket.is_socket()
            assert export.pid is not None and os.path.exists(f"/proc/{export.pid}")
        finally:
            export.close()
        assert not export.socket.exists() and export.pid is None
        export.close()  # twice is harmless
    finally:
        store.remove()
    assert not (tmp_path / "w").exists()


def test_a_daemon_that_fails_says_why(tmp_path, monkeypatch):
    store = backing.BackingStore("vhost-user", str(tmp_path / "missing.raw"), False, "raw", 1 << 20, None, "")
    if shutil.which("qemu-storage-daemon") is None:
        with pytest.raises(Exception, match="qemu-storage-daemon, which is not installed"):
            vhostuser.serve(store, tmp_path, cache="none", io="threads", queues=1, iothread=False)
        return
    with pytest.raises(Exception, match=r"qemu-storage-daemon exited 1 before serving .*missing.raw"):
        vhostuser.serve(store, tmp_path, cache="none", io="threads", queues=1, iothread=False)


def rendered(prof: Profile, domain_type: str = "kvm") -> str:
    hp = resolve(prof.placement, prof.guest.vcpus, Topology({0: (0, 1)}))
    return render_domain(DomainPlan(prof, name="cbtest-vu", domain_type=domain_type, kernel="/k", initrd="/i",
                                    cmdline="", disk_path="/var/tmp/w/vhost-user-blk.sock", disk_is_block=False,
                                    bridge="cbbr0", placement=hp))


VARIANTS = {"plain": {}, "pinned-hugepages": {"more": '[placement]\nvcpu_pin = "auto"\nhugepages = "2M"'},
            "one-queue": {"queues": 1, "iothreads": 0}}


def test_the_disk_is_a_vhostuser_socket_on_shared_memory():
    root = ET.fromstring(rendered(profile()))
    disk = root.find("devices/disk")
    assert disk.get("type") == "vhostuser"
    assert disk.find("source").attrib == {"type": "unix", "path": "/var/tmp/w/vhost-user-blk.sock"}
    assert disk.find("driver").attrib == {"name": "qemu", "type": "raw", "queues": "2"}
    assert disk.find("target").attrib == {"dev": "vda", "bus": "virtio"}
    assert root.find("memoryBacking/source").get("type") == "memfd"
    assert root.find("memoryBacking/access").get("mode") == "shared"
    assert root.find("iothreads") is None  # the daemon's
    both = ET.fromstring(rendered(profile(more='[placement]\nhugepages = "2M"')))
    assert both.find("memoryBacking/hugepages/page").get("size") == "2048"
    assert both.find("memoryBacking/access").get("mode") == "shared"


@pytest.mark.skipif(shutil.which("virt-xml-validate") is None, reason="virt-xml-validate (libvirt-clients)")
@pytest.mark.parametrize("variant", VARIANTS)
def test_schema_valid(variant, tmp_path):
    f = tmp_path / "d.xml"
    f.write_text(rendered(profile(**VARIANTS[variant])))
    r = subprocess.run(["virt-xml-validate", str(f), "domain"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr + f.read_text()


@pytest.mark.parametrize("variant", VARIANTS)
def test_test_driver_accepts(variant):
    libvirt = pytest.importorskip("libvirt")
    libvirt.registerErrorHandler(lambda *_: None, None)
    conn = libvirt.open("test:///default")
    try:
        dom = conn.defineXML(rendered(profile(**VARIANTS[variant]), domain_type="qemu"))
        desc = dom.XMLDesc(0)
        dom.undefine()
    finally:
        conn.close()
    assert ET.fromstring(desc).find("devices/disk").get("type") == "vhostuser"
