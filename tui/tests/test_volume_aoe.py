"""AoE volumes attached by the guest (disk.attach = guest): the checks before a run, the domain without a disk, the
labels, and a real vblade on a real bridge made by the test (started, serving, stopped, nothing left)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cloudbox.core.disks.volumes import aoe, attach, transports
from cloudbox.core.disks.volumes.store import VolumeStore
from cloudbox.core.errors import CloudboxError
from cloudbox.core.spec import profiles
from cloudbox.core.studies import loading
from cloudbox.core.virt.domain import DomainPlan, render_domain

MIB = 1024 * 1024


def test_guest_attach_is_checked_per_scheme_and_hypervisor():
    attach.check_attach("aoe", "guest", has_module=lambda m: False)  # the host needs no aoe driver for it
    attach.check_attach("nbd", "guest", has_module=lambda m: False)
    attach.check_attach("iscsi", "guest", has_module=lambda m: False)
    attach.check_attach("nvme-tcp", "guest", has_module=lambda m: False)  # the guest's own nvme_tcp
    with pytest.raises(attach.AttachRefused, match="KVM/QEMU only, not guest.hypervisor = xen"):
        attach.check_attach("aoe", "guest", hypervisor="xen")
    # host mode needs the host kernel's initiator; without it the message names the driver and what works here
    with pytest.raises(attach.AttachRefused, match=r"its aoe driver, which this kernel .* lacks.*disk.attach = qemu"):
        attach.check_attach("aoe", "host", has_module=lambda m: False)


def test_no_baseline_says_why():
    assert "this kernel" in transports.no_aoe_baseline()
    assert "a local disk is not the same volume" in transports.no_aoe_baseline()


def test_the_guest_presets_are_valid_and_runnable_and_the_host_one_is_not():
    for name, volume in (("kvm-ebs-aoe-guest", "aoe:ebs"), ("kvm-ebs-nbd-guest", "nbd:ebs")):
        guest = profiles.find_profile(name)
        assert (guest.disk.backing, guest.disk.attach, guest.disk.volume) == ("network-volume", "guest", volume)
        assert loading.cannot_run(guest) is None
    # host attach runs where the kernel has the initiator (the appliance): a study counts it as runnable
    for name in ("kvm-ebs-aoe", "kvm-ebs-aoe-virtio", "kvm-ebs-iscsi-host", "kvm-ebs-nvme", "kvm-ebs-nvme-guest"):
        assert loading.cannot_run(profiles.find_profile(name)) is None, name


def _render(prof: profiles.Profile, **kw: object) -> str:
    args: dict[str, object] = dict(name="g", domain_type="qemu", kernel="/k", initrd="/i", cmdline="console=ttyS0",
                                   disk_path="", disk_is_block=False, bridge="cbbr0")
    args.update(kw)
    return render_domain(DomainPlan(prof, **args))  # type: ignore[arg-type]


def test_a_guest_attach_domain_has_a_nic_and_no_disk():
    prof = profiles.find_profile("kvm-ebs-aoe-guest")
    root = ET.fromstring(_render(prof))
    assert root.findall("devices/disk") == []
    assert root.find("devices/interface/source").get("bridge") == "cbbr0"
    assert root.find("devices/interface/model").get("type") == "e1000"
    drivers = root.findtext("os/cmdline").split("cloudbox.drivers=")[1].split(",")
    assert "e1000" in drivers and "sym53c8xx" not in drivers  # no disk on the profile's bus
    with pytest.raises(ValueError, match="needs a bridge"):
        _render(prof, bridge=None)
    with pytest.raises(ValueError, match="disk_path must be empty"):
        _render(prof, disk_path="/var/tmp/x.img")


def test_shelves_are_in_range_and_per_run():
    shelves = {aoe.shelf_for(uuid.uuid4().hex) for _ in range(200)}
    assert all(0 <= s <= aoe.MAX_SHELF for s in shelves) and len(shelves) > 150


@pytest.fixture
def bridge():
    if os.geteuid() != 0:
        pytest.skip("a bridge and vblade's packet socket need root")
    name = f"cbtaoe{os.getpid() % 10000}"
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "link", "del", name], check=False)


@pytest.mark.root
def test_vblade_serves_on_the_bridge_and_is_gone_after(state, bridge):
    if shutil.which("vblade") is None:
        pytest.skip("vblade is not installed (make deps)")
    with VolumeStore() as vs:
        vol = vs.create("ebs", 8 * MIB)
    work = state / "work"
    work.mkdir()
    exp = aoe.start("ebs", vol.path, bridge, shelf=aoe.shelf_for("ab12" * 8), log=work / "vblade.log",
                    macs=(aoe.guest_mac(1),))
    try:
        assert aoe.running(vol.path) == [exp.pid]
        assert exp.uri == f"aoe:e{exp.shelf}.0@{bridge}"
        # the bridge's address is pinned (set by hand: 3), so a guest plugged in later does not change it
        assert Path(f"/sys/class/net/{bridge}/addr_assign_type").read_text().strip() == "3"
        assert set(exp.io()) == {"read_bytes", "write_bytes"}
    finally:
        exp.stop()
    assert aoe.running(vol.path) == [] and not (work / "vblade.log").exists()
    exp.stop()  # twice is fine


# An AoE "query config" (command 1) for shelf.slot, broadcast from this namespace's eth0; prints "answered" when
# vblade's reply (the response flag, 0x08) comes back within 3 s.
QUERY = """
import socket, struct, sys, time
shelf, slot = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x88a2))
s.bind(("eth0", 0x88a2))
me = s.getsockname()[4]
frame = b"\\xff" * 6 + me + struct.pack("!HBBHBBI", 0x88a2, 0x10, 0, shelf, slot, 1, 0x1234) + bytes(8)
s.sendall(frame.ljust(60, b"\\0"))
s.settimeout(0.2)
deadline = time.monotonic() + 3
while time.monotonic() < deadline:
    try:
        got = s.recv(2048)
    except TimeoutError:
        continue
    if got[6:12] != me and got[14] & 0x08 and struct.unpack("!H", got[16:18])[0] == shelf:
        print("answered")
        break
else:
    print("silent")
"""


@pytest.mark.root
def test_vblade_answers_the_runs_initiators_only(state, bridge):
    """Two hosts on the volume's segment (network namespaces on the bridge): the guest, with the MAC the run gives
    it, finds the target; another host with its own MAC gets no answer (a MAC is not a secret: this stops other
    initiators, not an impostor that sends from the guest's MAC)."""
    if shutil.which("vblade") is None:
        pytest.skip("vblade is not installed (make deps)")
    with VolumeStore() as vs:
        vol = vs.create("ebs", 8 * MIB)
    shelf = aoe.shelf_for("cd34" * 8)
    hosts = {"guest": aoe.guest_mac(shelf), "intruder": "52:54:00:12:34:56"}
    tag = os.getpid() % 10000
    made: list[str] = []
    try:
        for who, mac in hosts.items():
            ns, port = f"cbtaoe-{who}-{tag}", f"cbta{who[0]}{tag}"
            subprocess.run(["ip", "netns", "add", ns], check=True)
            made.append(ns)
            subprocess.run(["ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns],
                           check=True)
            subprocess.run(["ip", "link", "set", port, "master", bridge, "up"], check=True)
            for cmd in (["link", "set", "eth0", "address", mac], ["link", "set", "eth0", "up"]):
                subprocess.run(["ip", "netns", "exec", ns, "ip", *cmd], check=True)
        exp = aoe.start("ebs", vol.path, bridge, shelf=shelf, log=state / "vblade.log", macs=(hosts["guest"],))
        try:
            time.sleep(1)  # the ports forwarding (no STP on the test's bridge: at once, in practice)

            def asks(who: str) -> str:
                return subprocess.run(["ip", "netns", "exec", f"cbtaoe-{who}-{tag}", sys.executable, "-c", QUERY,
                                       str(shelf), "0"], capture_output=True, text=True, timeout=30).stdout.strip()
            assert asks("guest") == "answered"
            assert asks("intruder") == "silent"
        finally:
            exp.stop()
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], check=False)


@pytest.mark.root
def test_vblade_on_a_missing_interface_is_refused_and_leaves_nothing(state):
    with VolumeStore() as vs:
        vol = vs.create("ebs", 8 * MIB)
    with pytest.raises(CloudboxError, match="no network interface 'nope0'"):
        aoe.start("ebs", vol.path, "nope0", shelf=1, log=state / "vblade.log", macs=(aoe.guest_mac(1),))
    assert aoe.running(vol.path) == []


def test_an_nbd_guest_export_serves_loopback_then_the_bridge_and_hands_qemu_nothing(state, bridge):
    """NBD with guest attach: qemu-nbd on loopback for the baseline, moved to the host's address on the guest's
    bridge by serve(); the domain gets no network disk source; close() leaves no qemu-nbd."""
    with VolumeStore() as vs:
        vol = vs.create("ebs", 16 * MIB)
    subprocess.run(["ip", "addr", "add", "169.254.199.1/24", "dev", bridge], check=True)
    ve = attach.export_for_run("nbd:ebs", "guest", run_uuid="run-n", work_dir=state / "work" / "run-n",
                               size_bytes=8 * MIB)
    try:
        assert ve.store.network is None and ve.no_baseline == "" and ve.uri.startswith("nbds://127.0.0.1:")
        loop_pid = ve.export.pid if ve.export else None
        exp = ve.serve(bridge, "169.254.199.1")
        assert ve.uri == exp.uri and exp.uri.startswith("nbds://169.254.199.1:") and ve.store.path == exp.uri
        assert loop_pid is not None and not os.path.exists(f"/proc/{loop_pid}")
        assert ve.creds is not None and (ve.creds.client_dir / "client-key.pem").exists()
    finally:
        ve.close()
    assert subprocess.run(["pgrep", "-f", f"qemu-nbd .*{vol.path}"], capture_output=True).returncode == 1


def test_a_guest_attach_export_is_marked_then_cleared(state):
    """export_for_run for a guest-attached AoE volume only checks and marks it; close() clears the mark and the
    work directory (the export itself starts once the guest's bridge exists)."""
    if shutil.which("vblade") is None:
        pytest.skip("vblade is not installed (make deps)")
    with VolumeStore() as vs:
        vs.create("ebs", 16 * MIB)
    ve = attach.export_for_run("aoe:ebs", "guest", run_uuid="run-g", work_dir=state / "work" / "run-g",
                               size_bytes=8 * MIB)
    try:
        assert ve.export is None and ve.server == "not served yet" and ve.no_baseline.startswith("no baseline")
        assert ve.store.path.startswith("aoe:e") and ve.store.baseline_target == ""
        with VolumeStore() as vs:
            assert vs.get("ebs").attached_run == "run-g"
    finally:
        ve.close()
    with VolumeStore() as vs:
        assert vs.get("ebs").attached_run is None
    assert not (state / "work" / "run-g").exists()


def test_a_nodes_aoe_export_answers_that_nodes_host_and_its_guest(state, monkeypatch, tmp_path):
    """Across nodes the front-end's vblade allows the node's host (the MAC that answers for its private address on
    the private link) and its guest (the MAC the node gives it, from the shelf in the volume's address)."""
    from cloudbox.core.disks.volumes import nodecreds
    from cloudbox.core.spec import remote

    seen: dict = {}
    monkeypatch.setattr(aoe, "neighbour_mac", lambda addr, link: {("10.73.0.2", "priv0"): "0a:00:00:00:00:02"}[
        (addr, link)])
    monkeypatch.setattr(aoe, "start", lambda *a, **kw: seen.update(kw) or aoe.AoeExport("ebs", "", "priv0",
                                                                                       kw["shelf"], 0))
    creds = nodecreds.NodeCreds("be1", None, None, tmp_path)  # type: ignore[arg-type]
    t = transports.block_transport("aoe")
    exp = t.serve_node("ebs", "/v", creds, "guest", "run-x", "10.73.0.1", "priv0", tmp_path, "10.73.0.2")
    assert seen["macs"] == ("0a:00:00:00:00:02", aoe.guest_mac(aoe.shelf_for("run-x")))
    with pytest.raises(CloudboxError, match="private address is needed"):
        t.serve_node("ebs", "/v", creds, "guest", "run-x", "10.73.0.1", "priv0", tmp_path)
    # the node's side: the guest it launches carries the MAC of the target's shelf
    rv = remote.parse(f"aoe:{exp.target}@10.73.0.1")
    assert aoe.guest_mac(rv.shelf_slot[0]) == aoe.guest_mac(aoe.shelf_for("run-x"))
    assert aoe.guest_mac(0x1234) == "52:54:00:ae:12:34"


@pytest.mark.root
def test_the_host_s_own_aoe_link_carries_jumbo_frames_and_is_removed():
    """Study A carried AoE in 9000-byte frames (8 KiB of data per request instead of 1 KiB): the veth pair between
    vblade and this host's aoe driver has that MTU at both ends, and goes with its run."""
    if os.geteuid() != 0:
        pytest.skip("needs root: it makes a veth pair")
    run_uuid = str(uuid.uuid4())
    server, host = aoe.veth_pair(run_uuid)
    try:
        for name in (server, host):
            assert Path(f"/sys/class/net/{name}/mtu").read_text().strip() == str(aoe.VETH_MTU) == "9000"
    finally:
        aoe.remove_veth(server)
    assert not Path(f"/sys/class/net/{server}").exists() and not Path(f"/sys/class/net/{host}").exists()
